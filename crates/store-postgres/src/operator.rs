//! What an operator asks of a ledger and does to it: SQLite's statements, in
//! PostgreSQL. Every statement is index-backed: `operations_status (status,
//! updated_at)`, the primary keys, and `operator_log_ref`. The writes lock the rows they
//! decide on first (`FOR UPDATE`), so a requeue and a retention pass, or two of either,
//! never both act on what one of them read.

use serde_json::json;
use toolledger_contract::StatusRef;

use crate::{
    Figures, Finalize, Finalizer, ListFilter, ListPosition, Listed, Now, OperatorStore, Requeued,
    Resolved, STATES, Settlement, Shown, StoreError,
    pg::{BY_STATUS_REF, Ending, PgStore, bump, end_in, select_operation_in, shifted},
    session::{Db, Params, get},
};

const STATUS_COUNT: &str = "SELECT count(*) FROM operations WHERE status = $1";
const LIVE_OR_ENDED: &str = "SELECT count(*) FROM operations o JOIN outbox b ON b.op_id = o.id \
     WHERE o.status = 'processing' AND (b.lease_until > $1 AND b.last_reason IS NULL) = $2";
const OLDEST_PENDING: &str = "SELECT min(updated_at) FROM operations WHERE status = 'pending'";
/// Since when each unknown operation has been unknown: its attempt's end when it was set
/// aside (`last_reason` kept), else its lease's end.
const OLDEST_UNKNOWN: &str = "SELECT min(CASE WHEN b.last_reason IS NULL THEN b.lease_until ELSE b.updated_at END) \
     FROM operations o JOIN outbox b ON b.op_id = o.id \
     WHERE o.status = 'processing' AND (b.lease_until <= $1 OR b.last_reason IS NOT NULL)";
const COUNTER: &str = "SELECT coalesce(sum(value), 0)::bigint FROM counters WHERE name = $1";
/// One page of one listed state: $1 the stored status, $2 the cutoff (unchanged since),
/// ($3, $4) the position (`updated_at`, id) to continue after ((-1, 0) from the state's
/// start), $5 the tool (NULL: every tool), $6 whether the lease must have ended (NULL: no
/// split; `processing` and `unknown` share a stored status and are told apart here, so
/// the limit counts only what is listed), $7 now, $8 the limit. The row value seeks
/// `operations_status` from `updated_at >= $3` and ends at the cutoff; the index holds no
/// id, so the rest of the position's second is read from the table either way.
const LIST: &str = "SELECT o.status_ref, o.tool_name, b.attempt_count, o.created_at, o.updated_at, \
     coalesce(t.reason, b.last_reason), o.arguments_json, o.id \
     FROM operations o JOIN outbox b ON b.op_id = o.id LEFT JOIN terminal_outcomes t ON t.op_id = o.id \
     WHERE o.status = $1 AND o.updated_at <= $2 AND (o.updated_at, o.id) > ($3, $4) \
     AND ($5::text IS NULL OR o.tool_name = $5) \
     AND ($6::boolean IS NULL OR coalesce(b.lease_until <= $7 OR b.last_reason IS NOT NULL, false) = $6) \
     ORDER BY o.updated_at, o.id LIMIT $8";
const LOG: &str = "SELECT action, from_state, reason, was, at FROM operator_log WHERE status_ref = $1 ORDER BY id";
/// The requeue's first step: the event's row locked (as every commit point locks it),
/// so the state it is judged in is the one it changes.
const LOCK_EVENT: &str = "SELECT op_id FROM outbox \
     WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1) FOR UPDATE";
const REQUEUE_OUTBOX: &str = "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL, \
     next_attempt_at = $2, last_reason = NULL, attempts_before = attempt_count, updated_at = $2 \
     WHERE op_id = $1 AND state IN ('failed', 'dead')";
const REQUEUE_OPERATION: &str =
    "UPDATE operations SET status = 'pending', updated_at = $2 WHERE id = $1";
const DROP_OUTCOME: &str = "DELETE FROM terminal_outcomes WHERE op_id = $1";
const LOG_REQUEUE: &str = "INSERT INTO operator_log (status_ref, action, from_state, reason, was, at) \
     VALUES ($1, 'requeue', $2, $3, $4, $5)";
const LOG_RESOLVE: &str = "INSERT INTO operator_log (status_ref, action, from_state, reason, was, at) \
     VALUES ($1, 'resolve', $2, $3, $4, $5)";
const OPERATION_ID: &str = "SELECT id FROM operations WHERE status_ref = $1";
/// Finished operations to retire, locked: one a requeue changed meanwhile no longer
/// matches once its lock is had, and is left alone.
const RETIRABLE: &str = "SELECT id, status_ref, request_sha256, downstream_request_ref, status FROM operations \
     WHERE status = $1 AND updated_at <= $2 ORDER BY updated_at, id LIMIT $3 FOR UPDATE";
