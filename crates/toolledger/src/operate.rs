//! What an operator runs against a ledger file: list, show, requeue, retire (gc), and the
//! Prometheus text of `metrics`.

use std::fmt::Write as _;

use serde_json::{Value, json};
use toolledger_contract::{BlockCode, Identifier, StatusRef, UnixSeconds};
use toolledger_engine::Resolution;
use toolledger_store::{
    Figures, ListFilter, Listed, Operation, OperatorStore, Requeued, Resolved, TerminalOutcome,
    Waits,
};

use crate::{Error, Location, Store, StoreClock, wall_clock};

fn instant(now: Option<i64>) -> Result<UnixSeconds, Error> {
    UnixSeconds::new(now.unwrap_or_else(wall_clock))
        .map_err(|_| Error::invalid("the instant is out of range".to_owned()))
}

/// The ledger at `location`, never created. An explicit instant is a simulated clock:
/// a PostgreSQL ledger then judges by it instead of the database's clock.
fn existing(location: impl Into<Location>, now: Option<i64>) -> Result<Store, Error> {
    let clock = if now.is_some() { StoreClock::Caller } else { StoreClock::Database };
    Store::open_existing(&location.into(), Waits::default(), clock)
}

/// Operations by state, oldest change first, judged at `now` (default: the wall clock):
/// of one state and one tool when the filter names them, a page at a time. Each
/// [`Listed::cursor`] passed back as [`ListFilter::after`] (with the same state and tool)
/// continues right after that operation; a page is a keyset seek, so page 10,000 costs
/// what page 1 does.
///
/// # Errors
///
/// An [`Error`] when there is no store at `location` or it cannot be read; `USAGE_ERROR`
/// when `after` is not a cursor a listing of this state and tool handed out.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("list");
/// ledger.enqueue(&call)?;
/// let db = dir.join("ledger.sqlite3");
/// let now = Some(1_767_225_600);
/// let filter = toolledger::ListFilter { state: Some("pending"), limit: 10, ..Default::default() };
/// let listed = toolledger::list(&db, &filter, false, now)?;
/// assert_eq!(listed.len(), 1);
/// // The next page starts after the last operation listed: here, there is none.
/// let next = toolledger::ListFilter { after: Some(&listed[0].cursor), ..filter };
/// assert!(toolledger::list(&db, &next, false, now)?.is_empty());
/// // Only the tool's operations.
/// let other = toolledger::ListFilter { tool: Some("open_ticket"), ..filter };
/// assert!(toolledger::list(&db, &other, false, now)?.is_empty());
/// // A cursor is checked: edited, or carried to another listing, it is refused.
/// let moved = toolledger::ListFilter { after: Some(&listed[0].cursor), ..other };
/// let refused = toolledger::list(&db, &moved, false, now).unwrap_err();
/// assert_eq!(refused.code(), toolledger::ErrorCode::UsageError);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn list(
    location: impl Into<Location>,
    filter: &ListFilter<'_>,
    show_arguments: bool,
    now: Option<i64>,
) -> Result<Vec<Listed>, Error> {
    let (given, now) = (now, instant(now)?);
    Ok(existing(location, given)?.list(filter, show_arguments, now)?)
}

/// One listed operation as the JSON object `list` prints. The cursor is not in it: the
/// command line prints no pages.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("listed");
/// # ledger.enqueue(&call)?;
/// # let filter = toolledger::ListFilter::default();
/// let listed = toolledger::list(&dir.join("ledger.sqlite3"), &filter, false, Some(1_767_225_600))?;
/// assert_eq!(toolledger::listed_json(&listed[0])["state"], "pending");
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn listed_json(listed: &Listed) -> Value {
    let mut object = json!({
        "status_ref": listed.status_ref,
        "tool": listed.tool,
        "state": listed.state,
        "attempts": listed.attempts,
        "age_seconds": listed.age,
        "idle_seconds": listed.idle,
        "last_reason": listed.reason,
    });
    if let (Some(arguments), Some(members)) = (&listed.arguments, object.as_object_mut()) {
        let value = serde_json::from_str(arguments).unwrap_or(Value::Null);
        members.insert("arguments".to_owned(), value);
    }
    object
}

