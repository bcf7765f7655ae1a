//! The seam between the ledger's rules and a database driver.
//!
//! The ledger is written once, in [`crate::ledger`] and [`crate::actions`]: every
//! statement (standard SQL with `$n` parameters, plus the few places a dialect differs:
//! row locks, `SKIP LOCKED`, counter shards) and every commit point as an owned
//! [`Commit`] value. A backend provides what only a driver can:
//!
//! - [`Db`]: executing a statement, reading its rows through [`Columns`], the instant a
//!   write judges by (the caller's, or the database's clock);
//! - [`Backend`]: reads outside a transaction, and running a [`Commit`] inside one
//!   transaction with the backend's own isolation, retries and group commit; its health
//!   checks ([`Backend::audit_snapshot`]); and, where a dialect does better, its own batch
//!   statements (PostgreSQL's `unnest`) in place of the defaults.
//!
//! Every type with [`Backend`] is a [`LedgerStore`] and an [`OperatorStore`]. (The
//! engine's stand-in downstream writes its own receipts through [`Backend::commit`] and
//! [`Backend::batch_record_receipts`].)

use std::sync::OnceLock;

use toolledger_contract::{DownstreamIdentity, Identifier, LeaseSeconds, StatusRef};

use toolledger_contract::Scope;

use crate::{
    AuditReport, CallIdentity, Claim, ClaimedBatch, DispatchLookup, DownstreamReceipt, Ending,
    Figures, Finalize, Finalizer, Lease, LedgerStore, ListFilter, Listed, LocalReceipt,
    NewOperation, Now, Operation, OperatorStore, RecordedCall, Release, Requeued, Reservation,
    Resolved, Settlement, Shown, StoreError, actions,
    ledger::{self, End},
    verify::Columns,
};

/// Which SQL a backend speaks, where the ledger's statements differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: `?n` parameters, one writer at a time, no row locks.
    Sqlite,
    /// PostgreSQL: `$n` parameters, row locks, `SKIP LOCKED`, sharded counters.
    Postgres,
}

/// One statement of the ledger, written once: standard SQL with `$n` parameters, which
/// PostgreSQL runs as written and SQLite with each `$n` as `?n` (SQLite numbers `$n` by
/// first appearance, not by its digits). Where the dialects differ, each has its text.
#[derive(Debug)]
pub struct Sql {
    standard: &'static str,
    sqlite: Option<&'static str>,
    numbered: OnceLock<Box<str>>,
}

impl Sql {
    /// A statement both dialects run.
    pub const fn new(standard: &'static str) -> Sql {
        Sql { standard, sqlite: None, numbered: OnceLock::new() }
    }

    /// A statement whose SQLite text differs from PostgreSQL's (both with `$n`).
    pub const fn dialects(sqlite: &'static str, postgres: &'static str) -> Sql {
        Sql { standard: postgres, sqlite: Some(sqlite), numbered: OnceLock::new() }
    }

    /// The statement as `dialect` runs it.
    pub fn text(&self, dialect: Dialect) -> &str {
        match dialect {
            Dialect::Postgres => self.standard,
            Dialect::Sqlite => self.numbered.get_or_init(|| {
                question_marks(self.sqlite.unwrap_or(self.standard)).into_boxed_str()
            }),
        }
    }
}

/// `text` with every `$n` parameter written `?n`.
fn question_marks(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let numbered = c == '$' && chars.peek().is_some_and(char::is_ascii_digit);
        out.push(if numbered { '?' } else { c });
    }
    out
}

/// A statement PostgreSQL runs with a row-lock clause appended; SQLite (one writer at a
/// time) runs it without.
macro_rules! locked {
    ($text:literal, $lock:literal) => {
        $crate::driver::Sql::dialects($text, concat!($text, $lock))
    };
}
pub(crate) use locked;

/// An `INSERT` whose new row's id [`Db::insert`] answers: PostgreSQL reads it from a
/// `RETURNING id` appended to the statement; SQLite runs the statement as written and
/// reads the connection's last rowid, as a `RETURNING` clause costs SQLite an ephemeral
/// table (a b-tree opened, a page zeroed and closed) on every run.
macro_rules! returning_id {
    ($text:literal) => {
        $crate::driver::Sql::dialects($text, concat!($text, " RETURNING id"))
    };
}
pub(crate) use returning_id;

