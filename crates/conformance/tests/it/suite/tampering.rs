//! Tampering row: non-canonical or duplicate-key JSON in a row, a changed digest, a
//! receipt whose output or input binding is wrong: refused, never returned.

use toolledger_contract::{Clock, LeaseSeconds};

use crate::{FailurePoint, Flows, StoreUnderTest, at, audited, case, dispatch, id, status_ref_of};

const NOW: i64 = 1_767_225_600;

/// Dispatch fresh, tamper with `sql`, then expect every flow that reads the row to
/// refuse with STORE_CONTRACT_VIOLATION.
pub(crate) fn refused_after<B: StoreUnderTest>(sql: &str) {
    let db = B::fresh();
    let mut engine = db.engine();
    let fresh = dispatch(&mut engine, &case(), None);
    let status_ref = status_ref_of(&fresh);
    db.execute(sql);
    let before = db.dump();
    let clock = Clock { now: at(NOW), lease_seconds: LeaseSeconds::new(30).unwrap() };
    let replay = engine.dispatch_at(&case(), &id("w"), None).unwrap_err();
    assert_eq!(replay.code(), "STORE_CONTRACT_VIOLATION", "dispatch after {sql}");
    let status = engine.status_of(&case(), &status_ref).unwrap_err();
    assert_eq!(status.code(), "STORE_CONTRACT_VIOLATION", "status after {sql}");
    let process =
        engine.process_at(&status_ref, &clock, &case().business_state, &id("w"), None).unwrap_err();
    assert_eq!(process.code(), "STORE_CONTRACT_VIOLATION", "process after {sql}");
    assert_eq!(db.dump(), before, "a refusing command wrote after {sql}");
    let audit = audited(&db.audit());
    assert_eq!(audit.code(), "AUDIT_FAILED", "audit after {sql}");
    // Findings name rows by opaque ref only, and at least one names this row.
    let findings = audit.package()["findings"].as_array().unwrap();
    let references: Vec<&str> =
        findings.iter().filter_map(|finding| finding["ref"].as_str()).collect();
    assert!(!references.is_empty(), "no finding names a row after {sql}");
    for reference in references {
        assert!(reference.starts_with("sr_") || reference.starts_with("rc_"), "{reference}");
    }
}

/// Invariant 2 broken by hand, each way: every command refuses, none writes.
pub(crate) fn a_status_out_of_step_with_its_outbox_event_or_receipt_is_refused<
    B: StoreUnderTest,
>() {
    refused_after::<B>("UPDATE operations SET status = 'pending'");
    refused_after::<B>("UPDATE operations SET status = 'processing'");
    refused_after::<B>(
        "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL, attempt_count = 0",
    );
    refused_after::<B>("UPDATE outbox SET state = 'processing'");
    refused_after::<B>("DELETE FROM local_receipts");
}

/// A changed tenant: the row no longer recomputes its refs, so every reader refuses it,
/// dispatch included (its reservation meets the row's refs under another scope).
pub(crate) fn a_changed_tenant_is_refused_by_every_command<B: StoreUnderTest>() {
    refused_after::<B>("UPDATE operations SET tenant_id = 'tenant-z'");
    refused_after::<B>("UPDATE operations SET subject_id = 'user-9'");
}

/// The local receipt's own copy of the downstream request ref must be its operation's.
pub(crate) fn a_local_receipt_naming_another_downstream_request_is_refused<B: StoreUnderTest>() {
    refused_after::<B>(
        "UPDATE local_receipts SET downstream_request_ref = 'dr_11111111111111111111111111111111'",
    );
}

pub(crate) fn non_canonical_arguments_are_refused<B: StoreUnderTest>() {
    refused_after::<B>(
        r#"UPDATE operations SET arguments_json = '{"amount_minor": 2599,"currency":"USD","order_id":"ord-1001","reason":"damaged"}'"#,
    );
    refused_after::<B>(
        r#"UPDATE operations SET arguments_json = '{"reason":"damaged","amount_minor":2599,"currency":"USD","order_id":"ord-1001"}'"#,
    );
}

pub(crate) fn duplicate_key_arguments_are_refused<B: StoreUnderTest>() {
    refused_after::<B>(
        r#"UPDATE operations SET arguments_json = '{"amount_minor":2599,"currency":"USD","order_id":"ord-1001","reason":"damaged","reason":"damaged"}'"#,
    );
}

pub(crate) fn arguments_outside_the_input_schema_are_refused_even_with_a_matching_digest<
    B: StoreUnderTest,
