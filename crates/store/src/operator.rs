//! What an operator asks of a ledger and does to it: list operations by state, show one
//! operation's whole history, requeue a dead or failed one (logged), settle one whose
//! outcome is unknown by hand (logged), retire old finished ones (tombstoned), and the
//! figures `metrics` exposes.

use serde_json::Value;
use toolledger_contract::{StatusRef, UnixSeconds};

use crate::{LocalReceipt, Now, Operation, OperationStatus, StoreError, TerminalOutcome};

/// The states `list` and `metrics` know. `unknown` is a processing operation nobody is
/// working: its lease has ended (its worker is gone), or its attempt ended without an
/// outcome and was set aside until a backoff ends (the answer was lost, a recheck refused
/// it; its reason is kept). The outcome is not known until a status query or a relay
/// settles it. `processing` is one whose call is in flight under a live lease.
pub const STATES: [&str; 7] =
    ["pending", "processing", "unknown", "succeeded", "failed", "quarantined", "dead"];

/// One of the states `list` and `metrics` know ([`STATES`], in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListState {
    /// Accepted, nobody has claimed it.
    Pending,
    /// A call in flight under a live lease.
    Processing,
    /// Processing, and nobody is working it: its outcome is not known.
    Unknown,
    /// Ended with a receipt.
    Succeeded,
    /// Refused by the downstream.
    Failed,
    /// Its receipt broke the output contract.
    Quarantined,
    /// Out of attempts, nothing sent.
    Dead,
}

impl ListState {
    /// Every state, in [`STATES`] order.
    pub const ALL: [ListState; 7] = [
        ListState::Pending,
        ListState::Processing,
        ListState::Unknown,
        ListState::Succeeded,
        ListState::Failed,
        ListState::Quarantined,
        ListState::Dead,
    ];

    /// Its name, one of [`STATES`].
    pub fn as_str(self) -> &'static str {
        match self {
            ListState::Pending => "pending",
            ListState::Processing => "processing",
            ListState::Unknown => "unknown",
            ListState::Succeeded => "succeeded",
            ListState::Failed => "failed",
            ListState::Quarantined => "quarantined",
            ListState::Dead => "dead",
        }
    }

    /// The state named `text`, if it is one.
    pub fn parse(text: &str) -> Option<ListState> {
        ListState::ALL.into_iter().find(|state| state.as_str() == text)
    }

    /// The operation status it is stored under: `unknown` is a `processing` operation.
    pub fn stored(self) -> OperationStatus {
        match self {
            ListState::Pending => OperationStatus::Pending,
            ListState::Processing | ListState::Unknown => OperationStatus::Processing,
            ListState::Succeeded => OperationStatus::Succeeded,
            ListState::Failed => OperationStatus::Failed,
            ListState::Quarantined => OperationStatus::Quarantined,
            ListState::Dead => OperationStatus::Dead,
        }
    }

    /// Whether its lease must have ended: `unknown` is processing with nobody working it
    /// (its lease ended, or its attempt was set aside with a reason), `processing` one
    /// with a call in flight under a live lease; other states have no lease to judge.
    pub fn lease_ended(self) -> Option<bool> {
        match self {
            ListState::Processing => Some(false),
            ListState::Unknown => Some(true),
            _ => None,
        }
    }
}

/// Which operations `list` answers, and from where.
///
/// ```
/// # use toolledger_store::ListFilter;
/// let dead = ListFilter { state: Some("dead"), tool: Some("refund_order"), ..ListFilter::default() };
/// assert_eq!((dead.limit, dead.after), (100, None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListFilter<'a> {
    /// One of [`STATES`]; `None` for all.
    pub state: Option<&'a str>,
    /// Only operations of this tool; `None` for every tool.
    pub tool: Option<&'a str>,
    /// Only operations unchanged for at least this many seconds; 0 lists every one,
    /// whenever it changed (see [`ListFilter::cutoff`]).
    pub older_than: i64,
    /// At most this many (1 to [`LIST_LIMIT_MAX`]).
    pub limit: usize,
    /// The [`Listed::cursor`] of an operation an earlier page of this same listing (same
    /// `state` and `tool`) answered: the listing continues right after it. `None` starts
    /// at the beginning.
    pub after: Option<&'a str>,
}

