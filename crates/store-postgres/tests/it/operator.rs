//! What an operator reads and does.

use toolledger_engine::StandInReceipts;
use toolledger_store::{
    Claim, Ending, Finalize, Finalizer, Lease, LedgerStore, ListFilter, OperationStatus,
    OperatorStore, Release, Requeued, Reservation,
};

use crate::{
    assert_audit_passes, at, count, fresh, intent, lease, raw, receipts, sr, store, worker,
};

#[test]
fn a_requeue_of_a_dead_event_is_logged_and_the_log_is_append_only() {
    let url = fresh("requeue");
    let mut store = store(&url);
    let (new, call) = intent("k-1");
    store.reserve(&new, &call, at(0)).unwrap();
    let status_ref = sr(&new);
    assert_eq!(
        store.requeue(&status_ref, "try again", at(1)).unwrap(),
        Requeued::Refused(OperationStatus::Pending)
    );
    let owner = worker("relay");
    store.claim(&status_ref, &owner, at(1), lease(30)).unwrap();
    let dead = Release::Dead { reason: "attempts spent" };
    assert_eq!(
        store
            .release(&status_ref, &Lease { owner: owner.clone(), attempt: 1 }, &dead, at(2))
            .unwrap(),
        Finalize::Finalized
    );

    assert_eq!(
        store.requeue(&status_ref, "the service is back", at(10)).unwrap(),
        Requeued::Requeued
    );
    let operation = store.operation_by_status_ref(&status_ref).unwrap().unwrap();
    assert_eq!(operation.status, OperationStatus::Pending);
    assert_eq!((operation.outbox.attempt_count, operation.outbox.attempts_before), (1, 1));
    assert_eq!(operation.outbox.next_attempt_at, at(10).get());
    let shown = store.show(&status_ref).unwrap();
    assert_eq!(shown.operation.as_ref(), Some(&operation));
    assert_eq!(
        shown.log,
        [serde_json::json!({
            "action": "requeue", "from": "dead", "reason": "the service is back",
            "was": "attempts spent", "at": at(10).get()
        })]
    );
    assert_eq!(shown.tombstone, None);

    // The log refuses every change.
    let mut client = raw(&url);
    for sql in [
        "UPDATE operator_log SET reason = 'rewritten'",
        "DELETE FROM operator_log",
        "TRUNCATE operator_log",
    ] {
        let err = client.batch_execute(sql).unwrap_err();
        assert_eq!(err.code().map(|code| code.code()), Some("23000"), "{sql}");
    }
    assert_eq!(count(&mut client, "SELECT count(*) FROM operator_log"), 1);

    // Worked again: attempt 2 (the fencing token keeps counting).
    assert!(matches!(
        store.claim(&status_ref, &owner, at(11), lease(30)).unwrap(),
        Claim::Claimed(claimed) if claimed.attempt == 2
    ));
    assert_audit_passes(&mut store);
}

#[test]
fn list_figures_and_retention_read_and_retire_as_sqlite_does() {
    let url = fresh("operator");
    let mut store = store(&url);
    let keys = ["k-1", "k-2", "k-3"];
    for key in keys {
        let (new, call) = intent(key);
        store.reserve(&new, &call, at(0)).unwrap();
    }
    let (done, _) = intent("k-1");
    let (unknown, _) = intent("k-2");
    store.claim(&sr(&done), &worker("w"), at(1), lease(30)).unwrap();
    store.claim(&sr(&unknown), &worker("gone"), at(1), lease(30)).unwrap();
    let (downstream, local) = receipts(&done);
    store.record_downstream_receipt(&downstream, at(2)).unwrap();
    let by = Finalizer::Lease(Lease { owner: worker("w"), attempt: 1 });
    store.end(&sr(&done), &by, &Ending::Succeeded(&local), at(3)).unwrap();

    let now = at(100);
    let figures = store.figures(now).unwrap();
    let by_state: Vec<_> = figures.by_state.iter().map(|(state, count)| (*state, *count)).collect();
    assert_eq!(
        by_state,
        [
            ("pending", 1),
            ("processing", 0),
            ("unknown", 1),
            ("succeeded", 1),
            ("failed", 0),
            ("quarantined", 0),
            ("dead", 0)
        ]
    );
    assert_eq!(figures.oldest_pending_age, 100);
    assert_eq!(figures.oldest_unknown_age, 69);
    assert_eq!(figures.attempts, 2);

    let all = store.list(&ListFilter::default(), false, now).unwrap();
    let states: Vec<_> = all.iter().map(|listed| listed.state).collect();
    assert_eq!(states, ["pending", "unknown", "succeeded"]);
    let unknown_only = store
        .list(&ListFilter { state: Some("unknown"), ..ListFilter::default() }, true, now)
        .unwrap();
    assert_eq!(unknown_only.len(), 1);
    assert_eq!(unknown_only[0].status_ref, sr(&unknown).as_str());
    assert!(unknown_only[0].arguments.as_deref().is_some_and(|text| text.starts_with('{')));
    assert_eq!(unknown_only[0].age, 100);

    // Retention: the succeeded operation, unchanged since before the cutoff, is retired.
    assert_eq!(store.retire(at(2), now, 10).unwrap(), 0);
    assert_eq!(store.retire(at(50), now, 10).unwrap(), 1);
    assert!(store.retired(&sr(&done)).unwrap());
    assert_eq!(store.operation_by_status_ref(&sr(&done)).unwrap(), None);
    let shown = store.show(&sr(&done)).unwrap();
    assert_eq!(
        shown.tombstone,
        Some(serde_json::json!({"final_status": "succeeded", "retired_at": now.get()}))
    );
    assert_eq!(store.downstream_receipt(&downstream.downstream_request_ref).unwrap(), None);
    // Its key is a new business decision now, not a replay.
    let (again, again_call) = crate::intent_by("k-1", "call-after-retention");
    assert_eq!(store.reserve(&again, &again_call, at(101)).unwrap(), Reservation::Retired);
    assert_eq!(store.figures(at(102)).unwrap().tombstones, 1);
    assert_audit_passes(&mut store);
}
