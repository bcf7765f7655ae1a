//! The engine and its stores, tested together.
//!
//! A [`StoreUnderTest`] is one database a ledger can live in, seen the way a test needs it: a
//! fresh, empty ledger; as many store connections to it as the test opens; and a raw
//! connection of the database's own driver, to look at rows and to tamper with them.
//! The suite in `tests/it` is written once over [`StoreUnderTest`] and instantiated for
//! [`Sqlite`] (a file in a temporary directory) and [`Postgres`] (a fresh database on
//! the throwaway cluster the harness starts, or on `TOOLLEDGER_PG_URL`).
//!
//! Raw reads answer every value as text (`None` for NULL), so one assertion reads the
//! same on every database.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test harness: a failure to set up is the test's failure"
)]

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use toolledger_contract::{Identifier, PrincipalResolver, Registry, ResolverError};
use toolledger_engine::StandInReceipts;
use toolledger_engine::{
    Engine, EngineError, StandIn,
    drill::{Interrupt, Switch},
};
use toolledger_store::{AuditReport, LedgerStore, OperatorStore};
use toolledger_store_sqlite::SqliteStore;

pub use crate::{
    faulty::{Disk, Faults, Faulty, Rule},
    postgres::Postgres,
};

mod faulty;
mod postgres;

/// One database a ledger can live in.
pub trait StoreUnderTest: Send + Sync + Sized + 'static {
    /// Its store.
    type Store: LedgerStore + StandInReceipts + OperatorStore + Send + 'static;

    /// `sqlite` or `postgres`, for messages.
    const NAME: &'static str;

    /// A new, empty ledger of its own.
    fn fresh() -> Self;

    /// A new connection to this ledger, judging time by the instants it is handed.
    ///
    /// # Errors
    ///
    /// As the store's open.
    fn open(&self) -> Result<Self::Store, EngineError>;

    /// Every row `sql` answers, each value as text (`None` for NULL).
    fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>>;

    /// Runs `sql` (one or more statements) on a raw connection.
    fn execute(&self, sql: &str);

    /// The disk under this ledger for a simulated power loss: `Some` where a commit may
    /// be lazy (SQLite), `None` where every commit is synced (PostgreSQL: a power loss
    /// loses nothing that was answered).
    fn power_loss(&self) -> Option<Arc<PowerLoss>> {
        None
    }

    /// A new connection; panics when it cannot be opened.
    fn store(&self) -> Self::Store {
        self.open().unwrap_or_else(|err| panic!("{} store: {err}", Self::NAME))
    }

    /// The engine tests drive: this ledger, and the stand-in downstream on its own
    /// connection behind a recovery-drill switch.
    fn engine_with<R: PrincipalResolver>(&self, resolver: R, registry: Registry) -> Flow<Self, R> {
        let downstream = Interrupt::new(StandIn::new(self.store()), Switch::default());
        Engine::new(self.store(), downstream, resolver, registry)
    }

    /// The engine on this ledger with no roles granted and the built-in registry.
    fn engine(&self) -> Flow<Self, Roles> {
        self.engine_with(Roles::default(), Registry::builtin())
    }

    /// The audit of one snapshot.
    fn audit(&self) -> AuditReport {
        self.store().audit().unwrap_or_else(|err| panic!("{} audit: {err}", Self::NAME))
    }

    /// The one value `sql` answers.
    fn text(&self, sql: &str) -> String {
        let rows = self.rows(sql);
        match rows.as_slice() {
            [row] => match row.as_slice() {
                [Some(value)] => value.clone(),
                other => panic!("{sql}: not one value: {other:?}"),
            },
            other => panic!("{sql}: not one row: {other:?}"),
        }
    }

    /// The one integer `sql` answers.
    fn int(&self, sql: &str) -> i64 {
        let text = self.text(sql);
        text.parse().unwrap_or_else(|_| panic!("{sql}: not an integer: {text}"))
    }

    /// How many rows `table` holds.
    fn count(&self, table: &str) -> i64 {
        self.int(&format!("SELECT count(*) FROM {table}"))
    }

    /// `(operation status, outbox state, attempts, downstream receipts, local receipts)`
    /// of a ledger holding one operation.
    fn state(&self) -> (String, String, i64, i64, i64) {
        (
            self.text("SELECT status FROM operations"),
            self.text("SELECT state FROM outbox"),
            self.int("SELECT attempt_count FROM outbox"),
            self.count("downstream_receipts"),
            self.count("local_receipts"),
        )
    }

    /// Every row of every table, as text, in a fixed order: what "wrote nothing"
    /// compares.
    fn dump(&self) -> Vec<String> {
        let mut dump = Vec::new();
        for table in toolledger_store::audit::TABLES {
            let mut rows: Vec<String> = self
                .rows(&format!("SELECT * FROM {table}"))
                .into_iter()
                .map(|row| format!("{table}: {row:?}"))
                .collect();
            rows.sort();
            dump.extend(rows);
        }
        dump
    }
}

/// The engine a test drives on backend `B`.
pub type Flow<B, R> =
    Engine<<B as StoreUnderTest>::Store, Interrupt<StandIn<<B as StoreUnderTest>::Store>>, R>;

/// A ledger in a SQLite file of its own temporary directory (removed on drop).
#[derive(Debug)]
pub struct Sqlite {
    _dir: toolledger_testkit::TempDir,
    path: PathBuf,
}

impl Sqlite {
    /// The ledger's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A raw connection to the file.
    pub fn raw(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        conn
    }
}

