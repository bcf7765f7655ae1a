//! The serializer: `to_string` and friends write exactly what `canonicalize` writes for
//! `serde_json::to_value`, and refuse what that detour would silently let through.

use std::collections::{BTreeMap, HashMap};
use std::io;

use proptest::prelude::*;
use serde::ser::{Error as _, SerializeMap};
use serde::{Serialize, Serializer};
use serde_json::{Value, json};
use toolledger_json::{
    JsonError, V2_INTEGER_MAX, V2_INTEGER_MIN, canonicalize, check_v2_domain, to_string,
    to_string_v2, to_vec, to_vec_v2, to_writer, to_writer_v2,
};

use crate::data;
use crate::properties::{text, value};

/// What the detour through `serde_json::Value` writes, for values both paths accept.
fn via_value<T: Serialize>(value: &T) -> String {
    canonicalize(&serde_json::to_value(value).unwrap())
}

/// `to_string`'s refusal code, checking on the way that the other five entry points agree
/// and that a refusal has no offset.
fn refusal<T: Serialize>(value: &T) -> &'static str {
    let err = to_string(value).unwrap_err();
    assert_eq!(err.offset(), None);
    assert_eq!(to_vec(value).unwrap_err(), err);
    assert_eq!(to_writer(Vec::new(), value).unwrap_err(), err);
    assert_eq!(to_string_v2(value).unwrap_err().code(), err.code());
    err.code()
}

fn v2_refusal<T: Serialize>(value: &T) -> &'static str {
    let err = to_string_v2(value).unwrap_err();
    assert_eq!(err.offset(), None);
    assert_eq!(to_vec_v2(value).unwrap_err(), err);
    assert_eq!(to_writer_v2(Vec::new(), value).unwrap_err(), err);
    err.code()
}

/// Calls `serialize_bytes`, as `serde_bytes` would.
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// A map that writes its entries as given, repeats included.
struct Entries<K, V>(Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for Entries<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

#[test]
fn nan_and_infinities_are_number_out_of_range_where_to_value_writes_null() {
    for float in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(refusal(&float), "number_out_of_range", "{float}");
        assert_eq!(refusal(&(1u8, vec![float])), "number_out_of_range");
        // The detour this serializer exists to avoid: NaN quietly becomes `null`.
        assert_eq!(serde_json::to_value(float).unwrap(), Value::Null);
    }
    for float in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(refusal(&float), "number_out_of_range", "{float}");
        assert_eq!(refusal(&BTreeMap::from([("x", float)])), "number_out_of_range");
    }
    assert_eq!(to_string(&f64::NAN).unwrap_err(), JsonError::NonFiniteFloat);
    // In the v2 domain too, a NaN is out of range before it is a float.
    assert_eq!(v2_refusal(&f64::NAN), "number_out_of_range");
}

#[test]
fn finite_floats_are_written_as_ecmascript_writes_them() {
    assert_eq!(to_string(&1.5f64).unwrap(), "1.5");
    assert_eq!(to_string(&2.0f64).unwrap(), "2");
    assert_eq!(to_string(&-0.0f64).unwrap(), "0");
    assert_eq!(to_string(&1e30f64).unwrap(), "1e+30");
    assert_eq!(to_string(&f64::MAX).unwrap(), "1.7976931348623157e+308");
    // `f32` is widened exactly, as serde_json's `Value` widens it.
    assert_eq!(to_string(&0.1f32).unwrap(), "0.10000000149011612");
    assert_eq!(to_string(&0.1f32).unwrap(), via_value(&0.1f32));
}

#[test]
fn every_es6_number_line_serializes_exactly() {
    let file = std::fs::read_to_string(data("rfc8785/numbers/es6testfile-first10000.txt")).unwrap();
    let mut lines = 0;
    for line in file.lines() {
        let (hex, expected) = line.split_once(',').unwrap();
        let double = f64::from_bits(u64::from_str_radix(hex, 16).unwrap());
        assert_eq!(to_string(&double).unwrap(), expected, "{hex}");
        lines += 1;
    }
    assert_eq!(lines, 10_000);
}

