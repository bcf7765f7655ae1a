//! The SQLite implementation of [`LedgerStore`]: one connection, one thread.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction (the write lock is taken before the
//! first read, so two writers never both read "absent" and both insert). A transaction
//! dropped without commit rolls back: `?` on any error inside one is always safe.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::Value;
use toolledger_contract::{
    DownstreamIdentity, Identifier, LeaseSeconds, Purpose, Scope, StatusRef,
};
use toolledger_json::canonicalize;
use toolledger_store::{OPERATION_COLUMNS, OPERATION_FROM, OPERATION_WIDTH};

use crate::{
    AuditReport, CallIdentity, Claim, ClaimedBatch, DispatchLookup, DownstreamReceipt, Finalize,
    Finalizer, LedgerStore, LocalReceipt, NewOperation, Now, Operation, OperationStatus,
    OutboxEvent, OutboxState, RecordedCall, Release, Reservation, StandInReceipts, StoreError,
    Waits,
    error::{self, sqlite},
    gate::{Answer, Combining, Entered, Gate, Job},
    not_claimed, schema,
    verify::{self, RawOperation},
};

// The hot statements, named so `statement_plans` can show each one's query plan.
const SELECT_CALL: &str = "SELECT c.purpose, o.status_ref, o.tenant_id, o.subject_id, o.status \
             FROM call_identities c JOIN operations o ON o.id = c.op_id \
             WHERE c.provider = ?1 AND c.api_family = ?2 AND c.provider_response_id = ?3 AND c.provider_call_id = ?4";
const INSERT_OPERATION: &str = "INSERT INTO operations (tenant_id, subject_id, tool_name, idempotency_key, status_ref, \
                 downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision, \
                 effect_revision, handler_revision, producer_revision, policy_revision, provider, api_family, \
                 adapter_revision, provider_response_id, provider_call_id, operation_id, approval_id, approver_id, \
                 approval_sha256, approved_at, approval_expires_at, downstream_name, downstream_revision, status, \
                 created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, \
                 ?21, ?22, ?23, ?24, ?25, ?27, ?28, ?29, ?26, ?26) \
                 ON CONFLICT (tenant_id, subject_id, tool_name, idempotency_key) DO NOTHING";
const INSERT_OUTBOX_CLAIMED: &str = "INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, \
             next_attempt_at, last_reason, attempts_before, created_at, updated_at) \
             VALUES (?1, 'processing', ?3, ?4, 1, ?4, NULL, 0, ?2, ?2)";
const INSERT_OUTBOX: &str = "INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, next_attempt_at, \
             last_reason, attempts_before, created_at, updated_at) VALUES (?1, 'pending', NULL, NULL, 0, ?2, NULL, 0, ?2, ?2)";
const BUMP: &str = "INSERT INTO counters (name, value) VALUES (?1, 1) \
             ON CONFLICT (name) DO UPDATE SET value = value + 1";
const BUMP_BY: &str = "INSERT INTO counters (name, value) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET value = value + ?2";
const RETIRED: &str = "SELECT final_status FROM tombstones WHERE status_ref = ?1";
const INSERT_CALL: &str = "INSERT INTO call_identities (provider, api_family, adapter_revision, provider_response_id, \
         provider_call_id, purpose, op_id, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT (provider, api_family, provider_response_id, provider_call_id) DO NOTHING";
const CLAIM: &str = "UPDATE outbox SET state = 'processing', lease_owner = ?2, lease_until = ?3, \
                 next_attempt_at = ?3, attempt_count = attempt_count + 1, last_reason = NULL, updated_at = ?4 \
                 WHERE op_id = (SELECT id FROM operations WHERE status_ref = ?1) \
                 AND (state = 'pending' OR (state = 'processing' AND lease_until <= ?4)) \
                 RETURNING op_id, attempt_count";
const SELECT_OUTBOX_STATE: &str =
    "SELECT b.state FROM operations o JOIN outbox b ON b.op_id = o.id WHERE o.status_ref = ?1";
const MARK_PROCESSING: &str =
    "UPDATE operations SET status = 'processing', updated_at = ?2 WHERE id = ?1";
const INSERT_DOWNSTREAM: &str = "INSERT INTO downstream_receipts (downstream_request_ref, request_sha256, receipt_ref, receipt_json, \
             created_at) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (downstream_request_ref) DO NOTHING";
const SELECT_DOWNSTREAM: &str = "SELECT request_sha256, receipt_ref, receipt_json FROM downstream_receipts WHERE downstream_request_ref = ?1";
const FINALIZE: &str = "UPDATE outbox SET state = ?5, updated_at = ?4 \
                 WHERE op_id = (SELECT id FROM operations WHERE status_ref = ?1 \
                 AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead')) \
                 AND (?2 IS NULL OR (state = 'processing' AND lease_owner = ?2 AND attempt_count = ?3)) \
                 RETURNING op_id";
const INSERT_OUTCOME: &str = "INSERT INTO terminal_outcomes (op_id, kind, reason, receipt_json, finalized_by, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const MARK_ENDED: &str = "UPDATE operations SET status = ?3, updated_at = ?2 WHERE id = ?1 \
             AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead')";
const RELEASE: &str = "UPDATE outbox SET state = ?5, lease_owner = NULL, lease_until = NULL, next_attempt_at = ?6, \
                 last_reason = ?7, updated_at = ?4 \
                 WHERE op_id = (SELECT id FROM operations WHERE status_ref = ?1) \
                 AND state = 'processing' AND lease_owner = ?2 AND attempt_count = ?3 RETURNING op_id";
const MARK_RELEASED: &str = "UPDATE operations SET status = ?3, updated_at = ?2 WHERE id = ?1";
/// An attempt set aside (`Release::Later`): still processing (?5), its lease ending at ?6,
/// the reason kept (so no heartbeat renews it), fenced as a release is; the owner stays.
const SET_ASIDE: &str = "UPDATE outbox SET state = ?5, lease_until = ?6, next_attempt_at = ?6, last_reason = ?7, \
                 updated_at = ?4 WHERE op_id = (SELECT id FROM operations WHERE status_ref = ?1) \
                 AND state = 'processing' AND lease_owner = ?2 AND attempt_count = ?3 RETURNING op_id";
const DUE: &str = "SELECT b.op_id, b.state FROM outbox b JOIN operations o ON o.id = b.op_id \
                 WHERE b.state IN ('pending', 'processing') AND b.next_attempt_at <= ?1 \
                 AND o.downstream_name = ?3 AND o.downstream_revision = ?4 \
                 ORDER BY b.next_attempt_at, b.op_id LIMIT ?2";
