//! The `toolledger-store-v1` schema and the connection opener.
//!
//! Every connection gets the four pragmas of `docs/schema.md` and each is read back: a store
//! that cannot be WAL is refused. A file is classified *before* anything is written to
//! it, so a foreign SQLite file is left byte for byte as it was.

use std::{
    path::Path,
    sync::OnceLock,
    time::{Duration, Instant},
};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::{StoreError, Waits, error::sqlite};

/// The schema id kept in `meta`.
pub const SCHEMA_ID: &str = "toolledger-store-v4";
/// The `PRAGMA user_version` of this schema.
pub const USER_VERSION: i64 = 4;

/// The `meta` table: the same in every version.
pub(crate) const META_DDL: &str = r#"
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
"#;

/// Every other table and index of `toolledger-store-v4`. Migrations create exactly
/// these, so a migrated store and a new one have byte-identical schemas.
pub(crate) const TABLES_DDL: &str = r#"
CREATE TABLE operations (
    id                     INTEGER PRIMARY KEY,
    tenant_id              TEXT NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
    subject_id             TEXT NOT NULL CHECK (length(subject_id) BETWEEN 1 AND 128),
    tool_name              TEXT NOT NULL CHECK (length(tool_name) BETWEEN 1 AND 128),
    idempotency_key        TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    status_ref             TEXT NOT NULL UNIQUE CHECK (status_ref GLOB 'sr_*' AND length(status_ref) = 35),
    downstream_request_ref TEXT NOT NULL UNIQUE CHECK (downstream_request_ref GLOB 'dr_*' AND length(downstream_request_ref) = 35),
    request_sha256         TEXT NOT NULL CHECK (length(request_sha256) = 64),
    arguments_json         TEXT NOT NULL CHECK (json_valid(arguments_json)),
    input_revision         TEXT NOT NULL,
    output_revision        TEXT NOT NULL,
    effect_revision        TEXT NOT NULL,
    handler_revision       TEXT NOT NULL,
    producer_revision      TEXT NOT NULL,
    policy_revision        TEXT NOT NULL,
    provider               TEXT NOT NULL,
    api_family             TEXT NOT NULL,
    adapter_revision       TEXT NOT NULL,
    provider_response_id   TEXT NOT NULL,
    provider_call_id       TEXT NOT NULL,
    operation_id           TEXT NOT NULL,
    approval_id            TEXT,
    approver_id            TEXT,
    approval_sha256        TEXT CHECK (approval_sha256 IS NULL OR length(approval_sha256) = 64),
    approved_at            INTEGER CHECK (approved_at IS NULL OR approved_at BETWEEN 0 AND 253402300799),
    approval_expires_at    INTEGER CHECK (approval_expires_at IS NULL OR approval_expires_at BETWEEN 0 AND 253402300799),
    downstream_name        TEXT NOT NULL CHECK (length(downstream_name) BETWEEN 1 AND 128),
    downstream_revision    TEXT NOT NULL CHECK (length(downstream_revision) BETWEEN 1 AND 128),
    status                 TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'succeeded', 'failed', 'quarantined', 'dead')),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at             INTEGER NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK ((approval_id IS NULL) = (approver_id IS NULL) AND (approval_id IS NULL) = (approval_sha256 IS NULL)
           AND (approval_id IS NULL) = (approved_at IS NULL) AND (approval_id IS NULL) = (approval_expires_at IS NULL)),
    CHECK (approved_at IS NULL OR approved_at < approval_expires_at),
    UNIQUE (tenant_id, subject_id, tool_name, idempotency_key)
) STRICT;

