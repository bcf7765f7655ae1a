//! Rechecks before the side effect: contract drift, a revoked role, an order no longer
//! refundable, tampered approval or provider columns. Each fails closed with no
//! downstream receipt and leaves the operation recoverable.

use crate::FailurePoint;
use crate::StoreUnderTest;
use serde_json::json;
use toolledger_contract::{Clock, LeaseSeconds, Registry};

use crate::{Db, Flows, Roles, at, case, case_with, dispatch, id, status_ref_of};

const NOW: i64 = 1_767_225_600;

fn clock(now: i64) -> Clock {
    Clock { now: at(now), lease_seconds: LeaseSeconds::new(30).unwrap() }
}

fn drifted(change: impl FnOnce(&mut toolledger_contract::ToolSpec)) -> Registry {
    let builtin = Registry::builtin();
    let mut tool = builtin.tool("refund_order").unwrap().clone();
    change(&mut tool);
    Registry::new(vec![tool], builtin.profiles().to_vec())
}

/// An accepted, unworked intent: the state every recheck starts from.
fn accepted(db: &Db, roles: Roles, case: &toolledger_contract::HostCall) -> String {
    let answer = dispatch(
        &mut db.engine_with(roles, Registry::builtin()),
        case,
        Some(FailurePoint::AfterIntentCommit),
    );
    assert_eq!(answer.code(), "OUTCOME_UNKNOWN");
    status_ref_of(&answer)
}

#[test]
fn contract_drift_fails_closed_and_the_operation_recovers_under_its_contract() {
    let registries = [
        drifted(|tool| tool.revisions.handler = "refund_order.handler.v2".to_owned()),
        drifted(|tool| tool.revisions.policy = "refund_order.policy.v2".to_owned()),
        drifted(|tool| tool.revisions.input = "refund_order.input.v3".to_owned()),
        Registry::new(vec![], Registry::builtin().profiles().to_vec()),
    ];
    for registry in registries {
        let db = Db::fresh();
        let status_ref = accepted(&db, Roles::default(), &case());
        let mut engine = db.engine_with(Roles::default(), registry.clone());
        let answer = engine
            .process_at(&status_ref, &clock(NOW), &case().business_state, &id("w1"), None)
            .unwrap();
        assert_eq!(answer.code(), "CONTRACT_DRIFT");
        assert_eq!(answer.package()["status"], json!("processing"));
        assert_eq!(db.count("downstream_receipts"), 0);
        // Dispatch and status compare revisions as part of the intent.
        if registry.tool("refund_order").is_some() {
            assert_eq!(dispatch(&mut engine, &case(), None).code(), "IDEMPOTENCY_CONFLICT");
        }
        // The refusing worker wrote nothing; its lease runs out; the right contract works it.
        let answer = db
            .engine()
            .process_at(&status_ref, &clock(NOW), &case().business_state, &id("w2"), None)
            .unwrap();
        assert_eq!(answer.code(), "LEASE_HELD");
        let fresh = db
            .engine()
            .process_at(&status_ref, &clock(NOW + 30), &case().business_state, &id("w2"), None)
            .unwrap();
        assert_eq!(fresh.delivery().unwrap().as_str(), "fresh");
    }
}

#[test]
fn a_role_revoked_after_acceptance_denies_the_worker_without_a_receipt() {
    let db = Db::fresh();
    let roles = Roles::default();
    roles.grant("tenant-a", "agent-7", "support_admin");
    let admin_case = case_with(|case| case.principal.subject_id = id("agent-7"));
    let status_ref = accepted(&db, roles.clone(), &admin_case);
    roles.revoke_all();
    let mut engine = db.engine_with(roles.clone(), Registry::builtin());
    let denied = engine
        .process_at(&status_ref, &clock(NOW), &case().business_state, &id("w1"), None)
        .unwrap();
    assert_eq!(denied.code(), "AUTHORIZATION_DENIED");
    assert_eq!(denied.package()["status_ref"], json!(status_ref));
    assert_eq!(db.count("downstream_receipts"), 0);
    // Status and dispatch see a revoked principal's operation as missing.
    assert_eq!(engine.status_of(&admin_case, &status_ref).unwrap().code(), "NOT_FOUND");
    assert_eq!(dispatch(&mut engine, &admin_case, None).code(), "NOT_FOUND");
    roles.grant("tenant-a", "agent-7", "support_admin");
    let fresh = engine
        .process_at(&status_ref, &clock(NOW + 30), &case().business_state, &id("w2"), None)
        .unwrap();
    assert_eq!(fresh.delivery().unwrap().as_str(), "fresh");
}

