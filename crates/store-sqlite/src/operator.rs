//! What an operator asks of a ledger and does to it: list operations by state, show one
//! operation's whole history, requeue a dead or failed one (logged), settle an unknown
//! one by hand (logged), retire old finished
//! ones (tombstoned), and the figures `metrics` exposes. Every statement is
//! index-backed: `operations_status (status, updated_at)`, the primary keys, and
//! `operator_log_ref`.

use rusqlite::{OptionalExtension, params};
use serde_json::json;
use toolledger_contract::StatusRef;

use crate::{
    Figures, Finalize, Finalizer, ListFilter, ListPosition, Listed, Now, OperatorStore, Requeued,
    Resolved, STATES, Settlement, Shown, StoreError,
    error::sqlite,
    sqlite::{BY_STATUS_REF, Ending, SqliteStore, end_in, select_operation_in},
};

const STATUS_COUNT: &str = "SELECT count(*) FROM operations WHERE status = ?1";
const LIVE_OR_ENDED: &str = "SELECT count(*) FROM operations o JOIN outbox b ON b.op_id = o.id \
     WHERE o.status = 'processing' AND (b.lease_until > ?1 AND b.last_reason IS NULL) = ?2";
const OLDEST_PENDING: &str = "SELECT min(updated_at) FROM operations WHERE status = 'pending'";
/// Since when each unknown operation has been unknown: its attempt's end when it was set
/// aside (`last_reason` kept), else its lease's end.
const OLDEST_UNKNOWN: &str = "SELECT min(CASE WHEN b.last_reason IS NULL THEN b.lease_until ELSE b.updated_at END) \
     FROM operations o JOIN outbox b ON b.op_id = o.id \
     WHERE o.status = 'processing' AND (b.lease_until <= ?1 OR b.last_reason IS NOT NULL)";
const COUNTER: &str = "SELECT coalesce((SELECT value FROM counters WHERE name = ?1), 0)";
/// `list`'s columns, tables and filters around a keyset (`$keyset`, in `$order`):
/// ?1 the stored status, ?2 the cutoff (unchanged since), ?3 and ?4 the position
/// (`updated_at`, id) to continue after, ?5 the tool (NULL: every tool), ?6 whether the
/// lease must have ended (NULL: no split; `processing` and `unknown` share a stored status
/// and are told apart here, so the limit counts only what is listed), ?7 now, ?8 the limit.
macro_rules! list {
    ($keyset:literal, $order:literal) => {
        concat!(
            "SELECT o.status_ref, o.tool_name, b.attempt_count, o.created_at, o.updated_at, \
             coalesce(t.reason, b.last_reason), o.arguments_json, o.id \
             FROM operations o JOIN outbox b ON b.op_id = o.id LEFT JOIN terminal_outcomes t ON t.op_id = o.id \
             WHERE o.status = ?1 AND o.updated_at <= ?2 AND ",
            $keyset,
            " AND (?5 IS NULL OR o.tool_name = ?5) \
             AND (?6 IS NULL OR coalesce(b.lease_until <= ?7 OR b.last_reason IS NOT NULL, 0) = ?6) ORDER BY ",
            $order,
            " LIMIT ?8"
        )
    };
}
/// The rest of the second a page stopped in: a seek on `(status, updated_at, rowid)`,
/// the index's implicit last column. The row value `(updated_at, id) > (?3, ?4)` would
/// read the same rows, but SQLite seeks it on `updated_at` alone and filters the ids, so
/// every operation changed in that second would be read again on each page.
const LIST_TIES: &str = list!("o.updated_at = ?3 AND o.id > ?4", "o.id");
/// The operations changed after that second; from a state's start, ?3 is -1.
const LIST_AFTER: &str = list!("o.updated_at > ?3", "o.updated_at, o.id");
const LOG: &str = "SELECT action, from_state, reason, was, at FROM operator_log WHERE status_ref = ?1 ORDER BY id";
const REQUEUE_OUTBOX: &str = "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL, \
     next_attempt_at = ?2, last_reason = NULL, attempts_before = attempt_count, updated_at = ?2 \
     WHERE op_id = ?1 AND state IN ('failed', 'dead')";
