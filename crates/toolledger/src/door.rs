//! The one door: where a host's value becomes ledger data, or is refused.
//!
//! The Rust API, Python and the MCP gateway hand a call's arguments to the facade as a
//! host value, whatever tool (built in, declared in a configuration, an upstream's) it
//! names. Here, and nowhere else, that value is held to what the ledger can store and
//! read back: the v2 domain under the store's own bounds (`docs/library.md`, "Arguments: the
//! one door").
//!
//! - A number is judged by its value, not by how a host's serializer wrote it: one whose
//!   value is an integer within ±(2^53 − 1) *is* that integer (`2.0` and `2` are one
//!   intent, with one digest); any other number (a fraction, an integer beyond the
//!   range, whether it came as an integer or a float) is refused.
//! - Nesting is bounded by the store's depth (the arguments object is level 1; 32
//!   levels pass, 33 do not), and the canonical text by its size (65,536 bytes).
//!
//! A refusal names where (a JSON pointer) and which rule (`keyword`), never the value,
//! and comes before anything is written: the call is answered `INPUT_INVALID`.

use serde_json::{Number, Value};
use toolledger_contract::Rejection;
use toolledger_json::{V2_INTEGER_MAX, canonical_str_len};

/// The deepest nesting the ledger holds: the arguments object is level 1.
///
/// ```
/// assert_eq!(toolledger::door::DEPTH_MAX, 32);
/// ```
pub const DEPTH_MAX: usize = 32;
/// The longest canonical text of the arguments the ledger holds, in bytes.
///
/// ```
/// assert_eq!(toolledger::door::SIZE_MAX, 65_536);
/// ```
pub const SIZE_MAX: usize = 65_536;

/// The keyword of a number outside the v2 domain: an integer beyond ±(2^53 − 1).
///
/// ```
/// let refused = toolledger::door::admit(&serde_json::json!({"n": 1e300})).unwrap_err();
/// assert_eq!(refused.keyword, toolledger::door::INTEGER_RANGE);
/// ```
pub const INTEGER_RANGE: &str = "integer_range";
/// The keyword of a number with a fraction.
///
/// ```
/// let refused = toolledger::door::admit(&serde_json::json!({"n": 0.5})).unwrap_err();
/// assert_eq!(refused.keyword, toolledger::door::FRACTION);
/// ```
pub const FRACTION: &str = "fraction";
/// The keyword of a value nested deeper than the ledger stores.
///
/// ```
/// let deep = (0..40).fold(serde_json::json!(1), |inner, _| serde_json::json!([inner]));
/// let refused = toolledger::door::admit(&serde_json::json!({"n": deep})).unwrap_err();
/// assert_eq!(refused.keyword, toolledger::door::DEPTH);
/// ```
pub const DEPTH: &str = "depth";
/// The keyword of a value whose canonical text is longer than the ledger stores.
///
/// ```
/// let long = "x".repeat(toolledger::door::SIZE_MAX);
/// let refused = toolledger::door::admit(&serde_json::json!({"s": long})).unwrap_err();
/// assert_eq!((refused.pointer.as_str(), refused.keyword.as_str()), ("", toolledger::door::SIZE));
/// ```
pub const SIZE: &str = "size";

/// `value` as the ledger holds it (integral floats made integers), or where and why it
/// cannot be held. `value` is the top of a stored column: an object or array at its top
/// is level 1.
///
/// ```
/// use serde_json::json;
/// let held = toolledger::door::admit(&json!({"amount": 2.0, "note": "x"})).unwrap();
/// assert_eq!(toolledger_json::canonicalize(&held), r#"{"amount":2,"note":"x"}"#);
/// let refused = toolledger::door::admit(&json!({"items": [1, 19.99]})).unwrap_err();
/// assert_eq!((refused.pointer.as_str(), refused.keyword.as_str()), ("/items/1", "fraction"));
/// ```
///
/// # Errors
///
/// A [`Rejection`] naming the first value outside the domain (in document order), the
/// level past the depth bound, or the whole value (`""`) when its text is too long.
pub fn admit(value: &Value) -> Result<Value, Rejection> {
    let mut walk = Walk { room: SIZE_MAX, depth_max: DEPTH_MAX };
    let floats = walk.check(value, 0).map_err(Refused::into_rejection)?;
    // Most calls hold no float: their value is held as it is.
    Ok(if floats { integers(value) } else { value.clone() })
}

