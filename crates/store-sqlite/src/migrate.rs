//! Upgrading an older store: an explicit step, never done in passing.
//!
//! Every other command refuses an older schema (`SCHEMA_UNSUPPORTED`, naming
//! `migrate`). [`migrate`] first copies the file with SQLite's online backup API to a
//! sibling file, then applies every step of the chain from the file's version to the
//! current one in **one** transaction, records each in `migrations` with its times, and
//! checks foreign keys before it commits: a crash or an error leaves the file exactly as
//! it was. Digests and refs are copied, never recomputed, so every one still verifies.
//!
//! The chain: v1 → v2 (approval columns optional; `failed` and `quarantined` states;
//! the operation's downstream identity; `terminal_outcomes`; `migrations`); v2 → v3
//! (the relay's due time, last reason and `dead` state; the operator log, tombstones
//! and counters); v3 → v4 (an operator may settle an unknown outcome by hand: `operator`
//! as a finalizer, `resolve` in the operator log); v4 → v5 (a finished operation's
//! replay record, and the triggers that invalidate it); v5 → v6 (the trace context of
//! the call that asked for an operation). A later schema appends one step.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, backup::Backup};
use toolledger_contract::DownstreamIdentity;

use crate::{
    Now, StoreError, Waits,
    error::sqlite,
    schema::{self, Contents, SCHEMA_ID, USER_VERSION},
};

/// The schema ids of the older versions, by `user_version`.
const OLDER: [(i64, &str); 5] = [
    (1, "toolledger-store-v1"),
    (2, "toolledger-store-v2"),
    (3, "toolledger-store-v3"),
    (4, "toolledger-store-v4"),
    (5, "toolledger-store-v5"),
];

/// The schema of `toolledger-store-v1`, as version 1 of this crate created it: a file is
/// migrated only if its schema is exactly this.
const V1_DDL: &str = include_str!("v1.sql");

/// The tables of `toolledger-store-v2`, as version 2 created them.
const V2_TABLES: &str = include_str!("v2_tables.sql");

/// The tables of `toolledger-store-v3`, as version 3 created them.
const V3_TABLES: &str = include_str!("v3_tables.sql");

/// The version of an older store of this product, from its `meta.schema_id` and
/// `user_version`; `None` for the current version and for anything else.
pub(crate) fn older_version(schema_id: Option<&str>, user_version: i64) -> Option<i64> {
    OLDER
        .iter()
        .find(|(version, id)| *version == user_version && schema_id == Some(*id))
        .map(|(version, _)| *version)
}

fn schema_id_of(version: i64) -> &'static str {
    OLDER.iter().find(|(known, _)| *known == version).map_or(SCHEMA_ID, |(_, id)| id)
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Migrated {
    /// The store was already at the current version: nothing was written, no backup.
    Current,
    /// The store was upgraded.
    Upgraded {
        /// The version it had.
        from: i64,
        /// The version it has now.
        to: i64,
        /// The backup made before anything changed, beside the store (`None` for
        /// PostgreSQL, whose migration is one transaction and makes no copy).
        backup: Option<PathBuf>,
        /// Operations carried over.
        operations: i64,
    },
}