/// One operation's whole history as a JSON object: its state and event, attempts,
/// owner and lease, refs and digests, how it ended, and every operator action on it.
/// `None` when the ledger never had it (or retention removed it and nobody acted on it).
///
/// # Errors
///
/// An [`Error`] when there is no store or the row contradicts itself.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("show");
/// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
/// let shown = toolledger::show(&dir.join("ledger.sqlite3"), &status_ref, false)?.unwrap();
/// assert_eq!(shown["status"], "succeeded");
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn show(
    location: impl Into<Location>,
    status_ref: &StatusRef,
    show_arguments: bool,
) -> Result<Option<Value>, Error> {
    let toolledger_store::Shown { operation, log, tombstone } =
        existing(location, None)?.show(status_ref)?;
    let mut shown = match (&operation, tombstone) {
        (Some(operation), _) => history(operation),
        (None, Some(tombstone)) => json!({"status": "retired", "tombstone": tombstone}),
        (None, None) if log.is_empty() => return Ok(None),
        (None, None) => json!({"status": "retired"}),
    };
    if let Some(members) = shown.as_object_mut() {
        members.insert("status_ref".to_owned(), json!(status_ref.as_str()));
        members.insert("operator_log".to_owned(), Value::Array(log));
        if show_arguments {
            if let Some(operation) = &operation {
                members.insert("arguments".to_owned(), operation.intent.arguments.clone());
            }
        }
    }
    Ok(Some(shown))
}

fn history(operation: &Operation) -> Value {
    let intent = &operation.intent;
    let ended = match &operation.outcome {
        Some(TerminalOutcome::Failed { reason }) => json!({"kind": "failed", "reason": reason}),
        Some(TerminalOutcome::Quarantined { reason, receipt }) => {
            json!({"kind": "quarantined", "reason": reason, "receipt": receipt})
        }
        None => Value::Null,
    };
    json!({
        "tool": intent.scope.tool_name,
        "status": operation.status.as_str(),
        "created_at": operation.created_at,
        "request_sha256": intent.request_sha256.as_str(),
        "downstream_request_ref": operation.downstream_request_ref.as_str(),
        "downstream": intent.downstream.to_string(),
        "revisions": intent.revisions.to_json(),
        "approval_id": intent.approval.as_ref().map(|approval| approval.approval_id.as_str()),
        "outbox": {
            "state": operation.outbox.state.as_str(),
            "attempts": operation.outbox.attempt_count,
            "attempts_before_requeue": operation.outbox.attempts_before,
            "lease_owner": operation.outbox.lease_owner.as_ref().map(Identifier::as_str),
            "lease_until": operation.outbox.lease_until,
            "next_attempt_at": operation.outbox.next_attempt_at,
            "last_reason": operation.outbox.last_reason,
        },
        "receipt": operation.receipt.as_ref().map(|receipt| json!({
            "receipt_ref": receipt.downstream.receipt_ref.as_str(),
            "result_sha256": receipt.result_sha256.as_str(),
        })),
        "ended": ended,
    })
}

/// The longest reason an operator action keeps, in bytes.
///
/// ```
/// let longest = "x".repeat(toolledger::REASON_BYTES_MAX);
/// assert!(toolledger::operator_reason(&longest).is_some());
/// ```
pub const REASON_BYTES_MAX: usize = toolledger_store::REASON_BYTES_MAX;

/// An operator's reason as it is kept: trimmed, 1 to [`REASON_BYTES_MAX`] bytes, and no
/// control character (a NUL, a newline, an escape). Anything else is refused, never
/// shortened or cleaned: the operator log keeps exactly what was said.
///
/// ```
/// assert_eq!(toolledger::operator_reason("  the API is back "), Some("the API is back"));
/// assert_eq!(toolledger::operator_reason(&"x".repeat(513)), None);
/// assert_eq!(toolledger::operator_reason("a\u{0}b"), None);
/// assert_eq!(toolledger::operator_reason(" "), None);
/// ```
pub fn operator_reason(reason: &str) -> Option<&str> {
    let reason = reason.trim();
    let fits = (1..=REASON_BYTES_MAX).contains(&reason.len());
    (fits && !reason.chars().any(char::is_control)).then_some(reason)
}

/// `reason` as [`operator_reason`] keeps it, or the `USAGE_ERROR` that says why not.
pub(crate) fn kept_reason(reason: &str) -> Result<&str, Error> {
    operator_reason(reason).ok_or_else(|| {
        Error::invalid(format!(
            "the reason must be 1 to {REASON_BYTES_MAX} bytes of text without control characters"
        ))
    })
}

