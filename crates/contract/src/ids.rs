//! Validated value types: constructed once, checked then, trusted afterwards.
//!
//! Each string type holds a private `String` whose invariant is its pattern; there are
//! getters and no setters. Patterns match the whole string (no trailing newline slips
//! through), per the contract (`docs/contract.md`).

use std::fmt;

use jiff::{SignedDuration, civil::DateTime};

use crate::InvalidValue;

macro_rules! validated_string {
    ($(#[$doc:meta])* $name:ident, $what:literal, $rule:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(
            // Invariant: the rule named in the type's docs holds.
            String,
        );

        impl $name {
            #[doc = concat!("Checks `text` and wraps it as a ", $what, ".")]
            ///
            /// # Errors
            ///
            /// [`InvalidValue`] when `text` does not match the rule.
            pub fn new(text: &str) -> Result<$name, InvalidValue> {
                if $rule(text) { Ok($name(text.to_owned())) } else { Err(InvalidValue { what: $what }) }
            }

            /// The checked text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidValue;

            /// Checks `text` and keeps it as it is, without copying it.
            fn try_from(text: String) -> Result<$name, InvalidValue> {
                if $rule(&text) { Ok($name(text)) } else { Err(InvalidValue { what: $what }) }
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

validated_string!(
    /// A tenant, subject, call, operation, approval or approver id:
    /// `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`.
    Identifier,
    "identifier",
    is_identifier
);

validated_string!(
    /// An idempotency key: the identifier pattern, `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`.
    /// It is a retry identity, not intent: it is in the call binding, never in the
    /// request digest.
    IdempotencyKey,
    "idempotency key",
    is_identifier
);

validated_string!(
    /// A SHA-256 digest as 64 lowercase hex digits.
    Sha256Hex,
    "sha-256 hex digest",
    is_sha256_hex
);

validated_string!(
    /// An operation's opaque status reference: `sr_` and 32 lowercase hex digits.
    StatusRef,
    "status ref",
    is_status_ref
);

validated_string!(
    /// The scope a downstream is idempotent on (an HTTP service's `Idempotency-Key`):
    /// `dr_` and 32 lowercase hex digits.
    DownstreamRequestRef,
    "downstream request ref",
    is_downstream_request_ref
);

validated_string!(
    /// A downstream receipt's reference, a digest of the receipt itself: `rc_` and 32
    /// lowercase hex digits.
    ReceiptRef,
    "receipt ref",
    is_receipt_ref
);

/// `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`.
pub(crate) fn is_identifier(text: &str) -> bool {
    let bytes = text.as_bytes();
    matches!(bytes.first(), Some(first) if first.is_ascii_alphanumeric())
        && bytes.len() <= 128
        && bytes.iter().all(|byte| byte.is_ascii_alphanumeric() || b"._:-".contains(byte))
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && is_lower_hex(text)
}

/// `prefix` followed by exactly 32 lowercase hex digits.
pub(crate) fn is_prefixed_hex32(text: &str, prefix: &str) -> bool {
    text.strip_prefix(prefix).is_some_and(|rest| rest.len() == 32 && is_lower_hex(rest))
}

fn is_status_ref(text: &str) -> bool {
    is_prefixed_hex32(text, "sr_")
}

fn is_downstream_request_ref(text: &str) -> bool {
    is_prefixed_hex32(text, "dr_")
}

fn is_receipt_ref(text: &str) -> bool {
    is_prefixed_hex32(text, "rc_")
}

/// An instant as whole Unix seconds (UTC) in `[0, 253402300799]`: 1970-01-01T00:00:00Z
/// to 9999-12-31T23:59:59Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixSeconds(
    // Invariant: 0 <= .0 <= UnixSeconds::MAX.
    i64,
);

impl UnixSeconds {
    /// The last instant of year 9999.
    pub const MAX: i64 = 253_402_300_799;

    /// Checks `seconds` against the range with jiff's civil calendar, which ends at
    /// 9999-12-31T23:59:59.
    ///
    /// # Errors
    ///
    /// [`InvalidValue`] outside `[0, 253402300799]`.
    pub fn new(seconds: i64) -> Result<UnixSeconds, InvalidValue> {
        match civil_utc(seconds) {
            Some(_) if seconds >= 0 => Ok(UnixSeconds(seconds)),
            _ => Err(InvalidValue { what: "timestamp" }),
        }
    }

    /// The seconds.
    pub fn get(self) -> i64 {
        self.0
    }

    /// `self + lease`, if that is still in range.
    pub fn checked_add(self, lease: LeaseSeconds) -> Option<UnixSeconds> {
        self.0.checked_add(i64::from(lease.get())).and_then(|sum| UnixSeconds::new(sum).ok())
    }

    /// RFC 3339 in UTC, e.g. `2026-01-01T00:00:00Z`, for people to read.
    pub fn to_rfc3339(self) -> String {
        civil_utc(self.0).map_or_else(String::new, |civil| format!("{civil}Z"))
    }
}

/// The UTC civil time of `seconds`, or `None` past jiff's civil range.
fn civil_utc(seconds: i64) -> Option<DateTime> {
    DateTime::constant(1970, 1, 1, 0, 0, 0, 0).checked_add(SignedDuration::from_secs(seconds)).ok()
}

/// A lease length in seconds, `1..=3600`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseSeconds(
    // Invariant: 1 <= .0 <= 3600.
    u32,
);

impl LeaseSeconds {
    /// Checks `seconds` is in `1..=3600`.
    ///
    /// # Errors
    ///
    /// [`InvalidValue`] otherwise.
    pub fn new(seconds: i64) -> Result<LeaseSeconds, InvalidValue> {
        u32::try_from(seconds)
            .ok()
            .filter(|seconds| (1..=3600).contains(seconds))
            .map(LeaseSeconds)
            .ok_or(InvalidValue { what: "lease seconds" })
    }

    /// The seconds.
    pub fn get(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_pattern_matches_whole_string() {
        assert!(Identifier::new("tenant-a").is_ok());
        assert!(Identifier::new("a.b_c:d-e").is_ok());
        assert!(Identifier::new(&"a".repeat(128)).is_ok());
        for bad in ["", "-a", ".a", "a b", "a\n", &"a".repeat(129), "é", "a/b"] {
            assert!(Identifier::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timestamps_span_1970_to_9999() {
        assert_eq!(
            UnixSeconds::new(0).map(UnixSeconds::to_rfc3339).unwrap(),
            "1970-01-01T00:00:00Z"
        );
        let max = UnixSeconds::new(UnixSeconds::MAX).unwrap();
        assert_eq!(max.to_rfc3339(), "9999-12-31T23:59:59Z");
        assert!(UnixSeconds::new(UnixSeconds::MAX + 1).is_err());
        assert!(UnixSeconds::new(-1).is_err());
        assert!(UnixSeconds::new(i64::MAX).is_err());
        assert_eq!(max.checked_add(LeaseSeconds::new(1).unwrap()), None);
        let before = UnixSeconds::new(UnixSeconds::MAX - 30).unwrap();
        assert_eq!(before.checked_add(LeaseSeconds::new(30).unwrap()), Some(max));
    }

    #[test]
    fn lease_seconds_are_1_to_3600() {
        assert!(LeaseSeconds::new(0).is_err());
        assert!(LeaseSeconds::new(3601).is_err());
        assert!(LeaseSeconds::new(-5).is_err());
        assert_eq!(LeaseSeconds::new(3600).map(LeaseSeconds::get), Ok(3600));
    }

    #[test]
    fn digests_and_refs_are_lowercase_hex() {
        assert!(Sha256Hex::new(&"a".repeat(64)).is_ok());
        assert!(Sha256Hex::new(&"A".repeat(64)).is_err());
        assert!(Sha256Hex::new(&"a".repeat(63)).is_err());
        assert!(StatusRef::new(&format!("sr_{}", "0".repeat(32))).is_ok());
        assert!(StatusRef::new(&format!("sr_{}", "0".repeat(33))).is_err());
        assert!(StatusRef::new(&format!("rc_{}", "0".repeat(32))).is_err());
        assert!(DownstreamRequestRef::new(&format!("dr_{}", "a".repeat(32))).is_ok());
        assert!(DownstreamRequestRef::new(&format!("dr_{}", "A".repeat(32))).is_err());
        assert!(DownstreamRequestRef::new(&format!("sr_{}", "0".repeat(32))).is_err());
        assert!(ReceiptRef::new(&format!("rc_{}", "f".repeat(32))).is_ok());
        assert!(ReceiptRef::new(&format!("rc_{}", "f".repeat(31))).is_err());
        assert!(ReceiptRef::new(&format!("dr_{}", "0".repeat(32))).is_err());
    }
}
