//! Failures after commit A: once an intent is accepted in a call, no later failure of
//! the store, the resolver or the downstream may be answered as an error ("nothing
//! happened"). Each answers `OUTCOME_UNKNOWN` with the operation's `status_ref`, and the
//! public recovery path (status, then a worker past the lease) ends with exactly one
//! downstream receipt.

use crate::StoreUnderTest;
use toolledger_contract::{
    Clock, Identifier, LeaseSeconds, PrincipalResolver, Registry, ResolverError,
};
use toolledger_engine::{
    Answer, Engine, StandIn,
    drill::{Interrupt, Switch},
};

use crate::{FailurePoint, Flows};
use toolledger_conformance::{Faults, Faulty, Rule};

use crate::{Db, Roles, at, case, id};
use toolledger_store_sqlite::SqliteStore;

const NOW: i64 = 1_767_225_600;

/// A store on `db` whose calls of `method` fail: `claim` with `STORE_BUSY`, any other
/// with an I/O error.
fn failing(db: &Db, method: Option<&'static str>) -> Faulty<SqliteStore> {
    let rule = method.map_or(Rule::Clean, Rule::Method);
    Faulty::new(SqliteStore::open(db.path()).unwrap(), Faults::new(rule))
}

/// Roles that fail to resolve from the `fail_from`-th question on, as a claims file
/// that became unreadable in the middle of a call.
#[derive(Debug)]
struct FlakyRoles {
    roles: Roles,
    asked: std::cell::Cell<usize>,
    fail_from: usize,
}

impl PrincipalResolver for FlakyRoles {
    fn current_roles(
        &self,
        tenant: &Identifier,
        subject: &Identifier,
    ) -> Result<Vec<String>, ResolverError> {
        self.asked.set(self.asked.get() + 1);
        if self.asked.get() >= self.fail_from {
            return Err(ResolverError::Unavailable);
        }
        self.roles.current_roles(tenant, subject)
    }
}

fn roles() -> Roles {
    let roles = Roles::default();
    roles.grant("tenant-a", "user-1", "support_agent");
    roles
}

fn clock(now: i64) -> Clock {
    Clock { now: at(now), lease_seconds: LeaseSeconds::new(30).unwrap() }
}

/// Asserts the answer is OUTCOME_UNKNOWN for the case's operation, then drives it to
/// its end through the public recovery path and asserts one downstream receipt.
fn unknown_then_settled(db: &Db, answer: &Answer) {
    assert_eq!(answer.code(), "OUTCOME_UNKNOWN", "{:?}", answer.package());
    let status_ref = answer.package()["status_ref"].as_str().unwrap().to_owned();
    assert!(status_ref.starts_with("sr_"));
    let mut engine = db.engine_with(roles(), Registry::builtin());
    let status = engine.status_of(&case(), &status_ref).unwrap();
    if status.code() != "OK" {
        assert_eq!(status.code(), "OUTCOME_UNKNOWN");
        // No downstream receipt yet: a worker takes it once any lease has expired.
        let worked = engine
            .process_at(&status_ref, &clock(NOW + 31), &case().business_state, &id("w2"), None)
            .unwrap();
        assert_eq!(worked.code(), "OK", "{:?}", worked.package());
    }
    let settled = engine.status_of(&case(), &status_ref).unwrap();
    assert_eq!(settled.code(), "OK");
    assert_eq!(db.count("downstream_receipts"), 1);
    assert_eq!(db.count("local_receipts"), 1);
    assert_eq!(crate::audit_sqlite(db.path()).unwrap().code(), "OK");
}

#[test]
fn a_store_error_after_commit_a_is_outcome_unknown_in_dispatch() {
    // The downstream's connection fails at commit B, or the ledger's own at commit C.
    // (Dispatch's claim is part of commit A: see the test below.)
    for (ledger, downstream) in
        [(None, Some("record_downstream_receipt")), (Some("finalize"), None)]
    {
        let db = Db::fresh();
        let ledger_store = failing(&db, ledger);
        let downstream_store = failing(&db, downstream);
        let mut engine = Engine::new(
            ledger_store,
            Interrupt::new(StandIn::new(downstream_store), Switch::default()),
            roles(),
            Registry::builtin(),
        );
        let answer = engine.dispatch_at(&case(), &id("w1"), None).unwrap();
        assert_eq!(db.count("operations"), 1, "{ledger:?} {downstream:?}");
        unknown_then_settled(&db, &answer);
    }
}

/// Dispatch takes its lease in commit A itself: a failure of that one transaction is
/// an error before anything was accepted — nothing is written, and the same call later
/// goes through as new.
#[test]
fn a_failed_commit_a_with_its_claim_is_an_error_and_writes_nothing() {
    let db = Db::fresh();
    let mut engine = Engine::new(
        failing(&db, Some("reserve_claimed")),
        Interrupt::new(StandIn::new(failing(&db, None)), Switch::default()),
        roles(),
        Registry::builtin(),
    );
    let error = engine.dispatch_at(&case(), &id("w1"), None).unwrap_err();
    assert_eq!(error.code().as_str(), "STORE_ERROR");
    assert_eq!(db.count("operations"), 0);
    assert_eq!(db.count("outbox"), 0);
    let answer = db.engine_with(roles(), Registry::builtin()).dispatch_at(&case(), &id("w1"), None);
    assert_eq!(answer.unwrap().code(), "OK");
    assert_eq!(db.count("downstream_receipts"), 1);
}

#[test]
fn a_resolver_failure_after_commit_a_is_outcome_unknown_in_dispatch() {
    // Dispatch asks for roles twice before commit A and once more as the worker.
    let db = Db::fresh();
    let resolver = FlakyRoles { roles: roles(), asked: std::cell::Cell::new(0), fail_from: 3 };
    let mut engine = Engine::new(
        SqliteStore::open(db.path()).unwrap(),
        Interrupt::new(StandIn::new(SqliteStore::open(db.path()).unwrap()), Switch::default()),
        resolver,
        Registry::builtin(),
    );
    let answer = engine.dispatch_at(&case(), &id("w1"), None).unwrap();
    unknown_then_settled(&db, &answer);
}

#[test]
fn a_failure_after_the_claim_is_outcome_unknown_in_process() {
    for (ledger, downstream, fail_from) in [
        (None, Some("record_downstream_receipt"), usize::MAX),
        (Some("finalize"), None, usize::MAX),
        (None, None, 1),
    ] {
        let db = Db::fresh();
        let accepted = db
            .engine_with(roles(), Registry::builtin())
            .dispatch_at(&case(), &id("w0"), Some(FailurePoint::AfterIntentCommit))
            .unwrap();
        let status_ref = accepted.package()["status_ref"].as_str().unwrap().to_owned();
        let resolver = FlakyRoles { roles: roles(), asked: std::cell::Cell::new(0), fail_from };
        let mut engine = Engine::new(
            failing(&db, ledger),
            Interrupt::new(StandIn::new(failing(&db, downstream)), Switch::default()),
            resolver,
            Registry::builtin(),
        );
        let answer = engine
            .process_at(&status_ref, &clock(NOW), &case().business_state, &id("w1"), None)
            .unwrap();
        unknown_then_settled(&db, &answer);
    }
}
