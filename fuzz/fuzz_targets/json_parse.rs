//! `parse_strict` against serde_json, and `canonicalize`'s round trip.
//!
//! For any input `parse_strict` accepts:
//!
//! - serde_json accepts it too and reads the same value: the same structure, the same
//!   strings, integers equal exactly and doubles equal bit for bit (serde_json is built
//!   with `float_roundtrip`, so its doubles are correctly rounded too). The one spelling
//!   the two read differently is `-0`: an integer zero here, a negative-zero double there.
//! - its canonical form reparses with `parse_strict` to the same value, numbers compared
//!   as the doubles RFC 8785 writes (an integer beyond 2^53 is written as its double),
//!   and canonicalizing that again gives the same bytes.
//!
//! serde_json accepts more (duplicate names, lone surrogate escapes, overflowing
//! numbers), so inputs `parse_strict` refuses are not compared.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Number, Value};
use toolledger_json::{Limits, canonicalize, parse_strict};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let Ok(ours) = parse_strict(data, &limits) else {
        return;
    };
    let theirs: Value = match serde_json::from_slice(data) {
        Ok(theirs) => theirs,
        Err(err) => panic!("parse_strict accepted what serde_json refuses: {err}"),
    };
    assert!(same(&ours, &theirs, &exactly), "parse_strict and serde_json read different values");

    let canonical = canonicalize(&ours);
    // The canonical form may be longer than the input (`1e300` is written `1e+300`).
    let roomy = Limits { size_bytes_max: usize::MAX, ..limits };
    let reparsed = match parse_strict(canonical.as_bytes(), &roomy) {
        Ok(reparsed) => reparsed,
        Err(err) => panic!("the canonical form does not reparse: {}", err.code()),
    };
    assert!(same(&reparsed, &ours, &as_doubles), "the canonical form reads as another value");
    assert_eq!(canonicalize(&reparsed), canonical, "canonicalizing twice differs");
});

/// The same structure, member names and strings, with numbers compared by `numbers`.
fn same(a: &Value, b: &Value, numbers: &dyn Fn(&Number, &Number) -> bool) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::String(a), Value::String(b)) => a == b,
        (Value::Number(a), Value::Number(b)) => numbers(a, b),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b, numbers))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter().all(|(name, a)| b.get(name).is_some_and(|b| same(a, b, numbers)))
        }
        _ => false,
    }
}

fn integer(number: &Number) -> Option<i128> {
    number.as_i64().map(i128::from).or_else(|| number.as_u64().map(i128::from))
}

/// Integers exactly, doubles bit for bit; an integer and a double only when both are
/// zero (`-0`, see the module doc).
fn exactly(a: &Number, b: &Number) -> bool {
    match (integer(a), integer(b)) {
        (Some(a), Some(b)) => a == b,
        (None, None) => a.as_f64().map(f64::to_bits) == b.as_f64().map(f64::to_bits),
        _ => a.as_f64() == Some(0.0) && b.as_f64() == Some(0.0),
    }
}

/// As the doubles they are nearest to; `-0` equals `0`, as RFC 8785 writes both `0`.
fn as_doubles(a: &Number, b: &Number) -> bool {
    matches!((a.as_f64(), b.as_f64()), (Some(a), Some(b)) if a == b)
}
