//! The `toolledger-store-v6` schema (and the migrations from earlier versions) and the
//! connection opener.
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

use toolledger_store::{ddl, driver::Dialect};

use crate::{StoreError, Waits, error::sqlite};

/// The schema id kept in `meta`.
pub const SCHEMA_ID: &str = "toolledger-store-v6";
/// The `PRAGMA user_version` of this schema.
pub const USER_VERSION: i64 = 6;

/// The `meta` table: the same in every version (the store crate's DDL, written once
/// for every backend, in SQLite's spelling).
pub(crate) fn meta_ddl() -> &'static str {
    ddl::meta(Dialect::Sqlite)
}

/// Every other table and index of `toolledger-store-v6`. Migrations create exactly
/// these, so a migrated store and a new one have byte-identical schemas.
pub(crate) fn tables_ddl() -> &'static str {
    ddl::tables(Dialect::Sqlite)
}

/// The tables of `toolledger-store-v4`, frozen: what a migration from it starts from.
pub(crate) fn v4_tables_ddl() -> &'static str {
    ddl::tables_v4(Dialect::Sqlite)
}

/// The tables of `toolledger-store-v5`, frozen: what a migration from it starts from.
pub(crate) fn v5_tables_ddl() -> &'static str {
    ddl::tables_v5(Dialect::Sqlite)
}

/// What a new store is made of, in one transaction.
fn new_store_ddl() -> String {
    let (meta, tables) = (meta_ddl(), tables_ddl());
    format!(
        "{meta}{tables}\nINSERT INTO meta (key, value) VALUES ('schema_id', '{SCHEMA_ID}');\n\
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
    // A group commit runs each commit point in a savepoint, and SQLite keeps the page
    // images a savepoint may roll back to in a sub-journal, a temporary file once it
    // passes 64 KiB: with 31 commit points a batch, a fifth of the combiner's time went
    // to writing that file. In memory it is at most a batch's pages; the database and
    // its WAL are untouched by this setting.
    conn.execute_batch("PRAGMA temp_store = MEMORY;").map_err(sqlite)?;
    let temp_store: i64 =
        conn.query_row("PRAGMA temp_store", [], |row| row.get(0)).map_err(sqlite)?;
    if temp_store != 2 {
        return Err(crate::error::failed("a connection pragma did not take effect"));
    }
    // SQLite's automatic checkpoint would copy the log back into the database inside the
    // commit that passed 1,000 pages, with the writer gate held: every caller queued
    // behind that batch waited for it. The hook replaces it (SQLite runs one or the
    // other) and only notes the log's size; the gate has it copied outside (`gate`).
    conn.wal_hook(Some(note_wal_pages));
    Ok(conn)
}

thread_local! {
    /// The log's pages after the last commit on this thread's writer connection.
    static WAL_PAGES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// The writer connection's log hook: notes the log's size for [`wal_pages_committed`].
fn note_wal_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(pages);
    Ok(())
}

/// The pages in the log after the last commit this thread made on a writer connection
/// ([`open_writer`]) since it last asked, or 0.
pub(crate) fn wal_pages_committed() -> i32 {
    WAL_PAGES.replace(0)
}

/// How long the checkpointer's connection waits for a lock while it opens.
const CHECKPOINTER_WAIT: Duration = Duration::from_secs(1);

/// The connection a file's checkpointer copies the log with (see `gate`): the store's
/// per-connection pragmas (the copy is synced under `synchronous=FULL`), on an existing
/// file.
pub(crate) fn open_checkpointer(path: &Path) -> Result<Connection, StoreError> {
    let conn = raw_open(path, false, CHECKPOINTER_WAIT)?;
    connection_pragmas(&conn, CHECKPOINTER_WAIT)?;
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
