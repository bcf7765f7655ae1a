//! v2 compatibility row: the package's digests are the contract crate's; the key and the
//! downstream evidence enter the call binding; packages verify; the approval context is
//! persisted and recomputed; a status-query identity can never dispatch.

use crate::StoreUnderTest;
use serde_json::json;
use toolledger_contract::{
    IdempotencyKey, Registry, approval_sha256, digest::request_sha256, verify_package,
};

use crate::FailurePoint;
use crate::{Db, Flows, case, case_with, dispatch, field, id, status_ref_of};

#[test]
fn the_package_request_digest_is_the_contract_crates() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let case = case();
    let answer = dispatch(&mut engine, &case, None);
    let registry = Registry::builtin();
    let revisions = &registry.tool("refund_order").unwrap().revisions;
    let expected = request_sha256(
        &case.principal.tenant_id,
        &case.principal.subject_id,
        "refund_order",
        &case.proposal.arguments,
        revisions,
    );
    assert_eq!(field(&answer, "/result/digests/request_sha256"), &json!(expected.as_str()));
    assert_eq!(db.text("SELECT request_sha256 FROM operations"), expected.as_str());
    assert_eq!(verify_package(answer.package()), Ok(()));
}

#[test]
fn the_key_and_the_downstream_evidence_change_the_call_binding_but_not_the_request_digest() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let first = dispatch(&mut engine, &case(), None);
    let other_key = case_with(|case| {
        case.host.idempotency_key = IdempotencyKey::new("refund-ord-1001-b").unwrap();
        case.host.provider_call_id = id("call-002");
    });
    let second = dispatch(&mut engine, &other_key, None);
    assert_eq!(second.delivery().unwrap().as_str(), "fresh");
    let binding = "/result/digests/call_binding_sha256";
    assert_eq!(
        field(&first, "/result/digests/request_sha256"),
        field(&second, "/result/digests/request_sha256")
    );
    assert_ne!(field(&first, binding), field(&second, binding));
    for evidence in [
        "/result/host_view/downstream_request_ref",
        "/result/host_view/downstream_receipt_ref",
        "/status_ref",
    ] {
        assert_ne!(field(&first, evidence), field(&second, evidence), "{evidence}");
    }
    // Two keys are two operations and two side effects: that is what a key means.
    assert_eq!((db.count("operations"), db.count("downstream_receipts")), (2, 2));

    // The same operation answered as a replay: same request and result, other binding.
    let replay = dispatch(&mut engine, &case(), None);
    assert_eq!(replay.delivery().unwrap().as_str(), "local_replay");
    assert_eq!(
        field(&first, "/result/digests/result_sha256"),
        field(&replay, "/result/digests/result_sha256")
    );
    assert_ne!(field(&first, binding), field(&replay, binding));
    for answer in [&first, &second, &replay] {
        assert_eq!(verify_package(answer.package()), Ok(()));
    }
}

#[test]
fn every_delivery_verifies_and_answers_the_right_call() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterDownstreamCommit));
    let status_ref = status_ref_of(&unknown);
    let reconciled = engine.status_of(&case(), &status_ref).unwrap();
    assert_eq!(reconciled.delivery().unwrap().as_str(), "receipt_reconciled");
    assert_eq!(field(&reconciled, "/result/host_view/purpose"), &json!("query_status"));
    assert!(
        field(&reconciled, "/result/host_view/provider_call_id")
            .as_str()
            .unwrap()
            .starts_with("qs_")
    );
    assert_eq!(field(&reconciled, "/result/host_view/operation_id"), &json!("op-001"));
    let replayed = engine.status_of(&case(), &status_ref).unwrap();
    assert_eq!(replayed.delivery().unwrap().as_str(), "local_replay");
    assert_eq!(
        field(&replayed, "/result/host_view/provider_call_id"),
        field(&reconciled, "/result/host_view/provider_call_id")
    );
    let dispatched = dispatch(&mut engine, &case(), None);
    assert_eq!(field(&dispatched, "/result/host_view/purpose"), &json!("dispatch"));
    assert_eq!(field(&dispatched, "/result/host_view/provider_call_id"), &json!("call-001"));
    for answer in [&reconciled, &replayed, &dispatched] {
        assert_eq!(verify_package(answer.package()), Ok(()));
        assert_eq!(answer.package()["status_ref"], json!(status_ref));
    }
}

