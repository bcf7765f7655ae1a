//! The values that cross the engine↔store boundary. None of them is a database driver's type.

use serde_json::Value;
use toolledger_contract::{
    Approval, DownstreamIdentity, DownstreamRequestRef, Identifier, ProviderProfile, Purpose,
    ReceiptRef, Revisions, Scope, Sha256Hex, StatusRef, UnixSeconds,
    digest::short_ref_of_canonical,
};

use crate::{StoreError, driver::Durability};

/// An operation's place in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationStatus {
    /// Accepted at commit A; no worker has claimed it.
    Pending,
    /// A worker claimed it; the side effect may or may not have happened.
    Processing,
    /// Commit C: a local receipt exists.
    Succeeded,
    /// The downstream refused the request definitively: nothing happened. Terminal.
    Failed,
    /// The downstream's receipt broke the output contract after the effect: kept for
    /// review. Terminal.
    Quarantined,
    /// Every attempt the tool allows was made and none was sent: nothing happened.
    /// Terminal until an operator requeues it.
    Dead,
}

impl OperationStatus {
    /// `pending`, `processing`, `succeeded`, `failed`, `quarantined` or `dead`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationStatus::Pending => "pending",
            OperationStatus::Processing => "processing",
            OperationStatus::Succeeded => "succeeded",
            OperationStatus::Failed => "failed",
            OperationStatus::Quarantined => "quarantined",
            OperationStatus::Dead => "dead",
        }
    }

    /// The status stored as `text`, if it is one.
    pub fn parse(text: &str) -> Option<OperationStatus> {
        match text {
            "pending" => Some(OperationStatus::Pending),
            "processing" => Some(OperationStatus::Processing),
            "succeeded" => Some(OperationStatus::Succeeded),
            "failed" => Some(OperationStatus::Failed),
            "quarantined" => Some(OperationStatus::Quarantined),
            "dead" => Some(OperationStatus::Dead),
            _ => None,
        }
    }

    /// The outbox state in step with this status (`docs/schema.md`, invariant 2).
    pub fn outbox_state(self) -> OutboxState {
        match self {
            OperationStatus::Pending => OutboxState::Pending,
            OperationStatus::Processing => OutboxState::Processing,
            OperationStatus::Succeeded => OutboxState::Delivered,
            OperationStatus::Failed => OutboxState::Failed,
            OperationStatus::Quarantined => OutboxState::Quarantined,
            OperationStatus::Dead => OutboxState::Dead,
        }
    }

    /// Whether nothing more will happen to it (without an operator): succeeded,
    /// failed, quarantined or dead.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            OperationStatus::Succeeded
                | OperationStatus::Failed
                | OperationStatus::Quarantined
                | OperationStatus::Dead
        )
    }
}

/// How an operation ended when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalOutcome {
    /// The downstream refused the request definitively.
    Failed {
        /// The downstream's reason, as it gave it (bounded, never shown to the model).
        reason: String,
    },
    /// The downstream's receipt broke the tool's output contract after the effect.
    Quarantined {
        /// Which rule the receipt broke.
        reason: String,
        /// The receipt, kept as the downstream sent it, for a person to review.
        receipt: Value,
    },
}

/// Where an operation's outbox event stands, in step with the operation's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxState {
    /// Due for a worker to claim (from `next_attempt_at`).
    Pending,
    /// Claimed under a lease.
    Processing,
    /// The effect is recorded (the operation succeeded).
    Delivered,
    /// The downstream refused it.
    Failed,
    /// Its receipt broke the output contract.
    Quarantined,
    /// Out of attempts, nothing sent.
    Dead,
}