const CLAIM_ONE: &str = "UPDATE outbox SET state = 'processing', lease_owner = ?2, lease_until = ?3, \
                 next_attempt_at = ?3, attempt_count = attempt_count + 1, last_reason = NULL, updated_at = ?4 \
                 WHERE op_id = ?1 AND state IN ('pending', 'processing') AND next_attempt_at <= ?4 \
                 RETURNING attempt_count";
const HEARTBEAT: &str = "UPDATE outbox SET lease_until = ?3, next_attempt_at = ?3, updated_at = ?2 \
                 WHERE op_id IN (SELECT op_id FROM outbox WHERE state IN ('pending', 'processing') \
                 AND next_attempt_at > ?2 AND lease_owner = ?1) AND state = 'processing' AND last_reason IS NULL";
const SELECT_STATUS: &str = "SELECT status FROM operations WHERE status_ref = ?1";
const INSERT_LOCAL_RECEIPT: &str = "INSERT INTO local_receipts (op_id, downstream_request_ref, receipt_ref, receipt_json, output_json, \
             result_sha256, finalized_by, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const SELECT_OPERATION_ID: &str = "SELECT id FROM operations WHERE status_ref = ?1";

const BY_SCOPE: &str =
    "o.tenant_id = ?1 AND o.subject_id = ?2 AND o.tool_name = ?3 AND o.idempotency_key = ?4";
pub(crate) const BY_STATUS_REF: &str = "o.status_ref = ?1";
const BY_ID: &str = "o.id = ?1";

/// An operation with its outbox event and local receipt, chosen by `filter`.
fn operation_sql(filter: &str) -> String {
    format!("SELECT {OPERATION_COLUMNS} {OPERATION_FROM} WHERE {filter}")
}

/// Dispatch's one read: the scope's operation and the call's identity. `(SELECT 1)`
/// makes it one row whether or not either exists.
fn dispatch_lookup_sql() -> String {
    format!(
        "SELECT {OPERATION_COLUMNS}, o.id, c.purpose, co.status_ref, co.tenant_id, co.subject_id, co.status \
         FROM (SELECT 1) \
         LEFT JOIN operations o ON {} \
         LEFT JOIN outbox b ON b.op_id = o.id LEFT JOIN local_receipts l ON l.op_id = o.id \
         LEFT JOIN terminal_outcomes t ON t.op_id = o.id \
         LEFT JOIN call_identities c ON c.provider = ?5 AND c.api_family = ?6 AND c.provider_response_id = ?7 \
         AND c.provider_call_id = ?8 LEFT JOIN operations co ON co.id = c.op_id",
        BY_SCOPE
    )
}

/// Every statement a dispatch, a worker, a replay or a status query runs, by name.
fn hot_statements() -> Vec<(&'static str, String)> {
    vec![
        ("dispatch lookup (replay)", dispatch_lookup_sql()),
        ("operation by scope", operation_sql(BY_SCOPE)),
        ("operation by status_ref", operation_sql(BY_STATUS_REF)),
        ("call identity", SELECT_CALL.to_owned()),
        ("A: insert operation", INSERT_OPERATION.to_owned()),
        ("A: insert outbox event", INSERT_OUTBOX.to_owned()),
        ("A+claim: insert leased outbox event", INSERT_OUTBOX_CLAIMED.to_owned()),
        ("A: insert call identity", INSERT_CALL.to_owned()),
        ("claim", CLAIM.to_owned()),
        ("claim: outbox state", SELECT_OUTBOX_STATE.to_owned()),
        ("claim: mark processing", MARK_PROCESSING.to_owned()),
        ("B: insert downstream receipt", INSERT_DOWNSTREAM.to_owned()),
        ("B: downstream receipt by ref", SELECT_DOWNSTREAM.to_owned()),
        ("C: deliver", FINALIZE.to_owned()),
        ("C: operation status", SELECT_STATUS.to_owned()),
        ("C: insert local receipt", INSERT_LOCAL_RECEIPT.to_owned()),
        ("C: insert terminal outcome", INSERT_OUTCOME.to_owned()),
        ("C: mark ended", MARK_ENDED.to_owned()),
        ("release: outbox", RELEASE.to_owned()),
        ("release: mark pending, dead or still processing", MARK_RELEASED.to_owned()),
        ("release: set an attempt aside", SET_ASIDE.to_owned()),
        ("relay: due events", DUE.to_owned()),
        ("relay: claim one due event", CLAIM_ONE.to_owned()),
        ("relay: heartbeat", HEARTBEAT.to_owned()),
        ("counters: bump", BUMP.to_owned()),
        ("counters: bump by a batch's count", BUMP_BY.to_owned()),
        ("A: retired key", RETIRED.to_owned()),
        ("relay: operation by id", operation_sql(BY_ID)),
        ("status query: operation id", SELECT_OPERATION_ID.to_owned()),
    ]
}

/// A toolledger store in one SQLite file.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    gate: Gate,
    waits: Waits,
}

/// A write transaction holding the file's writer gate. Fields drop in order: the
/// transaction ends (rolls back unless committed) before the gate opens.
struct Write<'a> {
    tx: Transaction<'a>,
    _gate: Entered<'a>,
}

impl<'a> std::ops::Deref for Write<'a> {
    type Target = Transaction<'a>;

    fn deref(&self) -> &Transaction<'a> {
        &self.tx
    }
}

impl Write<'_> {
    fn commit(self) -> Result<(), StoreError> {
        // A failed COMMIT may have written the commit's frames before its sync failed:
        // SQLite's recovery of the WAL could still bring them back.
        self.tx.commit().map_err(|err| StoreError::commit_unknown("sqlite", sqlite(err)))?;
        toolledger_store::crash::committed();
        Ok(())
    }
}

