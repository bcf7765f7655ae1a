//! The SQLite backend: the ledger of `toolledger_store::ledger` over one connection,
//! one thread.
//!
//! What is SQLite's own here is driver glue: the file's writer gate with group commit
//! (`gate`), each commit point of a batch in its own savepoint, the pragmas and busy
//! handler (`schema`), and reading rows by position. Every write is one `BEGIN IMMEDIATE`
//! transaction (the write lock is taken before the first read, so two writers never both
//! read "absent" and both insert). A transaction dropped without commit rolls back: `?`
//! on any error inside one is always safe.

use std::{any::Any, path::Path};

use rusqlite::{
    Connection, Transaction, TransactionBehavior, params_from_iter,
    types::{ToSqlOutput, Value as SqlValue},
};
use toolledger_store::{
    actions,
    driver::{Arg, Backend, Commit, Db, Dialect, Durability, Row, Sql},
    ledger,
};

use crate::{
    AuditReport, CallIdentity, LocalReceipt, NewOperation, Now, StoreError, Waits,
    error::{self, sqlite},
    gate::{Answer, Combining, Entered, Gate, Job, Ran},
    schema,
    verify::{self, RawOperation},
};

/// A toolledger store in one SQLite file.
#[derive(Debug)]
pub struct SqliteStore {
    /// Boxed: with the hooks the writer connection uses compiled in, a connection is
    /// hundreds of bytes, and a store is moved around by value (an engine, a pool).
    conn: Box<Connection>,
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
        Ok(SqliteStore { conn: Box::new(conn), gate: Gate::of(path), waits })
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
        Ok(SqliteStore { conn: Box::new(conn), gate: Gate::of(path), waits })
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
            .map(|conn| SqliteStore { conn: Box::new(conn), gate: Gate::of(path), waits });
        match audited.and_then(|mut store| store.audit_snapshot()) {
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
        for (name, sql) in ledger::statements().into_iter().chain(actions::statements()) {
            let sql = sql.text(Dialect::Sqlite);
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

    /// Runs `command` alone in one write transaction on the store's own connection (not
    /// in a group commit: a load holds its transaction long), committed when it answers
    /// to keep what it wrote.
    fn write<C: Commit>(&mut self, command: &C) -> Result<C::Output, StoreError> {
        let tx = self.immediate()?;
        let (value, keep) = command.run(&mut Sqlite(&tx))?;
        if keep {
            tx.commit()?;
        }
        Ok(value)
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

    /// Runs `command` as one commit point in a group commit (see `gate`): answered once
    /// the transaction holding it has committed (durable under `synchronous=FULL`, or
    /// written to the OS for a lazy commit: `Durability::Lazy`), or with its error —
    /// then nothing of it was written. It may run on another thread's connection, inside
    /// that thread's transaction and its own savepoint.
    fn batched<C: Commit>(&mut self, command: C) -> Result<(C::Output, C), StoreError> {
        self.arm()?;
        let SqliteStore { conn, gate, waits } = self;
        let gate = &*gate;
        // Set when this thread, the combiner, is to copy the log back once out of the gate.
        let copy_log = std::cell::Cell::new(false);
        let lazy = command.durability() == Durability::Lazy;
        let run = Box::new(move |conn: &Connection| {
            let (value, keep) = command.run(&mut Sqlite(conn))?;
            // The command goes back with the answer: the caller frees it, or moves what
            // it owns into its answer, outside the group commit.
            Ok((Box::new((value, command)) as Box<dyn Any + Send>, keep))
        });
        let job = Job { lazy, run };
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
                    copy_log.set(gate.committed(schema::wal_pages_committed()));
                    answers
                }
                // Only the combiner's own job is refused; the queued ones wait for the next.
                Err(err) => vec![Err(err)],
            }
        });
        if copy_log.get() {
            gate.checkpoint(conn);
        }
        answer.and_then(|value| {
            value
                .downcast::<(C::Output, C)>()
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
        self.write(&ledger::Load::new(finished, now))
    }

    /// Group commits of this process on this file so far: transactions, and the commit
    /// points they held. Their ratio is the mean batch.
    pub fn group_commits(&self) -> (u64, u64) {
        self.gate.batches()
    }

    /// Copies of the log back into the database this process has finished on this file:
    /// the group commits' connection never checkpoints inside the writer gate, a lone
    /// combiner copies once out of it and the file's checkpointer thread copies while
    /// writers are queued (see the crate's `gate`), so no queued caller waits for a copy.
    pub fn checkpoints(&self) -> u64 {
        self.gate.checkpoints()
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
    if !combining.lazy() {
        return commit_jobs(conn, combining);
    }
    // A lazy batch (`Durability::Lazy`) commits under `synchronous=NORMAL`: its WAL
    // frames reach the OS, not the disk, and the next synced commit's fsync of the WAL
    // takes them along. SQLite changes the level only outside a transaction, so it is
    // set before `BEGIN` and set back after the transaction ended; a connection that
    // cannot be set back is dropped (the next opens with `FULL`).
    if let Err(err) = cached(conn, "PRAGMA synchronous = NORMAL") {
        return (vec![Err(err)], false);
    }
    let (answers, healthy) = commit_jobs(conn, combining);
    let restored = cached(conn, "PRAGMA synchronous = FULL").is_ok();
    (answers, healthy && restored)
}

/// [`commit_batch`] at the connection's sync level.
fn commit_jobs(conn: &mut Connection, combining: &mut Combining<'_>) -> (Vec<Answer>, bool) {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        // Only the combiner's own job is refused; the queued ones wait for the next.
        Err(err) => return (vec![Err(sqlite(err))], true),
    };
    let jobs = combining.jobs();
    let count = jobs.len();
    let mut answers = Vec::with_capacity(count);
    if count == 1 {
        let (answer, keep) = kept(jobs.into_iter().map(|job| (job.run)(&tx)).next());
        answers.push(answer);
        if !keep {
            // Dropping `tx` rolls it back; the connection is out of it unless SQLite
            // could not even do that.
            drop(tx);
            let healthy = conn.is_autocommit();
            return (answers, healthy);
        }
    } else {
        for job in jobs {
            if let Err(err) = cached(&tx, "SAVEPOINT batched") {
                return ((0..count).map(|_| Err(err.clone())).collect(), false);
            }
            let (answer, keep) = kept(Some((job.run)(&tx)));
            // SQLite itself ends the transaction on some errors (a full disk, I/O): then
            // the whole batch is gone.
            let kept = if tx.is_autocommit() {
                Err(error::failed("the transaction ended under a group commit"))
            } else if keep {
                cached(&tx, "RELEASE batched")
            } else {
                cached(&tx, "ROLLBACK TO batched").and_then(|()| cached(&tx, "RELEASE batched"))
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

/// Runs `sql`, a statement that answers no rows, from the connection's cache.
fn cached(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql).map_err(sqlite)?.execute([]).map(drop).map_err(sqlite)
}

/// A job's answer, and whether what it wrote is kept: not after an error, nor when the
/// commit point wrote nothing it needs (it asked for a rollback).
fn kept(ran: Option<Ran>) -> (Answer, bool) {
    match ran {
        Some(Ok((value, keep))) => (Ok(value), keep),
        Some(Err(err)) => (Err(err), false),
        None => (Err(StoreError::Internal("the group commit returned no answer")), false),
    }
}

/// SQLite's side of the seam: a connection, on its own (autocommit) or inside the
/// writer's transaction.
struct Sqlite<'c>(&'c Connection);

impl Db for Sqlite<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn backend(&self) -> &'static str {
        error::BACKEND
    }

    fn now(&mut self, caller: Now) -> Result<Now, StoreError> {
        Ok(caller)
    }

    fn execute(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let mut statement = self.0.prepare_cached(sql.text(Dialect::Sqlite)).map_err(sqlite)?;
        let changed = statement.execute(params_from_iter(args.iter().map(Bind))).map_err(sqlite)?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    fn insert(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<Option<i64>, StoreError> {
        // The statement has no `RETURNING` in SQLite's dialect: the rowid the insert just
        // gave its row, when it inserted one (`ON CONFLICT DO NOTHING` may insert none,
        // and then the last rowid is another statement's).
        Ok((self.execute(sql, args)? == 1).then(|| self.0.last_insert_rowid()))
    }

    fn query(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        each: &mut dyn FnMut(&Row<'_>) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let mut statement = self.0.prepare_cached(sql.text(Dialect::Sqlite)).map_err(sqlite)?;
        let mut rows = statement.query(params_from_iter(args.iter().map(Bind))).map_err(sqlite)?;
        while let Some(row) = rows.next().map_err(sqlite)? {
            if !each(&Columns(row))? {
                break;
            }
        }
        Ok(())
    }
}

/// A parameter, bound as SQLite stores it (a boolean as 0 or 1).
struct Bind<'a>(&'a Arg<'a>);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match *self.0 {
            Arg::Text(text) => ToSqlOutput::from(text),
            Arg::Int(int) => ToSqlOutput::from(int),
            Arg::Bool(value) => ToSqlOutput::from(value),
            Arg::Null => ToSqlOutput::Owned(SqlValue::Null),
        })
    }
}

