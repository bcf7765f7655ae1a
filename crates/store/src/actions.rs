//! What an operator reads of a ledger and does to it, written once for every backend:
//! list operations by state, show one operation's whole history, requeue a dead or
//! failed one (logged), settle an unknown one by hand (logged), retire old finished ones
//! (tombstoned), and the figures `metrics` exposes. Every statement is index-backed:
//! `operations_status (status, updated_at)`, the primary keys, and `operator_log_ref`.
//! PostgreSQL locks the rows a write decides on first (`FOR UPDATE`), so a requeue and a
//! retention pass, or two of either, never both act on what one of them read.

use serde_json::{Value, json};
use toolledger_contract::StatusRef;

use crate::{
    Figures, Finalize, Finalizer, ListFilter, ListPosition, ListState, Listed, Now, Requeued,
    Resolved, Settlement, Shown, StoreError,
    driver::{Arg, Commit, Db, Dialect, Sql, locked},
    ledger::{self, Written, bump, end_in, shifted},
};

static STATUS_COUNT: Sql = Sql::new("SELECT count(*) FROM operations WHERE status = $1");
static LIVE_OR_ENDED: Sql = Sql::new(
    "SELECT count(*) FROM operations o JOIN outbox b ON b.op_id = o.id \
     WHERE o.status = 'processing' AND (b.lease_until > $1 AND b.last_reason IS NULL) = $2",
);
static OLDEST_PENDING: Sql =
    Sql::new("SELECT min(updated_at) FROM operations WHERE status = 'pending'");
/// Since when each unknown operation has been unknown: its attempt's end when it was set
/// aside (`last_reason` kept), else its lease's end.
static OLDEST_UNKNOWN: Sql = Sql::new(
    "SELECT min(CASE WHEN b.last_reason IS NULL THEN b.lease_until ELSE b.updated_at END) \
     FROM operations o JOIN outbox b ON b.op_id = o.id \
     WHERE o.status = 'processing' AND (b.lease_until <= $1 OR b.last_reason IS NOT NULL)",
);
/// A counter's value: the sum of its shards (one row in SQLite, up to sixteen in
/// PostgreSQL).
static COUNTER: Sql =
    Sql::new("SELECT CAST(coalesce(sum(value), 0) AS BIGINT) FROM counters WHERE name = $1");
/// `list`'s columns, tables and filters around a keyset (`$keyset`, in `$order`):
/// $1 the stored status, $2 the cutoff (unchanged since), $3 and $4 the position
/// (`updated_at`, id) to continue after, $5 the tool (NULL: every tool), $6 whether the
/// lease must have ended (NULL: no split; `processing` and `unknown` share a stored status
/// and are told apart here, so the limit counts only what is listed), $7 now, $8 the limit.
macro_rules! list {
    ($keyset:literal, $order:literal) => {
        concat!(
            "SELECT o.status_ref, o.tool_name, b.attempt_count, o.created_at, o.updated_at, \
             coalesce(t.reason, b.last_reason), o.arguments_json, o.id \
             FROM operations o JOIN outbox b ON b.op_id = o.id LEFT JOIN terminal_outcomes t ON t.op_id = o.id \
             WHERE o.status = $1 AND o.updated_at <= $2 AND ",
            $keyset,
            " AND (CAST($5 AS TEXT) IS NULL OR o.tool_name = $5) \
             AND (CAST($6 AS BOOLEAN) IS NULL \
             OR coalesce(b.lease_until <= $7 OR b.last_reason IS NOT NULL, false) = $6) ORDER BY ",
            $order,
            " LIMIT $8"
        )
    };
}
/// The rest of the second a page stopped in: a seek on `(status, updated_at, rowid)`,
/// SQLite's index's implicit last column. The row value `(updated_at, id) > ($3, $4)`
/// would read the same rows, but SQLite seeks it on `updated_at` alone and filters the
/// ids, so every operation changed in that second would be read again on each page.
static LIST_TIES: Sql = Sql::new(list!("o.updated_at = $3 AND o.id > $4", "o.id"));
/// The operations changed after that second; from a state's start, $3 is -1.
static LIST_AFTER: Sql = Sql::new(list!("o.updated_at > $3", "o.updated_at, o.id"));
/// One page in one seek, for PostgreSQL: the row value seeks `operations_status` from
/// `updated_at >= $3` and ends at the cutoff; its index holds no id, so the rest of the
/// position's second is read from the table either way.
static LIST: Sql = Sql::new(list!("(o.updated_at, o.id) > ($3, $4)", "o.updated_at, o.id"));
static LOG: Sql = Sql::new(
    "SELECT action, from_state, reason, was, at FROM operator_log WHERE status_ref = $1 ORDER BY id",
);
/// A requeue's or a resolve's first step: the event's row locked in PostgreSQL (as every
/// commit point locks it), so the state it is judged in is the one it changes.
static LOCK_EVENT: Sql = locked!(
    "SELECT op_id FROM outbox WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1)",
    " FOR UPDATE"
);
static REQUEUE_OUTBOX: Sql = Sql::new(
    "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL, \
     next_attempt_at = $2, last_reason = NULL, attempts_before = attempt_count, updated_at = $2 \
     WHERE op_id = $1 AND state IN ('failed', 'dead')",
);
static REQUEUE_OPERATION: Sql =
    Sql::new("UPDATE operations SET status = 'pending', updated_at = $2 WHERE id = $1");
