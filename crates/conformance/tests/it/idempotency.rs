//! Idempotency row: fresh; same-intent replay; replay from a new call; cross
//! provider/API/adapter replay and different intent conflict; replay after reopening;
//! replay after revocation is NOT_FOUND.

use crate::StoreUnderTest;
use serde_json::json;
use toolledger_contract::{IdempotencyKey, Registry};

use crate::{Db, Flows, Roles, case, case_with, dispatch, field, id};

#[test]
fn fresh_then_same_intent_replays_without_a_second_side_effect() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let fresh = dispatch(&mut engine, &case(), None);
    assert_eq!((fresh.code(), fresh.delivery().unwrap().as_str()), ("OK", "fresh"));
    assert_eq!(fresh.package()["status"], json!("succeeded"));
    assert_eq!(field(&fresh, "/result/model_view/status"), &json!("refunded"));
    for _ in 0..3 {
        let replay = dispatch(&mut engine, &case(), None);
        assert_eq!(replay.delivery().unwrap().as_str(), "local_replay");
        assert_eq!(field(&replay, "/result/model_view"), field(&fresh, "/result/model_view"));
        assert_eq!(
            field(&replay, "/result/digests/result_sha256"),
            field(&fresh, "/result/digests/result_sha256")
        );
    }
    assert_eq!(db.state(), ("succeeded".to_owned(), "delivered".to_owned(), 1, 1, 1));
}

#[test]
fn a_replay_from_a_new_call_answers_that_call_with_the_ledgers_operation() {
    let db = Db::fresh();
    let mut engine = db.engine();
    dispatch(&mut engine, &case(), None);
    let retry = case_with(|case| {
        case.host.provider_response_id = id("resp-002");
        case.host.provider_call_id = id("call-002");
        case.host.operation_id = id("op-002");
    });
    let replay = dispatch(&mut engine, &retry, None);
    assert_eq!(replay.delivery().unwrap().as_str(), "local_replay");
    assert_eq!(field(&replay, "/result/host_view/provider_call_id"), &json!("call-002"));
    assert_eq!(field(&replay, "/result/host_view/provider_response_id"), &json!("resp-002"));
    assert_eq!(field(&replay, "/result/host_view/operation_id"), &json!("op-001"));
    // Replays record no call identity.
    assert_eq!(db.count("call_identities"), 1);
}

#[test]
fn a_replay_through_another_provider_api_or_adapter_conflicts() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let fresh = dispatch(&mut engine, &case(), None);
    let profiles = [
        ("openai", "chat_completions", "openai-chat-2026-05"),
        ("anthropic", "messages", "anthropic-messages-2026-05"),
    ];
    for (provider, api_family, adapter) in profiles {
        let moved = case_with(|case| {
            case.host.profile.provider = provider.to_owned();
            case.host.profile.api_family = api_family.to_owned();
            case.host.profile.adapter_revision = adapter.to_owned();
        });
        let answer = dispatch(&mut engine, &moved, None);
        assert_eq!(answer.code(), "IDEMPOTENCY_CONFLICT", "{provider}/{api_family}");
        assert_eq!(answer.package()["status"], json!("succeeded"));
        assert_eq!(answer.package()["status_ref"], fresh.package()["status_ref"]);
    }
}

#[test]
fn a_different_intent_under_the_same_key_conflicts_and_changes_nothing() {
    let db = Db::fresh();
    let mut engine = db.engine();
    dispatch(&mut engine, &case(), None);
    let changes: [fn(&mut toolledger_contract::HostCall); 3] = [
        |case| case.proposal.arguments["amount_minor"] = json!(2000),
        |case| case.proposal.arguments["reason"] = json!("duplicate"),
        |case| {
            case.proposal.arguments["order_id"] = json!("ord-1002");
            let mut order = case.business_state["orders"][0].clone();
            order["order_id"] = json!("ord-1002");
            case.business_state["orders"].as_array_mut().unwrap().push(order);
        },
    ];
    for change in changes {
        let answer = dispatch(&mut engine, &case_with(change), None);
        assert_eq!(answer.code(), "IDEMPOTENCY_CONFLICT");
    }
    assert_eq!((db.count("operations"), db.count("downstream_receipts")), (1, 1));
    // The same intent under a new key, from a new model call, is a new operation.
    let fresh = dispatch(
        &mut engine,
        &case_with(|case| {
            case.host.idempotency_key = IdempotencyKey::new("k-2").unwrap();
            case.host.provider_call_id = id("call-k-2");
        }),
        None,
    );
    assert_eq!(fresh.delivery().unwrap().as_str(), "fresh");
}