#[test]
fn approver_identity_and_provider_context_are_persisted_and_recompute() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let case = case();
    dispatch(&mut engine, &case, None);
    let row: (String, String, String, i64, i64, String, String, String, String, String, String) = db
        .raw()
        .query_row(
            "SELECT approval_id, approver_id, approval_sha256, approved_at, approval_expires_at, provider, api_family, \
             adapter_revision, provider_response_id, provider_call_id, operation_id FROM operations",
            [],
            |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?, row.get(7)?, row.get(8)?, row.get(9)?, row.get(10)?))
            },
        )
        .unwrap();
    assert_eq!(
        row,
        (
            "appr-001".to_owned(),
            "approver-1".to_owned(),
            case.approval.as_ref().unwrap().approval_sha256.as_str().to_owned(),
            1_767_225_500,
            1_767_229_100,
            "openai".to_owned(),
            "responses".to_owned(),
            "openai-responses-2026-05".to_owned(),
            "resp-001".to_owned(),
            "call-001".to_owned(),
            "op-001".to_owned(),
        )
    );
    // Recomputed from the persisted columns alone, the digest is the approver's.
    let registry = Registry::builtin();
    let tool = registry.tool("refund_order").unwrap();
    let binding = case.approval_binding(&tool.name, &tool.revisions);
    let recomputed =
        approval_sha256(&id(&row.0), &id(&row.1), crate::at(row.3), crate::at(row.4), &binding);
    assert_eq!(recomputed.as_str(), row.2);
}

#[test]
fn a_status_query_identity_cannot_dispatch_and_a_dispatch_identity_cannot_query() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterDownstreamCommit));
    let reconciled = engine.status_of(&case(), &status_ref_of(&unknown)).unwrap();
    let response =
        field(&reconciled, "/result/host_view/provider_response_id").as_str().unwrap().to_owned();
    let call =
        field(&reconciled, "/result/host_view/provider_call_id").as_str().unwrap().to_owned();

    // A dispatch presenting the status query's identity, for a new key.
    let reuse = case_with(|case| {
        case.host.provider_response_id = id(&response);
        case.host.provider_call_id = id(&call);
        case.host.idempotency_key = IdempotencyKey::new("refund-ord-1001-z").unwrap();
    });
    let answer = dispatch(&mut engine, &reuse, None);
    assert_eq!(answer.code(), "CALL_PURPOSE_CONFLICT");
    assert_eq!(answer.package()["status"], json!(null));
    assert_eq!(db.count("operations"), 1);

    // The other way: an identity first recorded by a dispatch is refused as a status
    // query's. Dispatch a second operation under the identity the next status query of
    // a fresh operation will derive, then query.
    let db = Db::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterDownstreamCommit));
    let status_ref = toolledger_contract::StatusRef::new(&status_ref_of(&unknown)).unwrap();
    use toolledger_contract::digest::{StatusQueryPart, status_query_id};
    let squatter = case_with(|case| {
        case.host.provider_response_id =
            status_query_id(StatusQueryPart::Response, &id("resp-001"), &status_ref);
        case.host.provider_call_id =
            status_query_id(StatusQueryPart::Call, &id("call-001"), &status_ref);
        case.host.idempotency_key = IdempotencyKey::new("refund-ord-1001-y").unwrap();
    });
    assert_eq!(dispatch(&mut engine, &squatter, None).code(), "OK");
    let answer = engine.status_of(&case(), status_ref.as_str()).unwrap();
    assert_eq!(answer.code(), "CALL_PURPOSE_CONFLICT");
    assert_eq!(db.count("local_receipts"), 1, "the conflicting query finalized something");
}
