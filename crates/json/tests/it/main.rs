//! The one integration-test binary of `toolledger-json`: conformance corpora, limits and
//! properties.

mod check;
mod domain;
mod limits;
mod properties;
mod rfc8785;
mod serialize;
mod suite;

use std::path::PathBuf;

/// `tests/data/<relative>` inside this crate.
fn data(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(relative)
}