impl OutboxState {
    /// `pending`, `processing`, `delivered`, `failed`, `quarantined` or `dead`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxState::Pending => "pending",
            OutboxState::Processing => "processing",
            OutboxState::Delivered => "delivered",
            OutboxState::Failed => "failed",
            OutboxState::Quarantined => "quarantined",
            OutboxState::Dead => "dead",
        }
    }

    /// The state stored as `text`, if it is one.
    pub fn parse(text: &str) -> Option<OutboxState> {
        [
            OutboxState::Pending,
            OutboxState::Processing,
            OutboxState::Delivered,
            OutboxState::Failed,
            OutboxState::Quarantined,
            OutboxState::Dead,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
    }

    /// Whether no worker will claim it again (without an operator): delivered, failed,
    /// quarantined or dead.
    pub fn is_final(self) -> bool {
        !matches!(self, OutboxState::Pending | OutboxState::Processing)
    }
}

/// A state equals its stored name.
impl PartialEq<&str> for OutboxState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// What a claim that updated nothing answers, from the event's state read in the same
/// transaction: a final event, or a lease still held. A pending event is always
/// claimable, so one that was not (or a state the ledger does not know) contradicts
/// the claim's own update.
///
/// # Errors
///
/// [`StoreError::ContractViolation`] for any state but a final one or `processing`.
pub fn not_claimed(state: &str) -> Result<Claim, StoreError> {
    match OutboxState::parse(state) {
        Some(state) if state.is_final() => Ok(Claim::Final),
        Some(OutboxState::Processing) => Ok(Claim::LeaseHeld),
        _ => Err(StoreError::ContractViolation("stored outbox state is unknown")),
    }
}

/// The outbox event of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// Where it stands.
    pub state: OutboxState,
    /// The worker holding (or last holding) the lease.
    pub lease_owner: Option<Identifier>,
    /// When the lease ends (a lease is live while `now < lease_until`).
    pub lease_until: Option<i64>,
    /// How many times the event was claimed.
    pub attempt_count: i64,
    /// When it is due: now or later while pending, its lease end while processing.
    pub next_attempt_at: i64,
    /// Why its last attempt was given back, or why it died.
    pub last_reason: Option<String>,
    /// Attempts made before the last requeue: a relay's attempt budget counts from here.
    pub attempts_before: i64,
}

/// The W3C trace context of the call that asked for an operation, kept beside its
/// intent (`trace_contexts`) so a later attempt or status query can link back to it. It
/// is no part of the intent: no digest covers it, and an intent is the same without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRecord {
    /// The `traceparent` value (version 00, 55 characters).
    pub traceparent: String,
    /// The `tracestate` value; empty when there is none.
    pub tracestate: String,
}

/// A new intent for commit A: everything the ledger keeps about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOperation {
    /// Tenant, subject, tool, key.
    pub scope: Scope,
    /// `sr_…` of the scope.
    pub status_ref: StatusRef,
    /// The request digest.
    pub request_sha256: Sha256Hex,
    /// The arguments, already validated against the input schema.
    pub arguments: Value,
    /// The six revisions of the registry that accepted it.
    pub revisions: Revisions,
    /// The first call's provider profile.
    pub profile: ProviderProfile,
    /// The first call's response id.
    pub provider_response_id: Identifier,
    /// The first call's call id.
    pub provider_call_id: Identifier,
    /// The host's operation id.
    pub operation_id: Identifier,
    /// The approval consumed by accepting it, when the tool's policy needed one.
    pub approval: Option<Approval>,
    /// The downstream that performs its effect: only this one may work it.
    pub downstream: DownstreamIdentity,
}

impl NewOperation {
    /// Whether `call` is the call that created this operation: its provider, API
    /// family, response id and call id. (The adapter revision is not part of a call's
    /// identity.)
    #[must_use]
    pub fn is_first_call(&self, call: &CallIdentity) -> bool {
        self.profile.provider == call.profile.provider
            && self.profile.api_family == call.profile.api_family
            && self.provider_response_id == call.provider_response_id
            && self.provider_call_id == call.provider_call_id
    }
}