static DROP_OUTCOME: Sql = Sql::new("DELETE FROM terminal_outcomes WHERE op_id = $1");
static LOG_REQUEUE: Sql = Sql::new(
    "INSERT INTO operator_log (status_ref, action, from_state, reason, was, at) \
     VALUES ($1, 'requeue', $2, $3, $4, $5)",
);
static LOG_RESOLVE: Sql = Sql::new(
    "INSERT INTO operator_log (status_ref, action, from_state, reason, was, at) \
     VALUES ($1, 'resolve', $2, $3, $4, $5)",
);
/// Finished operations to retire, locked in PostgreSQL: one a requeue changed meanwhile
/// no longer matches once its lock is had, and is left alone.
static RETIRABLE: Sql = locked!(
    "SELECT id, status_ref, request_sha256, downstream_request_ref, status FROM operations \
     WHERE status = $1 AND updated_at <= $2 ORDER BY updated_at, id LIMIT $3",
    " FOR UPDATE"
);
static TOMBSTONE_OF: Sql =
    Sql::new("SELECT final_status, retired_at FROM tombstones WHERE status_ref = $1");
static TOMBSTONE: Sql = Sql::new(
    "INSERT INTO tombstones (status_ref, request_sha256, final_status, retired_at) \
     VALUES ($1, $2, $3, $4)",
);
static RETIRE_ROWS: [Sql; 7] = [
    Sql::new("DELETE FROM replays WHERE op_id = $1"),
    Sql::new("DELETE FROM trace_contexts WHERE op_id = $1"),
    Sql::new("DELETE FROM local_receipts WHERE op_id = $1"),
    Sql::new("DELETE FROM terminal_outcomes WHERE op_id = $1"),
    Sql::new("DELETE FROM call_identities WHERE op_id = $1"),
    Sql::new("DELETE FROM outbox WHERE op_id = $1"),
    Sql::new("DELETE FROM operations WHERE id = $1"),
];
static RETIRE_DOWNSTREAM: Sql =
    Sql::new("DELETE FROM downstream_receipts WHERE downstream_request_ref = $1");

/// Every operator statement, by name, for the query-plan test. (`list` in one seek is
/// PostgreSQL's; SQLite's two seeks are listed.)
pub fn statements() -> Vec<(&'static str, &'static Sql)> {
    vec![
        ("metrics: count by status", &STATUS_COUNT),
        ("metrics: processing live or ended", &LIVE_OR_ENDED),
        ("metrics: oldest pending", &OLDEST_PENDING),
        ("metrics: oldest unknown", &OLDEST_UNKNOWN),
        ("metrics: counter", &COUNTER),
        ("list: the rest of a second", &LIST_TIES),
        ("list: after a second", &LIST_AFTER),
        ("show: operator log", &LOG),
        ("show: tombstone", &TOMBSTONE_OF),
        ("requeue: outbox", &REQUEUE_OUTBOX),
        ("requeue: operation", &REQUEUE_OPERATION),
        ("requeue: drop outcome", &DROP_OUTCOME),
        ("gc: retirable", &RETIRABLE),
    ]
}