/// Upgrades the store at `path` to the current schema.
///
/// Version 1 did not record which downstream an operation belongs to; `legacy` is the
/// identity every existing operation is recorded with (a host that has only ever used
/// one downstream names it; the command line's simulation is
/// `toolledger-stand-in@1`). `now` stamps the backup's name and the `migrations` rows.
///
/// # Errors
///
/// [`StoreError::Missing`] when there is no store; [`StoreError::SchemaUnsupported`]
/// when the file is not a store this crate knows, or an older store whose schema was
/// changed by hand; [`StoreError::Busy`] when another connection holds a lock past
/// `waits`; [`StoreError::Backend`] when the backup cannot be written. On any error the
/// store is as it was.
pub fn migrate(
    path: &Path,
    legacy: &DownstreamIdentity,
    now: Now,
    waits: Waits,
) -> Result<Migrated, StoreError> {
    if !std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.len() > 0) {
        return Err(StoreError::Missing);
    }
    let mut conn =
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(sqlite)?;
    schema::set_busy_timeout(&conn, waits.next_wait())?;
    let from = match schema::classify(&conn) {
        Ok(Contents::Store) => return Ok(Migrated::Current),
        Ok(Contents::Empty) => return Err(StoreError::Missing),
        Ok(Contents::Damaged) => return Err(StoreError::SchemaUnsupported),
        Err(StoreError::SchemaOutdated { version }) => version,
        Err(err) => return Err(err),
    };
    if schema::schema_rows(&conn)? != schema_of(from)? {
        return Err(StoreError::SchemaUnsupported);
    }

    let backup = back_up(&conn, path, from, now)?;

    // Foreign keys are checked once, at the end, over the whole result.
    conn.execute_batch("PRAGMA foreign_keys = OFF").map_err(sqlite)?;
    let tx =
        conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(sqlite)?;
    // Every step of the chain, in order, each recorded as it is applied.
    let steps =
        [(2, v1_to_v2(legacy)), (3, v2_to_v3()), (4, v3_to_v4()), (5, v4_to_v5()), (6, v5_to_v6())];
    for (to, step) in steps {
        if to <= from {
            continue;
        }
        tx.execute_batch(&step).map_err(sqlite)?;
        tx.execute(
            "INSERT INTO migrations (version, from_schema, to_schema, started_at, finished_at) \
             VALUES (?1, ?2, ?3, ?4, ?4)",
            rusqlite::params![to, schema_id_of(to - 1), schema_id_of(to), now.get()],
        )
        .map_err(sqlite)?;
    }
    let dangling: i64 = tx
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| row.get(0))
        .map_err(sqlite)?;
    if dangling != 0 || schema::schema_rows(&tx)? != schema::expected_schema() {
        return Err(crate::error::failed("the migrated store does not hold together"));
    }
    let operations: i64 =
        tx.query_row("SELECT count(*) FROM operations", [], |row| row.get(0)).map_err(sqlite)?;
    tx.commit().map_err(sqlite)?;
    conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA journal_mode = WAL;").map_err(sqlite)?;
    Ok(Migrated::Upgraded { from, to: USER_VERSION, backup: Some(backup), operations })
}

/// How many names a backup tries (`<file>.v<from>-backup-<now>`, then `-2`, `-3`, …).
const BACKUP_NAMES: u32 = 100;

/// Copies the store on `conn` to a new file beside it, with SQLite's online backup API:
/// `<file>.v<from>-backup-<now>`, or the first of `…-2`, `…-3` that is free. Each name
/// is created exclusively (`O_CREAT | O_EXCL`, which never follows a symlink, dangling or
/// not) and then opened by SQLite with `SQLITE_OPEN_NOFOLLOW`, so the copy is only ever
/// written into a file this call made. A copy that fails is removed; an empty file left
/// under a backup name by a migrate that was killed before its copy began is removed
/// first (a finished backup is never empty).
fn back_up(conn: &Connection, path: &Path, from: i64, now: Now) -> Result<PathBuf, StoreError> {
    let stem = {
        let mut name = path.file_name().map(|name| name.to_os_string()).unwrap_or_default();
        name.push(format!(".v{from}-backup-"));
        name.to_string_lossy().into_owned()
    };
    remove_empty_backups(path, &stem);
    let created = (1..=BACKUP_NAMES).find_map(|attempt| {
        let suffix = if attempt == 1 { String::new() } else { format!("-{attempt}") };
        let candidate = path.with_file_name(format!("{stem}{}{suffix}", now.get()));
        std::fs::OpenOptions::new().write(true).create_new(true).open(&candidate).ok()?;
        Some(candidate)
    });
    let backup =
        created.ok_or_else(|| crate::error::failed("no free name for the migration's backup"))?;
    let copied = Connection::open_with_flags(
        &backup,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )
    .and_then(|mut copy| {
        Backup::new(conn, &mut copy)
            .and_then(|job| job.run_to_completion(256, std::time::Duration::ZERO, None))
    });
    if let Err(err) = copied {
        let _ = std::fs::remove_file(&backup);
        let _ = std::fs::remove_file(format!("{}-journal", backup.to_string_lossy()));
        return Err(sqlite(err));
    }
    Ok(backup)
}