#[test]
fn v2_accepts_integers_to_two_to_the_53_minus_1_and_refuses_past_them() {
    let max = V2_INTEGER_MAX;
    assert_eq!(to_string_v2(&max).unwrap(), "9007199254740991");
    assert_eq!(to_string_v2(&max.unsigned_abs()).unwrap(), "9007199254740991");
    assert_eq!(to_string_v2(&i128::from(max)).unwrap(), "9007199254740991");
    assert_eq!(to_string_v2(&u128::from(max.unsigned_abs())).unwrap(), "9007199254740991");
    assert_eq!(to_string_v2(&V2_INTEGER_MIN).unwrap(), "-9007199254740991");
    assert_eq!(to_string_v2(&i128::from(V2_INTEGER_MIN)).unwrap(), "-9007199254740991");
    assert_eq!(to_string_v2(&0u8).unwrap(), "0");
    assert_eq!(to_string_v2(&i8::MIN).unwrap(), "-128");

    let beyond = 1i64 << 53;
    assert_eq!(v2_refusal(&beyond), "outside_v2_domain");
    assert_eq!(v2_refusal(&-beyond), "outside_v2_domain");
    assert_eq!(v2_refusal(&beyond.unsigned_abs()), "outside_v2_domain");
    assert_eq!(v2_refusal(&u64::MAX), "outside_v2_domain");
    assert_eq!(v2_refusal(&i128::MIN), "outside_v2_domain");
    assert_eq!(v2_refusal(&u128::MAX), "outside_v2_domain");
    assert_eq!(v2_refusal(&vec![vec![1, 2], vec![beyond]]), "outside_v2_domain");
}

#[test]
fn v2_refuses_every_float_even_an_integral_one() {
    for float in [1.5f64, 2.0, 0.0, -0.0, 1e3] {
        assert_eq!(v2_refusal(&float), "outside_v2_domain", "{float}");
    }
    assert_eq!(v2_refusal(&0.5f32), "outside_v2_domain");
    assert_eq!(v2_refusal(&BTreeMap::from([("a", 1.5)])), "outside_v2_domain");
    // As `check_v2_domain` refuses what `to_value` makes of them, with the same reason.
    let err = to_string_v2(&2.0f64).unwrap_err();
    assert_eq!(check_v2_domain(&serde_json::to_value(2.0f64).unwrap()), Err(err));
}

#[test]
fn json_domain_writes_big_integers_as_their_nearest_double() {
    assert_eq!(to_string(&(1u64 << 53)).unwrap(), "9007199254740992");
    assert_eq!(to_string(&((1u64 << 53) + 1)).unwrap(), "9007199254740992");
    assert_eq!(to_string(&u64::MAX).unwrap(), "18446744073709552000");
    assert_eq!(to_string(&u64::MAX).unwrap(), via_value(&u64::MAX));
    assert_eq!(to_string(&i64::MIN).unwrap(), via_value(&i64::MIN));
    // i128 and u128 within i64/u64 agree with `to_value`; beyond it `to_value` refuses
    // them while RFC 8785 writes every finite double, so they become one.
    assert_eq!(to_string(&-5i128).unwrap(), "-5");
    assert_eq!(to_string(&u128::from(u64::MAX)).unwrap(), via_value(&u64::MAX));
    assert_eq!(to_string(&u128::MAX).unwrap(), "3.402823669209385e+38");
    assert_eq!(to_string(&i128::MIN).unwrap(), "-1.7014118346046923e+38");
    assert!(serde_json::to_value(u128::MAX).is_err());
}

