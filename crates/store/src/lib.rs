//! The durable ledger: where toolledger's facts live.
//!
//! This crate is the engine↔store boundary and holds no database driver: [`LedgerStore`]
//! (the commit points), [`OperatorStore`] (what an operator reads and does), the model
//! they speak, the verification every read applies to a decoded row, and the audit's
//! invariants. It writes every statement the backends run and renders each for a
//! [`Dialect`](driver::Dialect), SQLite's or PostgreSQL's, but runs none itself. The
//! simulated downstream's own storage is not part of it: the engine's
//! `StandInReceipts` writes its receipts through this crate's driver seam.
//! `toolledger-store-sqlite` (the embedded default) and `toolledger-store-postgres`
//! implement it. Every store implements the transactions of `docs/schema.md`, each commit
//! point in one transaction of the backend's own kind (`toolledger-store-sqlite` begins
//! it with `BEGIN IMMEDIATE`, `toolledger-store-postgres` runs it at `READ COMMITTED`
//! with row locks):
//!
//! - **A** [`reserve`](LedgerStore::reserve): operation + outbox event + call identity in
//!   one transaction; an existing scope is returned for the caller to compare;
//!   [`reserve_claimed`](LedgerStore::reserve_claimed) also leases the new event to the
//!   dispatcher that will work it (A and the claim in one commit);
//! - **claim** [`claim`](LedgerStore::claim): pending, or processing with an expired
//!   lease, becomes processing under a new owner and attempt;
//! - **B** ([`ledger::RecordReceipts`]): the offline downstream stand-in's own commit,
//!   idempotent on `downstream_request_ref`, run by the engine's stand-in (a real
//!   downstream commits on its own side);
//! - **C** [`end`](LedgerStore::end), whichever way the operation ends: local receipt +
//!   operation succeeded + outbox delivered, or the operation and its event failed (with
//!   the refusal's reason) or quarantined (with the receipt and the rule it broke), in
//!   one transaction, by the current lease holder, a status query or an operator
//!   settling it by hand.
//!
//! Every read re-verifies what it returns (canonical JSON, recomputed digests) and
//! answers `STORE_CONTRACT_VIOLATION` on any difference. The store reads no wall clock:
//! every instant a write records or judges is handed in as a [`Now`] (a backend's
//! [`Db::now`](driver::Db::now) may put the database's clock in its place); [`Waits`]
//! reads the monotonic clock only to bound a wait. `docs/schema.md` documents the tables,
//! invariants and state machine.
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

/// [`OPERATION_COLUMNS`] as a literal, for statements built with `concat!`.
macro_rules! operation_columns {
    () => {
        "o.tenant_id, o.subject_id, o.tool_name, o.idempotency_key, o.status_ref, \
         o.downstream_request_ref, o.request_sha256, o.arguments_json, o.input_revision, o.output_revision, \
         o.effect_revision, o.handler_revision, o.producer_revision, o.policy_revision, o.provider, o.api_family, \
         o.adapter_revision, o.provider_response_id, o.provider_call_id, o.operation_id, o.approval_id, \
         o.approver_id, o.approval_sha256, o.approved_at, o.approval_expires_at, o.status, o.created_at, \
         b.state, b.lease_owner, b.lease_until, b.attempt_count, \
         l.receipt_ref, l.receipt_json, l.output_json, l.result_sha256, l.downstream_request_ref, l.finalized_by, \
         o.downstream_name, o.downstream_revision, t.kind, t.reason, t.receipt_json, t.finalized_by, \
         b.next_attempt_at, b.last_reason, b.attempts_before"
    };
}

/// [`OPERATION_FROM`] as a literal, for statements built with `concat!`.
macro_rules! operation_from {
    () => {
        "FROM operations o LEFT JOIN outbox b ON b.op_id = o.id \
         LEFT JOIN local_receipts l ON l.op_id = o.id LEFT JOIN terminal_outcomes t ON t.op_id = o.id"
    };
}

pub mod actions;
pub mod audit;
pub mod crash;
pub mod ddl;
pub mod driver;
mod error;
pub mod ledger;
mod model;
mod operator;
pub mod verify;
mod waits;

use toolledger_contract::{DownstreamIdentity, Identifier, LeaseSeconds, Scope, StatusRef};

pub use crate::{
    error::{Cause, FailureKind, StoreError},
    model::{
        AuditFinding, AuditReport, CallIdentity, Claim, Claimed, ClaimedBatch, DispatchLookup,
        DownstreamReceipt, Ending, Finalize, Finalizer, Lease, LocalReceipt, NewOperation, Now,
        Operation, OperationStatus, OutboxEvent, OutboxState, RecordedCall, Release, Reservation,
        TerminalOutcome, TraceRecord, not_claimed,
    },
    operator::{
        Figures, LIST_LIMIT_MAX, ListFilter, ListPosition, ListState, Listed, OperatorStore,
        REASON_BYTES_MAX, Requeued, Resolved, STATES, Settlement, Shown, bounded_reason,
        not_happened_reason, requeue_reason, resolvable,
    },
    verify::approval_binding,
    waits::{DEFAULT_BUSY_TIMEOUT_MS, Waits},
};

/// The name of the simulated downstream (the engine's `StandIn`), whose receipts live in
/// the store's `downstream_receipts` table (written by commit B, [`ledger::RecordReceipts`]).
pub const STAND_IN_NAME: &str = "toolledger-stand-in";
/// The revision of the simulated downstream.
pub const STAND_IN_REVISION: &str = "1";