/// Puts a dead or failed operation back to pending with a fresh attempt budget, logging
/// `reason` in the append-only operator log.
///
/// # Errors
///
/// An [`Error`] when there is no store or it cannot be written; `USAGE_ERROR`, before
/// the store is opened, when `reason` is not one [`operator_reason`] keeps.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("requeue");
/// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
/// // A succeeded operation is not requeued.
/// let answer = toolledger::requeue(&dir.join("ledger.sqlite3"), &status_ref, "retry it", None)?;
/// assert!(matches!(answer, toolledger::Requeued::Refused(_)));
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn requeue(
    location: impl Into<Location>,
    status_ref: &StatusRef,
    reason: &str,
    now: Option<i64>,
) -> Result<Requeued, Error> {
    let reason = kept_reason(reason)?;
    let (given, now) = (now, instant(now)?);
    Ok(existing(location, given)?.requeue(status_ref, reason, now)?)
}

/// Retires every finished operation unchanged for `older_than_days` days: a tombstone
/// each, its rows removed; a reused key then answers `KEY_RETIRED`. The number retired.
///
/// # Errors
///
/// An [`Error`] when there is no store or it cannot be written.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("gc");
/// ledger.dispatch(&call)?;
/// let retired = toolledger::gc(&dir.join("ledger.sqlite3"), 30, Some(1_767_225_600 + 31 * 86_400))?;
/// assert_eq!(retired, 1);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn gc(
    location: impl Into<Location>,
    older_than_days: i64,
    now: Option<i64>,
) -> Result<usize, Error> {
    let (given, now) = (now, instant(now)?);
    let cutoff = UnixSeconds::new(
        now.get().saturating_sub(older_than_days.max(0).saturating_mul(86_400)).max(0),
    )
    .map_err(|_| Error::invalid("the cutoff is out of range".to_owned()))?;
    let mut store = existing(location, given)?;
    let mut total = 0;
    loop {
        let retired = store.retire(cutoff, now, 1000)?;
        total += retired;
        if retired == 0 {
            return Ok(total);
        }
    }
}

/// The ledger's figures in the Prometheus text exposition format, version 0.0.4.
///
/// # Errors
///
/// An [`Error`] when there is no store or it cannot be read.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("metrics");
/// ledger.enqueue(&call)?;
/// let text = toolledger::metrics(&dir.join("ledger.sqlite3"), Some(1_767_225_660))?;
/// assert!(text.contains("toolledger_operations{state=\"pending\"} 1\n"));
/// assert!(text.contains("toolledger_oldest_pending_age_seconds 60\n"));
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn metrics(location: impl Into<Location>, now: Option<i64>) -> Result<String, Error> {
    let (given, now) = (now, instant(now)?);
    Ok(exposition(&existing(location, given)?.figures(now)?))
}

/// The ledger's figures, judged at `now` (default: the wall clock): what `metrics`
/// prints, as values (a dashboard's overview).
///
/// # Errors
///
/// An [`Error`] when there is no store or it cannot be read.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("figures");
/// ledger.enqueue(&call)?;
/// let figures = toolledger::figures(&dir.join("ledger.sqlite3"), Some(1_767_225_660))?;
/// assert_eq!(figures.by_state[0], ("pending", 1));
/// assert_eq!(figures.oldest_pending_age, 60);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn figures(location: impl Into<Location>, now: Option<i64>) -> Result<Figures, Error> {
    let (given, now) = (now, instant(now)?);
    Ok(existing(location, given)?.figures(now)?)
}

