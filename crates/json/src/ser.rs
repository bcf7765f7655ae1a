//! A `serde::Serializer` that writes the RFC 8785 canonical form of any `Serialize` value.
//!
//! It writes exactly what [`canonicalize`](crate::canonicalize) would write for
//! `serde_json::to_value(value)`, with the same number formatting and string escaping
//! (`number.rs`, `canon.rs`), but refuses what that detour would let through: NaN and
//! infinities (`to_value` makes them `null`), non-string map keys (`to_value` turns
//! integers and bools into strings) and repeated member names (`to_value` keeps the last).
//! The v2 variants also refuse every float and every integer beyond `±(2^53 - 1)`, as
//! [`check_v2_domain`](crate::check_v2_domain) does.
//!
//! Output is built in memory: a canonical object can only be written once all of its
//! members are known, since they are sorted. So `to_writer` writes nothing at all for a
//! value it refuses.
//!
//! Recursion follows the value's own `Serialize` implementation; the serializer adds no
//! recursion of its own and no limit. What it writes may be larger or deeper than a
//! reader's [`Limits`](crate::Limits) accept.

use std::{borrow::Cow, fmt::Display, io, ops::Range};

use serde::ser::{self, Impossible, Serialize};

use crate::{
    JsonError,
    canon::{utf16_cmp, write_string},
    domain::{NOT_AN_INTEGER, check_v2_integer},
    number::{write_f64, write_integer},
};

/// Writes `value` in the RFC 8785 canonical form, as [`canonicalize`](crate::canonicalize)
/// would write `serde_json::to_value(value)`.
///
/// Numbers are ECMAScript's: integers are exact up to `2^53` in magnitude and beyond that
/// (a large `u64`, any `i128`/`u128`) are written as the nearest double, the rounding
/// RFC 8785 prescribes and `canonicalize` applies; `f32` is widened to `f64` first. Bytes
/// are an array of numbers, a `char` a one-character string, `None` and `()` `null`, and
/// enums use serde's representations (`"Unit"`, `{"Newtype":…}` and so on).
///
/// # Errors
///
/// - `number_out_of_range` ([`JsonError::NonFiniteFloat`]): a NaN or an infinity;
/// - `key_not_string` ([`JsonError::KeyNotString`]): a map key that is not a string, a
///   `char`, a unit enum variant or a newtype struct around one of those;
/// - `duplicate_key` ([`JsonError::DuplicateMapKey`]): one object with a member name
///   twice;
/// - `serialize_failed` ([`JsonError::SerializeFailed`]): the value's own `Serialize`
///   implementation reported an error.
pub fn to_string<T: ?Sized + Serialize>(value: &T) -> Result<String, JsonError> {
    serialize(value, Domain::Json)
}

/// Like [`to_string`], as UTF-8 bytes.
///
/// # Errors
///
/// As [`to_string`].
pub fn to_vec<T: ?Sized + Serialize>(value: &T) -> Result<Vec<u8>, JsonError> {
    to_string(value).map(String::into_bytes)
}

/// Like [`to_string`], written to `writer` with one `write_all` once the whole value has
/// been serialized: a refused value writes nothing. `writer` is not flushed.
///
/// # Errors
///
/// As [`to_string`], and `io` ([`JsonError::Io`]) if the writer fails.
pub fn to_writer<W: io::Write, T: ?Sized + Serialize>(
    writer: W,
    value: &T,
) -> Result<(), JsonError> {
    write_all(writer, &to_string(value)?)
}

/// Like [`to_string`], refusing what lies outside the v2 domain as
/// [`check_v2_domain`](crate::check_v2_domain) does: the output is what
/// `canonicalize(&to_value(value))` writes when `check_v2_domain` accepts that value.
///
/// # Errors
///
/// As [`to_string`], and `outside_v2_domain` ([`JsonError::OutsideV2Domain`]) for any
/// finite float (even `2.0`: a float has no one spelling) and any integer beyond
/// `±(2^53 - 1)`. A NaN or an infinity is `number_out_of_range`, as in [`to_string`].
pub fn to_string_v2<T: ?Sized + Serialize>(value: &T) -> Result<String, JsonError> {
    serialize(value, Domain::V2)
}