/// An operation as stored, verified on the way out (canonical JSON, every digest
/// recomputed from the row's own fields), with its local receipt when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// What was accepted.
    pub intent: NewOperation,
    /// `dr_…` of the intent, recomputed.
    pub downstream_request_ref: DownstreamRequestRef,
    /// Where it is now.
    pub status: OperationStatus,
    /// Its outbox event.
    pub outbox: OutboxEvent,
    /// Its local receipt (commit C), verified against it.
    pub receipt: Option<LocalReceipt>,
    /// How it ended, when it failed or was quarantined.
    pub outcome: Option<TerminalOutcome>,
    /// When it was accepted.
    pub created_at: i64,
}

/// The outcome of commit A.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// This call reserved the scope: operation, outbox event and call identity committed.
    Reserved(Box<Operation>),
    /// The scope was already in the ledger (a racer won, or a replay): nothing was
    /// written; the caller compares intents.
    Exists(Box<Operation>),
    /// The call identity was already recorded for a status query: nothing was written.
    CallPurposeConflict,
    /// The call identity was already recorded as the dispatch of another operation:
    /// one model call is one intent. Nothing was written.
    CallReused(Box<RecordedCall>),
    /// The scope belonged to an operation that retention removed: reusing its key is a
    /// new business decision, not a replay. Nothing was written.
    Retired,
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller holds the lease.
    Claimed(Box<Claimed>),
    /// Someone else holds an unexpired lease.
    LeaseHeld,
    /// The operation has ended: delivered, failed or quarantined.
    Final,
    /// No such operation.
    Missing,
}

/// An event claimed for a worker, by [`claim`](crate::LedgerStore::claim) or in a
/// relay's batch ([`claim_due`](crate::LedgerStore::claim_due)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// `attempt_count` after the claim: the caller's fencing token for commit C.
    pub attempt: i64,
    /// Whether this took over an ended lease: an earlier attempt's outcome is unknown,
    /// and the downstream must be asked before anything is concluded.
    pub reclaimed: bool,
    /// The operation as of the claim, read and verified inside the claim's transaction:
    /// what the worker must recheck before the side effect.
    pub operation: Operation,
}

/// A worker's lease on an operation's event: who holds it and the attempt it was
/// granted at. A write under a lease is fenced on both: a lease taken over since is
/// refused (`LeaseLost`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The worker's id.
    pub owner: Identifier,
    /// The attempt it claimed.
    pub attempt: i64,
}

/// Who writes commit C.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finalizer {
    /// The worker that holds the lease: owner and attempt must still match.
    Lease(Lease),
    /// A status query, whose evidence is the downstream receipt itself: no lease needed.
    StatusQuery,
    /// An operator settling an operation by hand (`resolve`), on evidence they hold: only
    /// when no worker holds a live lease on it.
    Operator,
}

impl Finalizer {
    /// `worker`, `status_query` or `operator`, as stored.
    pub fn as_str(&self) -> &'static str {
        match self {
            Finalizer::Lease(_) => "worker",
            Finalizer::StatusQuery => "status_query",
            Finalizer::Operator => "operator",
        }
    }
}

/// The outcome of commit C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalize {
    /// The outcome written (a local receipt and `succeeded`, or a terminal outcome), the
    /// outbox event ended with it: one transaction.
    Finalized,
    /// The operation had already ended: nothing written.
    AlreadyFinal,
    /// The caller's lease was reclaimed by another worker: nothing written.
    LeaseLost,
}

