//! What an operator asks of a ledger and does to it: list operations by state, show one
//! operation's whole history, requeue a dead or failed one (logged), retire old finished
//! ones (tombstoned), and the figures `metrics` exposes.

use serde_json::Value;
use toolledger_contract::StatusRef;

use crate::{Now, Operation, OperationStatus, StoreError, TerminalOutcome};

/// The states `list` and `metrics` know. `unknown` is a processing operation whose lease
/// has ended: its worker is gone and the outcome is not known until a status query or a
/// relay settles it; `processing` is one whose lease is live.
pub const STATES: [&str; 7] =
    ["pending", "processing", "unknown", "succeeded", "failed", "quarantined", "dead"];

/// Which operations `list` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListFilter<'a> {
    /// One of [`STATES`]; `None` for all.
    pub state: Option<&'a str>,
    /// Only operations unchanged since at least this many seconds.
    pub older_than: i64,
    /// At most this many (1–10,000).
    pub limit: usize,
}

/// One line of `list`: opaque refs, ages, reasons; arguments only when asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// `sr_…`.
    pub status_ref: String,
    /// The tool.
    pub tool: String,
    /// One of [`STATES`].
    pub state: &'static str,
    /// Claims so far.
    pub attempts: i64,
    /// Seconds since it was accepted.
    pub age: i64,
    /// Seconds since it last changed.
    pub idle: i64,
    /// The last reason: a refusal, a broken contract, a request not sent.
    pub reason: Option<String>,
    /// The arguments, canonical JSON (only with `show_arguments`).
    pub arguments: Option<String>,
}

/// The figures `metrics` exposes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Figures {
    /// Operations by [`STATES`], in that order.
    pub by_state: Vec<(&'static str, i64)>,
    /// Seconds since the oldest pending operation last changed (0 when none).
    pub oldest_pending_age: i64,
    /// Seconds since the oldest unknown operation's lease ended (0 when none).
    pub oldest_unknown_age: i64,
    /// Claims made, ever (retired operations' included).
    pub attempts: i64,
    /// Expired leases taken over by another worker.
    pub lease_reclaims: i64,
    /// Worker writes refused because their lease was taken over.
    pub fenced_writes: i64,
    /// Status queries that settled an unknown outcome with a receipt.
    pub reconciliations: i64,
    /// Operations retired by retention, ever.
    pub tombstones: i64,
}

/// One operation's history, as `show` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// The operation, verified; `None` when it is not (or no longer) in the ledger.
    pub operation: Option<Operation>,
    /// Every operator action on its ref, oldest first.
    pub log: Vec<Value>,
    /// Its tombstone, when retention removed it.
    pub tombstone: Option<Value>,
}

/// What `requeue` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeued {
    /// Pending again, due now, logged.
    Requeued,
    /// No such operation.
    Missing,
    /// Not dead or failed: nothing done.
    Refused(OperationStatus),
}

/// What an operator reads of a ledger and does to it. Every statement behind it is
/// index-backed, and every write is one transaction recorded in the operator log.
pub trait OperatorStore {
    /// Operations in `filter.state` (all states, one after another, when `None`), oldest
    /// change first.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn list(
        &mut self,
        filter: &ListFilter<'_>,
        show_arguments: bool,
        now: Now,
    ) -> Result<Vec<Listed>, StoreError>;

    /// One operation's history: the operation as verified, every operator action on its
    /// ref, and its tombstone when retention removed it.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; `ContractViolation` when the row contradicts itself.
    fn show(&mut self, status_ref: &StatusRef) -> Result<Shown, StoreError>;

    /// Puts a dead or failed operation back to pending, due now, with a fresh attempt
    /// budget (the attempt count, the fencing token, keeps counting), and appends the
    /// action, the operator's reason and the reason it had ended to the operator log —
    /// one transaction. Anything else is refused and nothing is written.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn requeue(
        &mut self,
        status_ref: &StatusRef,
        reason: &str,
        now: Now,
    ) -> Result<Requeued, StoreError>;

    /// Retires finished operations (succeeded, failed, quarantined, dead) unchanged since
    /// `cutoff`: each leaves a tombstone (its status ref — a digest of its scope — its
    /// request digest and how it ended), and its rows are removed: operation, event,
    /// receipts, outcome, call identities. At most `limit` per transaction; the number
    /// retired.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; a failure rolls the transaction back whole.
    fn retire(&mut self, cutoff: Now, now: Now, limit: usize) -> Result<usize, StoreError>;

    /// The figures of `metrics`, each from an index.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn figures(&mut self, now: Now) -> Result<Figures, StoreError>;
}

/// What a requeued operation had ended with, for the operator log: a failed one's
/// refusal, a dead one's last reason; any other status may not be requeued and is
/// answered back.
///
/// # Errors
///
/// The operation's status when it is neither failed nor dead.
pub fn requeue_reason(operation: &Operation) -> Result<String, OperationStatus> {
    match (&operation.status, &operation.outcome) {
        (OperationStatus::Failed, Some(TerminalOutcome::Failed { reason })) => Ok(reason.clone()),
        (OperationStatus::Dead, _) => {
            Ok(operation.outbox.last_reason.clone().unwrap_or_else(|| "no reason given".to_owned()))
        }
        (status, _) => Err(*status),
    }
}

/// A reason as stored: 1–512 bytes, trimmed, cut at a character boundary; an empty one
/// says so.
pub fn bounded_reason(reason: &str) -> String {
    let reason = reason.trim();
    if reason.is_empty() {
        return "no reason given".to_owned();
    }
    let mut end = reason.len().min(512);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.get(..end).unwrap_or_default().to_owned()
}