#[test]
fn an_order_no_longer_refundable_stops_the_worker_without_a_receipt() {
    type Change = fn(&mut serde_json::Value);
    let changes: [(&str, Change); 4] = [
        ("refunded", |order| order["status"] = "refunded".into()),
        ("partly refunded", |order| order["amount_minor"] = 2000.into()),
        ("other currency", |order| order["currency"] = "EUR".into()),
        ("moved tenant", |order| order["tenant_id"] = "tenant-b".into()),
    ];
    for (what, change) in changes {
        let db = Db::fresh();
        let status_ref = accepted(&db, Roles::default(), &case());
        let mut state = case().business_state;
        change(&mut state["orders"][0]);
        let answer =
            db.engine().process_at(&status_ref, &clock(NOW), &state, &id("w1"), None).unwrap();
        let expected =
            if what == "moved tenant" { "AUTHORIZATION_DENIED" } else { "BUSINESS_STATE_INVALID" };
        assert_eq!(answer.code(), expected, "{what}");
        assert_eq!(db.count("downstream_receipts"), 0, "{what}");
        let fresh = db
            .engine()
            .process_at(&status_ref, &clock(NOW + 30), &case().business_state, &id("w2"), None)
            .unwrap();
        assert_eq!(fresh.delivery().unwrap().as_str(), "fresh", "{what}");
    }
}

#[test]
fn tampered_approval_or_provider_columns_fail_closed_before_the_side_effect() {
    let tampers = [
        ("approver_id", "'approver-2'"),
        ("approval_id", "'appr-999'"),
        ("approval_sha256", "'0000000000000000000000000000000000000000000000000000000000000000'"),
        ("approved_at", "1767225501"),
        ("approval_expires_at", "1767229101"),
        ("provider", "'anthropic'"),
        ("api_family", "'chat_completions'"),
        ("adapter_revision", "'openai-chat-2026-05'"),
        ("provider_call_id", "'call-999'"),
        ("operation_id", "'op-999'"),
    ];
    for (column, value) in tampers {
        let db = Db::fresh();
        let status_ref = accepted(&db, Roles::default(), &case());
        let original: String = db
            .raw()
            .query_row(&format!("SELECT CAST({column} AS TEXT) FROM operations"), [], |row| {
                row.get(0)
            })
            .unwrap();
        db.raw().execute(&format!("UPDATE operations SET {column} = {value}"), []).unwrap();
        let err = db
            .engine()
            .process_at(&status_ref, &clock(NOW), &case().business_state, &id("w1"), None)
            .unwrap_err();
        assert_eq!(err.code(), "STORE_CONTRACT_VIOLATION", "{column}");
        assert_eq!(db.count("downstream_receipts"), 0, "{column}");
        assert_eq!(
            db.int("SELECT attempt_count FROM outbox"),
            0,
            "{column}: claimed a tampered row"
        );
        // Put the column back: the operation is still there to be worked.
        let restore = if value.starts_with('\'') { format!("'{original}'") } else { original };
        db.raw().execute(&format!("UPDATE operations SET {column} = {restore}"), []).unwrap();
        let fresh = db
            .engine()
            .process_at(&status_ref, &clock(NOW), &case().business_state, &id("w2"), None)
            .unwrap();
        assert_eq!(fresh.delivery().unwrap().as_str(), "fresh", "{column}");
    }
}