/// `value`, checked, with each float written as the integer it is.
fn integers(value: &Value) -> Value {
    match value {
        Value::Number(number) if number.is_f64() => {
            #[allow(clippy::cast_possible_truncation, reason = "checked: integral, within ±2^53")]
            let integer = number.as_f64().unwrap_or_default() as i64;
            Value::Number(Number::from(integer))
        }
        Value::Array(items) => Value::Array(items.iter().map(integers).collect()),
        Value::Object(members) => Value::Object(
            members.iter().map(|(name, item)| (name.clone(), integers(item))).collect(),
        ),
        other => other.clone(),
    }
}

/// How far the walk may still go.
struct Walk {
    /// Canonical bytes still allowed.
    room: usize,
    depth_max: usize,
}

/// A refusal on its way out: the path is gathered as the walk unwinds, innermost first.
struct Refused {
    keyword: &'static str,
    path: Vec<Segment>,
}

enum Segment {
    Index(usize),
    Member(String),
}

impl Refused {
    fn at(keyword: &'static str) -> Refused {
        Refused { keyword, path: Vec::new() }
    }

    fn into_rejection(self) -> Rejection {
        let mut pointer = String::new();
        for segment in self.path.iter().rev() {
            pointer.push('/');
            match segment {
                Segment::Index(index) => pointer.push_str(&index.to_string()),
                // RFC 6901: `~` first, so `/` becomes `~1` and not `~01`.
                Segment::Member(name) => {
                    pointer.push_str(&name.replace('~', "~0").replace('/', "~1"));
                }
            }
        }
        Rejection { pointer, keyword: self.keyword.to_owned() }
    }
}

impl Walk {
    /// Takes `len` canonical bytes from the room left, or refuses the whole value.
    fn take(&mut self, len: usize) -> Result<(), Refused> {
        self.room = self.room.checked_sub(len).ok_or_else(|| Refused {
            keyword: SIZE,
            // The size is the whole column's: the pointer names the whole value.
            path: Vec::new(),
        })?;
        Ok(())
    }

    /// Checks `value` at `depth` against every bound, allocating nothing; `true` when it
    /// holds a float (integral, or it would have been refused) that the ledger writes
    /// as its integer.
    fn check(&mut self, value: &Value, depth: usize) -> Result<bool, Refused> {
        match value {
            Value::Null => self.take(4).map(|()| false),
            Value::Bool(flag) => self.take(if *flag { 4 } else { 5 }).map(|()| false),
            Value::String(text) => {
                // The unescaped length is a lower bound: a long string is refused unread.
                if text.len() >= self.room {
                    return Err(Refused::at(SIZE));
                }
                self.take(canonical_str_len(text)).map(|()| false)
            }
            Value::Number(number) => {
                let integer = integer_of(number).map_err(Refused::at)?;
                self.take(decimal_len(integer)).map(|()| number.is_f64())
            }
            Value::Array(items) => {
                let depth = self.deeper(depth)?;
                self.take(2 + items.len().saturating_sub(1))?;
                let mut floats = false;
                for (index, item) in items.iter().enumerate() {
                    floats |= self.check(item, depth).map_err(|mut refused| {
                        if refused.keyword != SIZE {
                            refused.path.push(Segment::Index(index));
                        }
                        refused
                    })?;
                }
                Ok(floats)
            }
            Value::Object(members) => {
                let depth = self.deeper(depth)?;
                self.take(2 + members.len().saturating_sub(1))?;
                let mut floats = false;
                for (name, item) in members {
                    // The name, quoted, and its colon.
                    self.take(canonical_str_len(name) + 1)?;
                    floats |= self.check(item, depth).map_err(|mut refused| {
                        if refused.keyword != SIZE {
                            refused.path.push(Segment::Member(name.clone()));
                        }
                        refused
                    })?;
                }
                Ok(floats)
            }
        }
    }

    /// The level a container at `depth` opens, or a refusal when it is past the bound.
    fn deeper(&self, depth: usize) -> Result<usize, Refused> {
        if depth >= self.depth_max { Err(Refused::at(DEPTH)) } else { Ok(depth + 1) }
    }
}

/// The integer `number` is, when it is one within ±(2^53 − 1) (`-0.0` is 0).
fn integer_of(number: &Number) -> Result<i64, &'static str> {
    let integer = if let Some(signed) = number.as_i64() {
        signed
    } else if number.as_u64().is_some() {
        return Err(INTEGER_RANGE);
    } else {
        let float = number.as_f64().unwrap_or(f64::NAN);
        if !float.is_finite() || float.fract() != 0.0 {
            return Err(if float.is_finite() { FRACTION } else { INTEGER_RANGE });
        }
        if float.abs() > V2_INTEGER_MAX as f64 {
            return Err(INTEGER_RANGE);
        }
        #[allow(clippy::cast_possible_truncation, reason = "integral and within ±2^53")]
        let integer = float as i64;
        integer
    };
    if integer.unsigned_abs() > V2_INTEGER_MAX.unsigned_abs() {
        return Err(INTEGER_RANGE);
    }
    Ok(integer)
}

