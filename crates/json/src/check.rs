//! Whether a text is already canonical v2 JSON, read once and nothing built.
//!
//! A stored column is canonical JSON in the v2 domain or it is refused. Proving that by
//! parsing it into a tree, writing the tree back and comparing the bytes allocates every
//! string, array and map of the document twice. The canonical form is narrow enough to
//! recognise directly: no whitespace, integers only and in one spelling, strings with one
//! escape per character that needs one, object names in strictly increasing UTF-16 order.
//! [`is_canonical_v2`] accepts exactly the texts that [`parse_strict`](crate::parse_strict),
//! [`check_v2_domain`](crate::check_v2_domain) and [`canonicalize`](crate::canonicalize)
//! together would accept and write back unchanged; the tests hold the two to the same
//! answer.

use std::cmp::Ordering;

use crate::{Limits, canon::utf16_cmp, domain::V2_INTEGER_MAX};

/// Whether `text` is, byte for byte, the RFC 8785 canonical form of a JSON value in the
/// v2 domain that `limits` admit.
///
/// ```
/// use toolledger_json::{Limits, is_canonical_v2};
///
/// let limits = Limits::default();
/// assert!(is_canonical_v2(r#"{"a":[1,"\n"],"b":null}"#, &limits));
/// assert!(!is_canonical_v2(r#"{"b":null,"a":1}"#, &limits)); // names out of order
/// assert!(!is_canonical_v2(r#"{"a": 1}"#, &limits)); // whitespace
/// assert!(!is_canonical_v2("1.0", &limits)); // outside the v2 domain
/// assert!(!is_canonical_v2(r#""\u0041""#, &limits)); // an escape canonical form does not use
/// ```
pub fn is_canonical_v2(text: &str, limits: &Limits) -> bool {
    if text.len() > limits.size_bytes_max {
        return false;
    }
    let mut reader = Reader { text, bytes: text.as_bytes(), pos: 0, depth_max: limits.depth_max };
    reader.value(0) && reader.pos == text.len()
}

struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    depth_max: usize,
}

/// A string token's place in the text, its quotes excluded.
#[derive(Clone, Copy)]
struct Name {
    start: usize,
    end: usize,
    escaped: bool,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let here = self.peek() == Some(byte);
        self.pos += usize::from(here);
        here
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let here = self.bytes.get(self.pos..self.pos + word.len()) == Some(word);
        self.pos += if here { word.len() } else { 0 };
        here
    }

    /// One value at nesting `depth` (its container's), recursion bounded by `depth_max`.
    fn value(&mut self, depth: usize) -> bool {
        match self.peek() {
            Some(b'n') => self.literal(b"null"),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'"') => self.string().is_some(),
            Some(b'-' | b'0'..=b'9') => self.integer(),
            Some(b'[') => depth < self.depth_max && self.array(depth + 1),
            Some(b'{') => depth < self.depth_max && self.object(depth + 1),
            _ => false,
        }
    }

    fn array(&mut self, depth: usize) -> bool {
        self.pos += 1;
        if self.eat(b']') {
            return true;
        }
        loop {
            if !self.value(depth) {
                return false;
            }
            if self.eat(b']') {
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }

    fn object(&mut self, depth: usize) -> bool {
        self.pos += 1;
        if self.eat(b'}') {
            return true;
        }
        let mut previous: Option<Name> = None;
        loop {
            let Some(name) = self.string() else { return false };
            if let Some(previous) = previous
                && self.order(previous, name) != Ordering::Less
            {
                return false;
            }
            previous = Some(name);
            if !self.eat(b':') || !self.value(depth) {
                return false;
            }
            if self.eat(b'}') {
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }

    /// The order of two names by the UTF-16 code units of what they say, unescaped.
    fn order(&self, a: Name, b: Name) -> Ordering {
        let raw = |name: Name| self.text.get(name.start..name.end).unwrap_or_default();
        if !a.escaped && !b.escaped {
            return utf16_cmp(raw(a), raw(b));
        }
        utf16_cmp(&unescape(raw(a)), &unescape(raw(b)))
    }

    /// A string in canonical form: every byte below 0x20, `"` and `\` escaped, each in
    /// the one spelling RFC 8785 writes, and nothing else escaped.
    fn string(&mut self) -> Option<Name> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.pos;
        let mut escaped = false;
        loop {
            let byte = self.peek()?;
            self.pos += 1;
            match byte {
                b'"' => return Some(Name { start, end: self.pos - 1, escaped }),
                0x00..=0x1F => return None,
                b'\\' => {
                    escaped = true;
                    let short = self.peek()?;
                    self.pos += 1;
                    match short {
                        b'"' | b'\\' | b'b' | b't' | b'n' | b'f' | b'r' => {}
                        b'u' => {
                            let hex = self.bytes.get(self.pos..self.pos + 4)?;
                            self.pos += 4;
                            let [b'0', b'0', high, low] = *hex else { return None };
                            let digit = |byte: u8| match byte {
                                b'0'..=b'9' => Some(byte - b'0'),
                                b'a'..=b'f' => Some(byte - b'a' + 10),
                                _ => None,
                            };
                            let code = digit(high)? * 16 + digit(low)?;
                            // Only controls without a short form are written as `\u00xx`.
                            if code >= 0x20 || matches!(code, 0x08 | 0x09 | 0x0A | 0x0C | 0x0D) {
                                return None;
                            }
                        }
                        _ => return None,
                    }
                }
                _ => {}
            }
        }
    }

    /// An integer in `±(2^53 - 1)`, written without a sign on zero, a leading zero, a
    /// fraction or an exponent.
    fn integer(&mut self) -> bool {
        let negative = self.eat(b'-');
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        let digits = self.bytes.get(start..self.pos).unwrap_or_default();
        let well_formed = match digits {
            [] => false,
            [b'0'] => !negative,
            [b'0', ..] => false,
            // 16 digits hold 2^53 - 1; more are out of the domain, and parse them no further.
            _ => digits.len() <= 16,
        };
        if !well_formed {
            return false;
        }
        let magnitude =
            digits.iter().fold(0i64, |total, &digit| total * 10 + i64::from(digit - b'0'));
        // A fraction or an exponent right after is a different number, outside the domain.
        magnitude <= V2_INTEGER_MAX && !matches!(self.peek(), Some(b'.' | b'e' | b'E'))
    }
}

/// A canonical string's body unescaped; only names that carry an escape come here.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(char) = chars.next() {
        if char != '\\' {
            out.push(char);
            continue;
        }
        match chars.next() {
            Some('b') => out.push('\u{8}'),
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('f') => out.push('\u{c}'),
            Some('r') => out.push('\r'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                out.push(code.unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}