const REQUEUE_OPERATION: &str =
    "UPDATE operations SET status = 'pending', updated_at = ?2 WHERE id = ?1";
const DROP_OUTCOME: &str = "DELETE FROM terminal_outcomes WHERE op_id = ?1";
const LOG_REQUEUE: &str = "INSERT INTO operator_log (status_ref, action, from_state, reason, was, at) \
     VALUES (?1, 'requeue', ?2, ?3, ?4, ?5)";
const LOG_RESOLVE: &str = "INSERT INTO operator_log (status_ref, action, from_state, reason, was, at) \
     VALUES (?1, 'resolve', ?2, ?3, ?4, ?5)";
const RETIRABLE: &str = "SELECT id, status_ref, request_sha256, downstream_request_ref, status FROM operations \
     WHERE status = ?1 AND updated_at <= ?2 ORDER BY updated_at, id LIMIT ?3";
const TOMBSTONE_OF: &str = "SELECT final_status, retired_at FROM tombstones WHERE status_ref = ?1";
const TOMBSTONE: &str = "INSERT INTO tombstones (status_ref, request_sha256, final_status, retired_at) \
     VALUES (?1, ?2, ?3, ?4)";

/// Every operator statement, by name, for the query-plan test.
pub(crate) fn statements() -> Vec<(&'static str, String)> {
    [
        ("metrics: count by status", STATUS_COUNT),
        ("metrics: processing live or ended", LIVE_OR_ENDED),
        ("metrics: oldest pending", OLDEST_PENDING),
        ("metrics: oldest unknown", OLDEST_UNKNOWN),
        ("metrics: counter", COUNTER),
        ("list: the rest of a second", LIST_TIES),
        ("list: after a second", LIST_AFTER),
        ("show: operator log", LOG),
        ("show: tombstone", TOMBSTONE_OF),
        ("requeue: outbox", REQUEUE_OUTBOX),
        ("requeue: operation", REQUEUE_OPERATION),
        ("requeue: drop outcome", DROP_OUTCOME),
        ("gc: retirable", RETIRABLE),
    ]
    .into_iter()
    .map(|(name, sql)| (name, sql.to_owned()))
    .collect()
}

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

impl OperatorStore for SqliteStore {
    fn list(
        &mut self,
        filter: &ListFilter<'_>,
        show_arguments: bool,
        now: Now,
    ) -> Result<Vec<Listed>, StoreError> {
        self.arm_waits()?;
        let walk = filter.walk()?;
        let limit = filter.limit.clamp(1, 10_000);
        let cutoff = filter.cutoff(now.get());
        let conn = self.connection();
        let mut listed = Vec::new();
        for (state, after) in walk {
            // The rest of the cursor's second first, then every later second.
            let mut steps = Vec::with_capacity(2);
            if let Some(position) = after {
                steps.push((LIST_TIES, position.updated_at, position.id));
            }
            steps.push((LIST_AFTER, after.map_or(-1, |position| position.updated_at), 0));
            for (sql, updated_at, id) in steps {
                let left = i64::try_from(limit - listed.len()).unwrap_or(10_000);
                if left == 0 {
                    return Ok(listed);
                }
                let mut statement = conn.prepare_cached(sql).map_err(sqlite)?;
                let mut rows = statement
                    .query(params![
                        stored(state),
                        cutoff,
                        updated_at,
                        id,
                        filter.tool,
                        lease_ended(state),
                        now.get(),
                        left
                    ])
                    .map_err(sqlite)?;
                while let Some(row) = rows.next().map_err(sqlite)? {
                    let created: i64 = row.get(3).map_err(sqlite)?;
                    let updated: i64 = row.get(4).map_err(sqlite)?;
                    let position =
                        ListPosition { updated_at: updated, id: row.get(7).map_err(sqlite)? };
                    listed.push(Listed {
                        status_ref: row.get(0).map_err(sqlite)?,
                        tool: row.get(1).map_err(sqlite)?,
                        state,
                        attempts: row.get(2).map_err(sqlite)?,
                        age: now.get().saturating_sub(created).max(0),
                        idle: now.get().saturating_sub(updated).max(0),
                        reason: row.get(5).map_err(sqlite)?,
                        arguments: if show_arguments {
                            Some(row.get(6).map_err(sqlite)?)
                        } else {
                            None
                        },
                        cursor: filter.cursor(state, position),
                    });
                }
            }
        }
        Ok(listed)
    }

