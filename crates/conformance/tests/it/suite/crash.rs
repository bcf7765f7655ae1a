//! Crash-recovery row: each failure point leaves exactly the state of its row in the
//! crash table of `docs/schema.md` ("Commit points"); re-dispatch of an unfinished intent
//! is OUTCOME_UNKNOWN and touches nothing; a live lease is LEASE_HELD, an expired one is
//! reclaimed; a status query reconciles after the downstream commit; a stale lease holder
//! never finalizes.

use serde_json::json;
use toolledger_contract::{Clock, LeaseSeconds, StatusRef, digest::downstream_request_ref};
use toolledger_engine::{Downstream, DownstreamRequest, StandIn};

use toolledger_store::{
    Claim, Claimed, Ending, Finalize, Finalizer, Lease, LedgerStore, LocalReceipt,
};

use crate::{FailurePoint, Flows, StoreUnderTest, at, case, dispatch, id, status_ref_of};

const NOW: i64 = 1_767_225_600;

/// Every row of the ledger's tables, as text: to prove a call touched nothing.
fn snapshot<B: StoreUnderTest>(db: &B) -> Vec<String> {
    let mut rows = Vec::new();
    for table in
        ["operations", "outbox", "downstream_receipts", "local_receipts", "call_identities"]
    {
        for row in db.rows(&format!("SELECT * FROM {table} ORDER BY 1")) {
            rows.push(format!("{table}: {row:?}"));
        }
    }
    rows
}

fn clock(now: i64) -> Clock {
    Clock { now: at(now), lease_seconds: LeaseSeconds::new(30).unwrap() }
}

pub(crate) fn each_failure_point_leaves_the_crash_table_state_and_redispatch_touches_nothing<
    B: StoreUnderTest,
>() {
    let expected = [
        (FailurePoint::AfterIntentCommit, ("pending", "pending", 0, 0, 0), "pending"),
        (FailurePoint::AfterClaim, ("processing", "processing", 1, 0, 0), "processing"),
        (FailurePoint::AfterDownstreamCommit, ("processing", "processing", 1, 1, 0), "processing"),
    ];
    for (point, (status, state, attempts, downstream, local), answered) in expected {
        let db = B::fresh();
        let mut engine = db.engine();
        let answer = dispatch(&mut engine, &case(), Some(point));
        assert_eq!(answer.code(), "OUTCOME_UNKNOWN", "{point:?}");
        assert_eq!(answer.package()["status"], json!(answered));
        assert!(answer.package()["status_ref"].as_str().unwrap().starts_with("sr_"));
        assert_eq!(
            db.state(),
            (status.to_owned(), state.to_owned(), attempts, downstream, local),
            "{point:?}"
        );
        if point != FailurePoint::AfterIntentCommit {
            assert_eq!(db.text("SELECT lease_owner FROM outbox"), "worker-dispatch");
            assert_eq!(db.int("SELECT lease_until FROM outbox"), NOW + 30);
        }

        let before = snapshot(&db);
        for now in [NOW, NOW + 3600] {
            let again = engine.dispatch_at(&case_at(now), &id("worker-other"), None).unwrap();
            assert_eq!(again.code(), "OUTCOME_UNKNOWN", "{point:?} re-dispatch");
            assert_eq!(again.package()["status_ref"], answer.package()["status_ref"]);
        }
        assert_eq!(snapshot(&db), before, "{point:?}: re-dispatch wrote something");
    }
}

fn case_at(now: i64) -> toolledger_contract::HostCall {
    let mut case = case();
    case.clock.now = at(now);
    case
}