/// One parameter of a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    /// Text.
    Text(&'a str),
    /// A 64-bit integer.
    Int(i64),
    /// A boolean (an integer 0 or 1 in SQLite).
    Bool(bool),
    /// NULL, of whatever type the parameter has.
    Null,
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(text: &'a str) -> Arg<'a> {
        Arg::Text(text)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(text: &'a String) -> Arg<'a> {
        Arg::Text(text)
    }
}

impl From<i64> for Arg<'_> {
    fn from(int: i64) -> Self {
        Arg::Int(int)
    }
}

impl From<bool> for Arg<'_> {
    fn from(value: bool) -> Self {
        Arg::Bool(value)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(value: Option<T>) -> Arg<'a> {
        value.map_or(Arg::Null, Into::into)
    }
}

/// A row as a driver hands it over, read by position.
pub type Row<'r> = dyn Columns<Error = StoreError> + 'r;

/// What runs statements: a connection, or a transaction on one. Every error is a
/// [`StoreError`] that carries no SQL, path or OS text.
pub trait Db {
    /// The dialect its statements are chosen in.
    fn dialect(&self) -> Dialect;

    /// The backend's name in messages (`sqlite`, `postgres`).
    fn backend(&self) -> &'static str;

    /// The instant a write judges and stamps by, given the caller's: the caller's own,
    /// or the database's clock (read inside the current transaction).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the database's clock cannot be read.
    fn now(&mut self, caller: Now) -> Result<Now, StoreError>;

    /// Runs `sql`; how many rows it changed.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn execute(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<u64, StoreError>;

    /// Runs the `INSERT` `sql` (written with `returning_id!`): the id of the row it
    /// inserted, or `None` when it inserted none (a conflict it was told to ignore).
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn insert(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<Option<i64>, StoreError>;

    /// Hands the rows of `sql` to `each`, in order, until it answers `false`.
    ///
    /// # Errors
    ///
    /// [`StoreError`], or the first error `each` answers.
    fn query(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        each: &mut dyn FnMut(&Row<'_>) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError>;
}

impl dyn Db + '_ {
    /// `read` of the first row of `sql`, if there is one.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    pub fn first<T>(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        read: impl FnOnce(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let (mut read, mut found) = (Some(read), None);
        self.query(sql, args, &mut |row| {
            if let Some(read) = read.take() {
                found = Some(read(row)?);
            }
            Ok(false)
        })?;
        Ok(found)
    }

    /// Every row of `sql`, each read by `read`.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    pub fn all<T>(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        mut read: impl FnMut(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut all = Vec::new();
        self.query(sql, args, &mut |row| {
            all.push(read(row)?);
            Ok(true)
        })?;
        Ok(all)
    }

    /// The integer in column 0 of the first row of `sql`, if there is a row.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    pub fn int(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<Option<i64>, StoreError> {
        self.first(sql, args, |row| row.int(0))
    }

    /// The text in column 0 of the first row of `sql`, if there is a row.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    pub fn text(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<Option<String>, StoreError> {
        self.first(sql, args, |row| row.text(0))
    }

    /// A failure of this backend, described by `what`.
    pub fn failed(&self, what: &'static str) -> StoreError {
        StoreError::failed(self.backend(), what)
    }
}

/// How durable a commit must be before its caller is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// On disk before anyone learns of it (SQLite's `synchronous=FULL`: the WAL is
    /// fsynced at `COMMIT`). Every commit point but one.
    Synced,
    /// May reach the disk with the next synced commit instead of its own: written to the
    /// operating system before its caller is answered, so a killed process loses
    /// nothing, but a power loss before the next synced commit may take it back. Only
    /// commit C ending an operation *succeeded* asks for it
    /// ([`Ending::durability`](crate::Ending::durability)): what it records is the
    /// downstream's receipt, which the downstream itself holds durably under the
    /// operation's downstream request ref, so losing it leaves the operation exactly as
    /// a crash just after commit B would, and the status query (or a worker after the
    /// lease) reconciles it to the same receipt and the same result digest
    /// (`docs/schema.md`, "Commit points"). A backend may treat it as
    /// [`Durability::Synced`] (PostgreSQL does).
    Lazy,
}

