//! Multi-connection row: 8 threads with 8 connections race on one ledger. Exactly one
//! operation, one outbox event, one downstream receipt; no lock error surfaces.

use std::{
    collections::BTreeMap,
    sync::{Arc, Barrier},
    thread,
};

use serde_json::json;
use toolledger_contract::{Clock, HostCall, LeaseSeconds, Registry, StatusRef};
use toolledger_engine::Answer;

use toolledger_store::{Claim, LedgerStore};

use crate::{
    FailurePoint, Flows, Roles, StoreUnderTest, at, case, case_with, dispatch, id, status_ref_of,
};

const THREADS: usize = 8;

/// Runs `work(i, setup(i))` on `THREADS` threads, each releasing its work at the same
/// instant once every `setup` is done; the results in thread order.
fn released_together<S, T>(
    setup: impl Fn(usize) -> S + Send + Sync + 'static,
    work: impl Fn(usize, S) -> T + Send + Sync + 'static,
) -> Vec<T>
where
    T: Send + 'static,
{
    let (setup, work) = (Arc::new(setup), Arc::new(work));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|index| {
            let (setup, work, barrier) =
                (Arc::clone(&setup), Arc::clone(&work), Arc::clone(&barrier));
            thread::spawn(move || {
                let prepared = setup(index);
                barrier.wait();
                work(index, prepared)
            })
        })
        .collect();
    handles.into_iter().map(|handle| handle.join().unwrap()).collect()
}

/// Runs `cases[i]` on thread `i`, each with its own engine (and connections), all
/// released at once. Every thread opens the store itself, so creation races too.
fn race<B: StoreUnderTest>(db: &Arc<B>, cases: Vec<HostCall>) -> Vec<Answer> {
    assert_eq!(cases.len(), THREADS);
    let db = Arc::clone(db);
    released_together(
        move |index| cases[index].clone(),
        move |index, case| {
            let mut engine = db.engine_with(Roles::default(), Registry::builtin());
            engine.dispatch_at(&case, &id(&format!("worker-{index}")), None).unwrap()
        },
    )
}

fn tally(answers: &[Answer]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for answer in answers {
        let key = match answer.delivery() {
            Some(delivery) => delivery.as_str().to_owned(),
            None => answer.code().to_owned(),
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

pub(crate) fn eight_connections_reserving_one_intent_make_one_operation_and_one_side_effect<
    B: StoreUnderTest,
>() {
    let db = Arc::new(B::fresh());
    let answers = race(&db, vec![case(); THREADS]);
    let counts = tally(&answers);
    assert_eq!(counts.get("fresh"), Some(&1), "{counts:?}");
    let others: usize = counts
        .iter()
        .filter(|(key, _)| ["local_replay", "OUTCOME_UNKNOWN"].contains(&key.as_str()))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(others, THREADS - 1, "{counts:?}");
    assert_eq!(
        (
            db.count("operations"),
            db.count("outbox"),
            db.count("downstream_receipts"),
            db.count("local_receipts")
        ),
        (1, 1, 1, 1)
    );
    assert!(db.audit().passed(), "{:?}", db.audit());
}

pub(crate) fn eight_different_intents_under_one_key_one_wins_the_rest_conflict<
    B: StoreUnderTest,
>() {
    let db = Arc::new(B::fresh());
    let cases = (0..THREADS as i64)
        .map(|index| {
            case_with(|case| case.proposal.arguments["amount_minor"] = json!(2590 + index))
        })
        .collect();
    let answers = race(&db, cases);
    let counts = tally(&answers);
    assert_eq!(counts.get("fresh"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("IDEMPOTENCY_CONFLICT"), Some(&(THREADS - 1)), "{counts:?}");
    assert_eq!((db.count("operations"), db.count("downstream_receipts")), (1, 1));
}

pub(crate) fn eight_workers_claiming_one_event_get_exactly_one_owner<B: StoreUnderTest>() {
    let db = Arc::new(B::fresh());
    let status_ref =
        status_ref_of(&dispatch(&mut db.engine(), &case(), Some(FailurePoint::AfterIntentCommit)));
    let status_ref = StatusRef::new(&status_ref).unwrap();
    let opener = Arc::clone(&db);
    let claims: Vec<Claim> = released_together(
        move |_| opener.store(),
        move |index, mut store| {
            let owner = id(&format!("w{index}"));
            store
                .claim(&status_ref, &owner, at(1_767_225_600), LeaseSeconds::new(30).unwrap())
                .unwrap()
        },
    );
    assert_eq!(
        claims
            .iter()
            .filter(|claim| matches!(claim, Claim::Claimed(claimed) if claimed.attempt == 1))
            .count(),
        1,
        "{claims:?}"
    );
    assert_eq!(claims.iter().filter(|claim| **claim == Claim::LeaseHeld).count(), THREADS - 1);
    assert_eq!(db.int("SELECT attempt_count FROM outbox"), 1);
}

pub(crate) fn eight_processes_of_one_event_make_one_side_effect<B: StoreUnderTest>() {
    let db = Arc::new(B::fresh());
    let status_ref =
        status_ref_of(&dispatch(&mut db.engine(), &case(), Some(FailurePoint::AfterIntentCommit)));
    let opener = Arc::clone(&db);
    let answers: Vec<Answer> = released_together(
        move |_| opener.engine(),
        move |index, mut engine| {
            let clock =
                Clock { now: at(1_767_225_600), lease_seconds: LeaseSeconds::new(30).unwrap() };
            let worker = id(&format!("w{index}"));
            engine.process_at(&status_ref, &clock, &case().business_state, &worker, None).unwrap()
        },
    );
    let counts = tally(&answers);
    assert_eq!(counts.get("fresh"), Some(&1), "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), THREADS);
    assert!(
        counts.keys().all(|key| ["fresh", "LEASE_HELD", "local_replay"].contains(&key.as_str())),
        "{counts:?}"
    );
    assert_eq!((db.count("downstream_receipts"), db.count("local_receipts")), (1, 1));
}

pub(crate) fn a_replay_on_another_connection_sees_the_first_ones_receipt<B: StoreUnderTest>() {
    let db = Arc::new(B::fresh());
    let mut first = db.engine();
    let mut second = db.engine();
    let fresh = dispatch(&mut first, &case(), None);
    let replay = dispatch(&mut second, &case(), None);
    assert_eq!(replay.delivery().unwrap().as_str(), "local_replay");
    assert_eq!(replay.package()["result"]["model_view"], fresh.package()["result"]["model_view"]);
    assert_eq!(dispatch(&mut first, &case(), None).delivery().unwrap().as_str(), "local_replay");
}