impl SqliteStore {
    /// Opens the store at `path`, creating it when no file exists and initialising a
    /// 0-byte or table-less file. Any other SQLite file must carry the schema id in
    /// `meta` and `user_version` 1, else [`StoreError::SchemaUnsupported`] and the file is
    /// left untouched.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the file is not SQLite, cannot be opened, or cannot
    /// use WAL; [`StoreError::SchemaUnsupported`] as above.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, Waits::default())
    }

    /// [`SqliteStore::open`] with its own bound on waiting for other connections.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open`], plus [`StoreError::Busy`] when another connection
    /// held a lock past the bound.
    pub fn open_with(path: &Path, waits: Waits) -> Result<SqliteStore, StoreError> {
        let conn = schema::open(path, &waits)?;
        // The open spent some of the bound; a long-lived store (no deadline) gets its
        // whole per-wait bound back for every later wait.
        schema::set_busy_timeout(&conn, waits.next_wait())?;
        Ok(SqliteStore { conn, gate: Gate::of(path), waits })
    }

    /// Opens an existing store, for the commands that never create one. Creates nothing:
    /// a missing or 0-byte file is [`StoreError::Missing`], and a store whose schema
    /// differs from the DDL (an index, trigger or CHECK dropped, a column or table added)
    /// is [`StoreError::SchemaUnsupported`]: only [`SqliteStore::audit_path`] reads one.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open`], plus [`StoreError::Missing`].
    pub fn open_existing(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_existing_with(path, Waits::default())
    }

    /// [`SqliteStore::open_existing`] with its own bound on waiting.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open_existing`], plus [`StoreError::Busy`].
    pub fn open_existing_with(path: &Path, waits: Waits) -> Result<SqliteStore, StoreError> {
        let conn = schema::open_existing(path, &waits, schema::Damaged::Refused)?;
        Ok(SqliteStore { conn, gate: Gate::of(path), waits })
    }

    /// Audits the store at `path` without creating or changing anything. A store SQLite
    /// finds corrupt before the audit's snapshot can start is a report too (its
    /// `integrity_check` failed), not an error: the audit reports, it does not abort.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open_existing_with`], except [`StoreError::Corrupt`] and a
    /// schema that differs from the DDL: both are reported, not refused.
    pub fn audit_path(path: &Path, waits: Waits) -> Result<AuditReport, StoreError> {
        let audited = schema::open_existing(path, &waits, schema::Damaged::Audited)
            .map(|conn| SqliteStore { conn, gate: Gate::of(path), waits });
        match audited.and_then(|mut store| store.audit()) {
            Err(StoreError::Corrupt) => Ok(crate::audit::corrupt()),
            result => result,
        }
    }

    /// `EXPLAIN QUERY PLAN` of every hot statement, by name: each must search an index
    /// (or a primary key), never scan a table, so its cost does not grow with the ledger.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when a statement cannot be explained.
    pub fn query_plans(&self) -> Result<Vec<(&'static str, Vec<String>)>, StoreError> {
        let mut plans = Vec::new();
        for (name, sql) in hot_statements().into_iter().chain(crate::operator::statements()) {
            let mut statement =
                self.conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).map_err(sqlite)?;
            // Parameters stay unbound: a plan does not depend on their values.
            let mut rows = statement.raw_query();
            let mut plan = Vec::new();
            while let Some(row) = rows.next().map_err(sqlite)? {
                plan.push(row.get::<_, String>(3).map_err(sqlite)?);
            }
            plans.push((name, plan));
        }
        Ok(plans)
    }

    /// Gives SQLite's busy handler only the time the bound leaves. Without a deadline
    /// the timeout set at open stands, and this costs nothing.
    fn arm(&self) -> Result<(), StoreError> {
        if self.waits.deadline.is_some() {
            schema::set_busy_timeout(&self.conn, self.waits.next_wait())?;
        }
        Ok(())
    }

    /// Arms the busy handler for a read (see [`SqliteStore::arm`]).
    pub(crate) fn arm_waits(&self) -> Result<(), StoreError> {
        self.arm()
    }

    /// The connection, for the operator's reads.
    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Runs `work` in one write transaction and commits it when `work` succeeds.
    pub(crate) fn write<T>(
        &mut self,
        work: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self.immediate()?;
        let result = work(&tx)?;
        tx.commit()?;
        Ok(result)
    }

    /// `BEGIN IMMEDIATE` behind the file's writer gate, alone (an operator's write), each
    /// wait within the bound.
    fn immediate(&mut self) -> Result<Write<'_>, StoreError> {
        self.arm()?;
        let SqliteStore { conn, gate, waits } = self;
        let gate = gate.enter(waits.next_wait()).ok_or(StoreError::Busy)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sqlite)?;
        Ok(Write { tx, _gate: gate })
    }

    /// Runs `work` as one commit point in a group commit (see `gate`): answered once the
    /// transaction holding it has committed (durable under `synchronous=FULL`), or with
    /// its error — then nothing of it was written. `work` may run on another thread's
    /// connection, inside that thread's transaction and its own savepoint.
    fn batched<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.arm()?;
        let SqliteStore { gate, waits, .. } = self;
        let job: Job = Box::new(move |conn| {
            work(conn).map(|value| Box::new(value) as Box<dyn std::any::Any + Send>)
        });
        let wait = waits.next_wait();
        let answer = gate.run(job, wait, |writer, combining| {
            let connection = match writer.connection.take() {
                Some(connection) => {
                    schema::set_busy_timeout(&connection, wait).map(|()| connection)
                }
                None => schema::open_writer(writer.path, wait),
            };
            match connection {
                Ok(mut connection) => {
                    let (answers, healthy) = commit_batch(&mut connection, combining);
                    if healthy {
                        *writer.connection = Some(connection);
                    }
                    answers
                }
                // Only the combiner's own job is refused; the queued ones wait for the next.
                Err(err) => vec![Err(err)],
            }
        });
        answer.and_then(|value| {
            value
                .downcast::<T>()
                .map(|value| *value)
                .map_err(|_| StoreError::Internal("a group commit answered another write"))
        })
    }

    /// Writes operations that have already finished — each intent with its call
    /// identity, the stand-in's downstream receipt and the local receipt — through the
    /// very statements of A with the claim (owner `loader`, attempt 1), B and C, all in
    /// **one** transaction: one fsync for the whole load, for building large ledgers
    /// (benchmarks, tests). Nothing of it is written when any operation is refused (its
    /// scope, refs or call identity already in the store, or a row the checks refuse).
    /// The number loaded.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; `ContractViolation` when an operation is not new.
    pub fn load_finished(
        &mut self,
        finished: &[(NewOperation, CallIdentity, LocalReceipt)],
        now: Now,
    ) -> Result<usize, StoreError> {
        let loader = Identifier::new("loader")
            .map_err(|_| StoreError::Internal("the loader's name is an identifier"))?;
        let lease_until = now
            .checked_add(LeaseSeconds::new(1).map_err(|_| StoreError::Internal("one second"))?)
            .ok_or(error::failed("the lease would end after year 9999"))?;
        let by = Finalizer::Lease { owner: loader.clone(), attempt: 1 };
        self.write(|tx| {
            for (intent, call, receipt) in finished {
                let status_ref = intent.status_ref.clone();
                let arguments = canonicalize(&intent.arguments);
                match reserve_in(
                    tx,
                    (intent.clone(), arguments),
                    call,
                    now,
                    Some((&loader, lease_until)),
                )? {
                    Reservation::Reserved(_) => {}
                    _ => {
                        return Err(StoreError::ContractViolation("a loaded operation is not new"));
                    }
                }
                let downstream = receipt.downstream.clone();
                let receipt_json = canonicalize(&downstream.receipt);
                record_downstream_in(tx, (downstream, receipt_json), now)?;
                match end_in(tx, &status_ref, &by, now, &Ending::succeeded(receipt))? {
                    Finalize::Finalized => {}
                    _ => return Err(StoreError::Internal("a loaded operation did not finish")),
                }
            }
            Ok(finished.len())
        })
    }

    /// Group commits of this process on this file so far: transactions, and the commit
    /// points they held. Their ratio is the mean batch.
    pub fn group_commits(&self) -> (u64, u64) {
        self.gate.batches()
    }

    /// How many writes of this process wait behind the one holding the file's writer
    /// gate right now.
    pub fn writes_waiting(&self) -> usize {
        self.gate.waiting()
    }
}

