//! A fault-injecting store: [`Faulty`] wraps any store and, as its [`Faults`] plan
//! says, fails a call before it reaches the store or lets it commit and then "crashes"
//! — the caller gets an error for a transaction that did commit, and every later call
//! of the same process fails until the test starts a new one ([`Faults::restart`]).
//!
//! Every method of [`LedgerStore`] and [`StandInReceipts`] is one transaction of the
//! store or one read, so "at any statement" means at any of them, in the order the
//! engine makes them: the Nth call of a process ([`Rule::FailCall`],
//! [`Rule::CrashAfterCall`], [`Rule::CommitUnknownCall`]) or every call of one method
//! ([`Rule::Method`]). The ledger
//! and the stand-in's storage of one engine share a plan, as they share a process.
//!
//! A plan may also carry a [`Disk`]: told before each lazy commit (a success's commit C,
//! `Durability::Lazy`) and after each synced write that answered, it keeps what a power
//! loss would leave of the ledger (the simulation's power-loss step).

use std::sync::{Arc, Mutex, PoisonError};

use toolledger_contract::{
    DownstreamIdentity, DownstreamRequestRef, Identifier, LeaseSeconds, Scope, StatusRef,
};
use toolledger_engine::StandInReceipts;
use toolledger_store::{
    AuditReport, CallIdentity, Claim, ClaimedBatch, DispatchLookup, DownstreamReceipt, Ending,
    Finalize, Finalizer, Lease, LedgerStore, LocalReceipt, NewOperation, Now, Operation,
    RecordedCall, Release, Reservation, StoreError, driver::Durability,
};

/// What a plan does to the calls it sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rule {
    /// Nothing: every call reaches the store.
    #[default]
    Clean,
    /// Every call of the named method fails before reaching the store: `claim` with
    /// `STORE_BUSY` (a lock held past the bound), any other with an I/O error (a full
    /// disk). `finalize_many` counts as `finalize` and `record_downstream_receipts` as
    /// `record_downstream_receipt`.
    Method(&'static str),
    /// The Nth call (from 1) fails before reaching the store; later calls run.
    FailCall(u64),
    /// The Nth call (from 1) runs, and then the process dies: the call and every later
    /// one answer an error.
    CrashAfterCall(u64),
    /// The Nth call (from 1) fails while committing: [`StoreError::CommitUnknown`],
    /// after it ran when the flag is true (the commit held), before it reached the
    /// store when false. The process lives on.
    CommitUnknownCall(u64, bool),
}

#[derive(Debug, Default)]
struct Plan {
    rule: Rule,
    calls: u64,
    crashed: bool,
}

/// What a simulated power loss keeps of a ledger, told of every write a [`Faulty`]
/// store makes: the state as of the last synced commit.
pub trait Disk: Send + Sync + std::fmt::Debug {
    /// A lazy commit is about to run: what is written now is what a power loss keeps,
    /// unless an earlier lazy commit is still unsynced.
    fn before_lazy(&self);

    /// A synced write answered: everything written before it is on the disk. (A write
    /// that answered but changed nothing is counted too: the power loss then keeps a
    /// little more than it could, never less.)
    fn synced(&self);
}

/// The plan shared by the stores of one simulated process, and the disk under them.
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Mutex<Plan>>, Option<Arc<dyn Disk>>);

impl Faults {
    /// A plan following `rule`.
    pub fn new(rule: Rule) -> Faults {
        let faults = Faults::default();
        faults.restart(rule);
        faults
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A plan that tells `disk` of every write, following no rule yet.
    pub fn on_disk(disk: Arc<dyn Disk>) -> Faults {
        Faults(Arc::default(), Some(disk))
    }

    /// Runs one write of `durability`, telling the disk.
    fn write<T>(
        &self,
        durability: Durability,
        call: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(disk) = &self.1 else { return call() };
        if durability == Durability::Lazy {
            disk.before_lazy();
            return call();
        }
        let result = call();
        if result.is_ok() {
            disk.synced();
        }
        result
    }

    /// A new process: no call counted, not crashed, following `rule`.
    pub fn restart(&self, rule: Rule) {
        *self.plan() = Plan { rule, calls: 0, crashed: false };
    }

    /// Whether the process has crashed.
    pub fn crashed(&self) -> bool {
        self.plan().crashed
    }

    /// The calls counted since the last restart.
    pub fn calls(&self) -> u64 {
        self.plan().calls
    }

    /// Before a call of `method`: refuses it when the process is gone or the rule fails
    /// it; otherwise says whether the process dies once it has run.
    fn before(&self, method: &'static str) -> Result<bool, StoreError> {
        let mut plan = self.plan();
        if plan.crashed {
            return Err(StoreError::failed("simulation", "the process is gone"));
        }
        plan.calls += 1;
        match plan.rule {
            Rule::Method("claim") if method == "claim" => Err(StoreError::Busy),
            Rule::Method(failing) if failing == method => {
                Err(StoreError::failed("simulation", "an I/O error"))
            }
            Rule::FailCall(n) if n == plan.calls => {
                Err(StoreError::failed("simulation", "an injected fault"))
            }
            Rule::CrashAfterCall(n) if n == plan.calls => Ok(true),
            Rule::CommitUnknownCall(n, false) if n == plan.calls => Err(in_doubt()),
            _ => Ok(false),
        }
    }

    /// Whether this call is one that commits and then answers [`in_doubt`].
    fn held_in_doubt(&self) -> bool {
        let plan = self.plan();
        matches!(plan.rule, Rule::CommitUnknownCall(n, true) if n == plan.calls)
    }

    /// After a call that was to crash its process: whatever it did stays done, and its
    /// caller never hears of it.
    fn after<T>(&self, crash: bool, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if crash {
            self.plan().crashed = true;
            return Err(StoreError::failed("simulation", "the process died"));
        }
        if self.held_in_doubt() {
            return result.and(Err(in_doubt()));
        }
        result
    }
}

/// A commit whose outcome the caller cannot know.
fn in_doubt() -> StoreError {
    StoreError::commit_unknown("simulation", StoreError::failed("simulation", "an injected fault"))
}

/// `inner` under a fault plan.
#[derive(Debug)]
pub struct Faulty<S> {
    inner: S,
    faults: Faults,
}

impl<S> Faulty<S> {
    /// `inner`, faulted as `faults` says.
    pub fn new(inner: S, faults: Faults) -> Faulty<S> {
        Faulty { inner, faults }
    }