/// `list` (see [`OperatorStore::list`](crate::OperatorStore::list)), judged at the
/// clock the store's writes judge by.
pub(crate) fn list(
    db: &mut dyn Db,
    filter: &ListFilter<'_>,
    show_arguments: bool,
    now: Now,
) -> Result<Vec<Listed>, StoreError> {
    let walk = filter.walk()?;
    let limit = filter.limit.clamp(1, crate::LIST_LIMIT_MAX);
    let now = db.now(now)?;
    let cutoff = filter.cutoff(now.get());
    let mut listed = Vec::new();
    for (state, after) in walk {
        // SQLite: the rest of the cursor's second first, then every later second.
        // PostgreSQL: both in one seek.
        let mut steps = Vec::with_capacity(2);
        match (db.dialect(), after) {
            (Dialect::Postgres, after) => {
                let start = after.unwrap_or(ListPosition { updated_at: -1, id: 0 });
                steps.push((&LIST, start.updated_at, start.id));
            }
            (Dialect::Sqlite, after) => {
                if let Some(position) = after {
                    steps.push((&LIST_TIES, position.updated_at, position.id));
                }
                steps.push((&LIST_AFTER, after.map_or(-1, |position| position.updated_at), 0));
            }
        }
        for (sql, updated_at, id) in steps {
            let left = i64::try_from(limit - listed.len()).unwrap_or(i64::MAX);
            if left == 0 {
                return Ok(listed);
            }
            let args = [
                state.stored().as_str().into(),
                cutoff.into(),
                updated_at.into(),
                id.into(),
                filter.tool.into(),
                state.lease_ended().into(),
                now.get().into(),
                left.into(),
            ];
            db.query(sql, &args, &mut |row| {
                let (created, updated) = (row.int(3)?, row.int(4)?);
                let position = ListPosition { updated_at: updated, id: row.int(7)? };
                listed.push(Listed {
                    status_ref: row.text(0)?,
                    tool: row.text(1)?,
                    state: state.as_str(),
                    attempts: row.int(2)?,
                    age: now.get().saturating_sub(created).max(0),
                    idle: now.get().saturating_sub(updated).max(0),
                    reason: row.optional_text(5)?,
                    arguments: if show_arguments { Some(row.text(6)?) } else { None },
                    cursor: filter.cursor(state, position),
                });
                Ok(true)
            })?;
        }
    }
    Ok(listed)
}

