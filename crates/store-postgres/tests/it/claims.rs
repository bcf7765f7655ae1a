//! Claims, leases, fencing, commit C, releases and the relay's batches.

use std::{
    collections::HashSet,
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use toolledger_contract::StatusRef;
use toolledger_engine::StandInReceipts;
use toolledger_store::{
    Claim, Claimed, Ending, Finalize, Finalizer, Lease, LedgerStore, LocalReceipt, OperationStatus,
    OperatorStore, Release, Reservation, StoreError, TerminalOutcome, Waits,
};
use toolledger_store_postgres::{PgStore, StoreClock};

use crate::{
    assert_audit_passes, at, count, fresh, intent, lease, raw, receipts, sr, stand_in, store,
    worker,
};

/// Reserves `keys` (pending), due at `at(0)`.
fn reserve_all(store: &mut PgStore, keys: impl IntoIterator<Item = String>) -> Vec<StatusRef> {
    keys.into_iter()
        .map(|key| {
            let (new, call) = intent(&key);
            assert!(matches!(store.reserve(&new, &call, at(0)).unwrap(), Reservation::Reserved(_)));
            sr(&new)
        })
        .collect()
}

#[test]
fn eight_claimers_of_one_event_make_one_claim() {
    let url = fresh("claim_race");
    let status_ref = reserve_all(&mut store(&url), ["k-1".to_owned()]).remove(0);
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|index| {
            let (url, barrier, status_ref) =
                (url.clone(), Arc::clone(&barrier), status_ref.clone());
            std::thread::spawn(move || {
                let mut store = store(&url);
                barrier.wait();
                store.claim(&status_ref, &worker(&format!("w-{index}")), at(1), lease(30)).unwrap()
            })
        })
        .collect();
    let claims: Vec<Claim> = threads.into_iter().map(|thread| thread.join().unwrap()).collect();
    let claimed: Vec<_> = claims
        .iter()
        .filter_map(|claim| match claim {
            Claim::Claimed(claimed) => Some((claimed.attempt, claimed.reclaimed)),
            _ => None,
        })
        .collect();
    assert_eq!(claimed, [(1, false)], "{claims:?}");
    assert_eq!(claims.iter().filter(|claim| **claim == Claim::LeaseHeld).count(), 7);
    let mut client = raw(&url);
    assert_eq!(
        count(&mut client, "SELECT sum(value)::bigint FROM counters WHERE name = 'claims'"),
        1
    );
    assert_audit_passes(&mut store(&url));
}

#[test]
fn two_relays_claim_disjoint_batches_covering_every_due_event() {
    let url = fresh("claim_due");
    let all: HashSet<StatusRef> =
        reserve_all(&mut store(&url), (0..100).map(|index| format!("k-{index}")))
            .into_iter()
            .collect();
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|index| {
            let (url, barrier) = (url.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut store = store(&url);
                let owner = worker(&format!("relay-{index}"));
                let mut mine = Vec::new();
                barrier.wait();
                loop {
                    let batch = store.claim_due(&owner, &stand_in(), at(1), lease(300), 7).unwrap();
                    assert_eq!(batch.skipped, 0);
                    if batch.claimed.is_empty() {
                        return mine;
                    }
                    for Claimed { attempt, reclaimed, operation } in batch.claimed {
                        assert_eq!((attempt, reclaimed), (1, false));
                        assert_eq!(operation.outbox.lease_owner.as_ref(), Some(&owner));
                        // The batch answers each operation exactly as a read now returns it.
                        let read = store.operation_by_status_ref(&operation.intent.status_ref);
                        assert_eq!(read.unwrap().as_ref(), Some(&operation));
                        mine.push(operation.intent.status_ref);
                    }
                }
            })
        })
        .collect();
    let batches: Vec<Vec<StatusRef>> =
        threads.into_iter().map(|thread| thread.join().unwrap()).collect();
    let (first, second): (HashSet<_>, HashSet<_>) =
        (batches[0].iter().cloned().collect(), batches[1].iter().cloned().collect());
    assert_eq!(first.len() + second.len(), 100, "an event was claimed twice");
    assert!(first.is_disjoint(&second));
    assert_eq!(first.union(&second).cloned().collect::<HashSet<_>>(), all);
    let mut client = raw(&url);
    assert_eq!(
        count(&mut client, "SELECT sum(value)::bigint FROM counters WHERE name = 'claims'"),
        100
    );
    assert_eq!(count(&mut client, "SELECT count(*) FROM outbox WHERE state = 'processing'"), 100);
    assert_audit_passes(&mut store(&url));
}