/// The length of `integer` written in decimal, with its sign.
fn decimal_len(integer: i64) -> usize {
    let sign = usize::from(integer < 0);
    let digits = integer.unsigned_abs().checked_ilog10().map_or(1, |log| log as usize + 1);
    sign + digits
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};
    use toolledger_json::{Limits, canonicalize, is_canonical_v2};

    use super::{DEPTH, DEPTH_MAX, FRACTION, INTEGER_RANGE, SIZE, SIZE_MAX, admit};

    #[test]
    fn the_bounds_are_the_stores() {
        let limits = Limits::default();
        assert_eq!((DEPTH_MAX, SIZE_MAX), (limits.depth_max, limits.size_bytes_max));
    }

    fn refused(value: &Value) -> (String, String) {
        let rejection = admit(value).expect_err("refused");
        (rejection.pointer, rejection.keyword)
    }

    #[test]
    fn integral_floats_are_their_integers_and_other_numbers_are_refused() {
        let held =
            admit(&json!({"a": 2.0, "b": -0.0, "c": 9_007_199_254_740_991.0_f64})).expect("held");
        assert_eq!(canonicalize(&held), r#"{"a":2,"b":0,"c":9007199254740991}"#);
        assert_eq!(held, json!({"a": 2, "b": 0, "c": 9_007_199_254_740_991_i64}));
        let max = 9_007_199_254_740_991_i64;
        for (value, keyword) in [
            (json!(max + 1), INTEGER_RANGE),
            (json!(-max - 1), INTEGER_RANGE),
            (json!(i64::MAX), INTEGER_RANGE),
            (json!(u64::MAX), INTEGER_RANGE),
            (json!(18_446_744_073_709_551_621.0_f64), INTEGER_RANGE),
            (json!(1e300), INTEGER_RANGE),
            (json!(19.99), FRACTION),
            (json!(1.5), FRACTION),
            (json!(-1e-7), FRACTION),
        ] {
            assert_eq!(
                refused(&json!({"n/~": [value]})),
                ("/n~1~0/0".to_owned(), keyword.to_owned())
            );
        }
    }

    #[test]
    fn thirty_two_levels_pass_and_thirty_three_do_not() {
        let nest = |levels: usize| (1..levels).fold(json!({}), |inner, _| json!({"a": inner}));
        assert!(admit(&nest(32)).is_ok());
        let (pointer, keyword) = refused(&nest(33));
        assert_eq!(keyword, DEPTH);
        assert_eq!(pointer, "/a".repeat(32));
    }

    #[test]
    fn the_size_bound_is_the_canonical_texts() {
        let max = Limits::default().size_bytes_max;
        // {"s":"…"} is 8 bytes around the string's contents.
        let fits = json!({"s": "x".repeat(max - 8)});
        assert_eq!(canonicalize(&admit(&fits).expect("held")).len(), max);
        assert_eq!(refused(&json!({"s": "x".repeat(max - 7)})), (String::new(), SIZE.to_owned()));
        // Escapes count as written: each control byte is six.
        let escaped = json!({"s": "\u{1}".repeat((max - 8) / 6 + 1)});
        assert_eq!(refused(&escaped), (String::new(), SIZE.to_owned()));
        assert_eq!(refused(&json!({"s": "x".repeat(10 << 20)})).1, SIZE);
    }

    fn host_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|n| json!(n)),
            (-1_000_i64..1_000).prop_map(|n| json!(n as f64)),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(40, 400, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The door holds exactly what the store reads back: a value is held when its
        /// canonical text passes the store's own check, and is then that text's value.
        #[test]
        fn what_the_door_holds_the_store_reads(value in host_json()) {
            let text = canonicalize(&value);
            match admit(&value) {
                Ok(held) => {
                    prop_assert!(is_canonical_v2(&text, &Limits::default()));
                    prop_assert_eq!(&canonicalize(&held), &text);
                    let read: Value = serde_json::from_str(&text).expect("canonical text");
                    prop_assert_eq!(&read, &held);
                    prop_assert_eq!(admit(&held).ok(), Some(held));
                }
                Err(_) => prop_assert!(!is_canonical_v2(&text, &Limits::default())),
            }
        }
    }
}
