//! The claims-file loader (`load_claims`) on arbitrary bytes.
//!
//! Never a panic; and for any file it accepts: the file is strict JSON inside the v2
//! domain, and its canonical form (other member order, whitespace and escaping) loads to
//! the same claims.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolledger_contract::load_claims;
use toolledger_json::{Limits, canonicalize, check_v2_domain, parse_strict};

fuzz_target!(|data: &[u8]| {
    let Ok(claims) = load_claims(data) else {
        return;
    };
    let value = match parse_strict(data, &Limits::default()) {
        Ok(value) => value,
        Err(err) => panic!("a claims file that is not strict JSON was loaded: {}", err.code()),
    };
    assert!(check_v2_domain(&value).is_ok(), "a claims file outside the v2 domain was loaded");
    let canonical = canonicalize(&value);
    if canonical.len() <= Limits::default().size_bytes_max {
        let again = load_claims(canonical.as_bytes());
        assert_eq!(again.as_ref().ok(), Some(&claims), "the canonical form loads differently");
    }
});