/// A driver row, read by position.
pub(crate) struct Columns<'r, 's>(pub(crate) &'r rusqlite::Row<'s>);

impl verify::Columns for Columns<'_, '_> {
    type Error = StoreError;

    fn text(&self, index: usize) -> Result<String, StoreError> {
        self.0.get(index).map_err(sqlite)
    }

    fn optional_text(&self, index: usize) -> Result<Option<String>, StoreError> {
        self.0.get(index).map_err(sqlite)
    }

    fn optional_int(&self, index: usize) -> Result<Option<i64>, StoreError> {
        self.0.get(index).map_err(sqlite)
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        self.0.get(index).map_err(sqlite)
    }
}

/// A row of the columns of an operation joined with its outbox event, local receipt
/// and terminal outcome, in [`toolledger_store::OPERATION_COLUMNS`] order, decoded for
/// [`verify::operation`] (which checks it): for a tool that reads those columns with its
/// own statement.
///
/// # Errors
///
/// [`StoreError`] when a column is missing or of another type.
pub fn raw_operation(row: &rusqlite::Row<'_>) -> Result<RawOperation, StoreError> {
    RawOperation::decode(&Columns(row))
}

impl Backend for SqliteStore {
    fn read<T>(
        &mut self,
        mut read: impl FnMut(&mut dyn Db) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.arm()?;
        read(&mut Sqlite(&self.conn))
    }

    fn commit<C: Commit>(&mut self, command: C) -> Result<(C::Output, C), StoreError> {
        self.batched(command)
    }

    fn audit_snapshot(&mut self) -> Result<AuditReport, StoreError> {
        self.arm()?;
        crate::audit::run(&mut self.conn)
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
        assert_eq!(plans.len(), 46);
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
