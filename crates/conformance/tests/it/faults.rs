//! Failures after commit A: once an intent is accepted in a call, no later failure of
//! the store, the resolver or the downstream may be answered as an error ("nothing
//! happened"). Each answers `OUTCOME_UNKNOWN` with the operation's `status_ref`, and the
//! public recovery path (status, then a worker past the lease) ends with exactly one
//! downstream receipt.

use crate::Backend;
use toolledger_contract::{
    Clock, Identifier, LeaseSeconds, PrincipalResolver, Registry, ResolverError, Scope, StatusRef,
};
use toolledger_engine::{
    Answer, Engine, StandIn,
    drill::{Interrupt, Switch},
};

use crate::{FailurePoint, Flows};
use toolledger_store::{
    AuditReport, CallIdentity, Claim, ClaimedBatch, DispatchLookup, DownstreamReceipt, Finalize,
    Finalizer, LedgerStore, LocalReceipt, NewOperation, Now, Operation, RecordedCall, Release,
    Reservation, StandInReceipts, StoreError,
};

use crate::{Db, Roles, at, case, id};
use toolledger_store_sqlite::SqliteStore;

const NOW: i64 = 1_767_225_600;

/// A store whose one named method fails: with `STORE_BUSY` for the claim (a lock held
/// past the bound), with an I/O error (a full disk) for every other method.
#[derive(Debug)]
struct Failing {
    inner: SqliteStore,
    method: Option<&'static str>,
}

impl Failing {
    fn fault(&self, method: &'static str) -> Result<(), StoreError> {
        match self.method {
            Some("claim") if method == "claim" => Err(StoreError::Busy),
            Some(failing) if failing == method => Err(StoreError::failed("sqlite", "an I/O error")),
            _ => Ok(()),
        }
    }
}

impl LedgerStore for Failing {
    fn operation_by_scope(&mut self, scope: &Scope) -> Result<Option<Operation>, StoreError> {
        self.fault("operation_by_scope")?;
        self.inner.operation_by_scope(scope)
    }

    fn operation_by_status_ref(
        &mut self,
        status_ref: &StatusRef,
    ) -> Result<Option<Operation>, StoreError> {
        self.fault("operation_by_status_ref")?;
        self.inner.operation_by_status_ref(status_ref)
    }

    fn dispatch_lookup(
        &mut self,
        scope: &Scope,
        call: &CallIdentity,
    ) -> Result<DispatchLookup, StoreError> {
        self.fault("dispatch_lookup")?;
        self.inner.dispatch_lookup(scope, call)
    }

    fn recorded_call(&mut self, call: &CallIdentity) -> Result<Option<RecordedCall>, StoreError> {
        self.fault("recorded_call")?;
        self.inner.recorded_call(call)
    }

    fn reserve(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
    ) -> Result<Reservation, StoreError> {
        self.fault("reserve")?;
        self.inner.reserve(intent, call, now)
    }

    fn reserve_claimed(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        owner: &Identifier,
        lease: LeaseSeconds,
    ) -> Result<Reservation, StoreError> {
        self.fault("reserve_claimed")?;
        self.inner.reserve_claimed(intent, call, now, owner, lease)
    }

    fn claim(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<Claim, StoreError> {
        self.fault("claim")?;
        self.inner.claim(status_ref, owner, now, lease)
    }

    fn record_status_query(
        &mut self,
        call: &CallIdentity,
        status_ref: &StatusRef,
        now: Now,
    ) -> Result<Option<RecordedCall>, StoreError> {
        self.fault("record_status_query")?;
        self.inner.record_status_query(call, status_ref, now)
    }

    fn finalize(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        receipt: &LocalReceipt,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.fault("finalize")?;
        self.inner.finalize(status_ref, by, receipt, now)
    }

    fn fail(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        reason: &str,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.fault("fail")?;
        self.inner.fail(status_ref, by, reason, now)
    }

    fn quarantine(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        receipt: &serde_json::Value,
        reason: &str,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.fault("quarantine")?;
        self.inner.quarantine(status_ref, by, receipt, reason, now)
    }

    fn release(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        attempt: i64,
        release: &Release<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.fault("release")?;
        self.inner.release(status_ref, owner, attempt, release, now)
    }

    fn claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &toolledger_contract::DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        self.fault("claim_due")?;
        self.inner.claim_due(owner, downstream, now, lease, limit)
    }

    fn finalize_many(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError> {
        self.fault("finalize")?;
        self.inner.finalize_many(items, now)
    }

    fn retired(&mut self, status_ref: &StatusRef) -> Result<bool, StoreError> {
        self.fault("retired")?;
        self.inner.retired(status_ref)
    }

    fn heartbeat(
        &mut self,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<usize, StoreError> {
        self.fault("heartbeat")?;
        self.inner.heartbeat(owner, now, lease)
    }

    fn audit(&mut self) -> Result<AuditReport, StoreError> {
        self.fault("audit")?;
        self.inner.audit()
    }
}

impl StandInReceipts for Failing {
    fn record_downstream_receipt(
        &mut self,
        receipt: &DownstreamReceipt,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError> {
        self.fault("record_downstream_receipt")?;
        self.inner.record_downstream_receipt(receipt, now)
    }

    fn downstream_receipt(
        &mut self,
        downstream_request_ref: &str,
    ) -> Result<Option<DownstreamReceipt>, StoreError> {
        self.fault("downstream_receipt")?;
        self.inner.downstream_receipt(downstream_request_ref)
    }

    fn record_downstream_receipts(
        &mut self,
        receipts: &[DownstreamReceipt],
        now: Now,
    ) -> Result<Vec<DownstreamReceipt>, StoreError> {
        self.fault("record_downstream_receipt")?;
        self.inner.record_downstream_receipts(receipts, now)
    }
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
        let ledger_store = Failing { inner: SqliteStore::open(db.path()).unwrap(), method: ledger };
        let downstream_store =
            Failing { inner: SqliteStore::open(db.path()).unwrap(), method: downstream };
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
    let failing = |method| Failing { inner: SqliteStore::open(db.path()).unwrap(), method };
    let mut engine = Engine::new(
        failing(Some("reserve_claimed")),
        Interrupt::new(StandIn::new(failing(None)), Switch::default()),
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
            Failing { inner: SqliteStore::open(db.path()).unwrap(), method: ledger },
            Interrupt::new(
                StandIn::new(Failing {
                    inner: SqliteStore::open(db.path()).unwrap(),
                    method: downstream,
                }),
                Switch::default(),
            ),
            resolver,
            Registry::builtin(),
        );
        let answer = engine
            .process_at(&status_ref, &clock(NOW), &case().business_state, &id("w1"), None)
            .unwrap();
        unknown_then_settled(&db, &answer);
    }
}
