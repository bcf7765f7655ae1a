//! RFC 8785 (JCS) serialization.

use std::cmp::Ordering;

use serde_json::{Map, Value};

use crate::number::write_number;

/// Writes `value` in its RFC 8785 canonical form.
///
/// Object members are sorted by the UTF-16 code units of their names, there is no
/// whitespace, strings escape only `"`, `\` and control characters (with the short forms
/// `\b \t \n \f \r` and lowercase `\u00xx` otherwise), and numbers are written as
/// ECMAScript's `Number.prototype.toString` writes the nearest double.
///
/// The output does not depend on the order of `value`'s object members, so it is the
/// same whether or not serde_json's `preserve_order` feature is on.
///
/// Recursion follows the value's nesting: values from [`parse_strict`](crate::parse_strict)
/// are bounded by its depth limit; a value built by hand thousands of levels deep is the
/// caller's to bound.
pub fn canonicalize(value: &Value) -> String {
    let mut out = String::new();
    canonicalize_into(value, &mut out);
    out
}

/// Like [`canonicalize`], appending to `out` so a caller can reuse one buffer.
pub fn canonicalize_into(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(number, out),
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                canonicalize_into(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => write_object(members, out),
    }
}

fn write_object(members: &Map<String, Value>, out: &mut String) {
    out.push('{');
    // serde_json's default map is already sorted by UTF-8 bytes, which agrees with UTF-16
    // order unless names mix U+E000..U+FFFF with supplementary characters; check before
    // paying for a sort.
    let in_order =
        members.keys().zip(members.keys().skip(1)).all(|(a, b)| utf16_cmp(a, b) == Ordering::Less);
    if in_order {
        write_members(members.iter(), out);
    } else {
        let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
        sorted.sort_unstable_by(|a, b| utf16_cmp(a.0, b.0));
        write_members(sorted.into_iter(), out);
    }
    out.push('}');
}

fn write_members<'a>(members: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut String) {
    for (index, (name, value)) in members.enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_string(name, out);
        out.push(':');
        canonicalize_into(value, out);
    }
}

/// Compares two strings by their UTF-16 code units, as RFC 8785 §3.2.3 sorts names.
///
/// UTF-8 byte order is code point order, and UTF-16 order differs from it in one case
/// only: a supplementary character (UTF-8 lead byte `F0..F4`, UTF-16 high surrogate
/// `D800..DBFF`) sorts *before* a character in `U+E000..U+FFFF` (lead byte `EE`/`EF`).
/// At the first differing byte, that is the one case to flip.
pub(crate) fn utf16_cmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    match a.iter().zip(b).find(|(x, y)| x != y) {
        None => a.len().cmp(&b.len()),
        Some((&x, &y)) => {
            let supplementary = |byte: u8| (0xF0..=0xF4).contains(&byte);
            let high_bmp = |byte: u8| (0xEE..=0xEF).contains(&byte);
            if (supplementary(x) && high_bmp(y)) || (high_bmp(x) && supplementary(y)) {
                y.cmp(&x)
            } else {
                x.cmp(&y)
            }
        }
    }
}

/// Whether any byte is `"`, `\` or below 0x20, eight bytes at a time.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `word` is zero: the classic has-zero-byte test.
    let has_zero = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS != 0;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut lanes = [0u8; 8];
        lanes.copy_from_slice(chunk);
        let word = u64::from_le_bytes(lanes);
        // Below 0x20: subtracting 0x20 borrows into the high bit of a byte that had none.
        let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS != 0;
        if control
            || has_zero(word ^ (ONES * u64::from(b'"')))
            || has_zero(word ^ (ONES * u64::from(b'\\')))
        {
            return true;
        }
    }
    chunks.remainder().iter().any(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\')
}

/// Appends `text` as an RFC 8785 JSON string (quotes included) to `out`: the same bytes
/// [`canonicalize`] writes for a string value, without building one.
pub fn canonicalize_str_into(text: &str, out: &mut String) {
    write_string(text, out);
}

/// The length in bytes of `text` written as an RFC 8785 JSON string, quotes included:
/// what [`canonicalize_str_into`] would append, counted without writing it.
///
/// ```
/// assert_eq!(toolledger_json::canonical_str_len("a\"b\u{1}"), 2 + 1 + 2 + 1 + 6);
/// ```
#[must_use]
pub fn canonical_str_len(text: &str) -> usize {
    let bytes = text.as_bytes();
    if !needs_escape(bytes) {
        return bytes.len() + 2;
    }
    bytes.iter().fold(2, |len, &byte| {
        len + match byte {
            b'"' | b'\\' | 0x08 | 0x09 | 0x0A | 0x0C | 0x0D => 2,
            0x00..=0x1F => 6,
            _ => 1,
        }
    })
}

/// Appends `text` as an RFC 8785 JSON string, quotes included.
pub(crate) fn write_string(text: &str, out: &mut String) {
    // Most strings need no escape: one scan, one copy.
    if !needs_escape(text.as_bytes()) {
        out.reserve(text.len() + 2);
        out.push('"');
        out.push_str(text);
        out.push('"');
        return;
    }
    out.push('"');
    let mut run = 0;
    for (index, byte) in text.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0A => "\\n",
            0x0C => "\\f",
            0x0D => "\\r",
            0x00..=0x1F => "",
            _ => continue,
        };
        // `index` is an ASCII byte, so both ends of the run are char boundaries.
        out.push_str(text.get(run..index).unwrap_or_default());
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX.get(usize::from(byte >> 4)).copied().unwrap_or(b'0')));
            out.push(char::from(HEX.get(usize::from(byte & 0xF)).copied().unwrap_or(b'0')));
        } else {
            out.push_str(escape);
        }
        run = index + 1;
    }
    out.push_str(text.get(run..).unwrap_or_default());
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::utf16_cmp;
    use std::cmp::Ordering;

    #[test]
    fn needs_escape_agrees_with_a_byte_by_byte_scan() {
        let interesting =
            [b'a', b'"', b'\\', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xff, 0x21, 0x5c ^ 0x80, 0x22 ^ 0x80];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for length in 0..40 {
            for _ in 0..200 {
                let bytes: Vec<u8> = (0..length)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        interesting[(state % interesting.len() as u64) as usize]
                    })
                    .collect();
                let expected =
                    bytes.iter().any(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\');
                assert_eq!(super::needs_escape(&bytes), expected, "{bytes:?}");
            }
        }
    }

    #[test]
    fn utf16_order_matches_encode_utf16() {
        let samples = [
            "",
            "a",
            "ab",
            "b",
            "\u{7f}",
            "\u{80}",
            "\u{d7ff}",
            "\u{e000}",
            "\u{ffff}",
            "\u{10000}",
            "\u{1f600}",
            "\u{10ffff}",
            "a\u{e000}",
            "a\u{1f600}",
        ];
        for a in samples {
            for b in samples {
                let expected = a.encode_utf16().cmp(b.encode_utf16());
                assert_eq!(utf16_cmp(a, b), expected, "{a:?} vs {b:?}");
            }
        }
        assert_eq!(utf16_cmp("\u{1f600}", "\u{e000}"), Ordering::Less);
    }
}