#[test]
fn a_replay_after_reopening_the_store_is_a_local_replay() {
    let db = Db::fresh();
    let fresh = dispatch(&mut db.engine(), &case(), None);
    let replay = dispatch(&mut db.engine(), &case(), None);
    assert_eq!(replay.delivery().unwrap().as_str(), "local_replay");
    assert_eq!(field(&replay, "/result/model_view"), field(&fresh, "/result/model_view"));
}

#[test]
fn a_replay_after_revocation_looks_like_a_missing_order() {
    let db = Db::fresh();
    let roles = Roles::default();
    roles.grant("tenant-a", "agent-7", "support_admin");
    let mut engine = db.engine_with(roles.clone(), Registry::builtin());
    let admin_case = case_with(|case| case.principal.subject_id = id("agent-7"));
    assert_eq!(dispatch(&mut engine, &admin_case, None).delivery().unwrap().as_str(), "fresh");
    assert_eq!(
        dispatch(&mut engine, &admin_case, None).delivery().unwrap().as_str(),
        "local_replay"
    );
    roles.revoke_all();
    let answer = dispatch(&mut engine, &admin_case, None);
    assert_eq!(answer.code(), "NOT_FOUND");
    assert_eq!(
        (answer.package()["status"].clone(), answer.package()["status_ref"].clone()),
        (json!(null), json!(null))
    );
    // Exactly the answer for an order that does not exist.
    let missing = dispatch(
        &mut engine,
        &case_with(|case| case.proposal.arguments["order_id"] = json!("ord-404")),
        None,
    );
    assert_eq!(missing.package(), answer.package());
}

/// One model call is one intent: its recorded identity used for another key is refused
/// as CALL_REUSED, naming the recorded operation to a principal who may see it, and
/// nothing is written.
#[test]
fn a_recorded_call_under_a_new_key_is_refused_as_reused() {
    let db = Db::fresh();
    let mut engine = db.engine();
    let first = dispatch(&mut engine, &case(), None);
    let first_ref = first.package()["status_ref"].clone();
    let again = case_with(|case| {
        case.host.idempotency_key = IdempotencyKey::new("refund-ord-1001-b").unwrap();
    });
    let reused = dispatch(&mut engine, &again, None);
    assert_eq!(reused.code(), "CALL_REUSED", "{:?}", reused.package());
    assert_eq!(reused.package()["status_ref"], first_ref);
    assert_eq!(reused.package()["status"], json!("succeeded"));
    assert_eq!((db.count("operations"), db.count("downstream_receipts")), (1, 1));

    // Another subject of the tenant may not see the recorded operation: no ref.
    let other = case_with(|case| {
        case.principal.subject_id = id("user-2");
        case.host.idempotency_key = IdempotencyKey::new("refund-ord-2002-a").unwrap();
        case.proposal.arguments["order_id"] = json!("ord-2002");
        let mut order = case.business_state["orders"][0].clone();
        order["order_id"] = json!("ord-2002");
        order["owner_subject_id"] = json!("user-2");
        case.business_state["orders"].as_array_mut().unwrap().push(order);
    });
    let hidden = dispatch(&mut engine, &other, None);
    assert_eq!(hidden.code(), "CALL_REUSED", "{:?}", hidden.package());
    assert_eq!(hidden.package()["status_ref"], json!(null));
    assert_eq!(hidden.package()["status"], json!(null));
    assert_eq!((db.count("operations"), db.count("call_identities")), (1, 1));
}

/// A status query asked under a model call already recorded as another operation's
/// dispatch is CALL_REUSED too, and records nothing.
#[test]
fn a_status_query_under_another_operations_call_is_refused_as_reused() {
    let db = Db::fresh();
    let mut engine = db.engine();
    dispatch(&mut engine, &case(), None);
    let second = case_with(|case| {
        case.host.provider_response_id = id("resp-002");
        case.host.provider_call_id = id("call-002");
        case.host.idempotency_key = IdempotencyKey::new("refund-ord-1001-b").unwrap();
    });
    let second_ref =
        dispatch(&mut engine, &second, None).package()["status_ref"].as_str().unwrap().to_owned();
    // The second operation's own case, but the first operation's model call.
    let crossed = case_with(|case| {
        case.host.idempotency_key = IdempotencyKey::new("refund-ord-1001-b").unwrap();
    });
    let calls = db.count("call_identities");
    let answer = engine.status_of(&crossed, &second_ref).unwrap();
    assert_eq!(answer.code(), "CALL_REUSED", "{:?}", answer.package());
    assert_eq!(db.count("call_identities"), calls);
}
