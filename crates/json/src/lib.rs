//! Strict JSON in, canonical JSON out.
//!
//! `toolledger-json` does three things and nothing else:
//!
//! - [`parse_strict`] reads untrusted bytes as exactly RFC 8259 JSON, narrowed the way
//!   I-JSON (RFC 7493) narrows it: UTF-8 without a byte-order mark, no duplicate object
//!   names (compared after unescaping), no lone surrogate escapes, no number that
//!   overflows a double. The size limit is checked before anything else is read and the
//!   nesting limit by a linear scan *before* the recursive decoder runs, so hostile input
//!   (a 100,000-deep array, say) is a clean error and never a stack overflow. The
//!   [`Limits`] default to values meant for untrusted input.
//! - [`canonicalize`] writes a [`serde_json::Value`] in the RFC 8785 (JCS) canonical
//!   form: members sorted by the UTF-16 code units of their names, no whitespace,
//!   minimal string escaping, numbers as ECMAScript's `Number.prototype.toString`.
//! - [`to_string`] (and [`to_vec`], [`to_writer`]) writes any [`serde::Serialize`] value
//!   in that same canonical form, byte for byte what `canonicalize` writes for
//!   `serde_json::to_value(value)`, but refuses what that detour would quietly change:
//!   NaN and infinities (`number_out_of_range`; `to_value` makes them `null`), map keys
//!   that are not strings (`key_not_string`), and a member name produced twice
//!   (`duplicate_key`, which the parser refuses too).
//!
//! [`check_v2_domain`] narrows a value further to what toolledger stores and digests:
//! integers within `±(2^53 - 1)` and no fractions or exponents. [`to_string_v2`] (and
//! [`to_vec_v2`], [`to_writer_v2`]) apply the same narrowing while serializing.
//! [`is_canonical_v2`] answers whether a text already is that canonical v2 form, in one
//! pass over its bytes and without building a value.
//!
//! Errors carry a stable [`JsonError::code`] and, where it applies, a byte offset. They
//! never carry input text or the serialized value's content, so they are safe to log and
//! to show to whoever sent the input.
//!
//! The crate opens no files and holds no state; [`to_writer`] writes only to the writer
//! it is given.
//!
//! ```
//! use toolledger_json::{Limits, canonicalize, parse_strict};
//!
//! let value = parse_strict(br#"{ "b": 1.50, "a": [true, "\u00e9"] }"#, &Limits::default())?;
//! assert_eq!(canonicalize(&value), r#"{"a":[true,"é"],"b":1.5}"#);
//!
//! let err = parse_strict(br#"{"a":1,"\u0061":2}"#, &Limits::default()).unwrap_err();
//! assert_eq!(err.code(), "duplicate_key");
//! assert_eq!(err.offset(), Some(7));
//! # Ok::<(), toolledger_json::JsonError>(())
//! ```
//!
//! Serializing Rust values directly:
//!
//! ```
//! use serde::Serialize;
//! use toolledger_json::{to_string, to_string_v2};
//!
//! #[derive(Serialize)]
//! struct Reading {
//!     sensor: &'static str,
//!     celsius: f64,
//!     tags: Vec<char>,
//! }
//!
//! let reading = Reading { sensor: "t1", celsius: 21.50, tags: vec!['a'] };
//! assert_eq!(to_string(&reading)?, r#"{"celsius":21.5,"sensor":"t1","tags":["a"]}"#);
//!
//! // JSON has no NaN: refused, where `serde_json::to_value` would have written `null`.
//! let broken = Reading { celsius: f64::NAN, ..reading };
//! assert_eq!(to_string(&broken).unwrap_err().code(), "number_out_of_range");
//!
//! // The v2 domain holds integers only.
//! assert_eq!(to_string_v2(&[1, 2, 3])?, "[1,2,3]");
//! assert_eq!(to_string_v2(&21.5).unwrap_err().code(), "outside_v2_domain");
//! assert_eq!(to_string_v2(&(1u64 << 53)).unwrap_err().code(), "outside_v2_domain");
//! # Ok::<(), toolledger_json::JsonError>(())
//! ```
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod canon;
mod check;
mod domain;
mod error;
mod number;
mod parse;
mod ser;

pub use crate::{
    canon::{canonical_str_len, canonicalize, canonicalize_into, canonicalize_str_into},
    check::is_canonical_v2,
    domain::{V2_INTEGER_MAX, V2_INTEGER_MIN, check_v2_domain},
    error::JsonError,
    parse::{Limits, parse_strict},
    ser::{to_string, to_string_v2, to_vec, to_vec_v2, to_writer, to_writer_v2},
};
