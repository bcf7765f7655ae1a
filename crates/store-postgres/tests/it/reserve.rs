//! Commit A: reservations, replays, reused calls, and racers.

use std::sync::{Arc, Barrier};

use toolledger_contract::Purpose;
use toolledger_store::{LedgerStore, OperationStatus, Reservation, StoreError};

use crate::{
    assert_audit_passes, at, count, fresh, intent, intent_by, lease, raw, sr, store, worker,
};

#[test]
fn reserve_then_the_same_scope_exists_and_a_reused_call_is_refused() {
    let url = fresh("reserve");
    let mut store = store(&url);
    let (first, call) = intent("k-1");
    let Reservation::Reserved(reserved) = store.reserve(&first, &call, at(0)).unwrap() else {
        panic!("the first reservation reserves");
    };
    assert_eq!(reserved.status, OperationStatus::Pending);
    assert_eq!(reserved.created_at, at(0).get());
    // What a read returns is what the reservation answered.
    assert_eq!(store.operation_by_status_ref(&sr(&first)).unwrap().as_ref(), Some(&*reserved));
    assert_eq!(store.operation_by_scope(&first.scope).unwrap().as_ref(), Some(&*reserved));

    // The same scope from another model call: the stored operation, nothing written.
    let (replay, other_call) = intent_by("k-1", "call-replay");
    let Reservation::Exists(existing) = store.reserve(&replay, &other_call, at(5)).unwrap() else {
        panic!("the scope exists");
    };
    assert_eq!(existing, reserved);
    // The same call and scope again (a duplicate dispatch): exists too.
    assert!(matches!(store.reserve(&first, &call, at(6)).unwrap(), Reservation::Exists(_)));

    // The first call's identity for another scope: one model call is one intent.
    let (second, _) = intent("k-2");
    let (reused, _) = intent_by("k-2", "call-k-1");
    assert_eq!(reused.scope, second.scope);
    let Reservation::CallReused(recorded) = store.reserve(&reused, &call, at(7)).unwrap() else {
        panic!("the call is recorded for k-1");
    };
    assert_eq!(recorded.purpose, Purpose::Dispatch);
    assert_eq!(recorded.status_ref, sr(&first));
    assert!(store.operation_by_scope(&second.scope).unwrap().is_none());

    // A call recorded as a status query cannot dispatch.
    let (_, query_call) = intent_by("k-3", "call-status-query");
    assert_eq!(store.record_status_query(&query_call, &sr(&first), at(8)).unwrap(), None);
    let recorded = store.record_status_query(&query_call, &sr(&first), at(9)).unwrap().unwrap();
    assert_eq!(recorded.purpose, Purpose::QueryStatus);
    let (third, _) = intent_by("k-3", "call-status-query");
    assert_eq!(
        store.reserve(&third, &query_call, at(10)).unwrap(),
        Reservation::CallPurposeConflict
    );

    let lookup = store.dispatch_lookup(&first.scope, &call).unwrap();
    assert_eq!(lookup.operation.as_ref(), Some(&*reserved));
    assert_eq!(lookup.call.unwrap().status_ref, sr(&first));
    let lookup = store.dispatch_lookup(&second.scope, &other_call).unwrap();
    assert_eq!(lookup, toolledger_store::DispatchLookup { call: None, operation: None });

    let mut client = raw(&url);
    assert_eq!(count(&mut client, "SELECT count(*) FROM operations"), 1);
    assert_eq!(count(&mut client, "SELECT count(*) FROM call_identities"), 2);
    assert_audit_passes(&mut store);
}