/// `show`: one operation, its operator log and its tombstone.
pub(crate) fn show(db: &mut dyn Db, status_ref: &StatusRef) -> Result<Shown, StoreError> {
    let key: [Arg<'_>; 1] = [status_ref.as_str().into()];
    let operation = ledger::by_status_ref(db, status_ref)?;
    let tombstone = db.first(&TOMBSTONE_OF, &key, |row| {
        Ok(json!({"final_status": row.text(0)?, "retired_at": row.int(1)?}))
    })?;
    let log = db.all(&LOG, &key, |row| -> Result<Value, StoreError> {
        Ok(json!({
            "action": row.text(0)?,
            "from": row.text(1)?,
            "reason": row.text(2)?,
            "was": row.text(3)?,
            "at": row.int(4)?,
        }))
    })?;
    Ok(Shown { operation, log, tombstone })
}

/// The one number `sql` answers (0 for none, or NULL).
fn number(db: &mut dyn Db, sql: &Sql, args: &[Arg<'_>]) -> Result<i64, StoreError> {
    Ok(db.first(sql, args, |row| row.optional_int(0))?.flatten().unwrap_or_default())
}

/// The figures `metrics` exposes, judged at the clock the store's writes judge by.
pub(crate) fn figures(db: &mut dyn Db, now: Now) -> Result<Figures, StoreError> {
    let now = db.now(now)?.get();
    let mut figures = Figures::default();
    for state in ListState::ALL {
        let count = match state.lease_ended() {
            Some(ended) => number(db, &LIVE_OR_ENDED, &[now.into(), (!ended).into()])?,
            None => number(db, &STATUS_COUNT, &[state.stored().as_str().into()])?,
        };
        figures.by_state.push((state.as_str(), count));
    }
    let oldest_pending = db.first(&OLDEST_PENDING, &[], |row| row.optional_int(0))?.flatten();
    figures.oldest_pending_age = oldest_pending.map_or(0, |at| (now - at).max(0));
    let oldest_unknown = number(db, &OLDEST_UNKNOWN, &[now.into()])?;
    figures.oldest_unknown_age =
        if oldest_unknown == 0 { 0 } else { (now - oldest_unknown).max(0) };
    figures.attempts = number(db, &COUNTER, &["claims".into()])?;
    figures.lease_reclaims = number(db, &COUNTER, &["lease_reclaims".into()])?;
    figures.fenced_writes = number(db, &COUNTER, &["fenced_writes".into()])?;
    figures.reconciliations = number(db, &COUNTER, &["reconciliations".into()])?;
    figures.tombstones = number(db, &COUNTER, &["retired".into()])?;
    Ok(figures)
}

/// A dead or failed operation made pending again, logged.
#[derive(Debug)]
pub struct Requeue {
    status_ref: StatusRef,
    reason: String,
    now: Now,
}

impl Requeue {
    /// The requeue of `status_ref`, for `reason`.
    pub fn new(status_ref: &StatusRef, reason: &str, now: Now) -> Requeue {
        Requeue { status_ref: status_ref.clone(), reason: crate::bounded_reason(reason), now }
    }
}

impl Commit for Requeue {
    type Output = Requeued;

    fn run(&self, db: &mut dyn Db) -> Result<(Requeued, bool), StoreError> {
        let now = db.now(self.now)?.get();
        let status_ref = self.status_ref.as_str();
        db.first(&LOCK_EVENT, &[status_ref.into()], |_| Ok(()))?;
        let Some(operation) = ledger::by_status_ref(db, &self.status_ref)? else {
            return Ok((Requeued::Missing, false));
        };
        let was = match crate::requeue_reason(&operation) {
            Ok(was) => was,
            Err(status) => return Ok((Requeued::Refused(status), false)),
        };
        let id = db
            .int(&ledger::SELECT_OPERATION_ID, &[status_ref.into()])?
            .ok_or(StoreError::Internal("the operation vanished"))?;
        db.execute(&DROP_OUTCOME, &[id.into()])?;
        db.execute(&REQUEUE_OUTBOX, &[id.into(), now.into()])?;
        db.execute(&REQUEUE_OPERATION, &[id.into(), now.into()])?;
        let args = [
            status_ref.into(),
            operation.status.as_str().into(),
            self.reason.as_str().into(),
            was.as_str().into(),
            now.into(),
        ];
        db.execute(&LOG_REQUEUE, &args)?;
        Ok((Requeued::Requeued, true))
    }
}

/// An operation nobody works, settled by hand as it turned out, logged.
#[derive(Debug)]
pub struct Resolve {
    status_ref: StatusRef,
    ending: Written,
    ends_as: crate::OperationStatus,
    reason: String,
    now: Now,
}

impl Resolve {
    /// The settlement of `status_ref`, for `reason`.
    pub fn new(status_ref: &StatusRef, settlement: &Settlement, reason: &str, now: Now) -> Self {
        let reason = crate::bounded_reason(reason);
        let ending = match settlement {
            Settlement::Receipt(receipt) => Written::succeeded(receipt),
            Settlement::NotHappened => Written::Failed(crate::not_happened_reason(&reason)),
        };
        Resolve {
            status_ref: status_ref.clone(),
            ending,
            ends_as: settlement.ends_as(),
            reason,
            now,
        }
    }
}

impl Commit for Resolve {
    type Output = Resolved;

    fn run(&self, db: &mut dyn Db) -> Result<(Resolved, bool), StoreError> {
        let now = db.now(self.now)?;
        let status_ref = &self.status_ref;
        // The event is locked first: a worker's claim waits, and sees it ended.
        db.first(&LOCK_EVENT, &[status_ref.as_str().into()], |_| Ok(()))?;
        let Some(operation) = ledger::by_status_ref(db, status_ref)? else {
            return Ok((Resolved::Missing, false));
        };
        let (from, was) = match crate::resolvable(&operation, now) {
            Ok(resolvable) => resolvable,
            Err(answer) => return Ok((answer, false)),
        };
        if end_in(db, status_ref, &Finalizer::Operator, now, &self.ending)? != Finalize::Finalized {
            return Err(StoreError::Internal("an unended operation refused its ending"));
        }
        let args = [
            status_ref.as_str().into(),
            from.into(),
            self.reason.as_str().into(),
            was.as_str().into(),
            now.get().into(),
        ];
        db.execute(&LOG_RESOLVE, &args)?;
        Ok((Resolved::Resolved(self.ends_as), true))
    }
}

/// Finished operations unchanged since a cutoff, removed and tombstoned.
#[derive(Debug)]
pub struct Retire {
    cutoff: Now,
    now: Now,
    limit: usize,
}

impl Retire {
    /// At most `limit` operations finished and unchanged since `cutoff`.
    pub fn new(cutoff: Now, now: Now, limit: usize) -> Retire {
        Retire { cutoff, now, limit }
    }
}

impl Commit for Retire {
    type Output = usize;

    fn run(&self, db: &mut dyn Db) -> Result<(usize, bool), StoreError> {
        let now = db.now(self.now)?;
        // The cutoff keeps its distance from the clock the write judges by.
        let cutoff = shifted(self.cutoff, self.now, now);
        let limit = i64::try_from(self.limit).unwrap_or(i64::MAX);
        let mut retired = 0;
        for status in ["succeeded", "failed", "quarantined", "dead"] {
            let rows =
                db.all(&RETIRABLE, &[status.into(), cutoff.get().into(), limit.into()], |row| {
                    Ok((row.int(0)?, row.text(1)?, row.text(2)?, row.text(3)?, row.text(4)?))
                })?;
            for (id, status_ref, request, request_ref, final_status) in rows {
                if retired >= self.limit {
                    return Ok((retired, true));
                }
                let args = [
                    status_ref.as_str().into(),
                    request.as_str().into(),
                    final_status.as_str().into(),
                    now.get().into(),
                ];
                db.execute(&TOMBSTONE, &args)?;
                bump(db, "retired")?;
                for sql in &RETIRE_ROWS {
                    db.execute(sql, &[id.into()])?;
                }
                db.execute(&RETIRE_DOWNSTREAM, &[request_ref.as_str().into()])?;
                retired += 1;
            }
        }
        Ok((retired, true))
    }
}