#[test]
fn an_expired_lease_is_reclaimed_and_the_old_owner_is_fenced() {
    let url = fresh("reclaim");
    let mut store = store(&url);
    let (new, call) = intent("k-1");
    store.reserve(&new, &call, at(0)).unwrap();
    let status_ref = sr(&new);
    let (a, b) = (worker("worker-a"), worker("worker-b"));
    let Claim::Claimed(claimed) = store.claim(&status_ref, &a, at(1), lease(30)).unwrap() else {
        panic!("a claims");
    };
    let Claimed { attempt: 1, reclaimed: false, operation } = *claimed else {
        panic!("a claims");
    };
    assert_eq!(operation.outbox.lease_until, Some(at(31).get()));
    assert_eq!(store.claim(&status_ref, &b, at(30), lease(30)).unwrap(), Claim::LeaseHeld);
    assert_eq!(store.heartbeat(&b, at(30), lease(30)).unwrap(), 0);
    let Claim::Claimed(claimed) = store.claim(&status_ref, &b, at(31), lease(30)).unwrap() else {
        panic!("b reclaims the ended lease");
    };
    let Claimed { attempt: 2, reclaimed: true, .. } = *claimed else {
        panic!("b reclaims the ended lease");
    };
    // a's heartbeat does not extend b's lease.
    assert_eq!(store.heartbeat(&a, at(32), lease(60)).unwrap(), 0);
    assert_eq!(store.heartbeat(&b, at(32), lease(60)).unwrap(), 1);

    let (downstream, local) = receipts(&new);
    assert_eq!(store.record_downstream_receipt(&downstream, at(33)).unwrap(), downstream);
    assert_eq!(store.record_downstream_receipt(&downstream, at(34)).unwrap(), downstream);
    assert_eq!(
        store.downstream_receipt(&downstream.downstream_request_ref).unwrap().as_ref(),
        Some(&downstream)
    );
    let old = Finalizer::Lease(Lease { owner: a.clone(), attempt: 1 });
    assert_eq!(
        store.end(&status_ref, &old, &Ending::Succeeded(&local), at(35)).unwrap(),
        Finalize::LeaseLost
    );
    let current = Finalizer::Lease(Lease { owner: b.clone(), attempt: 2 });
    assert_eq!(
        store.end(&status_ref, &current, &Ending::Succeeded(&local), at(36)).unwrap(),
        Finalize::Finalized
    );
    assert_eq!(
        store.end(&status_ref, &current, &Ending::Succeeded(&local), at(37)).unwrap(),
        Finalize::AlreadyFinal
    );
    assert_eq!(
        store
            .end(&status_ref, &Finalizer::StatusQuery, &Ending::Succeeded(&local), at(38))
            .unwrap(),
        Finalize::AlreadyFinal
    );
    assert_eq!(store.claim(&status_ref, &a, at(99), lease(30)).unwrap(), Claim::Final);

    let operation = store.operation_by_status_ref(&status_ref).unwrap().unwrap();
    assert_eq!(operation.status, OperationStatus::Succeeded);
    assert_eq!(operation.outbox.state, "delivered");
    assert_eq!(operation.receipt.as_ref(), Some(&local));
    let figures = store.figures(at(40)).unwrap();
    assert_eq!((figures.attempts, figures.lease_reclaims, figures.fenced_writes), (2, 1, 1));
    assert_audit_passes(&mut store);
}

#[test]
fn a_status_query_settles_an_unknown_outcome_with_the_receipt() {
    let url = fresh("status_query");
    let mut store = store(&url);
    let (new, call) = intent("k-1");
    store.reserve_claimed(&new, &call, at(0), &worker("gone"), lease(30)).unwrap();
    let (downstream, local) = receipts(&new);
    store.record_downstream_receipt(&downstream, at(1)).unwrap();
    assert_eq!(
        store.audit().unwrap().unreconciled_downstream_receipts,
        [downstream.receipt_ref.to_string()]
    );
    assert_eq!(
        store.finalize_many(&[(sr(&new), Finalizer::StatusQuery, local)], at(2)).unwrap(),
        [Finalize::Finalized]
    );
    assert_eq!(store.figures(at(3)).unwrap().reconciliations, 1);
    assert!(store.audit().unwrap().unreconciled_downstream_receipts.is_empty());
    assert_audit_passes(&mut store);
}

