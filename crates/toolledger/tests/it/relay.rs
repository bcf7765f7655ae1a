//! The relay: batches of due events drained once each; a request not sent retried after
//! a backoff and dead once the tool's attempts are spent; leases fenced by owner and
//! attempt, and kept alive by the heartbeat.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use toolledger::{
    Backoff, BlockCode, Identifier, LeaseSeconds, Ledger, NoRoles, Outcome, Relay, UnixSeconds,
    Until,
};
use toolledger_store::{Claimed, Ending, Finalize, Lease, LedgerStore, Release};
use toolledger_store_sqlite::SqliteStore;

use crate::{
    TempDir, int, text,
    tickets::{TicketService, Tickets, open_ticket, ticket_call},
};

const T0: i64 = 1_767_225_600;

/// A host ledger with `count` accepted tickets, none worked yet.
fn accepted(dir: &TempDir, service: &Arc<Mutex<TicketService>>, count: usize) {
    let ledger = Ledger::builder(dir.join("host.sqlite3"))
        .tool(open_ticket())
        .open(Tickets::new(Arc::clone(service)), NoRoles)
        .unwrap();
    for n in 0..count {
        let reply =
            ledger.enqueue(&ticket_call(&format!("k{n}"), "acme-it", "low").at(T0)).unwrap();
        assert!(matches!(reply.outcome(), Outcome::Accepted { .. }));
    }
}

fn relay(dir: &TempDir, tool: toolledger::ToolSpec) -> Relay {
    Relay::new(dir.join("host.sqlite3"))
        .tool(tool)
        .backoff(Backoff { base_seconds: 10, max_seconds: 100 })
}

fn drain(relay: &Relay, service: &Arc<Mutex<TicketService>>) -> toolledger::Drained {
    relay
        .run(
            || Ok(Tickets::new(Arc::clone(service))),
            || NoRoles,
            &Value::Null,
            Until::Drained,
            &|_| {},
        )
        .unwrap()
}

#[test]
fn a_relay_drains_every_due_event_once_with_several_workers() {
    let dir = TempDir::new("relay");
    let service = Arc::new(Mutex::new(TicketService::default()));
    accepted(&dir, &service, 40);
    let drained = drain(&relay(&dir, open_ticket()).concurrency(3).batch(7).at(T0), &service);
    assert_eq!((drained.claimed, drained.delivered), (40, 40), "{drained:?}");
    assert_eq!(service.lock().unwrap().tickets.len(), 40);
    // Nothing is due any more.
    let again = drain(&relay(&dir, open_ticket()).at(T0 + 999), &service);
    assert_eq!(again.claimed, 0);
    assert!(toolledger::audit(dir.join("host.sqlite3")).unwrap().passed());
}

#[test]
fn a_request_not_sent_is_retried_after_a_backoff_and_dead_after_its_attempts() {
    let dir = TempDir::new("relay-dead");
    let service = Arc::new(Mutex::new(TicketService::default()));
    accepted(&dir, &service, 1);
    let path = dir.join("host.sqlite3");
    service.lock().unwrap().unreachable_for = 10;
    let tool = || open_ticket().with_max_attempts(3);
    let first = drain(&relay(&dir, tool()).at(T0), &service);
    assert_eq!(first.retried, 1, "{first:?}");
    let due = int(&path, "SELECT next_attempt_at FROM outbox");
    // Attempt 1 waits 5 to 10 s (half of it jitter); not due before.
    assert!((T0 + 5..=T0 + 10).contains(&due), "{due}");
    assert_eq!(drain(&relay(&dir, tool()).at(due - 1), &service).claimed, 0);
    assert_eq!(text(&path, "SELECT last_reason FROM outbox"), "connection refused");
    let second = drain(&relay(&dir, tool()).at(due), &service);
    assert_eq!(second.retried, 1, "{second:?}");
    let due = int(&path, "SELECT next_attempt_at FROM outbox");
    let third = drain(&relay(&dir, tool()).at(due), &service);
    assert_eq!(third.dead, 1, "{third:?}");
    assert_eq!(
        (text(&path, "SELECT status FROM operations"), text(&path, "SELECT state FROM outbox")),
        ("dead".to_owned(), "dead".to_owned())
    );
    assert_eq!(int(&path, "SELECT attempt_count FROM outbox"), 3);
    assert!(service.lock().unwrap().tickets.is_empty());
    // Dead is terminal: nothing claims it, every read says so.
    assert_eq!(drain(&relay(&dir, tool()).at(T0 + 99_999), &service).claimed, 0);
    let ledger = Ledger::builder(&path)
        .tool(tool())
        .open(Tickets::new(Arc::clone(&service)), NoRoles)
        .unwrap();
    let reply = ledger.dispatch(&ticket_call("k0", "acme-it", "low").at(T0)).unwrap();
    assert!(
        matches!(reply.outcome(), Outcome::Blocked { code: BlockCode::DownstreamUnavailable, .. }),
        "{reply:?}"
    );
    assert_eq!(reply.package()["status"], "dead");
    assert!(toolledger::audit(&path).unwrap().passed());
}

fn at(seconds: i64) -> UnixSeconds {
    UnixSeconds::new(seconds).unwrap()
}

fn id(text: &str) -> Identifier {
    Identifier::new(text).unwrap()
}