impl ListFilter<'_> {
    /// The latest change a listing at `now` includes: none is left out when
    /// [`ListFilter::older_than`] is 0 (an operation changed after the caller's clock,
    /// by a host whose clock runs ahead or by the database's clock, is listed too), else
    /// `now` less that many seconds.
    ///
    /// ```
    /// # use toolledger_store::ListFilter;
    /// assert_eq!(ListFilter::default().cutoff(1_000), i64::MAX);
    /// assert_eq!(ListFilter { older_than: 60, ..ListFilter::default() }.cutoff(1_000), 940);
    /// ```
    pub fn cutoff(&self, now: i64) -> i64 {
        if self.older_than <= 0 { i64::MAX } else { now.saturating_sub(self.older_than) }
    }
}

impl Default for ListFilter<'_> {
    /// Every state and tool, from the beginning, 100 at a time.
    fn default() -> Self {
        ListFilter { state: None, tool: None, older_than: 0, limit: 100, after: None }
    }
}

/// Where in one state a listing stands: after the operation with row id `id`, last
/// changed at `updated_at`. Listings are ordered by state (in [`STATES`] order), then
/// `updated_at`, then id, so a position is a keyset: a store seeks to it through its
/// `(status, updated_at)` index, and a page costs the same wherever it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListPosition {
    /// The operation's last change, Unix seconds.
    pub updated_at: i64,
    /// The operation's row id (the order's tie-break).
    pub id: i64,
}

/// The first word of every cursor: the format's version.
const CURSOR_VERSION: &str = "c1";
/// No cursor is longer than this; a longer text is refused before it is parsed.
const CURSOR_BYTES_MAX: usize = 64;

impl ListFilter<'_> {
    /// The states this listing walks, in [`STATES`] order, each with the position to
    /// continue after in it: without `after`, every state of the filter from its start;
    /// with it, the cursor's state from the cursor's position, then each later state from
    /// its start.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidCursor`] when `after` is not a cursor a listing of this
    /// `state` and `tool` handed out (malformed, edited, or from another listing).
    pub fn walk(&self) -> Result<Vec<(ListState, Option<ListPosition>)>, StoreError> {
        let states = ListState::ALL.into_iter().enumerate().filter(|(_, known)| match self.state {
            Some(state) => known.as_str() == state,
            None => true,
        });
        let Some(text) = self.after else {
            return Ok(states.map(|(_, state)| (state, None)).collect());
        };
        let (from, position) = self.decode(text).ok_or(StoreError::InvalidCursor)?;
        let walk: Vec<_> = states
            .filter(|(index, _)| *index >= from)
            .map(|(index, state)| (state, (index == from).then_some(position)))
            .collect();
        // A cursor names a state the filter walks: one of another state is refused, not
        // silently answered with the states after it.
        match walk.first() {
            Some((_, Some(_))) => Ok(walk),
            _ => Err(StoreError::InvalidCursor),
        }
    }

    /// The cursor of an operation listed in `state` at `position`: passed back as `after`
    /// with this same `state` and `tool`, the listing continues right after it.
    ///
    /// The text is opaque to callers: `c1.<state>.<updated_at>.<id>.<check>`, where the
    /// check is the first 16 hex digits of a SHA-256 over the position and the filter's
    /// `state` and `tool`. It is not a secret (a forged cursor only reaches a place in a
    /// listing the operator may read anyway); it makes an edited, truncated or misplaced
    /// cursor a clean refusal instead of a silently different page.
    pub fn cursor(&self, state: ListState, position: ListPosition) -> String {
        let index = ListState::ALL.iter().position(|known| *known == state).unwrap_or(STATES.len());
        self.encode(index, position)
    }

    fn encode(&self, index: usize, position: ListPosition) -> String {
        let ListPosition { updated_at, id } = position;
        let preimage = serde_json::json!({
            "domain": "toolledger-list-cursor/v1",
            "filter": {"state": self.state, "tool": self.tool},
            "position": [index, updated_at, id],
        });
        let digest = toolledger_contract::digest::sha256_canonical(&preimage);
        let check = digest.as_str().get(..16).unwrap_or_default();
        format!("{CURSOR_VERSION}.{index}.{updated_at}.{id}.{check}")
    }

    /// The state index and position of `text`, when it is exactly the cursor this filter
    /// makes for them: re-encoding refuses leading zeros, signs and a wrong check alike.
    fn decode(&self, text: &str) -> Option<(usize, ListPosition)> {
        if text.len() > CURSOR_BYTES_MAX {
            return None;
        }
        let mut words = text.split('.');
        let (Some(CURSOR_VERSION), Some(index), Some(updated_at), Some(id), Some(_), None) =
            (words.next(), words.next(), words.next(), words.next(), words.next(), words.next())
        else {
            return None;
        };
        let index: usize = index.parse().ok().filter(|index| *index < STATES.len())?;
        let updated_at: i64 = updated_at.parse().ok()?;
        UnixSeconds::new(updated_at).ok()?;
        let id: i64 = id.parse().ok().filter(|id| *id >= 0)?;
        let position = ListPosition { updated_at, id };
        (self.encode(index, position) == text).then_some((index, position))
    }
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
    /// An opaque text that, passed back as [`ListFilter::after`] with the same `state` and
    /// `tool`, continues the listing right after this operation.
    pub cursor: String,
}