pub(crate) fn a_live_lease_is_held_and_an_expired_one_is_reclaimed<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterClaim));
    let status_ref = status_ref_of(&unknown);
    let state = case().business_state;
    for now in [NOW, NOW + 29] {
        let held =
            engine.process_at(&status_ref, &clock(now), &state, &id("worker-2"), None).unwrap();
        assert_eq!(held.code(), "LEASE_HELD", "at +{}", now - NOW);
        assert_eq!(held.package()["status"], json!("processing"));
        assert_eq!(held.package()["status_ref"], json!(status_ref));
    }
    assert_eq!(db.int("SELECT attempt_count FROM outbox"), 1);
    // lease_until <= now: reclaimable.
    let fresh =
        engine.process_at(&status_ref, &clock(NOW + 30), &state, &id("worker-2"), None).unwrap();
    assert_eq!(fresh.delivery().unwrap().as_str(), "fresh");
    assert_eq!(db.state(), ("succeeded".to_owned(), "delivered".to_owned(), 2, 1, 1));
    assert_eq!(db.text("SELECT lease_owner FROM outbox"), "worker-2");
    // A worker on a finished operation replays with the ledger's first call.
    let replay =
        engine.process_at(&status_ref, &clock(NOW + 40), &state, &id("worker-3"), None).unwrap();
    assert_eq!(replay.delivery().unwrap().as_str(), "local_replay");
    assert_eq!(replay.package()["result"]["host_view"]["provider_call_id"], json!("call-001"));
    assert_eq!(replay.package()["result"]["host_view"]["purpose"], json!("dispatch"));
}

pub(crate) fn an_accepted_intent_is_worked_later_by_process<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterIntentCommit));
    let fresh = engine
        .process_at(
            &status_ref_of(&unknown),
            &clock(NOW + 7200),
            &case().business_state,
            &id("w"),
            None,
        )
        .unwrap();
    // The approval expired at +3500 but was consumed when the intent was accepted.
    assert_eq!(fresh.delivery().unwrap().as_str(), "fresh");
}

pub(crate) fn a_reclaimed_downstream_request_is_not_executed_twice<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterDownstreamCommit));
    let first_receipt = db.text("SELECT receipt_ref FROM downstream_receipts");
    let fresh = engine
        .process_at(
            &status_ref_of(&unknown),
            &clock(NOW + 30),
            &case().business_state,
            &id("w2"),
            None,
        )
        .unwrap();
    assert_eq!(fresh.delivery().unwrap().as_str(), "fresh");
    assert_eq!(db.count("downstream_receipts"), 1);
    assert_eq!(
        fresh.package()["result"]["host_view"]["downstream_receipt_ref"],
        json!(first_receipt)
    );
}

pub(crate) fn a_status_query_reconciles_after_the_downstream_commit<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterDownstreamCommit));
    let status_ref = status_ref_of(&unknown);
    // Still unknown to dispatch: it never looks at receipts.
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OUTCOME_UNKNOWN");
    // The worker holds a live lease; a status query needs none.
    let reconciled = engine.status_of(&case(), &status_ref).unwrap();
    assert_eq!(reconciled.delivery().unwrap().as_str(), "receipt_reconciled");
    assert_eq!(db.text("SELECT finalized_by FROM local_receipts"), "status_query");
    assert_eq!(
        engine.status_of(&case(), &status_ref).unwrap().delivery().unwrap().as_str(),
        "local_replay"
    );
    assert_eq!(dispatch(&mut engine, &case(), None).delivery().unwrap().as_str(), "local_replay");
    // The worker whose lease it was finds the operation finished.
    let late = engine
        .process_at(
            &status_ref,
            &clock(NOW + 1),
            &case().business_state,
            &id("worker-dispatch"),
            None,
        )
        .unwrap();
    assert_eq!(late.delivery().unwrap().as_str(), "local_replay");
    assert_eq!(db.state(), ("succeeded".to_owned(), "delivered".to_owned(), 1, 1, 1));
}

pub(crate) fn a_status_query_before_any_downstream_commit_stays_unknown<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    for point in [FailurePoint::AfterIntentCommit, FailurePoint::AfterClaim] {
        let key = format!("k-{}", point.as_str());
        // Each intent comes from its own model call: one call is one intent.
        let keyed = crate::case_with(|case| {
            case.host.idempotency_key = toolledger_contract::IdempotencyKey::new(&key).unwrap();
            case.host.provider_call_id = crate::id(&format!("call-{key}"));
        });
        let unknown = dispatch(&mut engine, &keyed, Some(point));
        let answer = engine.status_of(&keyed, &status_ref_of(&unknown)).unwrap();
        assert_eq!(answer.code(), "OUTCOME_UNKNOWN");
    }
    assert_eq!(db.count("local_receipts"), 0);
}