#[test]
fn map_keys_that_are_not_strings_are_refused() {
    assert_eq!(refusal(&BTreeMap::from([(1u32, "a")])), "key_not_string");
    assert_eq!(refusal(&BTreeMap::from([(-1i8, "a")])), "key_not_string");
    assert_eq!(refusal(&BTreeMap::from([(true, "a")])), "key_not_string");
    assert_eq!(refusal(&BTreeMap::from([((1u8, 2u8), "a")])), "key_not_string");
    assert_eq!(refusal(&BTreeMap::from([(Some("a"), 1)])), "key_not_string");
    assert_eq!(refusal(&BTreeMap::from([((), 1)])), "key_not_string");
    assert_eq!(refusal(&Entries(vec![(1.5f64, 1)])), "key_not_string");
    assert_eq!(refusal(&Entries(vec![(Bytes(b"a"), 1)])), "key_not_string");
    assert_eq!(refusal(&Entries(vec![(vec!["a"], 1)])), "key_not_string");
    assert_eq!(to_string(&BTreeMap::from([(1u32, "a")])).unwrap_err(), JsonError::KeyNotString);
    // serde_json would have written `{"1":"a"}`.
    assert_eq!(serde_json::to_string(&BTreeMap::from([(1u32, "a")])).unwrap(), r#"{"1":"a"}"#);
}

#[derive(Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Color {
    Red,
    Green,
}

#[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
struct Name(String);

