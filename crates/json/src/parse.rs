//! The strict parser.
//!
//! Three passes, cheapest first, so hostile input is refused before it costs much:
//! the size check, UTF-8 validation of the whole input, and a linear depth scan that
//! knows about strings and escapes. Only then does the recursive-descent decoder run,
//! and by then its recursion is bounded by [`Limits::depth_max`].

use serde_json::{Map, Number, Value};

use crate::JsonError;

/// Bounds on what [`parse_strict`] will read.
///
/// The defaults, 65,536 bytes and depth 32, are meant for untrusted input: toolledger
/// reads case files, claims and stored rows with them. Nothing in this crate raises them;
/// raising one is the caller's decision, for input it has reason to trust that far. Change one limit with struct-update syntax, so every
/// other keeps its default:
///
/// ```
/// use toolledger_json::Limits;
///
/// let limits = Limits { size_bytes_max: 1 << 20, ..Limits::default() };
/// assert_eq!(limits.depth_max, Limits::default().depth_max);
/// ```
///
/// `depth_max` also bounds the decoder's recursion: each level costs a few hundred bytes
/// of stack, so keep it in the hundreds, not the hundreds of thousands.
///
/// The serializer ([`to_string`](crate::to_string) and its siblings) takes no limits: it
/// writes trusted Rust values, and what it writes may be larger or deeper than a reader
/// with the default limits accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest input accepted, in bytes. Inputs of exactly this length pass.
    pub size_bytes_max: usize,
    /// The deepest nesting accepted. The outermost array or object is depth 1 and a
    /// scalar document has depth 0, so `depth_max = 32` accepts 32 nested arrays and
    /// refuses 33.
    pub depth_max: usize,
}

impl Default for Limits {
    /// 65,536 bytes and depth 32: the limits for untrusted input.
    fn default() -> Limits {
        Limits { size_bytes_max: 65_536, depth_max: 32 }
    }
}

/// Parses `input` as one strict JSON document.
///
/// Accepts exactly RFC 8259 JSON text, minus what I-JSON (RFC 7493) forbids:
///
/// - the input must be UTF-8, with no byte-order mark;
/// - object member names must be unique after unescaping (`"a"` and `"\u0061"` clash);
/// - `\u` escapes must not leave a lone UTF-16 surrogate;
/// - numbers must fit a finite double, and a non-zero literal must not round to zero.
///
/// Integers that fit `i64`/`u64` are kept exactly; other numbers become doubles,
/// rounded to nearest. The input's length is checked first and its depth by a linear
/// scan before any recursive decoding, so over-long or over-deep input costs one pass.
///
/// # Errors
///
/// A [`JsonError`] naming the first failure found, with its byte offset.
pub fn parse_strict(input: &[u8], limits: &Limits) -> Result<Value, JsonError> {
    if input.len() > limits.size_bytes_max {
        return Err(JsonError::TooLarge {
            size_bytes: input.len(),
            size_bytes_max: limits.size_bytes_max,
        });
    }
    let text = std::str::from_utf8(input)
        .map_err(|err| JsonError::InvalidUtf8 { offset: err.valid_up_to() })?;
    check_depth(input, limits.depth_max)?;

    let mut parser = Parser { text, bytes: input, pos: 0 };
    parser.skip_whitespace();
    let value = parser.value()?;
    parser.skip_whitespace();
    if parser.pos != input.len() {
        return Err(parser.syntax("trailing characters after the document"));
    }
    Ok(value)
}