/// One commit point or operator action, as an owned value a backend can carry: into a
/// group commit on another thread (SQLite), or into a transaction run again after a
/// serialization failure (PostgreSQL). [`Commit::run`] may therefore run more than once,
/// each time in a new transaction.
pub trait Commit: Send + 'static {
    /// What the commit answers.
    type Output: Send + 'static;

    /// Runs inside the backend's write transaction: the answer, and whether what it
    /// wrote is kept (committed) or rolled back.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; the backend then rolls back what it wrote.
    fn run(&self, db: &mut dyn Db) -> Result<(Self::Output, bool), StoreError>;

    /// How durable the commit must be before it is answered: [`Durability::Synced`]
    /// unless the commit point says otherwise.
    fn durability(&self) -> Durability {
        Durability::Synced
    }
}

/// What a database backend provides for the ledger to run on it.
pub trait Backend {
    /// Runs `read` outside a write transaction (each statement its own snapshot).
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn read<T>(
        &mut self,
        read: impl FnMut(&mut dyn Db) -> Result<T, StoreError>,
    ) -> Result<T, StoreError>;

    /// Runs `command` in one write transaction and answers once it has committed
    /// (durably) or rolled back: the last run's answer, and the command handed back, so
    /// what it owns can move into the caller's answer rather than be copied on every run
    /// (and is freed by the caller, not inside a group commit).
    ///
    /// # Errors
    ///
    /// [`StoreError`]; nothing of `command` was written unless the error is
    /// [`StoreError::CommitUnknown`].
    fn commit<C: Commit>(&mut self, command: C) -> Result<(C::Output, C), StoreError>;

    /// [`Backend::commit`], answering only what the command answered.
    ///
    /// # Errors
    ///
    /// As [`Backend::commit`].
    fn apply<C: Commit>(&mut self, command: C) -> Result<C::Output, StoreError> {
        self.commit(command).map(|(output, _)| output)
    }

    /// The audit of one read snapshot: the backend's health checks and the ledger's
    /// invariants.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the snapshot cannot be read at all.
    fn audit_snapshot(&mut self) -> Result<AuditReport, StoreError>;

    /// Commit C of several operations in one transaction
    /// ([`LedgerStore::finalize_many`]): by default
    /// each as one commit C would, in order.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; a failure rolls the whole batch back.
    fn batch_finalize(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        self.apply(ledger::Ends::succeeded(items, now))
    }

    /// The relay's claim of due events
    /// ([`LedgerStore::claim_due`]): by default one
    /// conditional update per due event.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    fn batch_claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        self.apply(ledger::ClaimDue::new(owner, downstream, now, lease, limit))
    }

    /// Commit B of several receipts in one transaction (the stand-in's batch): by
    /// default each as one commit B would.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; a failure rolls the whole batch back.
    fn batch_record_receipts(
        &mut self,
        receipts: &[DownstreamReceipt],
        now: Now,
    ) -> Result<Vec<DownstreamReceipt>, StoreError> {
        if receipts.is_empty() {
            return Ok(Vec::new());
        }
        let (stored, command) = self.commit(ledger::RecordReceipts::new(receipts, now))?;
        Ok(command.answer(stored))
    }
}

/// The ledger, on any backend.
impl<B: Backend> LedgerStore for B {
    fn operation_by_scope(&mut self, scope: &Scope) -> Result<Option<Operation>, StoreError> {
        self.read(|db| ledger::by_scope(db, scope))
    }

    fn operation_by_status_ref(
        &mut self,
        status_ref: &StatusRef,
    ) -> Result<Option<Operation>, StoreError> {
        self.read(|db| ledger::by_status_ref(db, status_ref))
    }

    fn dispatch_lookup(
        &mut self,
        scope: &Scope,
        call: &CallIdentity,
    ) -> Result<DispatchLookup, StoreError> {
        self.read(|db| ledger::dispatch_lookup(db, scope, call))
    }

    fn recorded_call(&mut self, call: &CallIdentity) -> Result<Option<RecordedCall>, StoreError> {
        self.read(|db| ledger::recorded_call(db, call))
    }

    fn reserve(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
    ) -> Result<Reservation, StoreError> {
        let (written, command) = self.commit(ledger::Reserve::new(intent, call, now, None))?;
        Ok(command.answer(written))
    }

    fn reserve_claimed(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        owner: &Identifier,
        lease: LeaseSeconds,
    ) -> Result<Reservation, StoreError> {
        let claim = Some((owner, lease));
        let (written, command) = self.commit(ledger::Reserve::new(intent, call, now, claim))?;
        Ok(command.answer(written))
    }

