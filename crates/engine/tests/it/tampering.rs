//! tampering
