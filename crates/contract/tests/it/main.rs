//! The one integration-test binary of `toolledger-contract`.
//!
//! Files that are generated from code (the PASS fixture's approval digest,
//! `docs/contract-vectors.json`) are checked against the code here; run with
//! `TOOLLEDGER_BLESS=1` to rewrite them after an intended change.

mod cases;
mod definitions;
mod digests;
mod packages;
mod vectors;

use std::path::PathBuf;

use toolledger_contract::{HostCall, Registry, load_case};

/// A path relative to the workspace root.
fn workspace(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

fn bless() -> bool {
    std::env::var_os("TOOLLEDGER_BLESS").is_some()
}

/// The PASS case (`docs/contract.md`, Case file), as committed.
fn pass_case_bytes() -> Vec<u8> {
    std::fs::read(workspace("fixtures/persistence-case.json")).unwrap()
}

fn pass_case() -> HostCall {
    load_case(&pass_case_bytes(), &Registry::builtin(), None).unwrap()
}