#[test]
fn releases_refusals_and_quarantines_end_where_sqlite_ends_them() {
    let url = fresh("endings");
    let mut store = store(&url);
    let refs = reserve_all(&mut store, ["k-1", "k-2", "k-3"].map(str::to_owned));
    let owner = worker("relay");
    let batch = store.claim_due(&owner, &stand_in(), at(1), lease(30), 10).unwrap();
    assert_eq!(batch.claimed.len(), 3);
    let by = Finalizer::Lease(Lease { owner: owner.clone(), attempt: 1 });

    assert_eq!(
        store.end(&refs[1], &by, &Ending::Failed("refused: order closed"), at(3)).unwrap(),
        Finalize::Finalized
    );
    let failed = store.operation_by_status_ref(&refs[1]).unwrap().unwrap();
    assert_eq!(failed.status, OperationStatus::Failed);
    assert_eq!(
        failed.outcome,
        Some(TerminalOutcome::Failed { reason: "refused: order closed".to_owned() })
    );

    let kept = r#"{"broken":true}"#;
    assert_eq!(
        store
            .end(
                &refs[2],
                &by,
                &Ending::Quarantined { receipt: kept, reason: "output breaks the schema" },
                at(4)
            )
            .unwrap(),
        Finalize::Finalized
    );
    let quarantined = store.operation_by_status_ref(&refs[2]).unwrap().unwrap();
    assert_eq!(quarantined.status, OperationStatus::Quarantined);
    // Not sent: pending again, due after the backoff, with the reason.
    let retry = Release::Retry { at: at(60), reason: "connection refused" };
    assert_eq!(
        store
            .release(&refs[0], &Lease { owner: owner.clone(), attempt: 1 }, &retry, at(2))
            .unwrap(),
        Finalize::Finalized
    );
    assert_eq!(
        store
            .release(&refs[0], &Lease { owner: owner.clone(), attempt: 1 }, &retry, at(2))
            .unwrap(),
        Finalize::LeaseLost
    );
    let released = store.operation_by_status_ref(&refs[0]).unwrap().unwrap();
    assert_eq!(released.status, OperationStatus::Pending);
    assert_eq!(released.outbox.next_attempt_at, at(60).get());
    assert_eq!(released.outbox.last_reason.as_deref(), Some("connection refused"));
    assert!(
        store.claim_due(&owner, &stand_in(), at(59), lease(30), 10).unwrap().claimed.is_empty()
    );
    let again = store.claim_due(&owner, &stand_in(), at(60), lease(30), 10).unwrap();
    assert_eq!(again.claimed.len(), 1);
    assert_eq!(again.claimed[0].attempt, 2);

    // A quarantined operation is an audit finding until a person deals with it.
    let report = store.audit().unwrap();
    let failed: Vec<_> =
        report.checks.iter().filter(|(_, passed)| !passed).map(|(check, _)| *check).collect();
    assert_eq!(failed, ["operations_quarantined"]);

    let dead = Release::Dead { reason: "attempts spent" };
    assert_eq!(
        store
            .release(&refs[0], &Lease { owner: owner.clone(), attempt: 2 }, &dead, at(61))
            .unwrap(),
        Finalize::Finalized
    );
    assert_eq!(
        store.operation_by_status_ref(&refs[0]).unwrap().unwrap().status,
        OperationStatus::Dead
    );
}

