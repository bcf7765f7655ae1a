//! The one error type of the crate.

/// Why input was refused, or why a Rust value could not be written.
///
/// Every variant has a stable [`code`](JsonError::code) and, where the failure has a
/// place in the input, a byte [`offset`](JsonError::offset). Messages describe the
/// failure in fixed words and never quote the input or the value.
///
/// The serializer ([`to_string`](crate::to_string) and its siblings) refuses what the
/// parser refuses with the same codes, through variants of its own that have no offset,
/// since it reads no input: [`NonFiniteFloat`](JsonError::NonFiniteFloat) is
/// `number_out_of_range` and [`DuplicateMapKey`](JsonError::DuplicateMapKey) is
/// `duplicate_key`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    /// The input is longer than [`Limits::size_bytes_max`](crate::Limits::size_bytes_max).
    #[error("input is {size_bytes} bytes, over the limit of {size_bytes_max}")]
    TooLarge {
        /// Length of the input.
        size_bytes: usize,
        /// The limit it broke.
        size_bytes_max: usize,
    },
    /// Containers nest deeper than [`Limits::depth_max`](crate::Limits::depth_max).
    #[error("nesting deeper than {depth_max} at byte {offset}")]
    TooDeep {
        /// Offset of the bracket that opened one container too many.
        offset: usize,
        /// The limit it broke.
        depth_max: usize,
    },
    /// The input is not UTF-8 (or not all of it is).
    #[error("invalid UTF-8 at byte {offset}")]
    InvalidUtf8 {
        /// Offset of the first byte that is not part of a valid UTF-8 sequence.
        offset: usize,
    },
    /// An object has two members whose names are equal after unescaping.
    #[error("duplicate object member name at byte {offset}")]
    DuplicateKey {
        /// Offset of the second occurrence's opening quote.
        offset: usize,
    },
    /// A `\uD800`–`\uDFFF` escape that is not half of a valid surrogate pair.
    #[error("lone surrogate escape at byte {offset}")]
    LoneSurrogate {
        /// Offset of the backslash that starts the escape.
        offset: usize,
    },
    /// A number whose magnitude does not fit a finite IEEE 754 double.
    #[error("number out of range at byte {offset}")]
    NumberOutOfRange {
        /// Offset of the number's first byte.
        offset: usize,
    },
    /// Anything else RFC 8259 does not allow.
    #[error("syntax error at byte {offset}: {reason}")]
    Syntax {
        /// Offset of the first byte that does not fit the grammar (the input's length at
        /// an unexpected end).
        offset: usize,
        /// What was wrong, in fixed words.
        reason: &'static str,
    },
    /// A well-formed value that toolledger may not store or digest.
    #[error("value outside the v2 domain: {reason}")]
    OutsideV2Domain {
        /// What was wrong, in fixed words.
        reason: &'static str,
    },
    /// The serializer was given a NaN or an infinity, which JSON cannot write (code
    /// `number_out_of_range`, like a literal the parser cannot fit in a finite double).
    #[error("number out of range: not finite")]
    NonFiniteFloat,
    /// The serializer was given a map key that is not a string (an integer, a bool, a
    /// sequence, `None`…). Strings, `char`s, unit enum variants and newtype structs around
    /// those are keys; nothing is turned into a string behind the caller's back.
    #[error("map key is not a string")]
    KeyNotString,
    /// The serializer was given a map or struct that produced one member name twice (a
    /// map serializing a key again, a flattened struct repeating a field). Code
    /// `duplicate_key`, as the parser would refuse the output.
    #[error("duplicate object member name")]
    DuplicateMapKey,
    /// The value's own `Serialize` implementation failed (a `RefCell` already borrowed, a
    /// path that is not UTF-8, a `serialize_with` function's error). Its message is
    /// dropped, because it may quote the value.
    #[error("the value's Serialize implementation failed")]
    SerializeFailed,
    /// The writer given to [`to_writer`](crate::to_writer) failed. Only the kind is kept:
    /// an I/O error's text may carry paths or OS wording.
    #[error("writing the output failed: {kind}")]
    Io {
        /// What kind of failure the writer reported.
        kind: std::io::ErrorKind,
    },
}

impl JsonError {
    /// The stable, machine-readable name of this kind of failure.
    ///
    /// One of `too_large`, `too_deep`, `invalid_utf8`, `duplicate_key`, `lone_surrogate`,
    /// `number_out_of_range`, `syntax`, `outside_v2_domain`, `key_not_string`,
    /// `serialize_failed`, `io`. These never change meaning.
    pub fn code(&self) -> &'static str {
        match self {
            JsonError::TooLarge { .. } => "too_large",
            JsonError::TooDeep { .. } => "too_deep",
            JsonError::InvalidUtf8 { .. } => "invalid_utf8",
            JsonError::DuplicateKey { .. } => "duplicate_key",
            JsonError::LoneSurrogate { .. } => "lone_surrogate",
            JsonError::NumberOutOfRange { .. } => "number_out_of_range",
            JsonError::Syntax { .. } => "syntax",
            JsonError::OutsideV2Domain { .. } => "outside_v2_domain",
            JsonError::NonFiniteFloat => "number_out_of_range",
            JsonError::KeyNotString => "key_not_string",
            JsonError::DuplicateMapKey => "duplicate_key",
            JsonError::SerializeFailed => "serialize_failed",
            JsonError::Io { .. } => "io",
        }
    }

    /// The byte offset in the input where the failure was found, if it has one.
    ///
    /// Whole-input and whole-value failures ([`TooLarge`](JsonError::TooLarge),
    /// [`OutsideV2Domain`](JsonError::OutsideV2Domain)) have none, and neither has any
    /// failure of the serializer, which reads no input.
    pub fn offset(&self) -> Option<usize> {
        match *self {
            JsonError::TooDeep { offset, .. }
            | JsonError::InvalidUtf8 { offset }
            | JsonError::DuplicateKey { offset }
            | JsonError::LoneSurrogate { offset }
            | JsonError::NumberOutOfRange { offset }
            | JsonError::Syntax { offset, .. } => Some(offset),
            JsonError::TooLarge { .. }
            | JsonError::OutsideV2Domain { .. }
            | JsonError::NonFiniteFloat
            | JsonError::KeyNotString
            | JsonError::DuplicateMapKey
            | JsonError::SerializeFailed
            | JsonError::Io { .. } => None,
        }
    }
}