/// The figures `metrics` exposes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Figures {
    /// Operations by [`STATES`], in that order.
    pub by_state: Vec<(&'static str, i64)>,
    /// Seconds since the oldest pending operation last changed (0 when none).
    pub oldest_pending_age: i64,
    /// Seconds since the oldest unknown operation became unknown: its lease ended, or its
    /// attempt was set aside (0 when none).
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

/// What an operator found became of an operation, to settle it with (`resolve`).
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// It happened: the downstream's result, already checked against the operation and
    /// the tool's output contract. The operation succeeds with it.
    Receipt(LocalReceipt),
    /// It did not happen. The operation ends `failed` (a `requeue` sends it again).
    NotHappened,
}

impl Settlement {
    /// The status an operation settled so ends in: `succeeded` or `failed`.
    pub fn ends_as(&self) -> OperationStatus {
        match self {
            Settlement::Receipt(_) => OperationStatus::Succeeded,
            Settlement::NotHappened => OperationStatus::Failed,
        }
    }
}

/// What `resolve` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// Settled as the operator said (`succeeded` or `failed`), logged.
    Resolved(OperationStatus),
    /// No such operation.
    Missing,
    /// It has already ended: nothing done.
    Refused(OperationStatus),
    /// A worker holds it under a lease that ends at this instant: its call may be in
    /// flight, so nothing done.
    Leased(i64),
}

/// The reason kept for an operation an operator found did not happen.
pub fn not_happened_reason(reason: &str) -> String {
    bounded_reason(&format!("an operator found it did not happen: {reason}"))
}

