//! Tampering row: non-canonical or duplicate-key JSON in a row, a changed digest, a
//! receipt whose output or input binding is wrong: refused, never returned.

use toolledger_contract::{Clock, LeaseSeconds};
use toolledger_engine::FailurePoint;

use crate::{Db, at, case, dispatch, id, status_ref_of};

const NOW: i64 = 1_767_225_600;

/// Dispatch fresh, tamper with `sql`, then expect every flow that reads the row to
/// refuse with STORE_CONTRACT_VIOLATION.
fn refused_after(sql: &str) {
    let db = Db::new();
    let mut engine = db.engine();
    let fresh = dispatch(&mut engine, &case(), None);
    let status_ref = status_ref_of(&fresh);
    db.raw().execute_batch(sql).unwrap();
    let clock = Clock { now: at(NOW), lease_seconds: LeaseSeconds::new(30).unwrap() };
    let replay = engine.dispatch(&case(), &id("w"), None).unwrap_err();
    assert_eq!(replay.code(), "STORE_CONTRACT_VIOLATION", "dispatch after {sql}");
    let status = engine.status(&case(), &status_ref).unwrap_err();
    assert_eq!(status.code(), "STORE_CONTRACT_VIOLATION", "status after {sql}");
    let process =
        engine.process(&status_ref, &clock, &case().business_state, &id("w"), None).unwrap_err();
    assert_eq!(process.code(), "STORE_CONTRACT_VIOLATION", "process after {sql}");
    let audit = toolledger_engine::audit_sqlite(&db.path).unwrap();
    assert_eq!(audit.code(), "AUDIT_FAILED", "audit after {sql}");
    let reference = audit.package()["findings"][0]["ref"].as_str().unwrap();
    assert!(reference.starts_with("sr_") || reference.starts_with("rc_"), "{reference}");
}

#[test]
fn non_canonical_arguments_are_refused() {
    refused_after(
        r#"UPDATE operations SET arguments_json = '{"amount_minor": 2599,"currency":"USD","order_id":"ord-1001","reason":"damaged"}'"#,
    );
    refused_after(
        r#"UPDATE operations SET arguments_json = '{"reason":"damaged","amount_minor":2599,"currency":"USD","order_id":"ord-1001"}'"#,
    );
}

#[test]
fn duplicate_key_arguments_are_refused() {
    refused_after(
        r#"UPDATE operations SET arguments_json = '{"amount_minor":2599,"currency":"USD","order_id":"ord-1001","reason":"damaged","reason":"damaged"}'"#,
    );
}

#[test]
fn arguments_outside_the_input_schema_are_refused_even_with_a_matching_digest() {
    // Rewrite the arguments *and* every digest derived from them, so the row agrees
    // with itself but not with the input schema.
    let db = Db::new();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterIntentCommit));
    let mut changed = case();
    changed.proposal.arguments["amount_minor"] = serde_json::json!(0);
    crate::rebind(&mut changed);
    let registry = toolledger_contract::Registry::builtin();
    let tool = registry.tool("refund_order").unwrap();
    let binding = changed.approval_binding(&tool.name, &tool.revisions);
    let scope = toolledger_contract::Scope {
        tenant_id: id("tenant-a"),
        subject_id: id("user-1"),
        tool_name: "refund_order".to_owned(),
        idempotency_key: changed.host.idempotency_key.clone(),
    };
    let dr_ref =
        toolledger_contract::digest::downstream_request_ref(&scope, &binding.request_sha256);
    db.raw()
        .execute(
            "UPDATE operations SET arguments_json = ?1, request_sha256 = ?2, approval_sha256 = ?3, downstream_request_ref = ?4",
            rusqlite::params![
                toolledger_json::canonicalize(&changed.proposal.arguments),
                binding.request_sha256.as_str(),
                changed.approval.approval_sha256.as_str(),
                dr_ref
            ],
        )
        .unwrap();
    let clock = Clock { now: at(NOW), lease_seconds: LeaseSeconds::new(30).unwrap() };
    let err = engine
        .process(&status_ref_of(&unknown), &clock, &case().business_state, &id("w"), None)
        .unwrap_err();
    assert_eq!(err.code(), "STORE_CONTRACT_VIOLATION");
    assert_eq!(db.count("downstream_receipts"), 0);
}

#[test]
fn a_changed_stored_digest_is_refused() {
    refused_after(
        "UPDATE operations SET request_sha256 = '1111111111111111111111111111111111111111111111111111111111111111'",
    );
    refused_after(
        "UPDATE local_receipts SET result_sha256 = '1111111111111111111111111111111111111111111111111111111111111111'",
    );
}

#[test]
fn a_changed_status_ref_is_refused_wherever_the_row_is_read() {
    let db = Db::new();
    let mut engine = db.engine();
    dispatch(&mut engine, &case(), None);
    let forged = "sr_11111111111111111111111111111111";
    db.raw().execute("UPDATE operations SET status_ref = ?1", [forged]).unwrap();
    assert_eq!(
        engine.dispatch(&case(), &id("w"), None).unwrap_err().code(),
        "STORE_CONTRACT_VIOLATION"
    );
    assert_eq!(engine.status(&case(), forged).unwrap_err().code(), "STORE_CONTRACT_VIOLATION");
    let clock = Clock { now: at(NOW), lease_seconds: LeaseSeconds::new(30).unwrap() };
    let process =
        engine.process(forged, &clock, &case().business_state, &id("w"), None).unwrap_err();
    assert_eq!(process.code(), "STORE_CONTRACT_VIOLATION");
    assert_eq!(toolledger_engine::audit_sqlite(&db.path).unwrap().code(), "AUDIT_FAILED");
}

#[test]
fn a_receipt_with_a_wrong_output_or_input_binding_is_refused() {
    // The local receipt's output no longer matches its receipt.
    refused_after(
        r#"UPDATE local_receipts SET output_json = '{"amount_minor":9999,"currency":"USD","order_id":"ord-1001","refund_id":"rf_00000000000000000000000000000000","status":"refunded"}'"#,
    );
    // The receipt JSON itself swapped for a non-canonical copy.
    refused_after("UPDATE local_receipts SET receipt_json = ' ' || receipt_json");
}

/// A downstream receipt that is self-consistent but whose output breaks the input
/// binding (another amount) is refused by the status query and never finalized.
#[test]
fn a_downstream_receipt_breaking_the_input_binding_is_never_reconciled() {
    let db = Db::new();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterDownstreamCommit));
    let receipt: String = db.text("SELECT receipt_json FROM downstream_receipts");
    let mut value: serde_json::Value = serde_json::from_str(&receipt).unwrap();
    value["output"]["amount_minor"] = serde_json::json!(100);
    let receipt_ref = toolledger_contract::digest::downstream_receipt_ref(&value);
    db.raw()
        .execute(
            "UPDATE downstream_receipts SET receipt_json = ?1, receipt_ref = ?2",
            rusqlite::params![toolledger_json::canonicalize(&value), receipt_ref],
        )
        .unwrap();
    let err = engine.status(&case(), &status_ref_of(&unknown)).unwrap_err();
    assert_eq!(err.code(), "STORE_CONTRACT_VIOLATION");
    assert_eq!(db.count("local_receipts"), 0);
    assert_eq!(db.text("SELECT status FROM operations"), "processing");
}