    /// The store underneath, unfaulted.
    pub fn inner(&mut self) -> &mut S {
        &mut self.inner
    }
}

/// One faulted call: `method` names it for [`Rule::Method`]; a write names its
/// durability too, for the disk.
macro_rules! faulted {
    ($self:ident, $method:expr, $call:expr) => {{
        let crash = $self.faults.before($method)?;
        let result = $call;
        $self.faults.after(crash, result)
    }};
    ($self:ident, $method:expr, $durability:expr, $call:expr) => {{
        let crash = $self.faults.before($method)?;
        let result = $self.faults.write($durability, || $call);
        $self.faults.after(crash, result)
    }};
}

impl<S: LedgerStore> LedgerStore for Faulty<S> {
    fn operation_by_scope(&mut self, scope: &Scope) -> Result<Option<Operation>, StoreError> {
        faulted!(self, "operation_by_scope", self.inner.operation_by_scope(scope))
    }

    fn operation_by_status_ref(
        &mut self,
        status_ref: &StatusRef,
    ) -> Result<Option<Operation>, StoreError> {
        faulted!(self, "operation_by_status_ref", self.inner.operation_by_status_ref(status_ref))
    }

    fn dispatch_lookup(
        &mut self,
        scope: &Scope,
        call: &CallIdentity,
    ) -> Result<DispatchLookup, StoreError> {
        faulted!(self, "dispatch_lookup", self.inner.dispatch_lookup(scope, call))
    }

    fn recorded_call(&mut self, call: &CallIdentity) -> Result<Option<RecordedCall>, StoreError> {
        faulted!(self, "recorded_call", self.inner.recorded_call(call))
    }

    fn reserve(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
    ) -> Result<Reservation, StoreError> {
        faulted!(self, "reserve", Durability::Synced, self.inner.reserve(intent, call, now))
    }

    fn reserve_claimed(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        owner: &Identifier,
        lease: LeaseSeconds,
    ) -> Result<Reservation, StoreError> {
        faulted!(
            self,
            "reserve_claimed",
            Durability::Synced,
            self.inner.reserve_claimed(intent, call, now, owner, lease)
        )
    }

    fn claim(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<Claim, StoreError> {
        faulted!(self, "claim", Durability::Synced, self.inner.claim(status_ref, owner, now, lease))
    }

    fn record_status_query(
        &mut self,
        call: &CallIdentity,
        status_ref: &StatusRef,
        now: Now,
    ) -> Result<Option<RecordedCall>, StoreError> {
        faulted!(
            self,
            "record_status_query",
            Durability::Synced,
            self.inner.record_status_query(call, status_ref, now)
        )
    }

    fn end(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        ending: &Ending<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        // The fault points keep the names of commit C's three endings.
        let point = match ending {
            Ending::Succeeded(_) | Ending::SucceededSynced(_) => "finalize",
            Ending::Failed(_) => "fail",
            Ending::Quarantined { .. } => "quarantine",
        };
        faulted!(self, point, ending.durability(), self.inner.end(status_ref, by, ending, now))
    }

    fn finalize_many(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError> {
        faulted!(self, "finalize", Durability::Lazy, self.inner.finalize_many(items, now))
    }

    fn release(
        &mut self,
        status_ref: &StatusRef,
        lease: &Lease,
        release: &Release<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        faulted!(
            self,
            "release",
            Durability::Synced,
            self.inner.release(status_ref, lease, release, now)
        )
    }

    fn claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        faulted!(
            self,
            "claim_due",
            Durability::Synced,
            self.inner.claim_due(owner, downstream, now, lease, limit)
        )
    }

    fn retired(&mut self, status_ref: &StatusRef) -> Result<bool, StoreError> {
        faulted!(self, "retired", self.inner.retired(status_ref))
    }

    fn heartbeat(
        &mut self,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<usize, StoreError> {
        faulted!(self, "heartbeat", Durability::Synced, self.inner.heartbeat(owner, now, lease))
    }

    fn audit(&mut self) -> Result<AuditReport, StoreError> {
        faulted!(self, "audit", self.inner.audit())
    }
}

impl<S: StandInReceipts> StandInReceipts for Faulty<S> {
    fn record_downstream_receipt(
        &mut self,
        receipt: &DownstreamReceipt,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError> {
        faulted!(
            self,
            "record_downstream_receipt",
            Durability::Synced,
            self.inner.record_downstream_receipt(receipt, now)
        )
    }

    fn downstream_receipt(
        &mut self,
        downstream_request_ref: &DownstreamRequestRef,
    ) -> Result<Option<DownstreamReceipt>, StoreError> {
        faulted!(self, "downstream_receipt", self.inner.downstream_receipt(downstream_request_ref))
    }

    fn record_downstream_receipts(
        &mut self,
        receipts: &[DownstreamReceipt],
        now: Now,
    ) -> Result<Vec<DownstreamReceipt>, StoreError> {
        faulted!(
            self,
            "record_downstream_receipt",
            Durability::Synced,
            self.inner.record_downstream_receipts(receipts, now)
        )
    }
}