/// A power loss of a SQLite ledger, simulated over its files: a [`Disk`] that copies the
/// file and its WAL before the first lazy commit that follows a synced one (what a power
/// loss would keep from then on, since the lazy commit's WAL frames are not fsynced),
/// forgets the copy after the next synced write, and, at the loss, puts the copy back.
#[derive(Debug)]
pub struct PowerLoss {
    path: PathBuf,
    /// Whether a copy is kept: an unsynced lazy commit may be lost.
    kept: Mutex<bool>,
}

impl PowerLoss {
    /// Over the ledger at `path`.
    pub fn new(path: &Path) -> PowerLoss {
        PowerLoss { path: path.to_path_buf(), kept: Mutex::new(false) }
    }

    fn file(&self, suffix: &str) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(suffix);
        PathBuf::from(name)
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, bool> {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The power fails: the ledger's files become what the disk held. Every connection
    /// to them must be closed. Whether a lazy commit was lost.
    pub fn cut(&self) -> bool {
        let mut kept = self.kept();
        if !*kept {
            return false;
        }
        // The WAL index is rebuilt from the WAL on the next open.
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(self.file(suffix));
        }
        for (from, to) in [(".power-kept", ""), ("-wal.power-kept", "-wal")] {
            if self.file(from).exists() {
                std::fs::rename(self.file(from), self.file(to)).unwrap();
            }
        }
        *kept = false;
        true
    }
}

impl Disk for PowerLoss {
    fn before_lazy(&self) {
        let mut kept = self.kept();
        if *kept {
            return;
        }
        // Between commits nothing is half written: the file and its WAL are one state.
        for (from, to) in [("", ".power-kept"), ("-wal", "-wal.power-kept")] {
            if self.file(from).exists() {
                std::fs::copy(self.file(from), self.file(to)).unwrap();
            }
        }
        *kept = true;
    }

    fn synced(&self) {
        let mut kept = self.kept();
        if *kept {
            for suffix in [".power-kept", "-wal.power-kept"] {
                let _ = std::fs::remove_file(self.file(suffix));
            }
            *kept = false;
        }
    }
}

/// Every row `sql` answers in the SQLite file at `path`, each value as text (`None` for
/// NULL), through a raw connection.
pub fn sqlite_rows(path: &Path, sql: &str) -> Vec<Vec<Option<String>>> {
    use rusqlite::types::ValueRef;
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let mut statement = conn.prepare(sql).unwrap_or_else(|err| panic!("{sql}: {err}"));
    let columns = statement.column_count();
    let mut query = statement.query([]).unwrap();
    let mut rows = Vec::new();
    while let Some(row) = query.next().unwrap() {
        rows.push(
            (0..columns)
                .map(|index| match row.get_ref(index).unwrap() {
                    ValueRef::Null => None,
                    ValueRef::Integer(value) => Some(value.to_string()),
                    ValueRef::Real(value) => Some(value.to_string()),
                    ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
                        Some(String::from_utf8_lossy(bytes).into_owned())
                    }
                })
                .collect(),
        );
    }
    rows
}

/// Runs `sql` (one or more statements) on a raw connection to the SQLite file at `path`.
pub fn sqlite_execute(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    conn.execute_batch(sql).unwrap_or_else(|err| panic!("{sql}: {err}"));
}

/// A seeded campaign's number from the environment variable `name` (a seed, a count),
/// or `default` when it is unset; panics when it is set to anything but a number.
pub fn setting(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text.parse().unwrap_or_else(|_| panic!("{name} must be a number: {text:?}")),
        Err(_) => default,
    }
}

impl StoreUnderTest for Sqlite {
    type Store = SqliteStore;
    const NAME: &'static str = "sqlite";

    fn fresh() -> Sqlite {
        let dir = toolledger_testkit::TempDir::new("test");
        let path = dir.join("ledger.sqlite3");
        Sqlite { _dir: dir, path }
    }

    fn open(&self) -> Result<SqliteStore, EngineError> {
        Ok(SqliteStore::open(&self.path)?)
    }

    fn power_loss(&self) -> Option<Arc<PowerLoss>> {
        Some(Arc::new(PowerLoss::new(&self.path)))
    }

    fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        sqlite_rows(&self.path, sql)
    }

    fn execute(&self, sql: &str) {
        sqlite_execute(&self.path, sql);
    }

    /// The audit as the command line runs it: on the file, whatever it holds.
    fn audit(&self) -> AuditReport {
        SqliteStore::audit_path(&self.path, toolledger_store::Waits::default())
            .unwrap_or_else(|err| panic!("sqlite audit: {err}"))
    }
}

/// Roles a test can change between calls: a resolver that is asked every time.
#[derive(Debug, Clone, Default)]
pub struct Roles(Arc<Mutex<Vec<Grant>>>);

/// `(tenant, subject, roles)`.
type Grant = (String, String, Vec<String>);

impl Roles {
    /// Grants `role` to `subject` of `tenant`.
    pub fn grant(&self, tenant: &str, subject: &str, role: &str) {
        self.0.lock().unwrap().push((tenant.to_owned(), subject.to_owned(), vec![role.to_owned()]));
    }

    /// Takes every role back.
    pub fn revoke_all(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl PrincipalResolver for Roles {
    fn current_roles(
        &self,
        tenant: &Identifier,
        subject: &Identifier,
    ) -> Result<Vec<String>, ResolverError> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, s, _)| t == tenant.as_str() && s == subject.as_str())
            .flat_map(|(_, _, roles)| roles.clone())
            .collect())
    }
}
