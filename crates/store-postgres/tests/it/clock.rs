//! Writes judged on the database's clock, whatever instant the caller hands in.

use std::time::{SystemTime, UNIX_EPOCH};

use toolledger_contract::UnixSeconds;
use toolledger_store::{Claim, Lease, LedgerStore, Release, Reservation, Waits};
use toolledger_store_postgres::{PgStore, StoreClock};

use crate::{assert_audit_passes, fresh, intent, lease, raw, sr, worker};

fn real_now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

fn close_to_real_time(seconds: i64) -> bool {
    (seconds - real_now()).abs() <= 5
}

#[test]
fn the_database_clock_stamps_and_judges_every_write() {
    let url = fresh("db_clock");
    let mut store = PgStore::connect(&url, Waits::default()).unwrap();
    assert_eq!(store.clock(), StoreClock::Database);
    // A caller whose clock is far off: 2001, then 2100.
    let past = UnixSeconds::new(1_000_000_000).unwrap();
    let future = UnixSeconds::new(4_102_444_800).unwrap();
    let (new, call) = intent("k-1");
    let Reservation::Reserved(reserved) = store.reserve(&new, &call, past).unwrap() else {
        panic!("reserved");
    };
    assert!(close_to_real_time(reserved.created_at), "{}", reserved.created_at);
    let mut client = raw(&url);
    let row = client
        .query_one(
            "SELECT o.created_at, o.updated_at, b.next_attempt_at, c.created_at FROM operations o \
             JOIN outbox b ON b.op_id = o.id JOIN call_identities c ON c.op_id = o.id",
            &[],
        )
        .unwrap();
    for column in 0..4 {
        assert!(close_to_real_time(row.get::<_, i64>(column)), "column {column}");
    }

    // A claim whose caller believes it is 2100 gets a lease from the database's now.
    let Claim::Claimed(claimed) = store.claim(&sr(&new), &worker("w"), future, lease(60)).unwrap()
    else {
        panic!("claimed");
    };
    let until = claimed.operation.outbox.lease_until.unwrap();
    assert!(close_to_real_time(until - 60), "{until}");
    // In 2100 by the caller's clock the lease would have ended; by the database's it
    // has not.
    assert_eq!(
        store.claim(&sr(&new), &worker("other"), future, lease(60)).unwrap(),
        Claim::LeaseHeld
    );

    // A retry time keeps its distance from the caller's now: 30 s from the database's.
    let retry = Release::Retry { at: UnixSeconds::new(4_102_444_830).unwrap(), reason: "busy" };
    store.release(&sr(&new), &Lease { owner: worker("w"), attempt: 1 }, &retry, future).unwrap();
    let due = store.operation_by_status_ref(&sr(&new)).unwrap().unwrap().outbox.next_attempt_at;
    assert!(close_to_real_time(due - 30), "{due}");
    assert_audit_passes(&mut store);
}

#[test]
fn the_caller_clock_keeps_the_instants_handed_in() {
    let url = fresh("caller_clock");
    let mut store =
        PgStore::connect(&url, Waits::default()).unwrap().with_clock(StoreClock::Caller);
    let past = UnixSeconds::new(1_000_000_000).unwrap();
    let (new, call) = intent("k-1");
    let Reservation::Reserved(reserved) = store.reserve(&new, &call, past).unwrap() else {
        panic!("reserved");
    };
    assert_eq!(reserved.created_at, 1_000_000_000);
    let stored: i64 = raw(&url).query_one("SELECT created_at FROM operations", &[]).unwrap().get(0);
    assert_eq!(stored, 1_000_000_000);
}

/// The operator's reads judge by the database's clock too: a host a minute behind the
/// server lists every operation the writers stamped, with ages never negative, and
/// counts what it lists (before: `list` hid what changed after the host's clock, while
/// `metrics` counted it).
#[test]
fn a_host_behind_the_database_clock_lists_what_it_counts() {
    use toolledger_store::{ListFilter, OperatorStore};
    let url = fresh("lagging_host");
    let mut store = PgStore::connect(&url, Waits::default()).unwrap();
    let behind = UnixSeconds::new(real_now() - 60).unwrap();
    for key in ["k-1", "k-2"] {
        let (new, call) = intent(key);
        store.reserve(&new, &call, behind).unwrap();
    }
    let filter = ListFilter { state: Some("pending"), ..ListFilter::default() };
    let listed = store.list(&filter, false, behind).unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|listed| listed.age >= 0 && listed.idle >= 0));
    let figures = store.figures(behind).unwrap();
    let pending = figures.by_state.iter().find(|(state, _)| *state == "pending").unwrap();
    assert_eq!(pending.1, 2);
    // An age filter judges by the database's clock: nothing is a minute old yet.
    let aged = ListFilter { older_than: 60, ..filter };
    assert!(store.list(&aged, false, behind).unwrap().is_empty());
    assert_audit_passes(&mut store);
}