#[test]
fn a_lock_held_past_the_bound_is_busy_and_nothing_is_written() {
    let url = fresh("busy");
    let status_ref = reserve_all(&mut store(&url), ["k-1".to_owned()]).remove(0);
    let mut holder = raw(&url);
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("SELECT * FROM outbox FOR UPDATE").unwrap();
    let waits = Waits { busy_timeout: Duration::from_millis(300), deadline: None };
    let mut store = PgStore::connect(&url, waits).unwrap().with_clock(StoreClock::Caller);
    let started = Instant::now();
    assert_eq!(
        store.claim(&status_ref, &worker("w"), at(1), lease(30)).unwrap_err(),
        StoreError::Busy
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    tx.rollback().unwrap();
    assert!(matches!(
        store.claim(&status_ref, &worker("w"), at(1), lease(30)).unwrap(),
        Claim::Claimed(claimed) if claimed.attempt == 1
    ));
}

#[test]
fn batches_finalizing_the_same_operations_in_opposite_orders_end_each_once() {
    let url = fresh("opposite_batches");
    let mut setup = store(&url);
    let keys: Vec<String> = (0..30).map(|index| format!("k-{index}")).collect();
    reserve_all(&mut setup, keys.clone());
    let items: Vec<_> = keys
        .iter()
        .map(|key| {
            let (new, _) = intent(key);
            let (downstream, local) = receipts(&new);
            (sr(&new), downstream, local)
        })
        .collect();
    let downstream: Vec<_> = items.iter().map(|(_, downstream, _)| downstream.clone()).collect();
    assert_eq!(setup.record_downstream_receipts(&downstream, at(1)).unwrap(), downstream);
    // Again: the stored ones, nothing new.
    assert_eq!(setup.record_downstream_receipts(&downstream, at(2)).unwrap(), downstream);

    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = [false, true]
        .into_iter()
        .map(|reversed| {
            let (url, barrier) = (url.clone(), Arc::clone(&barrier));
            let mut batch: Vec<_> = items
                .iter()
                .map(|(status_ref, _, local)| {
                    (status_ref.clone(), Finalizer::StatusQuery, local.clone())
                })
                .collect();
            if reversed {
                batch.reverse();
            }
            std::thread::spawn(move || {
                let mut store = store(&url);
                barrier.wait();
                let mut answers = store.finalize_many(&batch, at(3)).unwrap();
                if reversed {
                    answers.reverse();
                }
                answers
            })
        })
        .collect();
    let answers: Vec<Vec<Finalize>> =
        threads.into_iter().map(|thread| thread.join().unwrap()).collect();
    for index in 0..items.len() {
        let finalized =
            answers.iter().filter(|answers| answers[index] == Finalize::Finalized).count();
        assert_eq!(finalized, 1, "item {index}: {answers:?}");
    }
    assert_eq!(setup.figures(at(4)).unwrap().reconciliations, 30);
    assert_audit_passes(&mut setup);
}

/// A batch's commit C answers each item as one at a time would, in order: the current
/// lease holder's finalized, a stale owner's and an old attempt's refused (and counted),
/// an operation already ended untouched.
#[test]
fn a_batch_finalize_fences_each_item_on_its_own() {
    let url = fresh("finalize_many");
    let mut store = store(&url);
    reserve_all(&mut store, (0..3).map(|index| format!("batch-{index}")));
    let owner = worker("relay-a");
    let batch = store.claim_due(&owner, &stand_in(), at(1), lease(30), 10).unwrap();
    assert_eq!(batch.claimed.len(), 3);
    let refs: Vec<StatusRef> =
        batch.claimed.iter().map(|claimed| claimed.operation.intent.status_ref.clone()).collect();
    let locals: Vec<LocalReceipt> =
        batch.claimed.iter().map(|claimed| receipts(&claimed.operation.intent).1).collect();
    let downstream: Vec<_> = locals.iter().map(|local| local.downstream.clone()).collect();
    store.record_downstream_receipts(&downstream, at(2)).unwrap();
    // The third ends first, on its own.
    let current = Finalizer::Lease(Lease { owner: owner.clone(), attempt: 1 });
    assert_eq!(
        store.end(&refs[2], &current, &Ending::Succeeded(&locals[2]), at(3)).unwrap(),
        Finalize::Finalized
    );
    let items = vec![
        (refs[0].clone(), current.clone(), locals[0].clone()),
        (
            refs[1].clone(),
            Finalizer::Lease(Lease { owner: worker("relay-b"), attempt: 1 }),
            locals[1].clone(),
        ),
        (refs[2].clone(), current.clone(), locals[2].clone()),
    ];
    assert_eq!(
        store.finalize_many(&items, at(4)).unwrap(),
        vec![Finalize::Finalized, Finalize::LeaseLost, Finalize::AlreadyFinal]
    );
    let mut client = raw(&url);
    assert_eq!(count(&mut client, "SELECT count(*) FROM local_receipts"), 2);
    assert_eq!(
        count(&mut client, "SELECT sum(value)::bigint FROM counters WHERE name = 'fenced_writes'"),
        1
    );
    assert_audit_passes(&mut store);
}