/// A worker paused past its lease, while another takes the event over, can neither
/// finalize, nor give the lease back, nor renew it; the heartbeat keeps a live lease.
#[test]
fn leases_are_fenced_by_owner_and_attempt_and_kept_by_the_heartbeat() {
    let dir = TempDir::new("relay-fence");
    let service = Arc::new(Mutex::new(TicketService::default()));
    accepted(&dir, &service, 1);
    let path = dir.join("host.sqlite3");
    let identity = toolledger::DownstreamIdentity::new("acme-tickets", "2026-11").unwrap();
    let lease = LeaseSeconds::new(30).unwrap();
    let mut store = SqliteStore::open(&path).unwrap();
    let (a, b) = (id("worker-a"), id("worker-b"));

    let claimed = store.claim_due(&a, &identity, at(T0), lease, 10).unwrap();
    let Claimed { attempt: attempt_a, operation, .. } = claimed.claimed.first().cloned().unwrap();
    let status_ref = operation.intent.status_ref.clone();
    // The heartbeat keeps A's live lease: B finds nothing due at T0 + 31.
    assert_eq!(store.heartbeat(&a, at(T0 + 20), lease).unwrap(), 1);
    assert!(store.claim_due(&b, &identity, at(T0 + 31), lease, 10).unwrap().claimed.is_empty());
    // A pauses past its (renewed) lease; B takes over.
    let taken = store.claim_due(&b, &identity, at(T0 + 50), lease, 10).unwrap();
    let Claimed { attempt: attempt_b, reclaimed, .. } = taken.claimed.first().cloned().unwrap();
    assert!(reclaimed, "B took over an ended lease");
    assert_eq!((attempt_a, attempt_b), (1, 2));
    // A wakes: every write it tries is refused.
    assert_eq!(store.heartbeat(&a, at(T0 + 51), lease).unwrap(), 0);
    let retry = Release::Retry { at: at(T0 + 60), reason: "connection refused" };
    assert_eq!(
        store
            .release(
                &status_ref,
                &Lease { owner: a.clone(), attempt: attempt_a },
                &retry,
                at(T0 + 51)
            )
            .unwrap(),
        Finalize::LeaseLost
    );
    let dead = Release::Dead { reason: "connection refused" };
    assert_eq!(
        store
            .release(
                &status_ref,
                &Lease { owner: a.clone(), attempt: attempt_a },
                &dead,
                at(T0 + 51)
            )
            .unwrap(),
        Finalize::LeaseLost
    );
    assert_eq!(
        store
            .end(
                &status_ref,
                &toolledger_store::Finalizer::Lease(Lease { owner: a.clone(), attempt: attempt_a }),
                &Ending::Failed("late"),
                at(T0 + 51)
            )
            .unwrap(),
        Finalize::LeaseLost
    );
    // B's lease is intact and its own.
    assert_eq!(text(&path, "SELECT lease_owner FROM outbox"), "worker-b");
    assert_eq!(int(&path, "SELECT lease_until FROM outbox"), T0 + 80);
    assert_eq!(store.heartbeat(&b, at(T0 + 60), lease).unwrap(), 1);
    assert_eq!(
        store
            .release(
                &status_ref,
                &Lease { owner: b.clone(), attempt: attempt_b },
                &retry,
                at(T0 + 61)
            )
            .unwrap(),
        Finalize::Finalized
    );
    assert_eq!(text(&path, "SELECT state FROM outbox"), "pending");
}

/// The ticket client, saying it cannot look its requests up.
struct WithoutLookup(Tickets);

impl toolledger::Downstream for WithoutLookup {
    fn identity(&self) -> &toolledger::DownstreamIdentity {
        self.0.identity()
    }

    fn execute(
        &self,
        request: &toolledger::DownstreamRequest,
        now: toolledger::Now,
    ) -> Result<toolledger::DownstreamReceipt, toolledger::DownstreamError> {
        self.0.execute(request, now)
    }

    fn lookup(
        &self,
        _: &toolledger::DownstreamRequest,
    ) -> Result<toolledger::Lookup, toolledger::DownstreamError> {
        Err(toolledger::DownstreamError::Unknown { reason: "no lookup".to_owned() })
    }

    fn can_look_up(&self, _: &str) -> bool {
        false
    }
}

/// A relay's batch commits its successes in one lazy commit C; a success no lookup
/// could recover is left out of it and ends in a synced commit of its own. Every one
/// is delivered, once.
#[test]
fn a_relay_ends_each_success_no_lookup_could_recover_in_a_synced_commit() {
    let dir = TempDir::new("relay-no-lookup");
    let service = Arc::new(Mutex::new(TicketService::default()));
    accepted(&dir, &service, 12);
    let drained = relay(&dir, open_ticket())
        .concurrency(2)
        .batch(5)
        .at(T0)
        .run(
            || Ok(WithoutLookup(Tickets::new(Arc::clone(&service)))),
            || NoRoles,
            &Value::Null,
            Until::Drained,
            &|_| {},
        )
        .unwrap();
    assert_eq!((drained.claimed, drained.delivered, drained.unknown), (12, 12, 0), "{drained:?}");
    assert_eq!(service.lock().unwrap().tickets.len(), 12);
    let db = dir.join("host.sqlite3");
    assert_eq!(int(&db, "SELECT count(*) FROM operations WHERE status = 'succeeded'"), 12);
}