CREATE TABLE outbox (
    op_id           INTEGER PRIMARY KEY REFERENCES operations (id),
    state           TEXT NOT NULL CHECK (state IN ('pending', 'processing', 'delivered', 'failed', 'quarantined', 'dead')),
    lease_owner     TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
    lease_until     INTEGER CHECK (lease_until IS NULL OR lease_until BETWEEN 0 AND 253402300799),
    attempt_count   INTEGER NOT NULL CHECK (attempt_count >= 0),
    next_attempt_at INTEGER NOT NULL CHECK (next_attempt_at BETWEEN 0 AND 253402300799),
    last_reason     TEXT CHECK (last_reason IS NULL OR length(last_reason) BETWEEN 1 AND 512),
    attempts_before INTEGER NOT NULL CHECK (attempts_before BETWEEN 0 AND attempt_count),
    created_at      INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at      INTEGER NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK (state NOT IN ('pending', 'dead') OR (lease_owner IS NULL AND lease_until IS NULL)),
    CHECK (state <> 'processing' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL AND attempt_count > 0
           AND next_attempt_at = lease_until)),
    CHECK (state <> 'dead' OR last_reason IS NOT NULL)
) STRICT;

CREATE INDEX outbox_due ON outbox (next_attempt_at, op_id) WHERE state IN ('pending', 'processing');