    fn show(&mut self, status_ref: &StatusRef) -> Result<Shown, StoreError> {
        self.arm_waits()?;
        let conn = self.connection();
        let operation = select_operation_in(conn, BY_STATUS_REF, &[&status_ref.as_str()])?;
        let tombstone = conn
            .prepare_cached(TOMBSTONE_OF)
            .map_err(sqlite)?
            .query_row([status_ref.as_str()], |row| {
                Ok(json!({"final_status": row.get::<_, String>(0)?, "retired_at": row.get::<_, i64>(1)?}))
            })
            .optional()
            .map_err(sqlite)?;
        let mut statement = conn.prepare_cached(LOG).map_err(sqlite)?;
        let log = statement
            .query_map([status_ref.as_str()], |row| {
                Ok(json!({
                    "action": row.get::<_, String>(0)?,
                    "from": row.get::<_, String>(1)?,
                    "reason": row.get::<_, String>(2)?,
                    "was": row.get::<_, String>(3)?,
                    "at": row.get::<_, i64>(4)?,
                }))
            })
            .map_err(sqlite)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sqlite)?;
        Ok(Shown { operation, log, tombstone })
    }

    fn requeue(
        &mut self,
        status_ref: &StatusRef,
        reason: &str,
        now: Now,
    ) -> Result<Requeued, StoreError> {
        let reason = toolledger_store::bounded_reason(reason);
        self.write(|tx| {
            let Some(operation) = select_operation_in(tx, BY_STATUS_REF, &[&status_ref.as_str()])?
            else {
                return Ok(Requeued::Missing);
            };
            let was = match toolledger_store::requeue_reason(&operation) {
                Ok(was) => was,
                Err(status) => return Ok(Requeued::Refused(status)),
            };
            let id: i64 = tx
                .query_row(
                    "SELECT id FROM operations WHERE status_ref = ?1",
                    [status_ref.as_str()],
                    |row| row.get(0),
                )
                .map_err(sqlite)?;
            tx.prepare_cached(DROP_OUTCOME).map_err(sqlite)?.execute([id]).map_err(sqlite)?;
            tx.prepare_cached(REQUEUE_OUTBOX)
                .map_err(sqlite)?
                .execute(params![id, now.get()])
                .map_err(sqlite)?;
            tx.prepare_cached(REQUEUE_OPERATION)
                .map_err(sqlite)?
                .execute(params![id, now.get()])
                .map_err(sqlite)?;
            tx.prepare_cached(LOG_REQUEUE)
                .map_err(sqlite)?
                .execute(params![
                    status_ref.as_str(),
                    operation.status.as_str(),
                    reason,
                    was,
                    now.get()
                ])
                .map_err(sqlite)?;
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
        self.write(|tx| {
            let Some(operation) = select_operation_in(tx, BY_STATUS_REF, &[&status_ref.as_str()])?
            else {
                return Ok(Resolved::Missing);
            };
            let (from, was) = match toolledger_store::resolvable(&operation, now) {
                Ok(resolvable) => resolvable,
                Err(answer) => return Ok(answer),
            };
            if end_in(tx, status_ref, &Finalizer::Operator, now, &ending)? != Finalize::Finalized {
                return Err(StoreError::Internal("an unended operation refused its ending"));
            }
            tx.prepare_cached(LOG_RESOLVE)
                .map_err(sqlite)?
                .execute(params![status_ref.as_str(), from, reason, was, now.get()])
                .map_err(sqlite)?;
            Ok(Resolved::Resolved(settlement.ends_as()))
        })
    }

    fn retire(&mut self, cutoff: Now, now: Now, limit: usize) -> Result<usize, StoreError> {
        self.write(|tx| {
            let mut retired = 0;
            for status in ["succeeded", "failed", "quarantined", "dead"] {
                let rows: Vec<(i64, String, String, String, String)> = tx
                    .prepare_cached(RETIRABLE)
                    .map_err(sqlite)?
                    .query_map(
                        params![status, cutoff.get(), i64::try_from(limit).unwrap_or(1000)],
                        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
                    )
                    .map_err(sqlite)?
                    .collect::<Result<_, _>>()
                    .map_err(sqlite)?;
                for (id, status_ref, request, dr_ref, final_status) in rows {
                    if retired >= limit {
                        return Ok(retired);
                    }
                    tx.prepare_cached(TOMBSTONE)
                        .map_err(sqlite)?
                        .execute(params![status_ref, request, final_status, now.get()])
                        .map_err(sqlite)?;
                    crate::sqlite::bump(tx, "retired")?;
                    for sql in [
                        "DELETE FROM local_receipts WHERE op_id = ?1",
                        "DELETE FROM terminal_outcomes WHERE op_id = ?1",
                        "DELETE FROM call_identities WHERE op_id = ?1",
                        "DELETE FROM outbox WHERE op_id = ?1",
                        "DELETE FROM operations WHERE id = ?1",
                    ] {
                        tx.prepare_cached(sql).map_err(sqlite)?.execute([id]).map_err(sqlite)?;
                    }
                    tx.prepare_cached(
                        "DELETE FROM downstream_receipts WHERE downstream_request_ref = ?1",
                    )
                    .map_err(sqlite)?
                    .execute([dr_ref])
                    .map_err(sqlite)?;
                    retired += 1;
                }
            }
            Ok(retired)
        })
    }

    fn figures(&mut self, now: Now) -> Result<Figures, StoreError> {
        self.arm_waits()?;
        let conn = self.connection();
        let one = |sql: &str, key: &dyn rusqlite::ToSql| -> Result<i64, StoreError> {
            conn.prepare_cached(sql)
                .map_err(sqlite)?
                .query_row([key], |row| row.get::<_, Option<i64>>(0))
                .map_err(sqlite)
                .map(Option::unwrap_or_default)
        };
        let mut figures = Figures::default();
        for state in STATES {
            let count = match state {
                "processing" | "unknown" => conn
                    .prepare_cached(LIVE_OR_ENDED)
                    .map_err(sqlite)?
                    .query_row(params![now.get(), state == "processing"], |row| row.get(0))
                    .map_err(sqlite)?,
                _ => one(STATUS_COUNT, &state)?,
            };
            figures.by_state.push((state, count));
        }
        let oldest_pending: Option<i64> = conn
            .query_row(OLDEST_PENDING, [], |row| row.get(0))
            .optional()
            .map_err(sqlite)?
            .flatten();
        figures.oldest_pending_age = oldest_pending.map_or(0, |at| (now.get() - at).max(0));
        let oldest_unknown = one(OLDEST_UNKNOWN, &now.get())?;
        figures.oldest_unknown_age =
            if oldest_unknown == 0 { 0 } else { (now.get() - oldest_unknown).max(0) };
        figures.attempts = one(COUNTER, &"claims")?;
        figures.lease_reclaims = one(COUNTER, &"lease_reclaims")?;
        figures.fenced_writes = one(COUNTER, &"fenced_writes")?;
        figures.reconciliations = one(COUNTER, &"reconciliations")?;
        figures.tombstones = one(COUNTER, &"retired")?;
        Ok(figures)
    }
}