    fn claim(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<Claim, StoreError> {
        self.apply(ledger::ClaimOne::new(status_ref, owner, now, lease))
    }

    fn record_status_query(
        &mut self,
        call: &CallIdentity,
        status_ref: &StatusRef,
        now: Now,
    ) -> Result<Option<RecordedCall>, StoreError> {
        self.apply(ledger::RecordStatusQuery::new(call, status_ref, now))
    }

    fn end(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        ending: &Ending<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.apply(End::new(status_ref, by, ending, now))
    }

    fn finalize_many(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError> {
        self.batch_finalize(items, now)
    }

    fn release(
        &mut self,
        status_ref: &StatusRef,
        lease: &Lease,
        release: &Release<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        self.apply(ledger::ReleaseLease::new(status_ref, lease, release, now))
    }

    fn claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        self.batch_claim_due(owner, downstream, now, lease, limit)
    }

    fn retired(&mut self, status_ref: &StatusRef) -> Result<bool, StoreError> {
        self.read(|db| ledger::retired(db, status_ref))
    }

    fn heartbeat(
        &mut self,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<usize, StoreError> {
        self.apply(ledger::Heartbeat::new(owner, now, lease))
    }

    fn audit(&mut self) -> Result<AuditReport, StoreError> {
        self.audit_snapshot()
    }
}

/// The traces kept with operations, on any backend.
impl<B: Backend> crate::TraceStore for B {
    fn reserve_traced(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        claim: Option<(&Identifier, LeaseSeconds)>,
        trace: &crate::TraceRecord,
    ) -> Result<Reservation, StoreError> {
        let command = ledger::Reserve::new(intent, call, now, claim).traced(trace.clone());
        let (written, command) = self.commit(command)?;
        Ok(command.answer(written))
    }

    fn trace_of(
        &mut self,
        status_ref: &StatusRef,
    ) -> Result<Option<crate::TraceRecord>, StoreError> {
        self.read(|db| ledger::trace_of(db, status_ref))
    }
}

/// What an operator reads and does, on any backend.
impl<B: Backend> OperatorStore for B {
    fn list(
        &mut self,
        filter: &ListFilter<'_>,
        show_arguments: bool,
        now: Now,
    ) -> Result<Vec<Listed>, StoreError> {
        self.read(|db| actions::list(db, filter, show_arguments, now))
    }

    fn show(&mut self, status_ref: &StatusRef) -> Result<Shown, StoreError> {
        self.read(|db| actions::show(db, status_ref))
    }

    fn requeue(
        &mut self,
        status_ref: &StatusRef,
        reason: &str,
        now: Now,
    ) -> Result<Requeued, StoreError> {
        self.apply(actions::Requeue::new(status_ref, reason, now))
    }

    fn resolve(
        &mut self,
        status_ref: &StatusRef,
        settlement: &Settlement,
        reason: &str,
        now: Now,
    ) -> Result<Resolved, StoreError> {
        self.apply(actions::Resolve::new(status_ref, settlement, reason, now))
    }

    fn retire(&mut self, cutoff: Now, now: Now, limit: usize) -> Result<usize, StoreError> {
        self.apply(actions::Retire::new(cutoff, now, limit))
    }

    fn figures(&mut self, now: Now) -> Result<Figures, StoreError> {
        self.read(|db| actions::figures(db, now))
    }
}

#[cfg(test)]
mod tests {
    use super::{Dialect, Sql};

    #[test]
    fn sqlite_reads_each_dollar_parameter_by_its_number() {
        static SQL: Sql = Sql::new("SELECT $2, $10 FROM t WHERE a = $1 AND b = '$' || $2");
        assert_eq!(
            SQL.text(Dialect::Sqlite),
            "SELECT ?2, ?10 FROM t WHERE a = ?1 AND b = '$' || ?2"
        );
        assert_eq!(
            SQL.text(Dialect::Postgres),
            "SELECT $2, $10 FROM t WHERE a = $1 AND b = '$' || $2"
        );
        static LOCKED: Sql = locked!("SELECT a FROM t WHERE a = $1", " FOR UPDATE");
        assert_eq!(LOCKED.text(Dialect::Sqlite), "SELECT a FROM t WHERE a = ?1");
        assert_eq!(LOCKED.text(Dialect::Postgres), "SELECT a FROM t WHERE a = $1 FOR UPDATE");
    }
}