/// Like [`to_string_v2`], as UTF-8 bytes.
///
/// # Errors
///
/// As [`to_string_v2`].
pub fn to_vec_v2<T: ?Sized + Serialize>(value: &T) -> Result<Vec<u8>, JsonError> {
    to_string_v2(value).map(String::into_bytes)
}

/// Like [`to_writer`], refusing what lies outside the v2 domain as [`to_string_v2`] does.
///
/// # Errors
///
/// As [`to_string_v2`], and `io` ([`JsonError::Io`]) if the writer fails.
pub fn to_writer_v2<W: io::Write, T: ?Sized + Serialize>(
    writer: W,
    value: &T,
) -> Result<(), JsonError> {
    write_all(writer, &to_string_v2(value)?)
}

fn write_all<W: io::Write>(mut writer: W, text: &str) -> Result<(), JsonError> {
    writer.write_all(text.as_bytes()).map_err(|err| JsonError::Io { kind: err.kind() })
}

fn serialize<T: ?Sized + Serialize>(value: &T, domain: Domain) -> Result<String, JsonError> {
    let mut out = String::new();
    value.serialize(Serializer { out: &mut out, domain }).map_err(|Error(err)| err)?;
    Ok(out)
}

/// Which values the serializer accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Domain {
    /// Everything JSON can write: finite numbers, string keys, unique member names.
    Json,
    /// [`Domain::Json`] narrowed to integers within `±(2^53 - 1)`.
    V2,
}

/// `serde` needs an error type that implements `serde::ser::Error`; this wrapper keeps
/// that impl off the public [`JsonError`].
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Error(#[from] JsonError);

impl ser::Error for Error {
    /// The message is dropped: a `Serialize` impl's words may quote the value.
    fn custom<T: Display>(_message: T) -> Error {
        Error(JsonError::SerializeFailed)
    }
}

/// Appends one value to `out`.
#[derive(Debug)]
struct Serializer<'a> {
    out: &'a mut String,
    domain: Domain,
}

impl<'a> Serializer<'a> {
    fn integer(self, negative: bool, magnitude: u128) -> Result<(), Error> {
        if self.domain == Domain::V2 {
            check_v2_integer(magnitude)?;
        }
        write_integer(negative, magnitude, self.out);
        Ok(())
    }

    fn float(self, value: f64) -> Result<(), Error> {
        if !value.is_finite() {
            return Err(Error(JsonError::NonFiniteFloat));
        }
        if self.domain == Domain::V2 {
            return Err(Error(JsonError::OutsideV2Domain { reason: NOT_AN_INTEGER }));
        }
        write_f64(value, self.out);
        Ok(())
    }

    /// Writes `{"variant":`, the start of an externally tagged variant; whoever writes
    /// the variant's content closes it.
    fn open_variant(&mut self, variant: &str) {
        self.out.push('{');
        write_string(variant, self.out);
        self.out.push(':');
    }

    fn seq(self, close_variant: bool) -> Seq<'a> {
        self.out.push('[');
        Seq { out: self.out, domain: self.domain, first: true, close_variant }
    }

    fn object(self, close_variant: bool) -> Object<'a> {
        let start = self.out.len();
        Object {
            out: self.out,
            domain: self.domain,
            start,
            members: Vec::new(),
            key: None,
            close_variant,
        }
    }
}

