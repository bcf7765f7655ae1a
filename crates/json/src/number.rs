//! Numbers as ECMAScript's `Number.prototype.toString` writes them (ECMA-262 §6.1.6.1.20),
//! which RFC 8785 §3.2.2.3 requires.

use std::fmt::Write as _;

use serde_json::Number;

/// Integers up to this magnitude are exact doubles, so their decimal digits are their
/// ECMAScript form and need no float formatting.
const EXACT_INTEGER_MAX: u64 = 1 << 53;

pub(crate) fn write_number(number: &Number, out: &mut String) {
    if let Some(unsigned) = number.as_u64() {
        write_integer(false, u128::from(unsigned), out);
    } else if let Some(signed) = number.as_i64() {
        write_integer(signed < 0, u128::from(signed.unsigned_abs()), out);
    } else {
        write_f64(number.as_f64().unwrap_or(f64::NAN), out);
    }
}

/// Writes the integer `±magnitude` as RFC 8785 writes a number: its decimal digits when a
/// double holds it exactly, else the ECMAScript form of the nearest double (as ECMAScript
/// itself would read and write it). Any width fits: `u128::MAX` is a finite double.
pub(crate) fn write_integer(negative: bool, magnitude: u128, out: &mut String) {
    match u64::try_from(magnitude) {
        Ok(exact) if exact <= EXACT_INTEGER_MAX => {
            if negative && exact != 0 {
                out.push('-');
            }
            write_u64(exact, out);
        }
        // `as` rounds to nearest, ties to even, as reading the digits as a double would.
        _ => {
            let double = magnitude as f64;
            write_f64(if negative { -double } else { double }, out);
        }
    }
}

fn write_u64(mut value: u64, out: &mut String) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        start -= 1;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    for &digit in digits.iter().skip(start) {
        out.push(char::from(digit));
    }
}

/// Writes a finite double in ECMAScript form. `-0` is written `0`.
pub(crate) fn write_f64(value: f64, out: &mut String) {
    if value == 0.0 {
        out.push('0');
        return;
    }
    if !value.is_finite() {
        // serde_json's `Number` cannot hold these; ECMAScript would say this.
        out.push_str(if value.is_nan() {
            "NaN"
        } else if value > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        });
        return;
    }
    if value < 0.0 {
        out.push('-');
    }
    let scientific = shortest_scientific(value.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = digits.len() as i32;
    let n = exponent + 1;

    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        let (whole, fraction) = digits.split_at(n as usize);
        out.push_str(whole);
        out.push('.');
        out.push_str(fraction);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let shown = n - 1;
        let _ = write!(out, "e{}{}", if shown < 0 { '-' } else { '+' }, shown.unsigned_abs());
    }
}

/// The `s`, `k` and `n` of ECMA-262's algorithm, as Rust's `{:e}` spelling: the fewest
/// significant digits that read back as `value`, and among those the nearest to it, with
/// an exact tie going to the even digit string.
///
/// Rust's shortest `{:e}` settles ties the other way, so the shortest length is taken
/// from it and the digits from exact formatting at that length (which rounds half to
/// even), kept only when they still read back as `value`. RFC 8785 Appendix B's
/// `1424953923781206.2` (`43143ff3c1cb0959`, exactly `…206.25`) is such a tie.
fn shortest_scientific(value: f64) -> String {
    let mut shortest = String::with_capacity(32);
    let _ = write!(shortest, "{value:e}");
    let significant =
        shortest.split('e').next().unwrap_or_default().bytes().filter(u8::is_ascii_digit).count();
    if significant > 1 {
        let mut nearest = String::with_capacity(32);
        let _ = write!(nearest, "{:.*e}", significant - 1, value);
        if nearest != shortest && nearest.parse::<f64>().is_ok_and(|back| back == value) {
            return nearest;
        }
    }
    shortest
}