/// One group commit: `BEGIN IMMEDIATE`, then the batch (taken once the write lock is
/// held, so writers that queued meanwhile join it), each job in its own savepoint when
/// there are several — a job's error rolls back only that job — then one `COMMIT`. The
/// answers follow the batch's order; when the transaction itself fails (the lock, the
/// commit, a savepoint, SQLite ending the transaction on an I/O error) every job is
/// answered that error and nothing of the batch was written.
fn commit_batch(conn: &mut Connection, combining: &mut Combining<'_>) -> (Vec<Answer>, bool) {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        // Only the combiner's own job is refused; the queued ones wait for the next.
        Err(err) => return (vec![Err(sqlite(err))], true),
    };
    let jobs = combining.jobs();
    let count = jobs.len();
    let mut answers = Vec::with_capacity(count);
    if count == 1 {
        answers.extend(jobs.into_iter().map(|job| job(&tx)));
        if answers.iter().any(Result::is_err) {
            // Dropping `tx` rolls it back; the connection is out of it unless SQLite
            // could not even do that.
            drop(tx);
            let healthy = conn.is_autocommit();
            return (answers, healthy);
        }
    } else {
        for job in jobs {
            if let Err(err) = savepoint(&tx, "SAVEPOINT batched") {
                return ((0..count).map(|_| Err(err.clone())).collect(), false);
            }
            let answer = job(&tx);
            // SQLite itself ends the transaction on some errors (a full disk, I/O): then
            // the whole batch is gone.
            let kept = if tx.is_autocommit() {
                Err(error::failed("the transaction ended under a group commit"))
            } else if answer.is_ok() {
                savepoint(&tx, "RELEASE batched")
            } else {
                savepoint(&tx, "ROLLBACK TO batched")
                    .and_then(|()| savepoint(&tx, "RELEASE batched"))
            };
            if let Err(err) = kept {
                return ((0..count).map(|_| Err(err.clone())).collect(), false);
            }
            answers.push(answer);
        }
    }
    match tx.commit() {
        Ok(()) => {
            toolledger_store::crash::committed();
            (answers, true)
        }
        Err(err) => {
            let err = StoreError::commit_unknown("sqlite", sqlite(err));
            (answers.into_iter().map(|answer| answer.and(Err(err.clone()))).collect(), false)
        }
    }
}

fn savepoint(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql).map_err(sqlite)?.execute([]).map(drop).map_err(sqlite)
}

/// The columns of an operation joined with its outbox event, in [`raw_operation`] order.
pub(crate) fn raw_operation(row: &Row<'_>) -> rusqlite::Result<RawOperation> {
    RawOperation::decode(&Columns(row))
}

/// A driver row, read by position for [`RawOperation::decode`].
struct Columns<'r, 's>(&'r Row<'s>);

impl verify::Columns for Columns<'_, '_> {
    type Error = rusqlite::Error;

    fn text(&self, index: usize) -> rusqlite::Result<String> {
        self.0.get(index)
    }

    fn optional_text(&self, index: usize) -> rusqlite::Result<Option<String>> {
        self.0.get(index)
    }

    fn optional_int(&self, index: usize) -> rusqlite::Result<Option<i64>> {
        self.0.get(index)
    }

    fn int(&self, index: usize) -> rusqlite::Result<i64> {
        self.0.get(index)
    }
}

pub(crate) fn select_operation_in(
    conn: &Connection,
    filter: &str,
    key: &[&dyn rusqlite::ToSql],
) -> Result<Option<Operation>, StoreError> {
    let raw = conn
        .prepare_cached(&operation_sql(filter))
        .map_err(sqlite)?
        .query_row(key, raw_operation)
        .optional()
        .map_err(sqlite)?;
    Ok(raw.map(verify::operation).transpose()?)
}

fn by_scope(conn: &Connection, scope: &Scope) -> Result<Option<Operation>, StoreError> {
    select_operation_in(
        conn,
        BY_SCOPE,
        &[
            &scope.tenant_id.as_str(),
            &scope.subject_id.as_str(),
            &scope.tool_name,
            &scope.idempotency_key.as_str(),
        ],
    )
}

fn by_status_ref(
    conn: &Connection,
    status_ref: &StatusRef,
) -> Result<Option<Operation>, StoreError> {
    select_operation_in(conn, BY_STATUS_REF, &[&status_ref.as_str()])
}

fn recorded_call(
    conn: &Connection,
    call: &CallIdentity,
) -> Result<Option<RecordedCall>, StoreError> {
    let row = conn
        .prepare_cached(SELECT_CALL)
        .map_err(sqlite)?
        .query_row(
            params![
                call.profile.provider,
                call.profile.api_family,
                call.provider_response_id.as_str(),
                call.provider_call_id.as_str()
            ],
            |row| raw_recorded(row, 0),
        )
        .optional()
        .map_err(sqlite)?;
    row.map(recorded_from).transpose()
}

/// A recorded call's purpose and its operation's status ref, tenant, subject and
/// status, from five columns starting at `at`.
type RawRecorded = (String, String, String, String, String);

fn raw_recorded(row: &Row<'_>, at: usize) -> rusqlite::Result<RawRecorded> {
    Ok((row.get(at)?, row.get(at + 1)?, row.get(at + 2)?, row.get(at + 3)?, row.get(at + 4)?))
}

fn recorded_from(
    (purpose, status_ref, tenant, subject, status): RawRecorded,
) -> Result<RecordedCall, StoreError> {
    verify::recorded_call(&purpose, &status_ref, &tenant, &subject, &status)
}

fn insert_call(
    tx: &Connection,
    call: &CallIdentity,
    purpose: Purpose,
    op_id: i64,
    now: Now,
) -> Result<(), StoreError> {
    tx.prepare_cached(INSERT_CALL)
        .map_err(sqlite)?
        .execute(params![
            call.profile.provider,
            call.profile.api_family,
            call.profile.adapter_revision,
            call.provider_response_id.as_str(),
            call.provider_call_id.as_str(),
            purpose.as_str(),
            op_id,
            now.get()
        ])
        .map_err(sqlite)?;
    Ok(())
}