/// The outbox state each operation state goes with (invariant 2).
pub(crate) fn event_state(state: &str) -> &str {
    match state {
        "succeeded" => "delivered",
        "unknown" => "processing_lease_ended",
        other => other,
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn exposition(figures: &Figures) -> String {
    let mut out = String::new();
    header(
        &mut out,
        "toolledger_operations",
        "gauge",
        "Operations by state; unknown is processing with an ended lease.",
    );
    for (state, count) in &figures.by_state {
        let _ = writeln!(out, "toolledger_operations{{state=\"{state}\"}} {count}");
    }
    header(
        &mut out,
        "toolledger_outbox_events",
        "gauge",
        "Outbox events by state; each moves with its operation.",
    );
    for (state, count) in &figures.by_state {
        let _ =
            writeln!(out, "toolledger_outbox_events{{state=\"{}\"}} {count}", event_state(state));
    }
    for (name, kind, help, value) in [
        (
            "toolledger_oldest_pending_age_seconds",
            "gauge",
            "Seconds since the oldest pending operation last changed.",
            figures.oldest_pending_age,
        ),
        (
            "toolledger_oldest_unknown_age_seconds",
            "gauge",
            "Seconds since the oldest unknown operation's lease ended.",
            figures.oldest_unknown_age,
        ),
        ("toolledger_dead_letters", "gauge", "Dead events awaiting an operator.", dead(figures)),
        (
            "toolledger_claims_total",
            "counter",
            "Claims made: attempts, every operation ever.",
            figures.attempts,
        ),
        (
            "toolledger_lease_reclaims_total",
            "counter",
            "Expired leases taken over by another worker.",
            figures.lease_reclaims,
        ),
        (
            "toolledger_fenced_writes_total",
            "counter",
            "Worker writes refused because their lease was taken over.",
            figures.fenced_writes,
        ),
        (
            "toolledger_reconciliations_total",
            "counter",
            "Unknown outcomes settled by a status query.",
            figures.reconciliations,
        ),
        (
            "toolledger_retired_total",
            "counter",
            "Finished operations retired by gc, each leaving a tombstone.",
            figures.tombstones,
        ),
    ] {
        header(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    out
}

pub(crate) fn dead(figures: &Figures) -> i64 {
    figures.by_state.iter().find(|(state, _)| *state == "dead").map_or(0, |(_, count)| *count)
}

/// The package an operator's requeue answers, built once for every door (the command
/// line prints it, Python raises or returns from it): PASS with the operation pending
/// again, `NOT_FOUND`, or `NOT_REQUEUEABLE` with the state that refused it.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("requeue-package");
/// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
/// let answer = toolledger::requeue(&dir.join("ledger.sqlite3"), &status_ref, "retry it", None)?;
/// let package = toolledger::requeue_package(&status_ref, &answer);
/// assert_eq!((package["code"].as_str(), package["status"].as_str()), (Some("NOT_REQUEUEABLE"), Some("succeeded")));
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn requeue_package(status_ref: &StatusRef, requeued: &Requeued) -> Value {
    match requeued {
        Requeued::Requeued => json!({"gate": "PASS", "code": "OK",
            "requeued": status_ref.as_str(), "status": "pending"}),
        Requeued::Missing => crate::Reply::not_found().package().clone(),
        Requeued::Refused(status) => json!({"gate": "BLOCK",
            "code": BlockCode::NotRequeueable.as_str(), "status": status.as_str(),
            "status_ref": status_ref.as_str(), "message": BlockCode::NotRequeueable.message()}),
    }
}

/// The package an operator's resolve answers, built once for every door: PASS with
/// the status it ended in, or BLOCK with the code of the contract's one table
/// (`NOT_FOUND`, `NOT_RESOLVABLE`, `LEASE_HELD`, `INPUT_INVALID`, `CONTRACT_DRIFT`)
/// and a sentence that never echoes the evidence.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("resolve-package");
/// use toolledger::{Evidence, Resolution, Resolved};
/// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
/// let ended = ledger.resolve(&status_ref, &Evidence::NotHappened, "not in the bank", None)?;
/// let package = toolledger::resolve_package(&status_ref, &ended);
/// assert_eq!((package["gate"].as_str(), package["code"].as_str()), (Some("BLOCK"), Some("NOT_RESOLVABLE")));
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn resolve_package(status_ref: &StatusRef, resolution: &Resolution) -> Value {
    let block = |code: BlockCode, message: String, extra: Value| {
        let mut package = json!({"gate": "BLOCK", "code": code.as_str(), "message": message,
            "status_ref": status_ref.as_str()});
        if let (Some(members), Value::Object(extra)) = (package.as_object_mut(), extra) {
            members.extend(extra);
        }
        package
    };
    match resolution {
        Resolution::Store(Resolved::Resolved(status)) => json!({"gate": "PASS", "code": "OK",
            "resolved": status_ref.as_str(), "status": status.as_str()}),
        Resolution::Store(Resolved::Missing) => crate::Reply::not_found().package().clone(),
        Resolution::Store(Resolved::Refused(status)) => block(
            BlockCode::NotResolvable,
            BlockCode::NotResolvable.message().to_owned(),
            json!({"status": status.as_str()}),
        ),
        Resolution::Store(Resolved::Leased(until)) => block(
            BlockCode::LeaseHeld,
            format!(
                "{}: its call may be in flight; resolve it after the lease ends",
                BlockCode::LeaseHeld.message()
            ),
            json!({"status": "processing", "lease_until": until}),
        ),
        Resolution::OutputInvalid(why) => block(
            BlockCode::InputInvalid,
            format!(
                "the receipt does not keep the tool's output contract ({why}); nothing was written"
            ),
            json!({}),
        ),
        Resolution::ContractDrift => block(
            BlockCode::ContractDrift,
            BlockCode::ContractDrift.message().to_owned(),
            json!({}),
        ),
    }
}