CREATE TABLE downstream_receipts (
    downstream_request_ref TEXT PRIMARY KEY CHECK (downstream_request_ref GLOB 'dr_*' AND length(downstream_request_ref) = 35),
    request_sha256         TEXT NOT NULL CHECK (length(request_sha256) = 64),
    receipt_ref            TEXT NOT NULL UNIQUE CHECK (receipt_ref GLOB 'rc_*' AND length(receipt_ref) = 35),
    receipt_json           TEXT NOT NULL CHECK (json_valid(receipt_json)),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE TABLE local_receipts (
    op_id                  INTEGER PRIMARY KEY REFERENCES operations (id),
    downstream_request_ref TEXT NOT NULL UNIQUE,
    receipt_ref            TEXT NOT NULL UNIQUE CHECK (receipt_ref GLOB 'rc_*' AND length(receipt_ref) = 35),
    receipt_json           TEXT NOT NULL CHECK (json_valid(receipt_json)),
    output_json            TEXT NOT NULL CHECK (json_valid(output_json)),
    result_sha256          TEXT NOT NULL CHECK (length(result_sha256) = 64),
    finalized_by           TEXT NOT NULL CHECK (finalized_by IN ('worker', 'status_query', 'operator')),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE TABLE terminal_outcomes (
    op_id        INTEGER PRIMARY KEY REFERENCES operations (id),
    kind         TEXT NOT NULL CHECK (kind IN ('failed', 'quarantined')),
    reason       TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 512),
    receipt_json TEXT CHECK (receipt_json IS NULL OR json_valid(receipt_json)),
    finalized_by TEXT NOT NULL CHECK (finalized_by IN ('worker', 'status_query', 'operator')),
    created_at   INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    CHECK ((kind = 'quarantined') = (receipt_json IS NOT NULL))
) STRICT;

CREATE TABLE call_identities (
    id                   INTEGER PRIMARY KEY,
    provider             TEXT NOT NULL,
    api_family           TEXT NOT NULL,
    adapter_revision     TEXT NOT NULL,
    provider_response_id TEXT NOT NULL,
    provider_call_id     TEXT NOT NULL,
    purpose              TEXT NOT NULL CHECK (purpose IN ('dispatch', 'query_status')),
    op_id                INTEGER NOT NULL REFERENCES operations (id),
    created_at           INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    UNIQUE (provider, api_family, provider_response_id, provider_call_id)
) STRICT;

CREATE INDEX call_identities_op ON call_identities (op_id);

CREATE INDEX operations_status ON operations (status, updated_at);

CREATE TABLE operator_log (
    id         INTEGER PRIMARY KEY,
    status_ref TEXT NOT NULL CHECK (status_ref GLOB 'sr_*' AND length(status_ref) = 35),
    action     TEXT NOT NULL CHECK (action IN ('requeue', 'resolve')),
    from_state TEXT NOT NULL CHECK (from_state IN ('failed', 'dead', 'pending', 'processing')),
    reason     TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 512),
    was        TEXT NOT NULL CHECK (length(was) BETWEEN 1 AND 512),
    at         INTEGER NOT NULL CHECK (at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE INDEX operator_log_ref ON operator_log (status_ref);

CREATE TRIGGER operator_log_no_update BEFORE UPDATE ON operator_log
BEGIN SELECT RAISE(ABORT, 'the operator log is append-only'); END;

CREATE TRIGGER operator_log_no_delete BEFORE DELETE ON operator_log
BEGIN SELECT RAISE(ABORT, 'the operator log is append-only'); END;

CREATE TABLE tombstones (
    status_ref     TEXT PRIMARY KEY CHECK (status_ref GLOB 'sr_*' AND length(status_ref) = 35),
    request_sha256 TEXT NOT NULL CHECK (length(request_sha256) = 64),
    final_status   TEXT NOT NULL CHECK (final_status IN ('succeeded', 'failed', 'quarantined', 'dead')),
    retired_at     INTEGER NOT NULL CHECK (retired_at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE TABLE counters (
    name  TEXT PRIMARY KEY CHECK (name IN ('claims', 'lease_reclaims', 'fenced_writes', 'reconciliations', 'retired')),
    value INTEGER NOT NULL CHECK (value >= 0)
) STRICT;

CREATE TABLE migrations (
    version     INTEGER PRIMARY KEY,
    from_schema TEXT NOT NULL,
    to_schema   TEXT NOT NULL,
    started_at  INTEGER NOT NULL CHECK (started_at BETWEEN 0 AND 253402300799),
    finished_at INTEGER NOT NULL CHECK (finished_at BETWEEN 0 AND 253402300799)
) STRICT;
"#;

/// What a new store is made of, in one transaction.
fn new_store_ddl() -> String {
    format!(
        "{META_DDL}{TABLES_DDL}\nINSERT INTO meta (key, value) VALUES ('schema_id', '{SCHEMA_ID}');\n\
         PRAGMA user_version = {USER_VERSION};\n"
    )
}

/// What a file holds, judged without writing to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contents {
    /// No tables and `user_version` 0: a new or empty file, to initialise.
    Empty,
    /// A store of this version whose schema is exactly the expected DDL.
    Store,
    /// It says it is a toolledger-store-v1 store (`meta`, `user_version`), but its
    /// tables, indexes or triggers differ from the expected DDL. Only the audit reads
    /// it, to report what differs.
    Damaged,
}

/// One row of `sqlite_schema`: type, name, table, SQL text.
pub(crate) type SchemaRow = (String, String, String, Option<String>);

const SCHEMA_ROWS: &str = "SELECT type, name, tbl_name, sql FROM sqlite_schema \
     WHERE name NOT LIKE 'sqlite_stat%' ORDER BY type, name";

/// Every table, index and trigger of `conn`, in a stable order. `sqlite_stat*` tables
/// (made by `ANALYZE`) are SQLite's own and not compared.
pub(crate) fn schema_rows(conn: &Connection) -> Result<Vec<SchemaRow>, StoreError> {
    let mut statement = conn.prepare(SCHEMA_ROWS).map_err(sqlite)?;
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
        .map_err(sqlite)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(sqlite)
}

/// The schema rows a new store's DDL makes, built once per process in a private in-memory
/// database: the reference every file is compared with, byte for byte.
pub(crate) fn expected_schema() -> &'static [SchemaRow] {
    static EXPECTED: OnceLock<Vec<SchemaRow>> = OnceLock::new();
    EXPECTED.get_or_init(|| {
        Connection::open_in_memory()
            .and_then(|conn| conn.execute_batch(&new_store_ddl()).map(|()| conn))
            .map_err(sqlite)
            .and_then(|conn| schema_rows(&conn))
            // Creating the DDL in memory cannot fail unless SQLite itself is broken;
            // then nothing matches, and every file is refused rather than trusted.
            .unwrap_or_default()
    })
}

pub(crate) fn classify(conn: &Connection) -> Result<Contents, StoreError> {
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .map_err(sqlite)?;
    let user_version: i64 =
        conn.query_row("PRAGMA user_version", [], |row| row.get(0)).map_err(sqlite)?;
    if tables == 0 && user_version == 0 {
        return Ok(Contents::Empty);
    }
    let has_meta: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'meta'",
            [],
            |row| row.get(0),
        )
        .map_err(sqlite)?;
    if has_meta == 0 {
        return Err(StoreError::SchemaUnsupported);
    }
    let schema_id: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'schema_id'", [], |row| row.get(0))
        .optional()
        .map_err(|_| StoreError::SchemaUnsupported)?;
    // An older store of this product: never used as it is, upgraded only by `migrate`.
    if let Some(version) = crate::migrate::older_version(schema_id.as_deref(), user_version) {
        return Err(StoreError::SchemaOutdated { version });
    }
    if schema_id.as_deref() != Some(SCHEMA_ID) || user_version != USER_VERSION {
        return Err(StoreError::SchemaUnsupported);
    }
    if schema_rows(conn)? == expected_schema() {
        Ok(Contents::Store)
    } else {
        Ok(Contents::Damaged)
    }
}

/// Sets and reads back `synchronous=FULL`, `foreign_keys=ON` and the busy timeout: the
/// per-connection pragmas.
fn connection_pragmas(conn: &Connection, busy_timeout: Duration) -> Result<(), StoreError> {
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;").map_err(sqlite)?;
    let synchronous: i64 =
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).map_err(sqlite)?;
    let foreign_keys: i64 =
        conn.query_row("PRAGMA foreign_keys", [], |row| row.get(0)).map_err(sqlite)?;
    let timeout: i64 =
        conn.query_row("PRAGMA busy_timeout", [], |row| row.get(0)).map_err(sqlite)?;
    if synchronous != 2 || foreign_keys != 1 || timeout != millis(busy_timeout) {
        return Err(crate::error::failed("a connection pragma did not take effect"));
    }
    Ok(())
}

