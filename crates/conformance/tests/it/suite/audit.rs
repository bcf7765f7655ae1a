//! The audit's invariants, broken by hand on every backend: each is a finding named by
//! its check, never an error.

use serde_json::json;

use crate::{Audited, StoreUnderTest, audited, case, dispatch};

/// A ledger with one succeeded operation, changed by `sql` through a raw connection.
pub(crate) fn store_after<B: StoreUnderTest>(sql: &str) -> B {
    let db = B::fresh();
    let mut engine = db.engine();
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OK");
    drop(engine);
    db.execute(sql);
    db
}

/// The audit of `db`, which must fail.
pub(crate) fn failed<B: StoreUnderTest>(db: &B) -> Audited {
    let answer = audited(&db.audit());
    assert_eq!(answer.code(), "AUDIT_FAILED", "{}", answer.package());
    answer
}

/// The check names of the findings.
fn checks(answer: &Audited) -> Vec<String> {
    answer.package()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|finding| finding["check"].as_str().unwrap().to_owned())
        .collect()
}

/// `check` failed, and a finding names it.
pub(crate) fn has(answer: &Audited, check: &str) {
    assert!(checks(answer).iter().any(|name| name == check), "{check}: {}", answer.package());
    assert_eq!(answer.package()["checks"][check], json!(false), "{check}");
}

pub(crate) fn a_local_receipts_downstream_request_ref_must_recompute<B: StoreUnderTest>() {
    let db = store_after::<B>(
        "UPDATE local_receipts SET downstream_request_ref = 'dr_11111111111111111111111111111111'",
    );
    has(&failed(&db), "digests_recompute");
}

pub(crate) fn call_identities_must_be_bound_to_their_operation<B: StoreUnderTest>() {
    // The dispatch identity no longer names the operation's first call.
    let db = store_after::<B>("UPDATE call_identities SET provider_call_id = 'call-999'");
    has(&failed(&db), "call_identities_bound");
    // The operation lost its dispatch identity altogether.
    let db = store_after::<B>("DELETE FROM call_identities");
    has(&failed(&db), "call_identities_bound");
    // A second dispatch identity for one operation.
    let db = store_after::<B>(
        "INSERT INTO call_identities (provider, api_family, adapter_revision, provider_response_id, \
         provider_call_id, purpose, op_id, created_at) SELECT provider, api_family, adapter_revision, \
         'resp-9', 'call-9', 'dispatch', op_id, created_at FROM call_identities",
    );
    has(&failed(&db), "call_identities_bound");
}

pub(crate) fn a_succeeded_operation_needs_its_downstream_receipt<B: StoreUnderTest>() {
    let db = store_after::<B>("DELETE FROM downstream_receipts");
    has(&failed(&db), "local_receipts_have_downstream_receipt");
}