/// Store level: a worker whose lease was reclaimed must not write commit C, and C never
/// runs twice.
pub(crate) fn a_stale_lease_holder_cannot_finalize<B: StoreUnderTest>() {
    let db = B::fresh();
    let mut engine = db.engine();
    let unknown = dispatch(&mut engine, &case(), Some(FailurePoint::AfterIntentCommit));
    let status_ref = StatusRef::new(&status_ref_of(&unknown)).unwrap();
    let lease = LeaseSeconds::new(30).unwrap();
    let mut store = db.store();
    let first = store.claim(&status_ref, &id("a"), at(NOW), lease).unwrap();
    let Claim::Claimed(claimed) = first else { panic!("{first:?}") };
    let Claimed { attempt: 1, operation, .. } = *claimed else { panic!("{claimed:?}") };
    // The claim hands back the operation as it wrote it.
    assert_eq!(
        (
            operation.outbox.lease_owner.as_ref().map(|owner| owner.as_str()),
            operation.outbox.attempt_count
        ),
        (Some("a"), 1)
    );
    assert_eq!(store.claim(&status_ref, &id("b"), at(NOW + 29), lease).unwrap(), Claim::LeaseHeld);
    let second = store.claim(&status_ref, &id("b"), at(NOW + 30), lease).unwrap();
    assert!(matches!(&second, Claim::Claimed(claimed) if claimed.attempt == 2), "{second:?}");

    let operation = store.operation_by_status_ref(&status_ref).unwrap().unwrap();
    let intent = &operation.intent;
    let stand_in = StandIn::new(db.store());
    let receipt = stand_in
        .execute(
            &DownstreamRequest {
                downstream_request_ref: downstream_request_ref(
                    &intent.scope,
                    &intent.request_sha256,
                ),
                request_sha256: intent.request_sha256.clone(),
                tool_name: "refund_order".to_owned(),
                output_revision: intent.revisions.output.clone(),
                arguments: intent.arguments.clone(),
            },
            at(NOW + 31),
        )
        .unwrap();
    let output = receipt.receipt()["output"].clone();
    let local = LocalReceipt {
        result_sha256: toolledger_contract::digest::result_sha256(
            "refund_order",
            &intent.revisions.output,
            &output,
        ),
        downstream: receipt,
        output,
    };
    let stale = Finalizer::Lease(Lease { owner: id("a"), attempt: 1 });
    let wrong_attempt = Finalizer::Lease(Lease { owner: id("b"), attempt: 1 });
    assert_eq!(
        store.end(&status_ref, &stale, &Ending::Succeeded(&local), at(NOW + 32)).unwrap(),
        Finalize::LeaseLost
    );
    assert_eq!(
        store.end(&status_ref, &wrong_attempt, &Ending::Succeeded(&local), at(NOW + 32)).unwrap(),
        Finalize::LeaseLost
    );
    assert_eq!(db.count("local_receipts"), 0);
    let current = Finalizer::Lease(Lease { owner: id("b"), attempt: 2 });
    assert_eq!(
        store.end(&status_ref, &current, &Ending::Succeeded(&local), at(NOW + 33)).unwrap(),
        Finalize::Finalized
    );
    assert_eq!(
        store.end(&status_ref, &current, &Ending::Succeeded(&local), at(NOW + 34)).unwrap(),
        Finalize::AlreadyFinal
    );
    assert_eq!(
        store
            .end(&status_ref, &Finalizer::StatusQuery, &Ending::Succeeded(&local), at(NOW + 34))
            .unwrap(),
        Finalize::AlreadyFinal
    );
    assert_eq!(db.state(), ("succeeded".to_owned(), "delivered".to_owned(), 2, 1, 1));
    assert_eq!(store.claim(&status_ref, &id("c"), at(NOW + 999), lease).unwrap(), Claim::Final);
}
