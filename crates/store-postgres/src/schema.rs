//! The `toolledger-store-v6` schema in PostgreSQL, and how a database is judged,
//! initialised and upgraded from v3, v4 or v5.
//!
//! The tables, columns, CHECKs, unique constraints and indexes are SQLite's
//! `toolledger-store-v6`, translated: `INTEGER PRIMARY KEY` row ids are `BIGINT
//! GENERATED ALWAYS AS IDENTITY`, `GLOB 'sr_*'` is `LIKE 'sr\_%'`, `json_valid(x)` is
//! `x::json IS NOT NULL` (a cast that refuses text that is not JSON), instants are
//! `BIGINT` Unix seconds, and the operator log's append-only triggers call one plpgsql
//! function. A database is judged before anything is written to it: toolledger's
//! tables are created (in one transaction, creators serialized by an advisory lock)
//! only when none of them exists.

use tokio_postgres::IsolationLevel;
use toolledger_store::{audit::TABLES, ddl, driver::Dialect};

use crate::{
    StoreError,
    session::{Conn, Db, GenericClient, get},
};

/// The schema id kept in `meta`.
pub const SCHEMA_ID: &str = "toolledger-store-v6";
/// The schema's version, recorded in `migrations` when a store is created.
pub const SCHEMA_VERSION: i64 = 6;

/// Serializes creators of a store in one database: `pg_advisory_xact_lock` on this key
/// (the first eight bytes of "toolledg", big-endian).
const CREATE_LOCK: i64 = 0x746f_6f6c_6c65_6467;

/// The rows a new store starts with: its schema id, and its creation recorded as the
/// step to the current version (from no schema), stamped with the database's clock.
const SEED_META: &str = "INSERT INTO meta (key, value) VALUES ('schema_id', $1)";
const SEED_MIGRATION: &str = "INSERT INTO migrations (version, from_schema, to_schema, started_at, finished_at) \
     VALUES ($1, 'none', $2, floor(extract(epoch FROM now()))::bigint, floor(extract(epoch FROM now()))::bigint)";

/// Every object of the schema, as [`CATALOG`] lists it, sorted: the reference a
/// database is compared with. Regenerate it from a new store when the DDL changes
/// (`tests/it/schema.rs` fails until it matches).
pub(crate) const EXPECTED: &[&str] = &include!("expected.in");

/// Every object of `toolledger-store-v4`, as [`CATALOG`] lists it, sorted: what a
/// migration from version 4 starts from. Frozen.
const EXPECTED_V4: &[&str] = &include!("expected_v4.in");

/// Every object of `toolledger-store-v5`, as [`CATALOG`] lists it, sorted: what a
/// migration from version 5 starts from. Frozen.
const EXPECTED_V5: &[&str] = &include!("expected_v5.in");

/// Toolledger's own objects in the current schema, one line each: its tables, their
/// columns (type and nullability), indexes, constraints (name, kind and a digest of the
/// definition, so a migrated store is held to a new one's every CHECK) and triggers
/// (whether enabled, a digest of the function each calls and one of its definition:
/// timing, events and condition). Other objects in the
/// same schema (another application's tables) are not listed.
const CATALOG: &str = "WITH ours AS ( \
       SELECT c.oid, c.relname FROM pg_catalog.pg_class c \
       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
       WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname = ANY($1)) \
     SELECT 'table ' || o.relname FROM ours o \
     UNION ALL SELECT 'column ' || o.relname || '.' || a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod) \
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END \
       || CASE WHEN a.attidentity <> '' THEN ' identity' ELSE '' END \
       FROM pg_catalog.pg_attribute a JOIN ours o ON o.oid = a.attrelid WHERE a.attnum > 0 AND NOT a.attisdropped \
     UNION ALL SELECT 'index ' || o.relname || '.' || i.relname \
       FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid JOIN ours o ON o.oid = x.indrelid \
     UNION ALL SELECT 'constraint ' || o.relname || '.' || k.conname || ' ' || k.contype::text || ' ' \
       || encode(sha256(convert_to(pg_catalog.pg_get_constraintdef(k.oid), 'UTF8')), 'hex') \
       FROM pg_catalog.pg_constraint k JOIN ours o ON o.oid = k.conrelid WHERE k.contype <> 'n' \
     UNION ALL SELECT 'trigger ' || o.relname || '.' || t.tgname || ' ' || t.tgenabled::text || ' ' || p.proname || ' ' || encode(sha256(convert_to(p.prosrc, 'UTF8')), 'hex') \
       || ' ' || encode(sha256(convert_to(pg_catalog.pg_get_triggerdef(t.oid), 'UTF8')), 'hex') \
       FROM pg_catalog.pg_trigger t JOIN ours o ON o.oid = t.tgrelid JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid \
       WHERE NOT t.tgisinternal";