/// Whether `operation` may be settled by hand at `now`: not ended, and no worker
/// holds a live lease on it (pending, or `unknown` as [`STATES`] says). The state it is settled from (`pending` or `processing`)
/// and what it was waiting on, for the operator log.
///
/// # Errors
///
/// What `resolve` answers instead.
pub fn resolvable(operation: &Operation, now: Now) -> Result<(&'static str, String), Resolved> {
    match operation.status {
        OperationStatus::Pending | OperationStatus::Processing => {}
        status => return Err(Resolved::Refused(status)),
    }
    // `unknown` as `list` means it: a processing operation whose lease has ended, or
    // whose attempt ended without an outcome and waits out a backoff (its reason kept).
    let outbox = &operation.outbox;
    if let (OperationStatus::Processing, Some(until), None) =
        (operation.status, outbox.lease_until, &outbox.last_reason)
    {
        if until > now.get() {
            return Err(Resolved::Leased(until));
        }
    }
    let was = outbox.last_reason.clone().unwrap_or_else(|| "no reason given".to_owned());
    Ok((operation.status.as_str(), was))
}

/// What an operator reads of a ledger and does to it. Every statement behind it is
/// index-backed, and every write is one transaction recorded in the operator log.
pub trait OperatorStore {
    /// Operations in `filter.state` (all states, one after another in [`STATES`] order,
    /// when `None`) and of `filter.tool`, oldest change first (ties by row id), at most
    /// `filter.limit`, starting right after `filter.after`. A page is a keyset seek on
    /// `operations_status (status, updated_at)`, never an offset: it costs the same on
    /// page 1 and page 10,000. The walk reads no snapshot across pages: an operation that
    /// changes between two pages moves to its new place (later in its state, or into
    /// another state), so a walk may meet it twice or not at all, but never lists one
    /// twice within one state's run of pages.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; [`StoreError::InvalidCursor`] when `filter.after` is not a cursor
    /// a listing of this `state` and `tool` handed out.
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

    /// Settles an operation whose outcome is unknown as the operator found it: with the
    /// downstream's result (`succeeded`, commit C by the operator) or as not having
    /// happened (`failed`), and appends the action, the operator's reason and what it was
    /// waiting on to the operator log — one transaction, and only when
    /// [`resolvable`] allows. Anything else is answered back and nothing is written.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn resolve(
        &mut self,
        status_ref: &StatusRef,
        settlement: &Settlement,
        reason: &str,
        now: Now,
    ) -> Result<Resolved, StoreError>;

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

/// The longest reason the ledger keeps, in bytes: an outbox event's last reason, a
/// failure's, an operator's (the tables' CHECKs say the same number).
pub const REASON_BYTES_MAX: usize = 512;

/// The most operations one `list` page answers; a larger limit is this one.
pub const LIST_LIMIT_MAX: usize = 10_000;