fn op_id(tx: &Connection, status_ref: &StatusRef) -> Result<Option<i64>, StoreError> {
    tx.prepare_cached(SELECT_OPERATION_ID)
        .map_err(sqlite)?
        .query_row([status_ref.as_str()], |row| row.get(0))
        .optional()
        .map_err(sqlite)
}

fn downstream_receipt(
    conn: &Connection,
    downstream_request_ref: &str,
) -> Result<Option<DownstreamReceipt>, StoreError> {
    let row: Option<(String, String, String)> = conn
        .prepare_cached(SELECT_DOWNSTREAM)
        .map_err(sqlite)?
        .query_row([downstream_request_ref], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()
        .map_err(sqlite)?;
    Ok(row
        .map(|(request, receipt_ref, receipt_json)| {
            verify::downstream(
                downstream_request_ref.to_owned(),
                &request,
                receipt_ref,
                &receipt_json,
            )
        })
        .transpose()?)
}

/// How an operation ends, in commit C (owned: commit C may run on a combiner's thread).
/// Its JSON is canonicalized by the caller, outside the group commit's transaction.
pub(crate) enum Ending {
    /// The local receipt, its receipt's canonical JSON and its output's.
    Succeeded(LocalReceipt, String, String),
    Failed(String),
    /// The kept receipt's canonical JSON and the reason.
    Quarantined(String, String),
}

impl Ending {
    pub(crate) fn succeeded(receipt: &LocalReceipt) -> Ending {
        Ending::Succeeded(
            receipt.clone(),
            canonicalize(&receipt.downstream.receipt),
            canonicalize(&receipt.output),
        )
    }
}

/// The one text column `sql` selects for `status_ref`, if its row exists.
fn text_by_ref(
    conn: &Connection,
    sql: &str,
    status_ref: &StatusRef,
) -> Result<Option<String>, StoreError> {
    conn.prepare_cached(sql)
        .map_err(sqlite)?
        .query_row([status_ref.as_str()], |row| row.get(0))
        .optional()
        .map_err(sqlite)
}

/// An operation's status, read inside a transaction.
fn status_of(
    tx: &Connection,
    status_ref: &StatusRef,
) -> Result<Option<OperationStatus>, StoreError> {
    text_by_ref(tx, SELECT_STATUS, status_ref)?
        .map(|text| {
            OperationStatus::parse(&text)
                .ok_or(StoreError::ContractViolation("stored status is unknown"))
        })
        .transpose()
}

impl SqliteStore {
    /// Commit C, whichever way the operation ends: conditional on the operation not
    /// having ended and, for a worker, on it still holding the lease (owner and
    /// attempt); then the outcome's row and the operation's status, in one transaction.
    fn end(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        now: Now,
        ending: Ending,
    ) -> Result<Finalize, StoreError> {
        let (status_ref, by) = (status_ref.clone(), by.clone());
        self.batched(move |tx| end_in(tx, &status_ref, &by, now, &ending))
    }
}

/// Commit C inside the caller's transaction (see [`SqliteStore::end`]); a refused write
/// is counted there too.
pub(crate) fn end_in(
    tx: &Connection,
    status_ref: &StatusRef,
    by: &Finalizer,
    now: Now,
    ending: &Ending,
) -> Result<Finalize, StoreError> {
    {
        let (owner, attempt) = match by {
            Finalizer::Lease { owner, attempt } => (Some(owner.as_str()), Some(*attempt)),
            Finalizer::StatusQuery | Finalizer::Operator => (None, None),
        };
        let status = match ending {
            Ending::Succeeded(..) => OperationStatus::Succeeded,
            Ending::Failed(_) => OperationStatus::Failed,
            Ending::Quarantined(..) => OperationStatus::Quarantined,
        };
        let state = status.outbox_state().as_str();
        let id: Option<i64> = tx
            .prepare_cached(FINALIZE)
            .map_err(sqlite)?
            .query_row(params![status_ref.as_str(), owner, attempt, now.get(), state], |row| {
                row.get(0)
            })
            .optional()
            .map_err(sqlite)?;
        let Some(id) = id else {
            // Nothing of the ending written: say why (a refused write is counted).
            return not_written(tx, status_ref, owner.is_some());
        };
        if matches!((by, ending), (Finalizer::StatusQuery, Ending::Succeeded(..))) {
            bump(tx, "reconciliations")?;
        }
        match ending {
            Ending::Succeeded(receipt, receipt_json, output_json) => {
                let downstream = &receipt.downstream;
                tx.prepare_cached(INSERT_LOCAL_RECEIPT)
                    .map_err(sqlite)?
                    .execute(params![
                        id,
                        downstream.downstream_request_ref,
                        downstream.receipt_ref,
                        receipt_json,
                        output_json,
                        receipt.result_sha256.as_str(),
                        by.as_str(),
                        now.get()
                    ])
                    .map_err(sqlite)?;
            }
            Ending::Failed(reason) | Ending::Quarantined(_, reason) => {
                let receipt = match ending {
                    Ending::Quarantined(receipt, _) => Some(receipt),
                    _ => None,
                };
                tx.prepare_cached(INSERT_OUTCOME)
                    .map_err(sqlite)?
                    .execute(params![
                        id,
                        status.as_str(),
                        toolledger_store::bounded_reason(reason),
                        receipt,
                        by.as_str(),
                        now.get()
                    ])
                    .map_err(sqlite)?;
            }
        }
        tx.prepare_cached(MARK_ENDED)
            .map_err(sqlite)?
            .execute(params![id, now.get(), status.as_str()])
            .map_err(sqlite)?;
        Ok(Finalize::Finalized)
    }
}

/// Commit B inside the caller's transaction: the receipt unless one exists for its ref;
/// the stored one either way.
fn record_downstream_in(
    tx: &Connection,
    (receipt, receipt_json): (DownstreamReceipt, String),
    now: Now,
) -> Result<DownstreamReceipt, StoreError> {
    let inserted = tx
        .prepare_cached(INSERT_DOWNSTREAM)
        .map_err(sqlite)?
        .execute(params![
            receipt.downstream_request_ref,
            receipt.request_sha256.as_str(),
            receipt.receipt_ref,
            receipt_json,
            now.get()
        ])
        .map_err(sqlite)?;
    if inserted == 1 {
        // This call wrote it: what is stored is exactly `receipt`.
        return Ok(receipt);
    }
    downstream_receipt(tx, &receipt.downstream_request_ref)?
        .ok_or(StoreError::Internal("the receipt vanished"))
}

/// Adds one to the counter `name`, inside the caller's transaction.
pub(crate) fn bump(tx: &Connection, name: &str) -> Result<(), StoreError> {
    tx.prepare_cached(BUMP).map_err(sqlite)?.execute([name]).map_err(sqlite)?;
    Ok(())
}

/// Adds `count` to the counter `name` (nothing when zero), inside the caller's
/// transaction: a batch counts once.
fn bump_by(tx: &Connection, name: &str, count: i64) -> Result<(), StoreError> {
    if count > 0 {
        tx.prepare_cached(BUMP_BY)
            .map_err(sqlite)?
            .execute(params![name, count])
            .map_err(sqlite)?;
    }
    Ok(())
}

/// Why a conditional end or release matched nothing: the operation is gone, has already
/// ended, or — for a lease holder — its lease was taken over (a fenced write, counted).
fn not_written(
    tx: &Connection,
    status_ref: &StatusRef,
    by_lease: bool,
) -> Result<Finalize, StoreError> {
    match status_of(tx, status_ref)? {
        None => Err(StoreError::Internal("the operation vanished")),
        Some(status) if status.is_final() => Ok(Finalize::AlreadyFinal),
        Some(_) if by_lease => fenced(tx),
        Some(_) => Err(StoreError::Internal("the operation has no outbox event")),
    }
}

/// A worker's write refused because its lease was taken over: nothing of it was written,
/// and the refusal is counted.
fn fenced(tx: &Connection) -> Result<Finalize, StoreError> {
    bump(tx, "fenced_writes")?;
    Ok(Finalize::LeaseLost)
}

/// Whether the scope of `status_ref` was retired by retention.
fn retired(conn: &Connection, status_ref: &StatusRef) -> Result<bool, StoreError> {
    Ok(text_by_ref(conn, RETIRED, status_ref)?.is_some())
}

/// Commit A inside the caller's transaction (see [`LedgerStore::reserve`]); with `claim`,
/// the new event is leased to its owner until the given instant in the same transaction.
fn reserve_in(
    tx: &Connection,
    (intent, arguments_json): (NewOperation, String),
    call: &CallIdentity,
    now: Now,
    claim: Option<(&Identifier, Now)>,
) -> Result<Reservation, StoreError> {
    let downstream_request_ref =
        toolledger_contract::digest::downstream_request_ref(&intent.scope, &intent.request_sha256);
    match recorded_call(tx, call)? {
        Some(recorded) if recorded.purpose == Purpose::QueryStatus => {
            return Ok(Reservation::CallPurposeConflict);
        }
        // One model call is one intent: its identity already names another operation.
        Some(recorded) if recorded.status_ref != intent.status_ref => {
            return Ok(Reservation::CallReused(Box::new(recorded)));
        }
        _ => {}
    }
    if retired(tx, &intent.status_ref)? {
        return Ok(Reservation::Retired);
    }
    // Pending and unclaimed, or processing under the claim's lease at attempt 1.
    let status =
        if claim.is_some() { OperationStatus::Processing } else { OperationStatus::Pending };
    let scope = &intent.scope;
    let revisions = &intent.revisions;
    let approval = &intent.approval;
    let inserted = tx
        .prepare_cached(INSERT_OPERATION)
        .map_err(sqlite)?
        .execute(params![
            scope.tenant_id.as_str(),
            scope.subject_id.as_str(),
            scope.tool_name,
            scope.idempotency_key.as_str(),
            intent.status_ref.as_str(),
            downstream_request_ref,
            intent.request_sha256.as_str(),
            arguments_json,
            revisions.input,
            revisions.output,
            revisions.effect,
            revisions.handler,
            revisions.producer,
            revisions.policy,
            intent.profile.provider,
            intent.profile.api_family,
            intent.profile.adapter_revision,
            intent.provider_response_id.as_str(),
            intent.provider_call_id.as_str(),
            intent.operation_id.as_str(),
            approval.as_ref().map(|approval| approval.approval_id.as_str()),
            approval.as_ref().map(|approval| approval.approver_id.as_str()),
            approval.as_ref().map(|approval| approval.approval_sha256.as_str()),
            approval.as_ref().map(|approval| approval.approved_at.get()),
            approval.as_ref().map(|approval| approval.expires_at.get()),
            now.get(),
            intent.downstream.name(),
            intent.downstream.revision(),
            status.as_str(),
        ])
        .map_err(|err| match err.sqlite_error_code() {
            // Not the scope (that conflict does nothing): another row already holds
            // this intent's status ref or downstream request ref, so some stored row
            // no longer recomputes its refs from its scope.
            Some(rusqlite::ErrorCode::ConstraintViolation) => StoreError::ContractViolation(
                "a stored row holds this intent's refs under another scope",
            ),
            _ => sqlite(err),
        })?;
    if inserted == 0 {
        // The scope exists: read the authoritative row; write nothing (the transaction
        // rolls back when dropped).
        let existing =
            by_scope(tx, scope)?.ok_or(StoreError::Internal("the reserved row vanished"))?;
        return Ok(Reservation::Exists(Box::new(existing)));
    }
    let id = tx.last_insert_rowid();
    match claim {
        None => tx.prepare_cached(INSERT_OUTBOX).map_err(sqlite)?.execute(params![id, now.get()]),
        Some((owner, until)) => tx
            .prepare_cached(INSERT_OUTBOX_CLAIMED)
            .map_err(sqlite)?
            .execute(params![id, now.get(), owner.as_str(), until.get()]),
    }
    .map_err(sqlite)?;
    if claim.is_some() {
        bump(tx, "claims")?;
    }
    insert_call(tx, call, Purpose::Dispatch, id, now)?;
    // What was just written, as a read would return it: pending and unclaimed, or
    // processing under the claim's lease at attempt 1.
    let reserved = Operation {
        intent,
        downstream_request_ref,
        status,
        outbox: OutboxEvent {
            state: status.outbox_state(),
            lease_owner: claim.map(|(owner, _)| owner.as_str().to_owned()),
            lease_until: claim.map(|(_, until)| until.get()),
            attempt_count: i64::from(claim.is_some()),
            next_attempt_at: claim.map_or(now.get(), |(_, until)| until.get()),
            last_reason: None,
            attempts_before: 0,
        },
        receipt: None,
        outcome: None,
        created_at: now.get(),
    };
    Ok(Reservation::Reserved(Box::new(reserved)))
}

/// The claim inside the caller's transaction (see [`LedgerStore::claim`]).
fn claim_in(
    tx: &Connection,
    status_ref: &StatusRef,
    owner: &Identifier,
    now: Now,
    lease_until: Now,
) -> Result<Claim, StoreError> {
    let was = text_by_ref(tx, SELECT_OUTBOX_STATE, status_ref)?;
    // One conditional update claims a pending event or an expired lease (live while
    // now < lease_until) and answers the new attempt.
    let claimed: Option<(i64, i64)> = tx
        .prepare_cached(CLAIM)
        .map_err(sqlite)?
        .query_row(
            params![status_ref.as_str(), owner.as_str(), lease_until.get(), now.get()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(sqlite)?;
    let Some((id, attempt)) = claimed else {
        // Nothing claimed (and nothing written, so the state read above still holds:
        // the writer's transaction is the only one): say why.
        let Some(state) = was else { return Ok(Claim::Missing) };
        return not_claimed(&state);
    };
    tx.prepare_cached(MARK_PROCESSING)
        .map_err(sqlite)?
        .execute(params![id, now.get()])
        .map_err(sqlite)?;
    bump(tx, "claims")?;
    let reclaimed = was.as_deref() == Some(OutboxState::Processing.as_str());
    if reclaimed {
        bump(tx, "lease_reclaims")?;
    }
    // Read back inside the claim: a row that no longer verifies rolls the claim back.
    let operation =
        by_status_ref(tx, status_ref)?.ok_or(StoreError::Internal("the operation vanished"))?;
    Ok(Claim::Claimed { attempt, operation: Box::new(operation), reclaimed })
}

impl LedgerStore for SqliteStore {
    fn dispatch_lookup(
        &mut self,
        scope: &Scope,
        call: &CallIdentity,
    ) -> Result<DispatchLookup, StoreError> {
        self.arm()?;
        // One statement, so both facts come from one snapshot: the single row always
        // exists; the operation's columns are NULL when the scope is free.
        let mut statement = self.conn.prepare_cached(&dispatch_lookup_sql()).map_err(sqlite)?;
        let (raw, recorded) = statement
            .query_row(
                params![
                    scope.tenant_id.as_str(),
                    scope.subject_id.as_str(),
                    scope.tool_name,
                    scope.idempotency_key.as_str(),
                    call.profile.provider,
                    call.profile.api_family,
                    call.provider_response_id.as_str(),
                    call.provider_call_id.as_str()
                ],
                |row| {
                    let raw = match row.get::<_, Option<i64>>(OPERATION_WIDTH)? {
                        Some(_) => Some(raw_operation(row)?),
                        None => None,
                    };
                    let recorded = match row.get::<_, Option<String>>(OPERATION_WIDTH + 1)? {
                        Some(_) => Some(raw_recorded(row, OPERATION_WIDTH + 1)?),
                        None => None,
                    };
                    Ok((raw, recorded))
                },
            )
            .map_err(sqlite)?;
        let call = recorded.map(recorded_from).transpose()?;
        let operation = raw.map(verify::operation).transpose()?;
        Ok(DispatchLookup { call, operation })
    }

    fn operation_by_scope(&mut self, scope: &Scope) -> Result<Option<Operation>, StoreError> {
        self.arm()?;
        by_scope(&self.conn, scope)
    }

    fn operation_by_status_ref(
        &mut self,
        status_ref: &StatusRef,
    ) -> Result<Option<Operation>, StoreError> {
        self.arm()?;
        by_status_ref(&self.conn, status_ref)
    }

    fn recorded_call(&mut self, call: &CallIdentity) -> Result<Option<RecordedCall>, StoreError> {
        self.arm()?;
        recorded_call(&self.conn, call)
    }

    fn reserve(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
    ) -> Result<Reservation, StoreError> {
        let (intent, call) = ((intent.clone(), canonicalize(&intent.arguments)), call.clone());
        self.batched(move |tx| reserve_in(tx, intent, &call, now, None))
    }

    fn reserve_claimed(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        owner: &Identifier,
        lease: LeaseSeconds,
    ) -> Result<Reservation, StoreError> {
        let lease_until =
            now.checked_add(lease).ok_or(error::failed("the lease would end after year 9999"))?;
        let intent = (intent.clone(), canonicalize(&intent.arguments));
        let (call, owner) = (call.clone(), owner.clone());
        self.batched(move |tx| reserve_in(tx, intent, &call, now, Some((&owner, lease_until))))
    }

    fn claim(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<Claim, StoreError> {
        let lease_until =
            now.checked_add(lease).ok_or(error::failed("the lease would end after year 9999"))?;
        let (status_ref, owner) = (status_ref.clone(), owner.clone());
        self.batched(move |tx| claim_in(tx, &status_ref, &owner, now, lease_until))
    }

    fn record_status_query(
        &mut self,
        call: &CallIdentity,
        status_ref: &StatusRef,
        now: Now,
    ) -> Result<Option<RecordedCall>, StoreError> {
        let (call, status_ref) = (call.clone(), status_ref.clone());
        self.batched(move |tx| {
            if let Some(recorded) = recorded_call(tx, &call)? {
                return Ok(Some(recorded));
            }
            let id =
                op_id(tx, &status_ref)?.ok_or(StoreError::Internal("the operation vanished"))?;
            insert_call(tx, &call, Purpose::QueryStatus, id, now)?;
            Ok(None)
        })
    }

    fn finalize(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        receipt: &LocalReceipt,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.end(status_ref, by, now, Ending::succeeded(receipt))
    }

    fn fail(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        reason: &str,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.end(status_ref, by, now, Ending::Failed(reason.to_owned()))
    }

    fn quarantine(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        receipt: &Value,
        reason: &str,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.end(status_ref, by, now, Ending::Quarantined(canonicalize(receipt), reason.to_owned()))
    }

    fn finalize_many(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let items: Vec<_> = items
            .iter()
            .map(|(status_ref, by, receipt)| {
                (status_ref.clone(), by.clone(), Ending::succeeded(receipt))
            })
            .collect();
        self.batched(move |tx| {
            items
                .iter()
                .map(|(status_ref, by, ending)| end_in(tx, status_ref, by, now, ending))
                .collect()
        })
    }

    fn release(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        attempt: i64,
        release: &Release<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        let (sql, state, at, reason) = match release {
            Release::Later { at, reason } => (
                SET_ASIDE,
                OutboxState::Processing,
                at.get(),
                toolledger_store::bounded_reason(reason),
            ),
            Release::Retry { at, reason } => {
                (RELEASE, OutboxState::Pending, at.get(), toolledger_store::bounded_reason(reason))
            }
            Release::Dead { reason } => {
                (RELEASE, OutboxState::Dead, now.get(), toolledger_store::bounded_reason(reason))
            }
        };
        let (status_ref, owner) = (status_ref.clone(), owner.clone());
        self.batched(move |tx| {
            let (status_ref, owner) = (&status_ref, &owner);
            let id: Option<i64> = tx
                .prepare_cached(sql)
                .map_err(sqlite)?
                .query_row(
                    params![
                        status_ref.as_str(),
                        owner.as_str(),
                        attempt,
                        now.get(),
                        state.as_str(),
                        at,
                        reason
                    ],
                    |row| row.get(0),
                )
                .optional()
                .map_err(sqlite)?;
            let Some(id) = id else {
                return not_written(tx, status_ref, true);
            };
            tx.prepare_cached(MARK_RELEASED)
                .map_err(sqlite)?
                .execute(params![id, now.get(), state.as_str()])
                .map_err(sqlite)?;
            Ok(Finalize::Finalized)
        })
    }

    fn claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        let lease_until =
            now.checked_add(lease).ok_or(error::failed("the lease would end after year 9999"))?;
        let (owner, downstream) = (owner.clone(), downstream.clone());
        self.batched(move |tx| {
            let (owner, downstream) = (&owner, &downstream);
            let due: Vec<(i64, String)> = tx
                .prepare_cached(DUE)
                .map_err(sqlite)?
                .query_map(
                    params![
                        now.get(),
                        i64::try_from(limit).unwrap_or(i64::MAX),
                        downstream.name(),
                        downstream.revision()
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .map_err(sqlite)?
                .collect::<Result<_, _>>()
                .map_err(sqlite)?;
            let mut batch = ClaimedBatch::default();
            let (mut claims, mut reclaims) = (0, 0);
            for (id, state) in due {
                let reclaim = state == OutboxState::Processing.as_str();
                // Each claim in its own savepoint: a row that no longer verifies once
                // claimed is rolled back to as it was (nothing written) and counted, for
                // the audit to name.
                savepoint(tx, "SAVEPOINT due")?;
                let attempt: Option<i64> = tx
                    .prepare_cached(CLAIM_ONE)
                    .map_err(sqlite)?
                    .query_row(params![id, owner.as_str(), lease_until.get(), now.get()], |row| {
                        row.get(0)
                    })
                    .optional()
                    .map_err(sqlite)?;
                let Some(attempt) = attempt else {
                    savepoint(tx, "RELEASE due")?;
                    continue;
                };
                tx.prepare_cached(MARK_PROCESSING)
                    .map_err(sqlite)?
                    .execute(params![id, now.get()])
                    .map_err(sqlite)?;
                match select_operation_in(tx, BY_ID, &[&id]) {
                    Ok(Some(operation)) => {
                        savepoint(tx, "RELEASE due")?;
                        claims += 1;
                        reclaims += i64::from(reclaim);
                        batch.claimed.push((attempt, reclaim, operation));
                    }
                    Ok(None) | Err(StoreError::ContractViolation(_)) => {
                        savepoint(tx, "ROLLBACK TO due")?;
                        savepoint(tx, "RELEASE due")?;
                        batch.skipped += 1;
                    }
                    Err(err) => return Err(err),
                }
            }
            bump_by(tx, "claims", claims)?;
            bump_by(tx, "lease_reclaims", reclaims)?;
            Ok(batch)
        })
    }

    fn retired(&mut self, status_ref: &StatusRef) -> Result<bool, StoreError> {
        self.arm()?;
        retired(&self.conn, status_ref)
    }

    fn heartbeat(
        &mut self,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<usize, StoreError> {
        let lease_until =
            now.checked_add(lease).ok_or(error::failed("the lease would end after year 9999"))?;
        let owner = owner.clone();
        self.batched(move |tx| {
            tx.prepare_cached(HEARTBEAT)
                .map_err(sqlite)?
                .execute(params![owner.as_str(), now.get(), lease_until.get()])
                .map_err(sqlite)
        })
    }

    fn audit(&mut self) -> Result<AuditReport, StoreError> {
        self.arm()?;
        crate::audit::run(&mut self.conn)
    }
}

impl StandInReceipts for SqliteStore {
    fn record_downstream_receipt(
        &mut self,
        receipt: &DownstreamReceipt,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError> {
        let receipt = (receipt.clone(), canonicalize(&receipt.receipt));
        self.batched(move |tx| record_downstream_in(tx, receipt, now))
    }

    fn downstream_receipt(
        &mut self,
        downstream_request_ref: &str,
    ) -> Result<Option<DownstreamReceipt>, StoreError> {
        self.arm()?;
        downstream_receipt(&self.conn, downstream_request_ref)
    }

    fn record_downstream_receipts(
        &mut self,
        receipts: &[DownstreamReceipt],
        now: Now,
    ) -> Result<Vec<DownstreamReceipt>, StoreError> {
        if receipts.is_empty() {
            return Ok(Vec::new());
        }
        let receipts: Vec<_> = receipts
            .iter()
            .map(|receipt| (receipt.clone(), canonicalize(&receipt.receipt)))
            .collect();
        self.batched(move |tx| {
            receipts.into_iter().map(|receipt| record_downstream_in(tx, receipt, now)).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::SqliteStore;

    /// Every hot statement searches an index; none scans a table. (The one-row
    /// `(SELECT 1)` of the dispatch lookup is the only scan, of one constant row.)
    #[test]
    fn every_hot_statement_is_index_backed() {
        let dir = std::env::temp_dir().join(format!("toolledger-plans-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(&dir.join("plans.sqlite3")).unwrap();
        let plans = store.query_plans().unwrap();
        assert_eq!(plans.len(), 42);
        for (name, plan) in &plans {
            println!("{name}: {}", plan.join(" | "));
        }
        for (name, plan) in &plans {
            for step in plan {
                let one_row = step == "SCAN CONSTANT ROW" || step.starts_with("SCAN (subquery");
                let scans = step.starts_with("SCAN") && !one_row;
                assert!(!scans, "{name}: {step}");
                // A sort would read every matching row before the first is answered.
                assert!(!step.contains("TEMP B-TREE"), "{name}: {step}");
            }
        }
        // `list` pages are keyset seeks: the rest of a second by row id, then later
        // seconds, each in index order, so a page costs the same wherever it starts.
        let first = |wanted: &str| {
            plans.iter().find(|(name, _)| *name == wanted).and_then(|(_, plan)| plan.first())
        };
        assert_eq!(
            first("list: the rest of a second").map(String::as_str),
            Some("SEARCH o USING INDEX operations_status (status=? AND updated_at=? AND rowid>?)")
        );
        assert_eq!(
            first("list: after a second").map(String::as_str),
            Some(
                "SEARCH o USING INDEX operations_status (status=? AND updated_at>? AND updated_at<?)"
            )
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