/// How many of toolledger's tables the current schema holds.
const TABLES_PRESENT: &str = "SELECT count(*) FROM pg_catalog.pg_class c \
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
     WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname = ANY($1)";

const SCHEMA_ID_OF: &str = "SELECT value FROM meta WHERE key = 'schema_id'";

/// What a database holds, judged without writing to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contents {
    /// None of toolledger's tables: a store may be created.
    Empty,
    /// A store of this version whose objects are exactly the expected ones.
    Store,
    /// It says it is a store of this version, but its objects differ from the DDL's.
    /// Only the audit reads it, to report what differs.
    Damaged,
}

/// Toolledger's objects in the current schema, sorted (see [`CATALOG`]).
pub(crate) fn catalog<C: GenericClient>(db: &mut Db<'_, C>) -> Result<Vec<String>, StoreError> {
    let mut lines = db
        .query(CATALOG, &[&TABLES.as_slice()])?
        .iter()
        .map(|row| get::<String>(row, 0))
        .collect::<Result<Vec<_>, _>>()?;
    lines.sort_unstable();
    Ok(lines)
}

/// Whether the store's objects are exactly [`EXPECTED`] and `meta` names this schema.
pub(crate) fn matches<C: GenericClient>(db: &mut Db<'_, C>) -> Result<bool, StoreError> {
    let schema_id: Option<String> = db.value(SCHEMA_ID_OF, &[])?;
    Ok(schema_id.as_deref() == Some(SCHEMA_ID) && catalog(db)? == EXPECTED)
}

/// Judges the database without writing to it. A database holding some of toolledger's
/// tables but not this schema's id in `meta` is [`StoreError::SchemaUnsupported`].
pub(crate) fn classify<C: GenericClient>(db: &mut Db<'_, C>) -> Result<Contents, StoreError> {
    let present: i64 = db
        .value(TABLES_PRESENT, &[&TABLES.as_slice()])?
        .ok_or(StoreError::Internal("a count answered no row"))?;
    if present == 0 {
        return Ok(Contents::Empty);
    }
    // A `meta` of another shape, or none, is not this store.
    let schema_id: Option<String> =
        db.value(SCHEMA_ID_OF, &[]).map_err(|_| StoreError::SchemaUnsupported)?;
    if schema_id.as_deref() == Some(V3_SCHEMA_ID) {
        return Err(StoreError::SchemaOutdated { version: 3 });
    }
    if schema_id.as_deref() == Some(V4_SCHEMA_ID) {
        return Err(StoreError::SchemaOutdated { version: 4 });
    }
    if schema_id.as_deref() == Some(V5_SCHEMA_ID) {
        return Err(StoreError::SchemaOutdated { version: 5 });
    }
    if schema_id.as_deref() != Some(SCHEMA_ID) {
        return Err(StoreError::SchemaUnsupported);
    }
    if catalog(db)? == EXPECTED { Ok(Contents::Store) } else { Ok(Contents::Damaged) }
}

/// Opens the store on `conn`: judged first; created in one transaction when the
/// database holds none of toolledger's tables and `create` allows (creators serialized
/// by an advisory lock, the emptiness judged again under it), else
/// [`StoreError::Missing`]. A damaged store is opened only when `damaged_ok` (the
/// audit's connection), else [`StoreError::SchemaUnsupported`].
pub(crate) fn prepare(conn: &mut Conn, create: bool, damaged_ok: bool) -> Result<(), StoreError> {
    match classify(&mut conn.db())? {
        Contents::Store => return Ok(()),
        Contents::Damaged if damaged_ok => return Ok(()),
        Contents::Damaged => return Err(StoreError::SchemaUnsupported),
        Contents::Empty if !create => return Err(StoreError::Missing),
        Contents::Empty => {}
    }
    let Conn { client, cache } = conn;
    let mut tx = client.begin(IsolationLevel::ReadCommitted, false)?;
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({CREATE_LOCK})"))?;
    let mut db = Db::new(&mut tx, cache);
    match classify(&mut db)? {
        Contents::Empty => {
            // Every table, index, constraint and trigger of `toolledger-store-v6`.
            db.c.batch_execute(ddl::all(Dialect::Postgres))?;
            db.exec(SEED_META, &[&SCHEMA_ID])?;
            db.exec(SEED_MIGRATION, &[&SCHEMA_VERSION, &SCHEMA_ID])?;
        }
        Contents::Store => {}
        Contents::Damaged => return Err(StoreError::SchemaUnsupported),
    }
    tx.commit()
}