/// A reason as stored: 1 to [`REASON_BYTES_MAX`] bytes, trimmed, cut at a character
/// boundary; an empty one says so.
pub fn bounded_reason(reason: &str) -> String {
    let reason = reason.trim();
    if reason.is_empty() {
        return "no reason given".to_owned();
    }
    let mut end = reason.len().min(REASON_BYTES_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.get(..end).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::{ListFilter, ListPosition, ListState, STATES};
    use crate::{OperationStatus, StoreError};

    #[test]
    fn each_list_state_is_named_as_listed_and_stored_as_its_status() {
        assert_eq!(ListState::ALL.map(ListState::as_str), STATES);
        for state in ListState::ALL {
            assert_eq!(ListState::parse(state.as_str()), Some(state));
            let stored = state.stored();
            // Every state but `unknown` is stored under its own name.
            assert_eq!(stored.as_str() == state.as_str(), state != ListState::Unknown);
            assert_eq!(state.lease_ended().is_some(), stored == OperationStatus::Processing);
        }
        assert_eq!(ListState::parse("Unknown"), None);
    }

    const AT: ListPosition = ListPosition { updated_at: 1_767_225_600, id: 42 };

    fn after<'a>(filter: ListFilter<'a>, cursor: &'a str) -> ListFilter<'a> {
        ListFilter { after: Some(cursor), ..filter }
    }

    #[test]
    fn a_cursor_continues_in_its_state_then_walks_the_later_ones_from_their_start() {
        let all = ListFilter::default();
        let cursor = all.cursor(ListState::Unknown, AT);
        assert!(cursor.starts_with("c1.2.1767225600.42."), "{cursor}");
        let walk = after(all, &cursor).walk().unwrap();
        assert_eq!(walk.first(), Some(&(ListState::Unknown, Some(AT))));
        let rest: Vec<_> = walk.iter().skip(1).map(|(state, at)| (*state, *at)).collect();
        let later: Vec<_> = ListState::ALL.iter().skip(3).map(|state| (*state, None)).collect();
        assert_eq!(rest, later);
        // Without a cursor: every state from its start.
        assert_eq!(all.walk().unwrap().len(), STATES.len());
        let dead = ListFilter { state: Some("dead"), ..all };
        assert_eq!(dead.walk().unwrap(), [(ListState::Dead, None)]);
        let cursor = dead.cursor(ListState::Dead, AT);
        assert_eq!(after(dead, &cursor).walk().unwrap(), [(ListState::Dead, Some(AT))]);
    }

    #[test]
    fn an_edited_truncated_or_misplaced_cursor_is_refused() {
        let filter = ListFilter { tool: Some("refund_order"), ..ListFilter::default() };
        let cursor = filter.cursor(ListState::Pending, AT);
        let check = cursor.rsplit('.').next().unwrap();
        let mut refused = vec![
            String::new(),
            "c1".to_owned(),
            cursor[..cursor.len() - 1].to_owned(),
            format!("{cursor}."),
            format!("{cursor}0"),
            cursor.replace("c1.", "c2."),
            cursor.replace(".42.", ".43."),
            cursor.replace(".42.", ".042."),
            cursor.replace(".42.", ".+42."),
            cursor.replace(".1767225600.", ".1767225601."),
            cursor.replace("c1.0.", "c1.1."),
            cursor.replace(check, &check.to_uppercase()),
            format!("c1.9.1767225600.42.{check}"),
            format!("c1.0.-1.42.{check}"),
            format!("c1.0.1767225600.-42.{check}"),
            format!("c1.0.99999999999999999999.42.{check}"),
            "x".repeat(10_000),
            "c1.0.1767225600.42.é".to_owned(),
        ];
        // Carried to a listing of another tool or state, or read without its tool.
        for other in [
            ListFilter { tool: Some("open_ticket"), ..filter },
            ListFilter { tool: None, ..filter },
            ListFilter { state: Some("pending"), ..filter },
        ] {
            assert_eq!(after(other, &cursor).walk(), Err(StoreError::InvalidCursor));
        }
        // A cursor of a state the filter does not walk, even when its check is right.
        let dead = ListFilter { state: Some("dead"), ..ListFilter::default() };
        let pending_under_dead = dead.cursor(ListState::Pending, AT);
        refused.push(pending_under_dead);
        for text in &refused {
            let walked = after(ListFilter { state: Some("dead"), ..filter }, text).walk();
            assert_eq!(walked, Err(StoreError::InvalidCursor), "{text}");
            assert_eq!(after(filter, text).walk(), Err(StoreError::InvalidCursor), "{text}");
            assert_eq!(after(dead, text).walk(), Err(StoreError::InvalidCursor), "{text}");
        }
        // The code is a usage error's, and the message does not repeat the cursor.
        let err = after(filter, "c1.0.1.1.secret").walk().unwrap_err();
        assert_eq!(err.code(), "USAGE_ERROR");
        assert!(!err.to_string().contains("secret"), "{err}");
        // The untouched cursor, under its own filter, is accepted.
        assert_eq!(
            after(filter, &cursor).walk().unwrap().first(),
            Some(&(ListState::Pending, Some(AT)))
        );
    }

    #[test]
    fn the_default_filter_lists_every_state_and_tool_from_the_start_a_hundred_at_a_time() {
        assert_eq!(
            ListFilter::default(),
            ListFilter { state: None, tool: None, older_than: 0, limit: 100, after: None }
        );
    }
}