>() {
    // Rewrite the arguments *and* every digest derived from them, so the row agrees
    // with itself but not with the input schema.
    let db = B::fresh();
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
    db.execute(&format!(
        "UPDATE operations SET arguments_json = '{}', request_sha256 = '{}', approval_sha256 = '{}', \
         downstream_request_ref = '{dr_ref}'",
        toolledger_json::canonicalize(&changed.proposal.arguments),
        binding.request_sha256.as_str(),
        changed.approval.as_ref().unwrap().approval_sha256.as_str(),
    ));
    let clock = Clock { now: at(NOW), lease_seconds: LeaseSeconds::new(30).unwrap() };
    let err = engine
        .process_at(&status_ref_of(&unknown), &clock, &case().business_state, &id("w"), None)
        .unwrap_err();
    assert_eq!(err.code(), "STORE_CONTRACT_VIOLATION");
    // A replay of the original call meets stored arguments that differ from its own:
    // they are validated, and refused, before anything is answered.
    let replayed = engine.dispatch_at(&case(), &id("w"), None).unwrap_err();
    assert_eq!(replayed.code(), "STORE_CONTRACT_VIOLATION");
    assert_eq!(db.count("downstream_receipts"), 0);
}

pub(crate) fn a_changed_stored_digest_is_refused<B: StoreUnderTest>() {
    refused_after::<B>(
        "UPDATE operations SET request_sha256 = '1111111111111111111111111111111111111111111111111111111111111111'",
    );
    refused_after::<B>(
        "UPDATE local_receipts SET result_sha256 = '1111111111111111111111111111111111111111111111111111111111111111'",
    );
}

pub(crate) fn a_changed_status_ref_is_refused_wherever_the_row_is_read<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    dispatch(&mut engine, &case(), None);
    let forged = "sr_11111111111111111111111111111111";
    db.execute(&format!("UPDATE operations SET status_ref = '{forged}'"));
    assert_eq!(
        engine.dispatch_at(&case(), &id("w"), None).unwrap_err().code(),
        "STORE_CONTRACT_VIOLATION"
    );
    assert_eq!(engine.status_of(&case(), forged).unwrap_err().code(), "STORE_CONTRACT_VIOLATION");
    let clock = Clock { now: at(NOW), lease_seconds: LeaseSeconds::new(30).unwrap() };
    let process =
        engine.process_at(forged, &clock, &case().business_state, &id("w"), None).unwrap_err();
    assert_eq!(process.code(), "STORE_CONTRACT_VIOLATION");
    assert!(!db.audit().passed());
}

pub(crate) fn a_receipt_with_a_wrong_output_or_input_binding_is_refused<B: StoreUnderTest>() {
    // The local receipt's output no longer matches its receipt.
    refused_after::<B>(
        r#"UPDATE local_receipts SET output_json = '{"amount_minor":9999,"currency":"USD","order_id":"ord-1001","refund_id":"rf_00000000000000000000000000000000","status":"refunded"}'"#,
    );
    // The receipt JSON itself swapped for a non-canonical copy.
    refused_after::<B>("UPDATE local_receipts SET receipt_json = ' ' || receipt_json");
}

/// A downstream receipt that is self-consistent but whose output breaks the input
/// binding (another amount): the effect happened but its receipt breaks the output
/// contract, so the status query quarantines the operation (receipt kept, reason
/// recorded) instead of finalizing it, every later read answers RECEIPT_QUARANTINED, and
/// the audit lists it as needing attention.
pub(crate) fn a_downstream_receipt_breaking_the_input_binding_is_quarantined<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterDownstreamCommit));
    let receipt: String = db.text("SELECT receipt_json FROM downstream_receipts");
    let mut value: serde_json::Value = serde_json::from_str(&receipt).unwrap();
    value["output"]["amount_minor"] = serde_json::json!(100);
    let receipt_ref = toolledger_contract::digest::downstream_receipt_ref(&value);
    db.execute(&format!(
        "UPDATE downstream_receipts SET receipt_json = '{}', receipt_ref = '{receipt_ref}'",
        toolledger_json::canonicalize(&value)
    ));
    let status_ref = status_ref_of(&unknown);
    let answer = engine.status_of(&case(), &status_ref).unwrap();
    assert_eq!(answer.code(), "RECEIPT_QUARANTINED");
    assert_eq!(answer.package()["status"], serde_json::json!("quarantined"));
    assert_eq!(db.count("local_receipts"), 0);
    assert_eq!(db.text("SELECT status FROM operations"), "quarantined");
    assert_eq!(db.text("SELECT state FROM outbox"), "quarantined");
    assert_eq!(
        db.text("SELECT receipt_json FROM terminal_outcomes"),
        toolledger_json::canonicalize(&value)
    );
    for again in [
        engine.dispatch_at(&case(), &id("w"), None).unwrap(),
        engine.status_of(&case(), &status_ref).unwrap(),
        engine
            .process_at(
                &status_ref,
                &Clock { now: at(NOW + 99), lease_seconds: LeaseSeconds::new(30).unwrap() },
                &case().business_state,
                &id("w"),
                None,
            )
            .unwrap(),
    ] {
        assert_eq!(again.code(), "RECEIPT_QUARANTINED");
    }
    let audit = audited(&db.audit());
    assert_eq!(audit.code(), "AUDIT_FAILED");
    assert_eq!(
        audit.package()["findings"],
        serde_json::json!([{"check": "operations_quarantined", "ref": status_ref}])
    );
}