const TOMBSTONE_OF: &str = "SELECT final_status, retired_at FROM tombstones WHERE status_ref = $1";
const TOMBSTONE: &str = "INSERT INTO tombstones (status_ref, request_sha256, final_status, retired_at) \
     VALUES ($1, $2, $3, $4)";
const RETIRE_ROWS: [&str; 5] = [
    "DELETE FROM local_receipts WHERE op_id = $1",
    "DELETE FROM terminal_outcomes WHERE op_id = $1",
    "DELETE FROM call_identities WHERE op_id = $1",
    "DELETE FROM outbox WHERE op_id = $1",
    "DELETE FROM operations WHERE id = $1",
];
const RETIRE_DOWNSTREAM: &str = "DELETE FROM downstream_receipts WHERE downstream_request_ref = $1";

/// The stored status a listed state is kept under.
fn stored(state: &str) -> &str {
    if state == "unknown" { "processing" } else { state }
}

/// Whether a listed state's lease must have ended: `unknown` is processing with nobody
/// working it (its lease ended, or its attempt was set aside with a reason), `processing`
/// one with a call in flight under a live lease; other states have no lease to judge.
fn lease_ended(state: &str) -> Option<bool> {
    match state {
        "processing" => Some(false),
        "unknown" => Some(true),
        _ => None,
    }
}