/// `duration` in whole milliseconds, as SQLite's busy timeout takes it.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX).min(i64::from(i32::MAX))
}

fn raw_open(path: &Path, create: bool, busy_timeout: Duration) -> Result<Connection, StoreError> {
    // SQLite would open a FIFO or a device and then block or read forever: only a
    // regular file (or none yet, when creating) can be a store.
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(crate::error::failed("the database path is not a regular file"));
        }
        Ok(_) => {}
        Err(_) if create => {}
        Err(_) => return Err(StoreError::Missing),
    }
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite)?;
    set_busy_timeout(&conn, busy_timeout)?;
    // Room for every statement the store prepares (rusqlite keeps 16 by default, fewer
    // than the store's hot statements, which then were prepared again and again).
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    Ok(conn)
}

/// Sets how long SQLite's busy handler may wait on this connection (0 = not at all).
pub(crate) fn set_busy_timeout(conn: &Connection, timeout: Duration) -> Result<(), StoreError> {
    conn.busy_timeout(Duration::from_millis(u64::try_from(millis(timeout)).unwrap_or(0)))
        .map_err(sqlite)
}

/// Prepared statements kept per connection.
const STATEMENT_CACHE_CAPACITY: usize = 64;

/// Opens (creating or initialising where the schema page says so) a store connection
/// with all four pragmas in force, waiting for other connections no longer than
/// `waits` allows.
///
/// Switching a file to WAL, and reading one whose WAL another connection is setting up,
/// can answer `SQLITE_BUSY` at once instead of calling the busy handler. Several
/// processes creating one store at the same moment meet exactly that, so the whole
/// open is retried with a short pause — until the open's own deadline, never longer:
/// each attempt's busy handler is given only the time left.
pub(crate) fn open(path: &Path, waits: &Waits) -> Result<Connection, StoreError> {
    let deadline = waits.next_deadline();
    let mut attempt: u64 = 0;
    loop {
        match try_open(path, left(deadline)) {
            Err(StoreError::Busy) if !left(deadline).is_zero() => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(2 + attempt % 8).min(left(deadline)));
            }
            result => return result,
        }
    }
}

