//! The v2 value domain: what toolledger may store or digest.

use serde_json::Value;

use crate::JsonError;

/// The largest integer in the v2 domain, `2^53 - 1`: the last one every JSON
/// implementation that reads numbers as doubles still holds exactly.
pub const V2_INTEGER_MAX: i64 = (1 << 53) - 1;
/// The smallest integer in the v2 domain, `-(2^53 - 1)`.
pub const V2_INTEGER_MIN: i64 = -V2_INTEGER_MAX;

/// Why a float is outside the v2 domain, however it was written.
pub(crate) const NOT_AN_INTEGER: &str = "number with a fraction or an exponent";

/// Refuses an integer of magnitude `magnitude` (of either sign) if it lies outside
/// `[V2_INTEGER_MIN, V2_INTEGER_MAX]`. The range is symmetric, so the sign does not matter.
pub(crate) fn check_v2_integer(magnitude: u128) -> Result<(), JsonError> {
    if magnitude <= V2_INTEGER_MAX.unsigned_abs().into() {
        Ok(())
    } else {
        Err(JsonError::OutsideV2Domain { reason: "integer beyond 2^53 - 1 in magnitude" })
    }
}

/// Checks that `value` lies in the v2 domain: null, booleans, strings, arrays, objects,
/// and integers in `[V2_INTEGER_MIN, V2_INTEGER_MAX]`. Numbers written with a fraction
/// or an exponent (`2599.0`, `1e3`) are outside it, even when integral, because two
/// spellings of one value must not reach a digest. `-0` parses as the integer 0.
///
/// The walk uses an explicit stack, so any value can be checked, however deep.
///
/// # Errors
///
/// [`JsonError::OutsideV2Domain`] at the first number outside the domain.
pub fn check_v2_domain(value: &Value) -> Result<(), JsonError> {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Value::Null | Value::Bool(_) | Value::String(_) => {}
            Value::Number(number) => {
                if let Some(unsigned) = number.as_u64() {
                    check_v2_integer(u128::from(unsigned))?;
                } else if let Some(signed) = number.as_i64() {
                    check_v2_integer(u128::from(signed.unsigned_abs()))?;
                } else {
                    return Err(JsonError::OutsideV2Domain { reason: NOT_AN_INTEGER });
                }
            }
            Value::Array(items) => pending.extend(items),
            Value::Object(members) => pending.extend(members.values()),
        }
    }
    Ok(())
}