/// How commit C ends an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending<'a> {
    /// It happened: the local receipt, verified against the operation and the tool's
    /// output contract. The operation succeeds (`delivered`).
    Succeeded(&'a LocalReceipt),
    /// It happened, as [`Ending::Succeeded`], on a downstream that cannot look the
    /// request up: no status query could recover a commit C a power loss took back, so
    /// this one is synced before it is answered.
    SucceededSynced(&'a LocalReceipt),
    /// The downstream refused it definitively, for this reason: nothing happened.
    Failed(&'a str),
    /// Its receipt broke the tool's output contract after the effect: kept for review.
    Quarantined {
        /// The receipt's canonical JSON text, as the downstream sent it.
        receipt: &'a str,
        /// Which rule it broke.
        reason: &'a str,
    },
}

impl Ending<'_> {
    /// The status it leaves the operation in.
    pub fn status(&self) -> OperationStatus {
        match self {
            Ending::Succeeded(_) | Ending::SucceededSynced(_) => OperationStatus::Succeeded,
            Ending::Failed(_) => OperationStatus::Failed,
            Ending::Quarantined { .. } => OperationStatus::Quarantined,
        }
    }

    /// How durable its commit C must be: lazy for a success (the downstream holds its
    /// receipt, from which a status query recovers a lost commit); a success no lookup
    /// could recover, a refusal or a quarantine is synced, since nothing outside the
    /// ledger is sure to say the same again.
    pub fn durability(&self) -> Durability {
        match self {
            Ending::Succeeded(_) => Durability::Lazy,
            Ending::SucceededSynced(_) | Ending::Failed(_) | Ending::Quarantined { .. } => {
                Durability::Synced
            }
        }
    }
}

/// How a worker gives a lease back: the request was not sent, or its attempt ended
/// without an outcome the ledger can record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release<'a> {
    /// Still `processing` (the downstream may have acted), but nobody's call is in flight
    /// any more: the answer was lost, or a recheck refused the attempt. The lease ends at
    /// `at` (a backoff) and no heartbeat renews it (`last_reason` is set, which in-flight
    /// leases never have); from then on the operation is due, and a relay takes it over and
    /// asks the downstream before anything is sent again. `list` shows it as `unknown`.
    Later {
        /// When it is due again.
        at: Now,
        /// Why the attempt ended.
        reason: &'a str,
    },
    /// Pending again, due at `at` (a backoff), with the reason it was not sent.
    Retry {
        /// When it is due again.
        at: Now,
        /// Why it was not sent.
        reason: &'a str,
    },
    /// Dead: the tool's attempts are spent; the reason is kept.
    Dead {
        /// Why the last attempt was not sent.
        reason: &'a str,
    },
}

/// What one batch claim took: each claimed event, its operation read and verified
/// inside the claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimedBatch {
    /// The claimed events, oldest due first.
    pub claimed: Vec<Claimed>,
    /// Due events left alone because their row contradicts itself.
    pub skipped: usize,
}

/// A downstream receipt as the stand-in stores it (commit B).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamReceipt {
    /// The scope the downstream is idempotent on.
    pub downstream_request_ref: DownstreamRequestRef,
    /// The request it executed.
    pub request_sha256: Sha256Hex,
    /// The receipt object (`tool-result-v2/downstream-receipt`) as its canonical JSON
    /// text: what is stored, and what `receipt_ref` is the digest of.
    pub receipt_json: String,
    /// `rc_…` of the receipt.
    pub receipt_ref: ReceiptRef,
}

impl DownstreamReceipt {
    /// The receipt of `downstream_request_ref` and `request_sha256` whose object is
    /// `receipt`: its canonical text and its ref, each made once.
    pub fn new(
        downstream_request_ref: DownstreamRequestRef,
        request_sha256: Sha256Hex,
        receipt: &Value,
    ) -> DownstreamReceipt {
        let receipt_json = toolledger_json::canonicalize(receipt);
        let receipt_ref = ReceiptRef::new(&short_ref_of_canonical("rc_", &receipt_json))
            .unwrap_or_else(|_| unreachable!("rc_ and 32 lowercase hex digits"));
        DownstreamReceipt { downstream_request_ref, request_sha256, receipt_json, receipt_ref }
    }

    /// The receipt object, read from its text (`Value::Null` for text that is not JSON,
    /// which a receipt made by [`DownstreamReceipt::new`] or read back through the
    /// store's checks never holds).
    pub fn receipt(&self) -> Value {
        serde_json::from_str(&self.receipt_json).unwrap_or(Value::Null)
    }
}

