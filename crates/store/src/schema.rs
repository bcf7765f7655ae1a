//! The `toolledger-store-v1` schema and the connection opener.
//!
//! Every connection gets the four pragmas of SPEC §6 and each is read back: a store
//! that cannot be WAL is refused. A file is classified *before* anything is written to
//! it, so a foreign SQLite file is left byte for byte as it was.

use std::{path::Path, time::Duration};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::{
    StoreError,
    error::{BUSY, sqlite},
};

/// The schema id kept in `meta`.
pub const SCHEMA_ID: &str = "toolledger-store-v1";
/// The `PRAGMA user_version` of this schema.
pub const USER_VERSION: i64 = 1;
/// How long a connection waits on another writer before failing.
pub(crate) const BUSY_TIMEOUT_MS: u64 = 5000;

/// The whole schema, created in one transaction.
pub(crate) const DDL: &str = r#"
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

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
    approval_id            TEXT NOT NULL,
    approver_id            TEXT NOT NULL,
    approval_sha256        TEXT NOT NULL CHECK (length(approval_sha256) = 64),
    approved_at            INTEGER NOT NULL CHECK (approved_at BETWEEN 0 AND 253402300799),
    approval_expires_at    INTEGER NOT NULL CHECK (approval_expires_at BETWEEN 0 AND 253402300799),
    status                 TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'succeeded')),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at             INTEGER NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK (approved_at < approval_expires_at),
    UNIQUE (tenant_id, subject_id, tool_name, idempotency_key)
) STRICT;

CREATE TABLE outbox (
    op_id         INTEGER PRIMARY KEY REFERENCES operations (id),
    state         TEXT NOT NULL CHECK (state IN ('pending', 'processing', 'delivered')),
    lease_owner   TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
    lease_until   INTEGER CHECK (lease_until IS NULL OR lease_until BETWEEN 0 AND 253402300799),
    attempt_count INTEGER NOT NULL CHECK (attempt_count >= 0),
    created_at    INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at    INTEGER NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK (state <> 'pending' OR (lease_owner IS NULL AND lease_until IS NULL AND attempt_count = 0)),
    CHECK (state <> 'processing' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL AND attempt_count > 0))
) STRICT;

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
    finalized_by           TEXT NOT NULL CHECK (finalized_by IN ('worker', 'status_query')),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799)
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

INSERT INTO meta (key, value) VALUES ('schema_id', 'toolledger-store-v1');
PRAGMA user_version = 1;
"#;

/// What a file holds, judged without writing to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contents {
    /// No tables and `user_version` 0: a new or empty file, to initialise.
    Empty,
    /// A toolledger-store-v1 store.
    Store,
}

fn classify(conn: &Connection) -> Result<Contents, StoreError> {
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
    if has_meta == 0 || user_version != USER_VERSION {
        return Err(StoreError::SchemaUnsupported);
    }
    let schema_id: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'schema_id'", [], |row| row.get(0))
        .optional()
        .map_err(|_| StoreError::SchemaUnsupported)?;
    if schema_id.as_deref() == Some(SCHEMA_ID) {
        Ok(Contents::Store)
    } else {
        Err(StoreError::SchemaUnsupported)
    }
}

/// Sets and reads back `synchronous=FULL`, `foreign_keys=ON` (and the busy timeout, set
/// at open): the per-connection pragmas.
fn connection_pragmas(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;").map_err(sqlite)?;
    let synchronous: i64 =
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).map_err(sqlite)?;
    let foreign_keys: i64 =
        conn.query_row("PRAGMA foreign_keys", [], |row| row.get(0)).map_err(sqlite)?;
    let busy_timeout: i64 =
        conn.query_row("PRAGMA busy_timeout", [], |row| row.get(0)).map_err(sqlite)?;
    if synchronous != 2 || foreign_keys != 1 || busy_timeout != BUSY_TIMEOUT_MS as i64 {
        return Err(StoreError::Sqlite("a connection pragma did not take effect"));
    }
    Ok(())
}

fn raw_open(path: &Path, create: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite)?;
    conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS)).map_err(sqlite)?;
    // Room for every statement the store prepares (rusqlite keeps 16 by default, fewer
    // than the store's hot statements, which then were prepared again and again).
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    Ok(conn)
}

/// Prepared statements kept per connection.
const STATEMENT_CACHE_CAPACITY: usize = 64;

/// How many times opening is retried when SQLite answers busy without waiting.
const OPEN_ATTEMPTS: u32 = 500;

/// Opens (creating or initialising where SPEC §10 says so) a store connection with all
/// four pragmas in force.
///
/// Switching a file to WAL, and reading one whose WAL another connection is setting up,
/// can answer `SQLITE_BUSY` at once instead of calling the busy handler. Several
/// processes creating one store at the same moment meet exactly that, so the whole
/// open is retried, a bounded number of times, with a short pause.
pub(crate) fn open(path: &Path) -> Result<Connection, StoreError> {
    let mut attempt = 0;
    loop {
        match try_open(path) {
            Err(StoreError::Sqlite(what)) if what == BUSY && attempt < OPEN_ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(2 + u64::from(attempt % 8)));
            }
            result => return result,
        }
    }
}

fn try_open(path: &Path) -> Result<Connection, StoreError> {
    let mut conn = raw_open(path, true)?;
    let contents = classify(&conn)?;
    let mode: String =
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(sqlite)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Sqlite("the database cannot use WAL journal mode"));
    }
    connection_pragmas(&conn)?;
    if contents == Contents::Empty {
        // One transaction: a process killed here leaves an empty file or a whole store.
        // Several processes may race to here; the first creates, the rest find a store.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sqlite)?;
        if classify(&tx)? == Contents::Empty {
            tx.execute_batch(DDL).map_err(sqlite)?;
        }
        tx.commit().map_err(sqlite)?;
    }
    Ok(conn)
}

/// Opens an existing store for the audit: never creates, never changes the journal
/// mode, but applies the same per-connection pragmas as [`open`].
pub(crate) fn open_existing(path: &Path) -> Result<Connection, StoreError> {
    let size = std::fs::metadata(path).map(|meta| meta.len()).map_err(|_| StoreError::Missing)?;
    if size == 0 {
        return Err(StoreError::Missing);
    }
    let conn = raw_open(path, false)?;
    if classify(&conn)? == Contents::Empty {
        return Err(StoreError::Missing);
    }
    connection_pragmas(&conn)?;
    // The audit reads every page, several times over: map the file instead of copying
    // each page through read(2), and keep more of it cached between its passes.
    conn.execute_batch("PRAGMA mmap_size = 268435456; PRAGMA cache_size = -65536;")
        .map_err(sqlite)?;
    Ok(conn)
}