/// The schema ids of the older versions a store is migrated from.
const V3_SCHEMA_ID: &str = "toolledger-store-v3";
const V4_SCHEMA_ID: &str = "toolledger-store-v4";
const V5_SCHEMA_ID: &str = "toolledger-store-v5";

/// v3 → v4: only CHECKs widen (`operator` as a finalizer; `resolve` in the operator log,
/// from `pending` or `processing`). Each is replaced under its own name, so the result
/// is a new store's, constraint for constraint.
const V3_TO_V4: &str = "\
ALTER TABLE local_receipts DROP CONSTRAINT local_receipts_finalized_by_check, \
    ADD CONSTRAINT local_receipts_finalized_by_check CHECK (finalized_by IN ('worker', 'status_query', 'operator'));
ALTER TABLE terminal_outcomes DROP CONSTRAINT terminal_outcomes_finalized_by_check, \
    ADD CONSTRAINT terminal_outcomes_finalized_by_check CHECK (finalized_by IN ('worker', 'status_query', 'operator'));
ALTER TABLE operator_log DROP CONSTRAINT operator_log_action_check, \
    ADD CONSTRAINT operator_log_action_check CHECK (action IN ('requeue', 'resolve'));
ALTER TABLE operator_log DROP CONSTRAINT operator_log_from_state_check, \
    ADD CONSTRAINT operator_log_from_state_check CHECK (from_state IN ('failed', 'dead', 'pending', 'processing'));
UPDATE meta SET value = 'toolledger-store-v4' WHERE key = 'schema_id';
INSERT INTO migrations (version, from_schema, to_schema, started_at, finished_at) \
    VALUES (4, 'toolledger-store-v3', 'toolledger-store-v4', \
    floor(extract(epoch FROM now()))::bigint, floor(extract(epoch FROM now()))::bigint);
";

/// v4 → v5 after the DDL of [`ddl::added_in_v5`]: the store says so, and records the step.
const V4_TO_V5: &str = "\
UPDATE meta SET value = 'toolledger-store-v5' WHERE key = 'schema_id';
INSERT INTO migrations (version, from_schema, to_schema, started_at, finished_at) \
    VALUES (5, 'toolledger-store-v4', 'toolledger-store-v5', \
    floor(extract(epoch FROM now()))::bigint, floor(extract(epoch FROM now()))::bigint);
";

/// v5 → v6 after the DDL of [`ddl::added_in_v6`]: the store says so, and records the step.
const V5_TO_V6: &str = "\
UPDATE meta SET value = 'toolledger-store-v6' WHERE key = 'schema_id';
INSERT INTO migrations (version, from_schema, to_schema, started_at, finished_at) \
    VALUES (6, 'toolledger-store-v5', 'toolledger-store-v6', \
    floor(extract(epoch FROM now()))::bigint, floor(extract(epoch FROM now()))::bigint);
";