impl OperatorStore for PgStore {
    fn list(
        &mut self,
        filter: &ListFilter<'_>,
        show_arguments: bool,
        now: Now,
    ) -> Result<Vec<Listed>, StoreError> {
        let walk = filter.walk()?;
        let limit = filter.limit.clamp(1, 10_000);
        self.read_at(now, |db, now| {
            let cutoff = filter.cutoff(now.get());
            let mut listed = Vec::new();
            for (state, after) in &walk {
                let state = *state;
                let start = after.unwrap_or(ListPosition { updated_at: -1, id: 0 });
                let left = i64::try_from(limit - listed.len()).unwrap_or(10_000);
                if left == 0 {
                    break;
                }
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
                    &stored(state),
                    &cutoff,
                    &start.updated_at,
                    &start.id,
                    &filter.tool,
                    &lease_ended(state),
                    &now.get(),
                    &left,
                ];
                for row in db.query(LIST, &params)? {
                    let created: i64 = get(&row, 3)?;
                    let updated: i64 = get(&row, 4)?;
                    let position = ListPosition { updated_at: updated, id: get(&row, 7)? };
                    listed.push(Listed {
                        status_ref: get(&row, 0)?,
                        tool: get(&row, 1)?,
                        state,
                        attempts: get(&row, 2)?,
                        age: now.get().saturating_sub(created).max(0),
                        idle: now.get().saturating_sub(updated).max(0),
                        reason: get(&row, 5)?,
                        arguments: if show_arguments { Some(get(&row, 6)?) } else { None },
                        cursor: filter.cursor(state, position),
                    });
                }
            }
            Ok(listed)
        })
    }

    fn show(&mut self, status_ref: &StatusRef) -> Result<Shown, StoreError> {
        self.read(|db| {
            let operation = select_operation_in(db, BY_STATUS_REF, &[&status_ref.as_str()])?;
            let tombstone = match db.opt(TOMBSTONE_OF, &[&status_ref.as_str()])? {
                Some(row) => Some(json!({
                    "final_status": get::<String>(&row, 0)?,
                    "retired_at": get::<i64>(&row, 1)?,
                })),
                None => None,
            };
            let log = db
                .query(LOG, &[&status_ref.as_str()])?
                .iter()
                .map(|row| {
                    Ok(json!({
                        "action": get::<String>(row, 0)?,
                        "from": get::<String>(row, 1)?,
                        "reason": get::<String>(row, 2)?,
                        "was": get::<String>(row, 3)?,
                        "at": get::<i64>(row, 4)?,
                    }))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            Ok(Shown { operation, log, tombstone })
        })
    }

    fn requeue(
        &mut self,
        status_ref: &StatusRef,
        reason: &str,
        now: Now,
    ) -> Result<Requeued, StoreError> {
        let reason = toolledger_store::bounded_reason(reason);
        self.write(now, |db, now| {
            db.opt(LOCK_EVENT, &[&status_ref.as_str()])?;
            let Some(operation) = select_operation_in(db, BY_STATUS_REF, &[&status_ref.as_str()])?
            else {
                return Ok(Requeued::Missing);
            };
            let was = match toolledger_store::requeue_reason(&operation) {
                Ok(was) => was,
                Err(status) => return Ok(Requeued::Refused(status)),
            };
            let id: i64 = db
                .value(OPERATION_ID, &[&status_ref.as_str()])?
                .ok_or(StoreError::Internal("the operation vanished"))?;
            db.exec(DROP_OUTCOME, &[&id])?;
            db.exec(REQUEUE_OUTBOX, &[&id, &now.get()])?;
            db.exec(REQUEUE_OPERATION, &[&id, &now.get()])?;
            db.exec(
                LOG_REQUEUE,
                &[&status_ref.as_str(), &operation.status.as_str(), &reason, &was, &now.get()],
            )?;
            Ok(Requeued::Requeued)
        })
    }

    fn resolve(
        &mut self,
        status_ref: &StatusRef,
        settlement: &Settlement,
        reason: &str,
        now: Now,
    ) -> Result<Resolved, StoreError> {
        let reason = toolledger_store::bounded_reason(reason);
        let ending = match settlement {
            Settlement::Receipt(receipt) => Ending::succeeded(receipt),
            Settlement::NotHappened => {
                Ending::Failed(toolledger_store::not_happened_reason(&reason))
            }
        };
        self.write(now, |db, now| {
            // The event is locked first: a worker's claim waits, and sees it ended.
            db.opt(LOCK_EVENT, &[&status_ref.as_str()])?;
            let Some(operation) = select_operation_in(db, BY_STATUS_REF, &[&status_ref.as_str()])?
            else {
                return Ok(Resolved::Missing);
            };
            let (from, was) = match toolledger_store::resolvable(&operation, now) {
                Ok(resolvable) => resolvable,
                Err(answer) => return Ok(answer),
            };
            if end_in(db, status_ref, &Finalizer::Operator, now, &ending)? != Finalize::Finalized {
                return Err(StoreError::Internal("an unended operation refused its ending"));
            }
            db.exec(LOG_RESOLVE, &[&status_ref.as_str(), &from, &reason, &was, &now.get()])?;
            Ok(Resolved::Resolved(settlement.ends_as()))
        })
    }

    fn retire(&mut self, cutoff: Now, now: Now, limit: usize) -> Result<usize, StoreError> {
        let caller_now = now;
        let limit_param = i64::try_from(limit).unwrap_or(1000);
        self.write(now, |db, now| {
            // The cutoff keeps its distance from the clock the write judges by.
            let cutoff = shifted(cutoff, caller_now, now);
            let mut retired = 0;
            for status in ["succeeded", "failed", "quarantined", "dead"] {
                let rows = db.query(RETIRABLE, &[&status, &cutoff.get(), &limit_param])?;
                for row in rows {
                    if retired >= limit {
                        return Ok(retired);
                    }
                    let id: i64 = get(&row, 0)?;
                    let (status_ref, request, dr_ref, final_status): (
                        String,
                        String,
                        String,
                        String,
                    ) = (get(&row, 1)?, get(&row, 2)?, get(&row, 3)?, get(&row, 4)?);
                    db.exec(TOMBSTONE, &[&status_ref, &request, &final_status, &now.get()])?;
                    bump(db, "retired")?;
                    for sql in RETIRE_ROWS {
                        db.exec(sql, &[&id])?;
                    }
                    db.exec(RETIRE_DOWNSTREAM, &[&dr_ref])?;
                    retired += 1;
                }
            }
            Ok(retired)
        })
    }

    fn figures(&mut self, now: Now) -> Result<Figures, StoreError> {
        self.read_at(now, |db, now| {
            let mut figures = Figures::default();
            for state in STATES {
                let count = match state {
                    "processing" | "unknown" => {
                        number(db, LIVE_OR_ENDED, &[&now.get(), &(state == "processing")])?
                    }
                    _ => number(db, STATUS_COUNT, &[&state])?,
                };
                figures.by_state.push((state, count));
            }
            let oldest_pending: Option<i64> =
                db.value::<Option<i64>>(OLDEST_PENDING, &[])?.flatten();
            figures.oldest_pending_age = oldest_pending.map_or(0, |at| (now.get() - at).max(0));
            let oldest_unknown = number(db, OLDEST_UNKNOWN, &[&now.get()])?;
            figures.oldest_unknown_age =
                if oldest_unknown == 0 { 0 } else { (now.get() - oldest_unknown).max(0) };
            figures.attempts = number(db, COUNTER, &[&"claims"])?;
            figures.lease_reclaims = number(db, COUNTER, &[&"lease_reclaims"])?;
            figures.fenced_writes = number(db, COUNTER, &[&"fenced_writes"])?;
            figures.reconciliations = number(db, COUNTER, &[&"reconciliations"])?;
            figures.tombstones = number(db, COUNTER, &[&"retired"])?;
            Ok(figures)
        })
    }
}

/// The one number `sql` answers (0 for none, or NULL).
fn number(
    db: &mut Db<'_, crate::session::Client>,
    sql: &str,
    params: &Params<'_>,
) -> Result<i64, StoreError> {
    Ok(db.value::<Option<i64>>(sql, params)?.flatten().unwrap_or_default())
}