impl<'a> ser::Serializer for Serializer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, value: bool) -> Result<(), Error> {
        self.out.push_str(if value { "true" } else { "false" });
        Ok(())
    }

    fn serialize_i8(self, value: i8) -> Result<(), Error> {
        self.integer(value < 0, value.unsigned_abs().into())
    }

    fn serialize_i16(self, value: i16) -> Result<(), Error> {
        self.integer(value < 0, value.unsigned_abs().into())
    }

    fn serialize_i32(self, value: i32) -> Result<(), Error> {
        self.integer(value < 0, value.unsigned_abs().into())
    }

    fn serialize_i64(self, value: i64) -> Result<(), Error> {
        self.integer(value < 0, value.unsigned_abs().into())
    }

    fn serialize_i128(self, value: i128) -> Result<(), Error> {
        self.integer(value < 0, value.unsigned_abs())
    }

    fn serialize_u8(self, value: u8) -> Result<(), Error> {
        self.integer(false, value.into())
    }

    fn serialize_u16(self, value: u16) -> Result<(), Error> {
        self.integer(false, value.into())
    }

    fn serialize_u32(self, value: u32) -> Result<(), Error> {
        self.integer(false, value.into())
    }

    fn serialize_u64(self, value: u64) -> Result<(), Error> {
        self.integer(false, value.into())
    }

    fn serialize_u128(self, value: u128) -> Result<(), Error> {
        self.integer(false, value)
    }

    fn serialize_f32(self, value: f32) -> Result<(), Error> {
        // Widened exactly, as serde_json's `Value` does: 0.1f32 is 0.10000000149011612.
        self.float(value.into())
    }

    fn serialize_f64(self, value: f64) -> Result<(), Error> {
        self.float(value)
    }

    fn serialize_char(self, value: char) -> Result<(), Error> {
        write_string(value.encode_utf8(&mut [0; 4]), self.out);
        Ok(())
    }

    fn serialize_str(self, value: &str) -> Result<(), Error> {
        write_string(value, self.out);
        Ok(())
    }

    /// An array of numbers, as serde_json writes bytes.
    fn serialize_bytes(self, value: &[u8]) -> Result<(), Error> {
        self.out.push('[');
        for (index, &byte) in value.iter().enumerate() {
            if index > 0 {
                self.out.push(',');
            }
            write_integer(false, byte.into(), self.out);
        }
        self.out.push(']');
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.open_variant(variant);
        value.serialize(Serializer { out: &mut *self.out, domain: self.domain })?;
        self.out.push('}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, Error> {
        Ok(self.seq(false))
    }

    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a>, Error> {
        Ok(self.seq(false))
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Seq<'a>, Error> {
        Ok(self.seq(false))
    }

    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, Error> {
        self.open_variant(variant);
        Ok(self.seq(true))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Object<'a>, Error> {
        Ok(self.object(false))
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Object<'a>, Error> {
        Ok(self.object(false))
    }

    fn serialize_struct_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Object<'a>, Error> {
        self.open_variant(variant);
        Ok(self.object(true))
    }
}

/// An array being written: elements go straight to `out`.
#[derive(Debug)]
struct Seq<'a> {
    out: &'a mut String,
    domain: Domain,
    first: bool,
    /// Whether this is a tuple variant's content, so `end` also closes `{"variant":`.
    close_variant: bool,
}

impl Seq<'_> {
    fn element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        value.serialize(Serializer { out: &mut *self.out, domain: self.domain })
    }

    fn close(self) -> Result<(), Error> {
        self.out.push(']');
        if self.close_variant {
            self.out.push('}');
        }
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTupleStruct for Seq<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTupleVariant for Seq<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// An object being written. Members arrive in the value's order and must leave in
/// UTF-16 order of their names, so each value is written to `out` as it comes and its
/// place remembered; `end` cuts them off and writes the object sorted.
#[derive(Debug)]
struct Object<'a> {
    out: &'a mut String,
    domain: Domain,
    /// Where this object's text begins in `out`. Invariant: nothing before it is touched.
    start: usize,
    /// Each member's name and where its value's text lies, relative to `start`.
    members: Vec<Member>,
    /// A name given by `serialize_key` and waiting for its value.
    key: Option<Cow<'static, str>>,
    /// Whether this is a struct variant's content, so `end` also closes `{"variant":`.
    close_variant: bool,
}

#[derive(Debug)]
struct Member {
    name: Cow<'static, str>,
    value: Range<usize>,
}