/// Upgrades a `toolledger-store-v3`, `-v4` or `-v5` store on `conn` to the current schema, in
/// one transaction (PostgreSQL's DDL is transactional: on any error the store is as it
/// was), under the creators' advisory lock. The version it had and the operations it
/// carried over, or `None` when it was current already.
///
/// # Errors
///
/// [`StoreError::Missing`] when there is no store; [`StoreError::SchemaUnsupported`]
/// when it is not a v3, v4, v5 or v6 store with exactly the objects that version made.
pub(crate) fn migrate(conn: &mut Conn) -> Result<Option<(i64, i64)>, StoreError> {
    let Conn { client, cache } = conn;
    let mut tx = client.begin(IsolationLevel::ReadCommitted, false)?;
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({CREATE_LOCK})"))?;
    let mut db = Db::new(&mut tx, cache);
    let from = match classify(&mut db) {
        Ok(Contents::Store) => return Ok(None),
        Ok(Contents::Empty) => return Err(StoreError::Missing),
        Ok(Contents::Damaged) => return Err(StoreError::SchemaUnsupported),
        Err(StoreError::SchemaOutdated { version: version @ (3..=5) }) => version,
        Err(err) => return Err(err),
    };
    let expected_v4: Vec<String> = EXPECTED_V4.iter().map(|line| (*line).to_owned()).collect();
    if from == 3 {
        // A v3 store's objects are a v4 store's but for the four CHECKs this step replaces.
        let widened = [
            "local_receipts.local_receipts_finalized_by_check",
            "terminal_outcomes.terminal_outcomes_finalized_by_check",
            "operator_log.operator_log_action_check",
            "operator_log.operator_log_from_state_check",
        ];
        let unwidened = |lines: &[String]| -> Vec<String> {
            lines
                .iter()
                .filter(|line| {
                    !widened.iter().any(|name| line.starts_with(&format!("constraint {name} ")))
                })
                .cloned()
                .collect()
        };
        let before = catalog(&mut db)?;
        if unwidened(&before) != unwidened(&expected_v4) || before.len() != expected_v4.len() {
            return Err(StoreError::SchemaUnsupported);
        }
        db.c.batch_execute(V3_TO_V4)?;
    }
    if from <= 4 {
        if catalog(&mut db)? != expected_v4 {
            return Err(if from == 3 {
                crate::error::failed("the migrated store does not hold together")
            } else {
                StoreError::SchemaUnsupported
            });
        }
        db.c.batch_execute(ddl::added_in_v5(Dialect::Postgres))?;
        db.c.batch_execute(V4_TO_V5)?;
    }
    if catalog(&mut db)? != EXPECTED_V5 {
        return Err(if from <= 4 {
            crate::error::failed("the migrated store does not hold together")
        } else {
            StoreError::SchemaUnsupported
        });
    }
    db.c.batch_execute(ddl::added_in_v6(Dialect::Postgres))?;
    db.c.batch_execute(V5_TO_V6)?;
    if catalog(&mut db)? != EXPECTED {
        return Err(crate::error::failed("the migrated store does not hold together"));
    }
    let operations: i64 = db
        .value("SELECT count(*) FROM operations", &[])?
        .ok_or(StoreError::Internal("a count answered no row"))?;
    tx.commit()?;
    Ok(Some((from, operations)))
}

#[cfg(test)]
mod tests {
    use super::{EXPECTED, EXPECTED_V4, EXPECTED_V5, catalog};
    use crate::session::GenericClient;
    use toolledger_store::{ddl, driver::Dialect};
    use toolledger_testkit::cluster::Cluster;

    use crate::{PgStore, Waits, session};

    /// A new store's objects are exactly [`EXPECTED`]; on a difference, the listing to
    /// paste into `expected.in` is printed.
    #[test]
    fn a_new_store_lists_exactly_the_expected_objects() {
        let url = Cluster::shared().unwrap().fresh_database("catalog").unwrap();
        drop(PgStore::connect(&url, Waits::default()).unwrap());
        let config = session::config(&url).unwrap();
        let mut conn = session::open(&config, &Waits::default()).unwrap();
        let listed = catalog(&mut conn.db()).unwrap();
        if listed != EXPECTED {
            println!("[");
            for line in &listed {
                println!("    {line:?},");
            }
            println!("]");
        }
        assert_eq!(listed, EXPECTED);
    }

    /// Version 4's objects, created from its frozen DDL, are exactly [`EXPECTED_V4`]: what
    /// a migration from version 4 checks a store against.
    #[test]
    fn version_4s_ddl_lists_exactly_its_expected_objects() {
        let url = Cluster::shared().unwrap().fresh_database("catalog_v4").unwrap();
        let config = session::config(&url).unwrap();
        let mut conn = session::open(&config, &Waits::default()).unwrap();
        let mut db = conn.db();
        db.c.batch_execute(
            &[ddl::meta(Dialect::Postgres), ddl::tables_v4(Dialect::Postgres)].concat(),
        )
        .unwrap();
        let listed = catalog(&mut db).unwrap();
        if listed != EXPECTED_V4 {
            println!("[");
            for line in &listed {
                println!("    {line:?},");
            }
            println!("]");
        }
        assert_eq!(listed, EXPECTED_V4);
    }

    /// Version 5's objects, created from its frozen DDL, are exactly [`EXPECTED_V5`]: what
    /// a migration from version 5 checks a store against.
    #[test]
    fn version_5s_ddl_lists_exactly_its_expected_objects() {
        let url = Cluster::shared().unwrap().fresh_database("catalog_v5").unwrap();
        let config = session::config(&url).unwrap();
        let mut conn = session::open(&config, &Waits::default()).unwrap();
        let mut db = conn.db();
        db.c.batch_execute(
            &[ddl::meta(Dialect::Postgres), ddl::tables_v5(Dialect::Postgres)].concat(),
        )
        .unwrap();
        assert_eq!(catalog(&mut db).unwrap(), EXPECTED_V5);
    }
}
