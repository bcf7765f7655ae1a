//! The case-file loader (`load_case`) on arbitrary bytes.
//!
//! Never a panic; and for any file it accepts:
//!
//! - the file is strict JSON inside the v2 domain (the loader's documented contract);
//! - the case depends on the JSON value alone: the file's canonical form (other member
//!   order, whitespace and escaping) loads to the same case;
//! - `--now` set to the file's own `clock.now` changes nothing;
//! - the approval binding and its digest compute for the proposed tool.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use toolledger_contract::{Registry, load_case};
use toolledger_json::{Limits, canonicalize, check_v2_domain, parse_strict};

static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::builtin);

fuzz_target!(|data: &[u8]| {
    let Ok(case) = load_case(data, &REGISTRY, None) else {
        return;
    };
    let value = match parse_strict(data, &Limits::default()) {
        Ok(value) => value,
        Err(err) => panic!("a case file that is not strict JSON was loaded: {}", err.code()),
    };
    assert!(check_v2_domain(&value).is_ok(), "a case file outside the v2 domain was loaded");

    let canonical = canonicalize(&value);
    let roomy = Limits { size_bytes_max: usize::MAX, ..Limits::default() };
    assert!(parse_strict(canonical.as_bytes(), &roomy).is_ok());
    if canonical.len() <= Limits::default().size_bytes_max {
        let again = load_case(canonical.as_bytes(), &REGISTRY, None);
        assert_eq!(again.as_ref().ok(), Some(&case), "the canonical form loads differently");
    }

    let pinned = load_case(data, &REGISTRY, Some(case.clock.now.get()));
    assert_eq!(pinned.as_ref().ok(), Some(&case), "--now equal to clock.now changed the case");

    if let (Some(tool), Some(approval)) = (REGISTRY.tool(&case.proposal.tool_name), &case.approval)
    {
        let binding = case.approval_binding(&case.proposal.tool_name, &tool.revisions);
        let _ = approval.is_bound_to(&binding);
    }
});