/// The time from now until `deadline` (zero once it has passed).
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn try_open(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let mut conn = raw_open(path, true, busy_timeout)?;
    // Classified before anything can write: a foreign or damaged file keeps its bytes.
    let contents = classify(&conn)?;
    if contents == Contents::Damaged {
        return Err(StoreError::SchemaUnsupported);
    }
    let mode: String =
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(sqlite)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(crate::error::failed("the database cannot use WAL journal mode"));
    }
    connection_pragmas(&conn, busy_timeout)?;
    if contents == Contents::Empty {
        // One transaction: a process killed here leaves an empty file or a whole store.
        // Several processes may race to here; the first creates, the rest find a store.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sqlite)?;
        match classify(&tx)? {
            Contents::Empty => tx.execute_batch(&new_store_ddl()).map_err(sqlite)?,
            Contents::Store => {}
            Contents::Damaged => return Err(StoreError::SchemaUnsupported),
        }
        tx.commit().map_err(sqlite)?;
    }
    Ok(conn)
}

/// The connection a process's group commits run on (see `gate`): the store at `path`
/// was opened and checked by the store that asks, so this only opens the file with the
/// store's per-connection pragmas, in WAL mode.
pub(crate) fn open_writer(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = raw_open(path, false, busy_timeout)?;
    let mode: String =
        conn.query_row("PRAGMA journal_mode", [], |row| row.get(0)).map_err(sqlite)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(crate::error::failed("the database cannot use WAL journal mode"));
    }
    connection_pragmas(&conn, busy_timeout)?;
    Ok(conn)
}

/// Whether an existing store whose schema differs from the DDL may be opened: only for
/// the audit, which reports the difference. Every other reader and writer refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Damaged {
    Refused,
    Audited,
}

/// Opens an existing store: never creates, never changes the journal mode, but applies
/// the same per-connection pragmas as [`open`]. A store whose schema differs from the
/// DDL is [`StoreError::SchemaUnsupported`] unless `damaged` lets the audit read it; a
/// foreign file is [`StoreError::SchemaUnsupported`] always.
pub(crate) fn open_existing(
    path: &Path,
    waits: &Waits,
    damaged: Damaged,
) -> Result<Connection, StoreError> {
    let size = std::fs::metadata(path).map(|meta| meta.len()).map_err(|_| StoreError::Missing)?;
    if size == 0 {
        return Err(StoreError::Missing);
    }
    let deadline = waits.next_deadline();
    let mut attempt: u64 = 0;
    let conn = loop {
        let attempted = raw_open(path, false, left(deadline))
            .and_then(|conn| classify(&conn).map(|contents| (conn, contents)));
        match attempted {
            Err(StoreError::Busy) if !left(deadline).is_zero() => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(2 + attempt % 8).min(left(deadline)));
            }
            Err(err) => return Err(err),
            Ok((_, Contents::Empty)) => return Err(StoreError::Missing),
            Ok((_, Contents::Damaged)) if damaged == Damaged::Refused => {
                return Err(StoreError::SchemaUnsupported);
            }
            Ok((conn, _)) => break conn,
        }
    };
    let wait = left(deadline);
    set_busy_timeout(&conn, wait)?;
    connection_pragmas(&conn, wait)?;
    // The audit reads every page, several times over: map the file instead of copying
    // each page through read(2), and keep more of it cached between its passes.
    conn.execute_batch("PRAGMA mmap_size = 268435456; PRAGMA cache_size = -65536;")
        .map_err(sqlite)?;
    Ok(conn)
}