impl Object<'_> {
    fn member<T: ?Sized + Serialize>(
        &mut self,
        name: Cow<'static, str>,
        value: &T,
    ) -> Result<(), Error> {
        let begin = self.out.len() - self.start;
        value.serialize(Serializer { out: &mut *self.out, domain: self.domain })?;
        self.members.push(Member { name, value: begin..self.out.len() - self.start });
        Ok(())
    }

    fn close(mut self) -> Result<(), Error> {
        if self.key.is_some() {
            // A key without a value: the `Serialize` impl broke serde's protocol.
            return Err(Error(JsonError::SerializeFailed));
        }
        self.members.sort_unstable_by(|a, b| utf16_cmp(&a.name, &b.name));
        if self.members.windows(2).any(|pair| matches!(pair, [a, b] if a.name == b.name)) {
            return Err(Error(JsonError::DuplicateMapKey));
        }
        let values = self.out.split_off(self.start);
        self.out.reserve(values.len() + 2 + self.members.len() * 4);
        self.out.push('{');
        for (index, member) in self.members.iter().enumerate() {
            if index > 0 {
                self.out.push(',');
            }
            write_string(&member.name, self.out);
            self.out.push(':');
            // Every range was measured in `out` when its value was written, and `values`
            // is that same text, so the slice exists; `get` keeps that a checked claim.
            let value =
                values.get(member.value.clone()).ok_or(Error(JsonError::SerializeFailed))?;
            self.out.push_str(value);
        }
        self.out.push('}');
        if self.close_variant {
            self.out.push('}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Error> {
        if self.key.is_some() {
            // Two keys in a row: the `Serialize` impl broke serde's protocol.
            return Err(Error(JsonError::SerializeFailed));
        }
        self.key = Some(key.serialize(KeySerializer)?);
        Ok(())
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        // A value without a key: the `Serialize` impl broke serde's protocol.
        let name = self.key.take().ok_or(Error(JsonError::SerializeFailed))?;
        self.member(name, value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeStruct for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.member(Cow::Borrowed(name), value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeStructVariant for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.member(Cow::Borrowed(name), value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// Turns a map key into a member name, or refuses it. Only what is a string in serde's
/// data model passes: `str`, `char`, a unit variant's name, and newtype structs around
/// those. serde_json would also stringify integers, bools and floats; that is refused
/// here, so that a key's spelling is always the caller's own.
#[derive(Debug)]
struct KeySerializer;

fn key_not_string<T>() -> Result<T, Error> {
    Err(Error(JsonError::KeyNotString))
}

impl ser::Serializer for KeySerializer {
    type Ok = Cow<'static, str>;
    type Error = Error;
    type SerializeSeq = Impossible<Cow<'static, str>, Error>;
    type SerializeTuple = Impossible<Cow<'static, str>, Error>;
    type SerializeTupleStruct = Impossible<Cow<'static, str>, Error>;
    type SerializeTupleVariant = Impossible<Cow<'static, str>, Error>;
    type SerializeMap = Impossible<Cow<'static, str>, Error>;
    type SerializeStruct = Impossible<Cow<'static, str>, Error>;
    type SerializeStructVariant = Impossible<Cow<'static, str>, Error>;

    fn serialize_str(self, value: &str) -> Result<Cow<'static, str>, Error> {
        Ok(Cow::Owned(value.to_owned()))
    }

    fn serialize_char(self, value: char) -> Result<Cow<'static, str>, Error> {
        Ok(Cow::Owned(value.to_string()))
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Cow<'static, str>, Error> {
        Ok(Cow::Borrowed(variant))
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Cow<'static, str>, Error> {
        value.serialize(self)
    }

    fn serialize_bool(self, _value: bool) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_i8(self, _value: i8) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_i16(self, _value: i16) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_i32(self, _value: i32) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_i64(self, _value: i64) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_i128(self, _value: i128) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_u8(self, _value: u8) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_u16(self, _value: u16) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_u32(self, _value: u32) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_u64(self, _value: u64) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_u128(self, _value: u128) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_f32(self, _value: f32) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_f64(self, _value: f64) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_bytes(self, _value: &[u8]) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_none(self) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _value: &T) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_unit(self) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<Cow<'static, str>, Error> {
        key_not_string()
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        key_not_string()
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        key_not_string()
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        key_not_string()
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        key_not_string()
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        key_not_string()
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        key_not_string()
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        key_not_string()
    }
}