#[test]
fn reserve_claimed_leases_the_new_event_in_the_same_commit() {
    let url = fresh("reserve_claimed");
    let mut store = store(&url);
    let (new, call) = intent("k-1");
    let Reservation::Reserved(reserved) =
        store.reserve_claimed(&new, &call, at(0), &worker("dispatcher"), lease(30)).unwrap()
    else {
        panic!("reserved");
    };
    assert_eq!(reserved.status, OperationStatus::Processing);
    assert_eq!(reserved.outbox.lease_until, Some(at(30).get()));
    assert_eq!(reserved.outbox.attempt_count, 1);
    assert_eq!(store.operation_by_status_ref(&sr(&new)).unwrap().as_ref(), Some(&*reserved));
    let mut client = raw(&url);
    assert_eq!(
        count(&mut client, "SELECT sum(value)::bigint FROM counters WHERE name = 'claims'"),
        1
    );
    assert_audit_passes(&mut store);
}

/// Runs `each` on `n` threads, each with its own store, started together.
fn race<T: Send + 'static>(
    url: &str,
    n: usize,
    each: impl Fn(usize, &mut toolledger_store_postgres::PgStore) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(n));
    let each = Arc::new(each);
    let threads: Vec<_> = (0..n)
        .map(|index| {
            let (url, barrier, each) = (url.to_owned(), Arc::clone(&barrier), Arc::clone(&each));
            std::thread::spawn(move || {
                let mut store = crate::store(&url);
                barrier.wait();
                each(index, &mut store)
            })
        })
        .collect();
    threads.into_iter().map(|thread| thread.join().unwrap()).collect()
}

#[test]
fn eight_racers_on_one_scope_reserve_it_once() {
    let url = fresh("race_scope");
    let answers = race(&url, 8, |index, store| {
        // Each racer is its own model call proposing the same intent.
        let (new, call) = intent_by("k-race", &format!("call-racer-{index}"));
        store.reserve(&new, &call, at(0)).unwrap()
    });
    let reserved =
        answers.iter().filter(|answer| matches!(answer, Reservation::Reserved(_))).count();
    let existing = answers.iter().filter(|answer| matches!(answer, Reservation::Exists(_))).count();
    assert_eq!((reserved, existing), (1, 7), "{answers:?}");
    let mut client = raw(&url);
    assert_eq!(count(&mut client, "SELECT count(*) FROM operations"), 1);
    assert_eq!(count(&mut client, "SELECT count(*) FROM outbox"), 1);
    assert_eq!(count(&mut client, "SELECT count(*) FROM call_identities"), 1);
    assert_audit_passes(&mut crate::store(&url));
}

#[test]
fn eight_racers_with_one_call_for_different_scopes_reserve_one() {
    let url = fresh("race_call");
    let answers = race(&url, 8, |index, store| {
        // One model call's identity, eight different scopes.
        let (new, call) = intent_by(&format!("k-{index}"), "call-shared");
        store.reserve(&new, &call, at(0)).unwrap()
    });
    let reserved =
        answers.iter().filter(|answer| matches!(answer, Reservation::Reserved(_))).count();
    let reused =
        answers.iter().filter(|answer| matches!(answer, Reservation::CallReused(_))).count();
    assert_eq!((reserved, reused), (1, 7), "{answers:?}");
    let mut client = raw(&url);
    assert_eq!(count(&mut client, "SELECT count(*) FROM operations"), 1);
    assert_eq!(count(&mut client, "SELECT count(*) FROM call_identities"), 1);
    assert_audit_passes(&mut crate::store(&url));
}

#[test]
fn a_row_holding_the_refs_under_another_scope_is_a_contract_violation() {
    let url = fresh("refs_elsewhere");
    let mut store = store(&url);
    let (first, call) = intent("k-1");
    store.reserve(&first, &call, at(0)).unwrap();
    // Someone changes the stored scope by hand: its refs no longer recompute.
    raw(&url).batch_execute("UPDATE operations SET idempotency_key = 'k-hand-edited'").unwrap();
    let (again, other) = intent_by("k-1", "call-again");
    assert!(matches!(
        store.reserve(&again, &other, at(1)).unwrap_err(),
        StoreError::ContractViolation(_)
    ));
}
