//! The one integration-test binary of `toolledger-engine`: the seed's test matrix, row
//! by row, on real SQLite files in temporary directories.

mod audit;
mod concurrency;
mod crash;
mod faults;
mod idempotency;
mod properties;
mod rechecks;
mod schema;
mod tampering;
mod v2;

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use serde_json::Value;
use toolledger_contract::{
    Case, ContractError, Identifier, PrincipalResolver, Registry, UnixSeconds, load_case,
};
use toolledger_engine::{Answer, FailurePoint, SqliteEngine, open_sqlite};

/// A directory removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl Default for TempDir {
    fn default() -> TempDir {
        TempDir::new()
    }
}

impl TempDir {
    pub fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "toolledger-test-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Roles a test can change between calls: a resolver that is asked every time.
#[derive(Debug, Clone, Default)]
pub struct Roles(Arc<Mutex<Vec<Grant>>>);

/// `(tenant, subject, roles)`.
type Grant = (String, String, Vec<String>);

impl Roles {
    pub fn grant(&self, tenant: &str, subject: &str, role: &str) {
        self.0.lock().unwrap().push((tenant.to_owned(), subject.to_owned(), vec![role.to_owned()]));
    }

    pub fn revoke_all(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl PrincipalResolver for Roles {
    fn current_roles(
        &self,
        tenant: &Identifier,
        subject: &Identifier,
    ) -> Result<Vec<String>, ContractError> {
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

/// A store file in its own temporary directory.
#[derive(Debug)]
pub struct Db {
    _dir: TempDir,
    pub path: PathBuf,
}

impl Default for Db {
    fn default() -> Db {
        Db::new()
    }
}

impl Db {
    pub fn new() -> Db {
        let dir = TempDir::new();
        let path = dir.path().join("ledger.sqlite3");
        Db { _dir: dir, path }
    }

    pub fn engine(&self) -> SqliteEngine<Roles> {
        self.engine_with(Roles::default(), Registry::builtin())
    }

    pub fn engine_with(&self, roles: Roles, registry: Registry) -> SqliteEngine<Roles> {
        open_sqlite(&self.path, roles, registry).unwrap()
    }

    /// A raw connection, for looking at rows and tampering with them.
    pub fn raw(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        conn
    }

    pub fn count(&self, table: &str) -> i64 {
        self.raw()
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0))
            .unwrap()
    }

    pub fn text(&self, sql: &str) -> String {
        self.raw().query_row(sql, [], |row| row.get(0)).unwrap()
    }

    pub fn int(&self, sql: &str) -> i64 {
        self.raw().query_row(sql, [], |row| row.get(0)).unwrap()
    }

    /// `(operation status, outbox state, attempts, downstream receipts, local receipts)`.
    pub fn state(&self) -> (String, String, i64, i64, i64) {
        (
            self.text("SELECT status FROM operations"),
            self.text("SELECT state FROM outbox"),
            self.int("SELECT attempt_count FROM outbox"),
            self.count("downstream_receipts"),
            self.count("local_receipts"),
        )
    }
}

pub fn workspace(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// The PASS case of SPEC §5.
pub fn case() -> Case {
    load_case(
        &std::fs::read(workspace("fixtures/persistence-case.json")).unwrap(),
        &Registry::builtin(),
        None,
    )
    .unwrap()
}

/// The PASS case changed by `change`, with its approval digest recomputed so the
/// approval still binds the changed call.
pub fn case_with(change: impl FnOnce(&mut Case)) -> Case {
    let mut case = case();
    change(&mut case);
    rebind(&mut case);
    case
}

pub fn rebind(case: &mut Case) {
    let registry = Registry::builtin();
    let tool = registry.tool("refund_order").unwrap();
    let binding = case.approval_binding(&tool.name, &tool.revisions);
    case.approval.approval_sha256 = case.approval.digest_for(&binding);
}

pub fn id(text: &str) -> Identifier {
    Identifier::new(text).unwrap()
}

pub fn at(seconds: i64) -> UnixSeconds {
    UnixSeconds::new(seconds).unwrap()
}

pub fn dispatch(
    engine: &mut SqliteEngine<Roles>,
    case: &Case,
    failure: Option<FailurePoint>,
) -> Answer {
    engine.dispatch(case, &id("worker-dispatch"), failure).unwrap()
}

pub fn status_ref_of(answer: &Answer) -> String {
    answer.package()["status_ref"].as_str().unwrap().to_owned()
}

pub fn field<'a>(answer: &'a Answer, pointer: &str) -> &'a Value {
    answer.package().pointer(pointer).unwrap_or(&Value::Null)
}