/// Removes the empty regular files (never a symlink) beside `path` whose names start with
/// `stem`: backups a killed migrate created and never wrote.
fn remove_empty_backups(path: &Path, stem: &str) {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for entry in entries.flatten() {
        let named = entry.file_name().to_str().is_some_and(|name| {
            name.strip_prefix(stem).is_some_and(|rest| {
                !rest.is_empty() && rest.bytes().all(|byte| byte.is_ascii_digit() || byte == b'-')
            })
        });
        let empty = std::fs::symlink_metadata(entry.path())
            .is_ok_and(|meta| meta.file_type().is_file() && meta.len() == 0);
        if named && empty {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The schema rows version `version` made.
fn schema_of(version: i64) -> Result<Vec<schema::SchemaRow>, StoreError> {
    let ddl = match version {
        1 => V1_DDL.to_owned(),
        2 => format!("{}{V2_TABLES}", schema::meta_ddl()),
        3 => format!("{}{V3_TABLES}", schema::meta_ddl()),
        4 => format!("{}{}", schema::meta_ddl(), schema::v4_tables_ddl()),
        5 => format!("{}{}", schema::meta_ddl(), schema::v5_tables_ddl()),
        _ => return Err(StoreError::SchemaUnsupported),
    };
    let conn = Connection::open_in_memory().map_err(sqlite)?;
    conn.execute_batch(&ddl).map_err(sqlite)?;
    schema::schema_rows(&conn)
}

/// v1 → v2 in SQL: the old tables step aside, the new ones are created from version 2's
/// DDL, rows are copied with their ids, and the old tables are dropped.
fn v1_to_v2(legacy: &DownstreamIdentity) -> String {
    // The identity passed validation: `[A-Za-z0-9._:/-]` only, so it is safe as a literal.
    let (name, revision) = (legacy.name(), legacy.revision());
    format!(
        "DROP INDEX call_identities_op;
         ALTER TABLE call_identities RENAME TO v1_call_identities;
         ALTER TABLE local_receipts RENAME TO v1_local_receipts;
         ALTER TABLE downstream_receipts RENAME TO v1_downstream_receipts;
         ALTER TABLE outbox RENAME TO v1_outbox;
         ALTER TABLE operations RENAME TO v1_operations;
         {V2_TABLES}
         INSERT INTO operations (id, tenant_id, subject_id, tool_name, idempotency_key, status_ref,
             downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision,
             effect_revision, handler_revision, producer_revision, policy_revision, provider, api_family,
             adapter_revision, provider_response_id, provider_call_id, operation_id, approval_id, approver_id,
             approval_sha256, approved_at, approval_expires_at, downstream_name, downstream_revision, status,
             created_at, updated_at)
           SELECT id, tenant_id, subject_id, tool_name, idempotency_key, status_ref,
             downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision,
             effect_revision, handler_revision, producer_revision, policy_revision, provider, api_family,
             adapter_revision, provider_response_id, provider_call_id, operation_id, approval_id, approver_id,
             approval_sha256, approved_at, approval_expires_at, '{name}', '{revision}', status,
             created_at, updated_at FROM v1_operations;
         INSERT INTO outbox SELECT * FROM v1_outbox;
         INSERT INTO downstream_receipts SELECT * FROM v1_downstream_receipts;
         INSERT INTO local_receipts SELECT * FROM v1_local_receipts;
         INSERT INTO call_identities SELECT * FROM v1_call_identities;
         DROP TABLE v1_call_identities;
         DROP TABLE v1_local_receipts;
         DROP TABLE v1_downstream_receipts;
         DROP TABLE v1_outbox;
         DROP TABLE v1_operations;
         UPDATE meta SET value = 'toolledger-store-v2' WHERE key = 'schema_id';
         PRAGMA user_version = 2;"
    )
}

/// v2 → v3 in SQL, the same way, with version 3's DDL. An event's due time is its lease end while it is processing
/// (it is reclaimable then), its last change otherwise.
fn v2_to_v3() -> String {
    format!(
        "DROP INDEX call_identities_op;
         ALTER TABLE migrations RENAME TO v2_migrations;
         ALTER TABLE call_identities RENAME TO v2_call_identities;
         ALTER TABLE terminal_outcomes RENAME TO v2_terminal_outcomes;
         ALTER TABLE local_receipts RENAME TO v2_local_receipts;
         ALTER TABLE downstream_receipts RENAME TO v2_downstream_receipts;
         ALTER TABLE outbox RENAME TO v2_outbox;
         ALTER TABLE operations RENAME TO v2_operations;
         {V3_TABLES}
         INSERT INTO operations SELECT * FROM v2_operations;
         INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, next_attempt_at,
             last_reason, attempts_before, created_at, updated_at)
           SELECT op_id, state, lease_owner, lease_until, attempt_count,
             CASE WHEN state = 'processing' THEN lease_until ELSE updated_at END, NULL, 0, created_at, updated_at
           FROM v2_outbox;
         INSERT INTO downstream_receipts SELECT * FROM v2_downstream_receipts;
         INSERT INTO local_receipts SELECT * FROM v2_local_receipts;
         INSERT INTO terminal_outcomes SELECT * FROM v2_terminal_outcomes;
         INSERT INTO call_identities SELECT * FROM v2_call_identities;
         INSERT INTO migrations SELECT * FROM v2_migrations;
         DROP TABLE v2_migrations;
         DROP TABLE v2_call_identities;
         DROP TABLE v2_terminal_outcomes;
         DROP TABLE v2_local_receipts;
         DROP TABLE v2_downstream_receipts;
         DROP TABLE v2_outbox;
         DROP TABLE v2_operations;
         UPDATE meta SET value = 'toolledger-store-v3' WHERE key = 'schema_id';
         PRAGMA user_version = 3;"
    )
}

/// v3 → v4 in SQL, the same way, with version 4's DDL (so the schema text is a new v4
/// store's, byte for byte): every row is copied as it is; only the checks of the
/// finalizer and the operator log's action and state widen.
fn v3_to_v4() -> String {
    const TABLES: [&str; 10] = [
        "migrations",
        "counters",
        "tombstones",
        "operator_log",
        "call_identities",
        "terminal_outcomes",
        "local_receipts",
        "downstream_receipts",
        "outbox",
        "operations",
    ];
    let renamed: String =
        TABLES.iter().map(|table| format!("ALTER TABLE {table} RENAME TO v3_{table};\n")).collect();
    let copied: String = TABLES
        .iter()
        .rev()
        .map(|table| format!("INSERT INTO {table} SELECT * FROM v3_{table};\n"))
        .collect();
    let dropped: String = TABLES.iter().map(|table| format!("DROP TABLE v3_{table};\n")).collect();
    let tables = schema::v4_tables_ddl();
    format!(
        "DROP INDEX outbox_due;
         DROP INDEX call_identities_op;
         DROP INDEX operations_status;
         DROP INDEX operator_log_ref;
         DROP TRIGGER operator_log_no_update;
         DROP TRIGGER operator_log_no_delete;
         {renamed}{tables}{copied}{dropped}
         UPDATE meta SET value = 'toolledger-store-v4' WHERE key = 'schema_id';
         PRAGMA user_version = 4;"
    )
}

/// v4 → v5 in SQL: the replay records' table and the triggers that invalidate a record,
/// created after version 4's (so the schema text is a new store's, byte for byte). No
/// record is written for an operation that finished before: a replay of it reads the
/// join, as before, which a missing record always means.
fn v4_to_v5() -> String {
    format!(
        "{}
         UPDATE meta SET value = 'toolledger-store-v5' WHERE key = 'schema_id';
         PRAGMA user_version = 5;",
        toolledger_store::ddl::added_in_v5(toolledger_store::driver::Dialect::Sqlite)
    )
}

/// v5 → v6 in SQL: the trace contexts' table, created after version 5's (so the schema
/// text is a new store's, byte for byte). An operation accepted before has none: a later
/// attempt of it starts a trace with no link, which a missing row always means.
fn v5_to_v6() -> String {
    format!(
        "{}
         UPDATE meta SET value = '{SCHEMA_ID}' WHERE key = 'schema_id';
         PRAGMA user_version = {USER_VERSION};",
        toolledger_store::ddl::added_in_v6(toolledger_store::driver::Dialect::Sqlite)
    )
}