/// A finished operation's replay record is what a replay reads. Changed, a replay refuses
/// it and the audit names it, while the status query, which reads the operation's own
/// rows, still answers; nothing is written. Removed, a replay reads those rows and answers
/// exactly as it did from the record.
pub(crate) fn a_changed_replay_record_is_refused_on_replay<B: StoreUnderTest>() {
    for sql in [
        "UPDATE replays SET result_sha256 = '1111111111111111111111111111111111111111111111111111111111111111'",
        "UPDATE replays SET request_sha256 = '1111111111111111111111111111111111111111111111111111111111111111'",
        r#"UPDATE replays SET output_json = '{"amount_minor":9999,"currency":"USD","order_id":"ord-1001","refund_id":"rf_00000000000000000000000000000000","status":"refunded"}'"#,
        "UPDATE replays SET arguments_json = ' ' || arguments_json",
        "UPDATE replays SET receipt_request_ref = 'dr_11111111111111111111111111111111'",
        "UPDATE replays SET outbox_state = 'processing'",
        "UPDATE replays SET status = 'processing'",
    ] {
        let db = B::fresh();
        let mut engine = db.engine();
        let fresh = dispatch(&mut engine, &case(), None);
        assert_eq!(db.count("replays"), 1, "a success has its replay record");
        let status_ref = status_ref_of(&fresh);
        db.execute(sql);
        let before = db.dump();
        let replay = engine.dispatch_at(&case(), &id("w"), None).unwrap_err();
        assert_eq!(replay.code(), "STORE_CONTRACT_VIOLATION", "dispatch after {sql}");
        assert_eq!(db.dump(), before, "a refused replay wrote after {sql}");
        assert_eq!(engine.status_of(&case(), &status_ref).unwrap().code(), "OK", "{sql}");
        let audit = audited(&db.audit());
        assert_eq!(audit.code(), "AUDIT_FAILED", "audit after {sql}");
        let findings = audit.package()["findings"].as_array().unwrap().clone();
        assert!(
            findings.iter().any(|finding| finding["check"] == "replay_records_match"
                && finding["ref"] == status_ref.as_str()),
            "{sql}: {findings:?}"
        );
    }
    let db = B::fresh();
    let mut engine = db.engine();
    dispatch(&mut engine, &case(), None);
    let from_record = engine.dispatch_at(&case(), &id("w"), None).unwrap();
    db.execute("DELETE FROM replays");
    let from_rows = engine.dispatch_at(&case(), &id("w"), None).unwrap();
    assert_eq!(from_record.code(), "OK");
    assert_eq!(from_rows.package(), from_record.package());
    assert!(audited(&db.audit()).package()["findings"].as_array().unwrap().is_empty());
}

/// Any change to a row a replay record was copied from removes the record, in the same
/// statement (the schema's triggers): a replay then reads the rows themselves, so it
/// refuses a changed one, and answers from one that still verifies.
pub(crate) fn a_change_to_a_finished_operations_rows_removes_its_replay_record<
    B: StoreUnderTest,
>() {
    for sql in [
        "UPDATE operations SET updated_at = updated_at + 1",
        "UPDATE outbox SET updated_at = updated_at + 1",
        "UPDATE local_receipts SET created_at = created_at + 1",
        "UPDATE call_identities SET created_at = created_at + 1",
    ] {
        let db = B::fresh();
        let mut engine = db.engine();
        dispatch(&mut engine, &case(), None);
        let from_record = engine.dispatch_at(&case(), &id("w"), None).unwrap();
        db.execute(sql);
        assert_eq!(db.count("replays"), 0, "{sql} left the replay record");
        let from_rows = engine.dispatch_at(&case(), &id("w"), None).unwrap();
        assert_eq!(from_rows.package(), from_record.package(), "{sql}");
    }
}