/// Refuses input whose brackets nest deeper than `depth_max`, in one pass and no
/// recursion. Brackets inside strings do not count; mismatched brackets are left for the
/// decoder to report.
fn check_depth(input: &[u8], depth_max: usize) -> Result<(), JsonError> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &byte) in input.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > depth_max {
                    return Err(JsonError::TooDeep { offset, depth_max });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

struct Parser<'a> {
    /// The whole input, known to be UTF-8.
    text: &'a str,
    /// The same input as bytes.
    bytes: &'a [u8],
    /// The next byte to read. Invariant: always on a `char` boundary of `text` between
    /// tokens, because every token boundary is an ASCII byte.
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn syntax(&self, reason: &'static str) -> JsonError {
        JsonError::Syntax { offset: self.pos, reason }
    }

    fn slice(&self, start: usize, end: usize) -> Result<&'a str, JsonError> {
        // Both ends sit on ASCII bytes (quotes, backslashes, number characters), so the
        // slice is always on char boundaries; `get` keeps that a checked claim.
        self.text
            .get(start..end)
            .ok_or(JsonError::Syntax { offset: start, reason: "token not on a character boundary" })
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn value(&mut self) -> Result<Value, JsonError> {
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.literal(b"true", Value::Bool(true)),
            Some(b'f') => self.literal(b"false", Value::Bool(false)),
            Some(b'n') => self.literal(b"null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.syntax("expected a value")),
            None => Err(self.syntax("unexpected end of input")),
        }
    }

    fn literal(&mut self, word: &'static [u8], value: Value) -> Result<Value, JsonError> {
        if self.bytes.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.syntax("invalid literal"))
        }
    }

    fn array(&mut self) -> Result<Value, JsonError> {
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value()?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_whitespace();
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                Some(_) => return Err(self.syntax("expected ',' or ']'")),
                None => return Err(self.syntax("unexpected end of input")),
            }
        }
    }

    fn object(&mut self) -> Result<Value, JsonError> {
        self.pos += 1; // '{'
        let mut members = Map::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.syntax("expected a member name"));
            }
            let name_offset = self.pos;
            let name = self.string()?;
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.syntax("expected ':'"));
            }
            self.pos += 1;
            self.skip_whitespace();
            let value = self.value()?;
            if members.insert(name, value).is_some() {
                return Err(JsonError::DuplicateKey { offset: name_offset });
            }
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_whitespace();
                }
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                Some(_) => return Err(self.syntax("expected ',' or '}'")),
                None => return Err(self.syntax("unexpected end of input")),
            }
        }
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // '"'
        let start = self.pos;
        // Fast path: most strings have no escapes and are copied in one piece.
        loop {
            match self.peek() {
                Some(b'"') => {
                    let text = self.slice(start, self.pos)?;
                    self.pos += 1;
                    return Ok(text.to_owned());
                }
                Some(b'\\') => break,
                Some(0x00..=0x1f) => return Err(self.syntax("control character in string")),
                Some(_) => self.pos += 1,
                None => return Err(self.syntax("unterminated string")),
            }
        }
        let mut out = String::with_capacity(self.pos - start + 16);
        out.push_str(self.slice(start, self.pos)?);
        loop {
            let run = self.pos;
            while let Some(byte) = self.peek() {
                if byte == b'"' || byte == b'\\' || byte < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(self.slice(run, self.pos)?);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => self.escape(&mut out)?,
                Some(_) => return Err(self.syntax("control character in string")),
                None => return Err(self.syntax("unterminated string")),
            }
        }
    }

    /// Decodes one escape sequence at `self.pos` (a backslash) onto `out`.
    fn escape(&mut self, out: &mut String) -> Result<(), JsonError> {
        let backslash = self.pos;
        self.pos += 1;
        let decoded = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                let unit = self.hex4()?;
                let code_point = match unit {
                    0xD800..=0xDBFF => {
                        let low = if self.bytes.get(self.pos..self.pos + 2) == Some(b"\\u") {
                            self.pos += 2;
                            self.hex4()?
                        } else {
                            return Err(JsonError::LoneSurrogate { offset: backslash });
                        };
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(JsonError::LoneSurrogate { offset: backslash });
                        }
                        0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return Err(JsonError::LoneSurrogate { offset: backslash }),
                    _ => u32::from(unit),
                };
                // Every value reaching here is a scalar value: surrogates were handled above.
                let ch = char::from_u32(code_point)
                    .ok_or(JsonError::LoneSurrogate { offset: backslash })?;
                out.push(ch);
                return Ok(());
            }
            Some(_) => return Err(self.syntax("invalid escape")),
            None => return Err(self.syntax("unterminated string")),
        };
        self.pos += 1;
        out.push(decoded);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u16, JsonError> {
        let mut unit = 0u16;
        for _ in 0..4 {
            let digit = match self.peek() {
                Some(byte @ b'0'..=b'9') => byte - b'0',
                Some(byte @ b'a'..=b'f') => byte - b'a' + 10,
                Some(byte @ b'A'..=b'F') => byte - b'A' + 10,
                _ => return Err(self.syntax("invalid \\u escape")),
            };
            unit = (unit << 4) | u16::from(digit);
            self.pos += 1;
        }
        Ok(unit)
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.syntax("invalid number")),
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            integral = false;
            if self.digits() == 0 {
                return Err(self.syntax("invalid number"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            integral = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.syntax("invalid number"));
            }
        }
        let text = self.slice(start, self.pos)?;
        if integral {
            let exact = if negative {
                text.parse::<i64>().ok().map(Number::from)
            } else {
                text.parse::<u64>().ok().map(Number::from)
            };
            if let Some(number) = exact {
                return Ok(Value::Number(number));
            }
        }
        let out_of_range = JsonError::NumberOutOfRange { offset: start };
        let double: f64 = text.parse().map_err(|_| out_of_range.clone())?;
        // Underflow is refused like overflow: a literal such as `1e-999` would silently
        // become 0 and two different documents would canonicalize alike.
        if double == 0.0 && has_nonzero_mantissa(text) {
            return Err(out_of_range);
        }
        Number::from_f64(double).map(Value::Number).ok_or(out_of_range)
    }
}

/// Whether a number literal's digits before the exponent include a non-zero one.
fn has_nonzero_mantissa(literal: &str) -> bool {
    literal
        .bytes()
        .take_while(|byte| !matches!(byte, b'e' | b'E'))
        .any(|byte| matches!(byte, b'1'..=b'9'))
}