#[test]
fn keys_that_are_strings_in_serde_are_accepted() {
    let chars = BTreeMap::from([('b', 1), ('a', 2)]);
    assert_eq!(to_string(&chars).unwrap(), r#"{"a":2,"b":1}"#);
    assert_eq!(to_string(&chars).unwrap(), via_value(&chars));
    let colors = HashMap::from([(Color::Red, 1), (Color::Green, 2)]);
    assert_eq!(to_string(&colors).unwrap(), r#"{"Green":2,"Red":1}"#);
    assert_eq!(to_string(&colors).unwrap(), via_value(&colors));
    let names = BTreeMap::from([(Name("z".into()), 1), (Name("y".into()), 2)]);
    assert_eq!(to_string(&names).unwrap(), r#"{"y":2,"z":1}"#);
    assert_eq!(to_string(&names).unwrap(), via_value(&names));
}

#[derive(Serialize)]
struct Inner {
    a: u8,
}

#[derive(Serialize)]
struct Flattened {
    a: u8,
    #[serde(flatten)]
    inner: Inner,
}

#[derive(Serialize)]
#[serde(tag = "kind")]
enum Tagged {
    Variant {
        #[serde(flatten)]
        extra: BTreeMap<String, u8>,
    },
}

#[test]
fn duplicate_keys_produced_by_a_serialize_impl_are_refused() {
    assert_eq!(refusal(&Entries(vec![("a", 1), ("b", 2), ("a", 3)])), "duplicate_key");
    assert_eq!(
        to_string(&Entries(vec![("a", 1), ("a", 1)])).unwrap_err(),
        JsonError::DuplicateMapKey
    );
    // One name spelled by two key types is still one name.
    let mixed = Entries(vec![(Name("x".into()), 1), (Name("y".into()), 2)]);
    assert_eq!(to_string(&mixed).unwrap(), r#"{"x":1,"y":2}"#);
    assert_eq!(
        refusal(&(Entries(vec![("é", 1)]), Entries(vec![("é", 1), ("é", 2)]))),
        "duplicate_key"
    );
    // A flattened struct repeating a field, and a flattened map repeating an enum's tag
    // (serde's derive refuses a plain field named like the tag, but cannot see into a map).
    assert_eq!(refusal(&Flattened { a: 1, inner: Inner { a: 2 } }), "duplicate_key");
    let extra = BTreeMap::from([("kind".to_owned(), 1)]);
    assert_eq!(refusal(&Tagged::Variant { extra }), "duplicate_key");
    let extra = BTreeMap::from([("other".to_owned(), 1)]);
    check(&Tagged::Variant { extra }, r#"{"kind":"Variant","other":1}"#);
    // `to_value` would have kept the last one; `parse_strict` refuses either spelling.
    assert_eq!(via_value(&Entries(vec![("a", 1), ("a", 3)])), r#"{"a":3}"#);
    // Nested: a duplicate deep inside still refuses the whole value.
    let deep = vec![BTreeMap::from([("k", Entries(vec![("x", 1), ("x", 2)]))])];
    assert_eq!(refusal(&deep), "duplicate_key");
}

#[derive(Serialize, Clone, Debug)]
struct Unit;

#[derive(Serialize, Clone, Debug)]
struct Newtype(i32);

#[derive(Serialize, Clone, Debug)]
struct Tuple(i32, String);

#[derive(Serialize, Clone, Debug)]
enum External {
    Unit,
    Newtype(u8),
    Tuple(u8, bool),
    Struct { z: Option<u8>, a: char },
}

#[derive(Serialize, Clone, Debug)]
#[serde(tag = "type")]
enum Internal {
    Unit,
    Newtype(Inner2),
    Struct { z: u8, a: String },
}

#[derive(Serialize, Clone, Debug)]
struct Inner2 {
    y: u8,
    b: u8,
}

#[derive(Serialize, Clone, Debug)]
#[serde(tag = "t", content = "c")]
enum Adjacent {
    Unit,
    Newtype(u8),
    Tuple(u8, u8),
    Struct { z: u8, a: u8 },
}

#[derive(Serialize, Clone, Debug)]
#[serde(untagged)]
enum Untagged {
    Unit,
    Newtype(u8),
    Tuple(u8, u8),
    Struct { z: u8, a: u8 },
}

#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct Record {
    zeta: u32,
    alpha_beta: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    missing: Option<u8>,
    present: Option<u8>,
    nothing: (),
    unit: Unit,
    newtype: Newtype,
    tuple: Tuple,
    pair: (u8, char),
    list: Vec<External>,
}

/// Checks `value` against an expected text, against the `to_value` detour, and in the v2
/// domain (which accepts it when it has no floats).
fn check<T: Serialize>(value: &T, expected: &str) {
    assert_eq!(to_string(value).unwrap(), expected);
    assert_eq!(via_value(value), expected);
    assert_eq!(to_vec(value).unwrap(), expected.as_bytes());
    assert_eq!(to_string_v2(value).unwrap(), expected);
}

#[test]
fn derived_structs_sort_their_fields_and_nest() {
    let record = Record {
        zeta: 1,
        alpha_beta: "x".into(),
        missing: None,
        present: None,
        nothing: (),
        unit: Unit,
        newtype: Newtype(-7),
        tuple: Tuple(3, "t".into()),
        pair: (9, 'c'),
        list: vec![External::Unit],
    };
    check(
        &record,
        r#"{"alphaBeta":"x","list":["Unit"],"newtype":-7,"nothing":null,"pair":[9,"c"],"present":null,"tuple":[3,"t"],"unit":null,"zeta":1}"#,
    );
}

#[test]
fn every_enum_variant_kind_in_every_representation() {
    check(&External::Unit, r#""Unit""#);
    check(&External::Newtype(5), r#"{"Newtype":5}"#);
    check(&External::Tuple(5, true), r#"{"Tuple":[5,true]}"#);
    check(&External::Struct { z: None, a: 'é' }, r#"{"Struct":{"a":"é","z":null}}"#);
    check(&External::Struct { z: Some(1), a: '"' }, r#"{"Struct":{"a":"\"","z":1}}"#);

    check(&Internal::Unit, r#"{"type":"Unit"}"#);
    check(&Internal::Newtype(Inner2 { y: 1, b: 2 }), r#"{"b":2,"type":"Newtype","y":1}"#);
    check(&Internal::Struct { z: 1, a: "s".into() }, r#"{"a":"s","type":"Struct","z":1}"#);

    check(&Adjacent::Unit, r#"{"t":"Unit"}"#);
    check(&Adjacent::Newtype(1), r#"{"c":1,"t":"Newtype"}"#);
    check(&Adjacent::Tuple(1, 2), r#"{"c":[1,2],"t":"Tuple"}"#);
    check(&Adjacent::Struct { z: 1, a: 2 }, r#"{"c":{"a":2,"z":1},"t":"Struct"}"#);

    check(&Untagged::Unit, "null");
    check(&Untagged::Newtype(1), "1");
    check(&Untagged::Tuple(1, 2), "[1,2]");
    check(&Untagged::Struct { z: 1, a: 2 }, r#"{"a":2,"z":1}"#);

    // An enum nested in an enum, each closing its own braces.
    check(&vec![Some(External::Tuple(1, false)), None], r#"[{"Tuple":[1,false]},null]"#);
}

#[test]
fn scalars_options_units_chars_and_bytes() {
    check(&(), "null");
    check(&Unit, "null");
    check(&None::<u8>, "null");
    check(&Some(Some(3u8)), "3");
    check(&true, "true");
    check(&'x', r#""x""#);
    check(&'\u{1}', r#""\u0001""#);
    check(&"tab\there \u{7f}\u{2028}", "\"tab\\there \u{7f}\u{2028}\"");
    check(&Bytes(&[0, 1, 255]), "[0,1,255]");
    check(&Bytes(&[]), "[]");
    check(&Vec::<u8>::new(), "[]");
    check(&BTreeMap::<String, u8>::new(), "{}");
    check(&Inner2 { y: 0, b: 0 }, r#"{"b":0,"y":0}"#);
    check(&(1u8, "a", ['b']), r#"[1,"a",["b"]]"#);
}

#[test]
fn names_sort_by_utf16_code_units_not_utf8_bytes() {
    // U+10000 is F0 90 80 80 in UTF-8 but D800 DC00 in UTF-16, so it sorts before U+E000
    // in UTF-16 and after it in UTF-8.
    let names = HashMap::from([("\u{E000}", 1), ("\u{10000}", 2), ("a", 3), ("", 4)]);
    let expected = "{\"\":4,\"a\":3,\"\u{10000}\":2,\"\u{E000}\":1}";
    check(&names, expected);
    // Nested maps sort independently.
    let nested = BTreeMap::from([
        ("\u{E000}", BTreeMap::from([("\u{E000}", 1), ("\u{1F600}", 2)])),
        ("\u{1F600}", BTreeMap::from([("b", 3), ("a", 4)])),
    ]);
    let expected =
        "{\"\u{1F600}\":{\"a\":4,\"b\":3},\"\u{E000}\":{\"\u{1F600}\":2,\"\u{E000}\":1}}";
    check(&nested, expected);
}

/// A writer that fails every write with `kind`, and one that counts what it was given.
struct Failing(io::ErrorKind);

impl io::Write for Failing {
    fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(self.0, "/secret/path: disk on fire"))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failing_writer_is_io_and_a_refused_value_writes_nothing() {
    let err = to_writer(Failing(io::ErrorKind::BrokenPipe), &json!({"a": 1})).unwrap_err();
    assert_eq!(err, JsonError::Io { kind: io::ErrorKind::BrokenPipe });
    assert_eq!(err.code(), "io");
    assert_eq!(err.offset(), None);
    assert!(!err.to_string().contains("secret"), "{err}");
    let err = to_writer_v2(Failing(io::ErrorKind::StorageFull), &1).unwrap_err();
    assert_eq!(err.code(), "io");
    // A value refused is refused before the writer is touched.
    let err = to_writer(Failing(io::ErrorKind::BrokenPipe), &f64::NAN).unwrap_err();
    assert_eq!(err.code(), "number_out_of_range");
    let mut out = Vec::new();
    assert!(to_writer(&mut out, &vec![1.0, f64::INFINITY]).is_err());
    assert!(out.is_empty());
    assert!(to_writer_v2(&mut out, &Entries(vec![("a", 1u64), ("z", 1 << 60)])).is_err());
    assert!(out.is_empty());
    to_writer_v2(&mut out, &BTreeMap::from([("b", 1), ("a", 2)])).unwrap();
    assert_eq!(out, br#"{"a":2,"b":1}"#);
}

/// A `Serialize` impl that fails with a message quoting its data.
struct Secret;

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, _serializer: S) -> Result<S::Ok, S::Error> {
        Err(S::Error::custom("password hunter2 is not serializable"))
    }
}

#[test]
fn errors_never_quote_the_value() {
    let err = to_string(&vec![Secret]).unwrap_err();
    assert_eq!(err, JsonError::SerializeFailed);
    assert_eq!(err.code(), "serialize_failed");
    let refusals = [
        err,
        to_string(&BTreeMap::from([("hunter2", Secret)])).unwrap_err(),
        to_string(&Entries(vec![("hunter2", 1), ("hunter2", 2)])).unwrap_err(),
        to_string(&BTreeMap::from([(7_777_777u32, "hunter2")])).unwrap_err(),
        to_string_v2(&BTreeMap::from([("hunter2", 77_777_777_777_777_777u64)])).unwrap_err(),
        to_string_v2(&BTreeMap::from([("hunter2", 0.777)])).unwrap_err(),
    ];
    for err in refusals {
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("hunter2") && !text.contains("777"), "{text}");
        }
    }
}

/// A map that breaks serde's protocol: a key without a value, or a value without a key.
enum Broken {
    KeyTwice,
    ValueAlone,
    KeyLast,
}

impl Serialize for Broken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        match self {
            Broken::KeyTwice => {
                map.serialize_key("a")?;
                map.serialize_key("b")?;
            }
            Broken::ValueAlone => map.serialize_value(&1)?,
            Broken::KeyLast => map.serialize_key("a")?,
        }
        map.end()
    }
}

#[test]
fn a_map_that_breaks_serdes_protocol_is_serialize_failed_not_a_member_lost() {
    for broken in [Broken::KeyTwice, Broken::ValueAlone, Broken::KeyLast] {
        assert_eq!(refusal(&broken), "serialize_failed");
    }
}

/// Everything generated here has no NaN (a `Value` cannot hold one) and `text()` names.
#[derive(Serialize, Debug, Clone)]
struct Generated {
    name: String,
    count: u64,
    small: i16,
    ratio: Option<f64>,
    chars: Vec<char>,
    members: HashMap<String, i64>,
    shape: External,
    #[serde(flatten)]
    inner: Inner2,
}

fn generated() -> impl Strategy<Value = Generated> {
    let shape = prop_oneof![
        Just(External::Unit),
        any::<u8>().prop_map(External::Newtype),
        (any::<u8>(), any::<bool>()).prop_map(|(a, b)| External::Tuple(a, b)),
        (any::<Option<u8>>(), any::<char>()).prop_map(|(z, a)| External::Struct { z, a }),
    ];
    (
        text(),
        // Mostly inside the v2 domain, so both of its outcomes are exercised.
        prop_oneof![1 => any::<u64>(), 3 => 0..=V2_INTEGER_MAX.unsigned_abs()],
        any::<i16>(),
        proptest::option::of(any::<f64>().prop_filter("finite", |f| f.is_finite())),
        proptest::collection::vec(any::<char>(), 0..4),
        proptest::collection::hash_map(
            text(),
            prop_oneof![1 => any::<i64>(), 4 => V2_INTEGER_MIN..=V2_INTEGER_MAX],
            0..6,
        ),
        shape,
        (any::<u8>(), any::<u8>()),
    )
        .prop_map(|(name, count, small, ratio, chars, members, shape, (y, b))| Generated {
            name,
            count,
            small,
            ratio,
            chars,
            members,
            shape,
            inner: Inner2 { y, b },
        })
}

proptest! {
    #[test]
    fn to_string_is_canonicalize_for_every_value(value in value()) {
        prop_assert_eq!(to_string(&value), Ok(canonicalize(&value)));
        prop_assert_eq!(to_vec(&value), Ok(canonicalize(&value).into_bytes()));
    }

    #[test]
    fn to_string_v2_is_canonicalize_exactly_where_check_v2_domain_passes(value in value()) {
        match check_v2_domain(&value) {
            Ok(()) => prop_assert_eq!(to_string_v2(&value), Ok(canonicalize(&value))),
            Err(err) => prop_assert_eq!(to_string_v2(&value).map_err(|e| e.code()), Err(err.code())),
        }
    }

    #[test]
    fn derived_values_serialize_as_their_to_value_canonicalizes(record in generated()) {
        let detour = serde_json::to_value(&record).unwrap();
        prop_assert_eq!(to_string(&record), Ok(canonicalize(&detour)));
        match check_v2_domain(&detour) {
            Ok(()) => prop_assert_eq!(to_string_v2(&record), Ok(canonicalize(&detour))),
            Err(err) => prop_assert_eq!(to_string_v2(&record).map_err(|e| e.code()), Err(err.code())),
        }
    }
}