/// The columns every backend reads an operation with, in the order of
/// [`verify::RawOperation`]'s fields: the operation, its outbox event, its local
/// receipt, its terminal outcome. Standard SQL, over [`OPERATION_FROM`].
pub const OPERATION_COLUMNS: &str = operation_columns!();

/// How many columns [`OPERATION_COLUMNS`] has.
pub const OPERATION_WIDTH: usize = 46;

/// The tables [`OPERATION_COLUMNS`] reads: an operation, its outbox event, its local
/// receipt, its terminal outcome. One statement, one snapshot.
pub const OPERATION_FROM: &str = operation_from!();

/// What a store keeps of the traces that asked for its operations (`trace_contexts`):
/// the facade's, beside the engine's boundary, which knows no traces.
pub trait TraceStore {
    /// Commit A as [`LedgerStore::reserve`] (or, with `claim`, as
    /// [`LedgerStore::reserve_claimed`]), keeping `trace` beside the intent in the same
    /// transaction when it writes one.
    ///
    /// # Errors
    ///
    /// As [`LedgerStore::reserve`].
    fn reserve_traced(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        claim: Option<(&Identifier, LeaseSeconds)>,
        trace: &TraceRecord,
    ) -> Result<Reservation, StoreError>;

    /// The trace context kept with the intent of `status_ref`, when its caller had one.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn trace_of(&mut self, status_ref: &StatusRef) -> Result<Option<TraceRecord>, StoreError>;
}

/// The engine↔store boundary. Every method is one transaction (or one read); none holds
/// a transaction open across calls.
pub trait LedgerStore {
    /// The operation of `scope`, verified.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; `ContractViolation` when the row contradicts itself.
    fn operation_by_scope(&mut self, scope: &Scope) -> Result<Option<Operation>, StoreError>;

    /// The operation named by `status_ref`, verified.
    ///
    /// # Errors
    ///
    /// As [`LedgerStore::operation_by_scope`].
    fn operation_by_status_ref(
        &mut self,
        status_ref: &StatusRef,
    ) -> Result<Option<Operation>, StoreError>;

    /// How `call` is recorded and the operation of `scope`, read together from one
    /// snapshot: everything dispatch needs before it decides.
    ///
    /// # Errors
    ///
    /// As [`LedgerStore::operation_by_scope`].
    fn dispatch_lookup(
        &mut self,
        scope: &Scope,
        call: &CallIdentity,
    ) -> Result<DispatchLookup, StoreError>;

    /// What is recorded of a call identity.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn recorded_call(&mut self, call: &CallIdentity) -> Result<Option<RecordedCall>, StoreError>;

    /// Commit A: reserves the scope of `intent` and records `call` with purpose
    /// `dispatch`, or writes nothing and says why.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; a failure inside the transaction rolls all of it back.
    fn reserve(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
    ) -> Result<Reservation, StoreError>;

    /// Commit A fused with the claim, for a dispatcher that works the operation itself:
    /// as [`reserve`](LedgerStore::reserve), and when the intent is new its outbox event
    /// is leased to `owner` until `now + lease` (attempt 1) in the same transaction. The
    /// reserved operation comes back `processing` under that lease; a crash right after
    /// leaves it so until the lease ends, when a worker reclaims it.
    ///
    /// # Errors
    ///
    /// As [`reserve`](LedgerStore::reserve).
    fn reserve_claimed(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        owner: &Identifier,
        lease: LeaseSeconds,
    ) -> Result<Reservation, StoreError>;

    /// Claims the outbox event of `status_ref` for `owner` until `now + lease`.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn claim(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<Claim, StoreError>;

    /// Records `call` as a status query of `status_ref`, unless the identity is already
    /// recorded: then returns what is recorded and writes nothing.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn record_status_query(
        &mut self,
        call: &CallIdentity,
        status_ref: &StatusRef,
        now: Now,
    ) -> Result<Option<RecordedCall>, StoreError>;

    /// Commit C, whichever way the operation ends ([`Ending`]): conditional on the
    /// operation not having ended and, for a worker, on it still holding the lease
    /// (owner and attempt). A succeeded ending keeps the local receipt; a refusal its
    /// reason; a quarantine the receipt and the rule it broke.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; a failure inside the transaction rolls all of it back.
    fn end(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        ending: &Ending<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError>;

    /// Commit C of several operations in one transaction (a relay's batch): each
    /// succeeded with its local receipt, as [`end`](LedgerStore::end) would, answered in
    /// order.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; a failure rolls the whole batch back (each operation stays
    /// processing under its lease, to be reclaimed).
    fn finalize_many(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError>;

    /// Gives a lease back after a request that was certainly not sent: the event is
    /// `pending` again, due at a later time, or `dead` when the tool's attempts are
    /// spent — conditional on `lease` still being held (fenced on owner and attempt).
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn release(
        &mut self,
        status_ref: &StatusRef,
        lease: &Lease,
        release: &Release<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError>;

    /// Claims up to `limit` due events of `downstream`'s operations for `owner` until
    /// `now + lease` in one transaction, oldest due first: pending ones whose time has
    /// come and processing ones whose lease has ended.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError>;

    /// Whether the scope of `status_ref` belonged to an operation retention removed.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn retired(&mut self, status_ref: &StatusRef) -> Result<bool, StoreError>;

    /// Extends every lease `owner` still holds (not yet ended at `now`) to `now + lease`.
    /// A lease that has ended, or that another worker took over, is not touched. The
    /// number extended.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn heartbeat(
        &mut self,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<usize, StoreError>;

    /// The audit of one read snapshot.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the snapshot cannot be read at all.
    fn audit(&mut self) -> Result<AuditReport, StoreError>;
}