/// The local receipt of a succeeded operation (commit C), verified on the way out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReceipt {
    /// The downstream receipt it reconciles.
    pub downstream: DownstreamReceipt,
    /// The receipt's `output`.
    pub output: Value,
    /// `result_sha256` of the output.
    pub result_sha256: Sha256Hex,
}

/// A provider call identity: whose call a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallIdentity {
    /// Provider, API family, adapter revision.
    pub profile: ProviderProfile,
    /// Response id.
    pub provider_response_id: Identifier,
    /// Call id.
    pub provider_call_id: Identifier,
}

/// What is recorded of a call identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// Dispatch or status query.
    pub purpose: Purpose,
    /// The operation it belongs to.
    pub status_ref: StatusRef,
    /// That operation's tenant.
    pub tenant_id: Identifier,
    /// That operation's subject.
    pub subject_id: Identifier,
    /// That operation's status.
    pub status: OperationStatus,
}

/// What dispatch reads before deciding, from one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchLookup {
    /// How the dispatching call's identity is recorded, if it is.
    pub call: Option<RecordedCall>,
    /// The operation of the scope, verified, if the scope is taken.
    pub operation: Option<Operation>,
}

/// One audit check's name and result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditFinding {
    /// The check that failed.
    pub check: &'static str,
    /// The row, by `sr_`/`rc_` ref only, when there is one.
    pub reference: Option<String>,
}

/// The audit of one read snapshot (`docs/schema.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditReport {
    /// Every check by name, in a fixed order, and whether it passed.
    pub checks: Vec<(&'static str, bool)>,
    /// Row counts per table; `None` when a table could not be counted (missing, or
    /// unreadable).
    pub counts: Vec<(&'static str, Option<i64>)>,
    /// `rc_` refs of downstream receipts whose operation has not succeeded yet.
    pub unreconciled_downstream_receipts: Vec<String>,
    /// `sr_` refs of the operations an operator settled by hand (`resolve`), in the
    /// order they were: not a failure, but a person's word the ledger rests on.
    pub resolved_by_operator: Vec<String>,
    /// What failed, by opaque ref.
    pub findings: Vec<AuditFinding>,
}

impl AuditReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|(_, passed)| *passed)
    }
}

/// A clock reading handed in by the caller: the store reads no clock.
pub type Now = UnixSeconds;

#[cfg(test)]
mod tests {
    use super::{Claim, OperationStatus, OutboxState, not_claimed};
    use crate::StoreError;

    const STATUSES: [OperationStatus; 6] = [
        OperationStatus::Pending,
        OperationStatus::Processing,
        OperationStatus::Succeeded,
        OperationStatus::Failed,
        OperationStatus::Quarantined,
        OperationStatus::Dead,
    ];

    #[test]
    fn every_outbox_state_reads_back_as_stored_and_pairs_with_one_status() {
        for status in STATUSES {
            let state = status.outbox_state();
            assert_eq!(OutboxState::parse(state.as_str()), Some(state));
            assert_eq!(state, state.as_str());
            assert_eq!(state.is_final(), status.is_final(), "{status:?}");
        }
        let states: std::collections::BTreeSet<&str> =
            STATUSES.iter().map(|status| status.outbox_state().as_str()).collect();
        assert_eq!(states.len(), STATUSES.len());
        assert_eq!(OutboxState::parse("Processing"), None);
    }

    #[test]
    fn a_claim_that_claimed_nothing_says_why_from_the_state() {
        assert_eq!(not_claimed("processing"), Ok(Claim::LeaseHeld));
        for state in ["delivered", "failed", "quarantined", "dead"] {
            assert_eq!(not_claimed(state), Ok(Claim::Final), "{state}");
        }
        for state in ["pending", "bogus"] {
            let refused = not_claimed(state);
            assert!(matches!(refused, Err(StoreError::ContractViolation(_))), "{state}");
        }
    }
}
