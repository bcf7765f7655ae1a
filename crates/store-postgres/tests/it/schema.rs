//! Creating, reopening and refusing databases.

use std::sync::{Arc, Barrier};

use toolledger_store::{LedgerStore, StoreError, Waits};
use toolledger_store_postgres::{CHECKS, PgStore, SCHEMA_ID, SCHEMA_VERSION};

use crate::{assert_audit_passes, count, fresh, raw};

#[test]
fn a_store_is_created_once_and_reopened() {
    let url = fresh("created_once");
    let mut first = PgStore::connect(&url, Waits::default()).unwrap();
    assert_audit_passes(&mut first);
    drop(first);
    let mut again = PgStore::connect(&url, Waits::default()).unwrap();
    assert_audit_passes(&mut again);
    let mut existing = PgStore::connect_existing(&url, Waits::default()).unwrap();
    let report = existing.audit().unwrap();
    assert_eq!(report.checks.iter().map(|(check, _)| *check).collect::<Vec<_>>(), CHECKS);
    assert!(report.passed());

    let mut client = raw(&url);
    assert_eq!(count(&mut client, "SELECT count(*) FROM meta"), 1);
    let id: String =
        client.query_one("SELECT value FROM meta WHERE key = 'schema_id'", &[]).unwrap().get(0);
    assert_eq!(id, SCHEMA_ID);
    // The creation is recorded once, as the step to the current version.
    let row = client
        .query_one("SELECT version, from_schema, to_schema, started_at FROM migrations", &[])
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), SCHEMA_VERSION);
    assert_eq!(row.get::<_, String>(1), "none");
    assert_eq!(row.get::<_, String>(2), SCHEMA_ID);
    assert!(row.get::<_, i64>(3) > 1_700_000_000);
}

#[test]
fn creators_racing_on_one_database_all_open_one_store() {
    let url = fresh("racing_creators");
    let barrier = Arc::new(Barrier::new(6));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (url, barrier) = (url.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                PgStore::connect(&url, Waits::default()).map(drop)
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap().unwrap();
    }
    let mut client = raw(&url);
    assert_eq!(count(&mut client, "SELECT count(*) FROM meta"), 1);
    assert_eq!(count(&mut client, "SELECT count(*) FROM migrations"), 1);
}

#[test]
fn an_empty_database_is_missing_to_a_reader_and_stays_empty() {
    let url = fresh("missing");
    assert_eq!(PgStore::connect_existing(&url, Waits::default()).unwrap_err(), StoreError::Missing);
    let mut client = raw(&url);
    assert_eq!(count(&mut client, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"), 0);
    // A database that does not exist: no store there to a reader, an error to a writer
    // (a store creates its tables, never a database).
    let absent = format!("{url}_absent");
    assert_eq!(
        PgStore::connect_existing(&absent, Waits::default()).unwrap_err(),
        StoreError::Missing
    );
    assert_eq!(
        PgStore::connect(&absent, Waits::default()).unwrap_err().to_string(),
        "postgres failed: the database does not exist"
    );
}

#[test]
fn a_foreign_schema_is_refused_and_left_untouched() {
    // Another application's `meta`, and its own `operations`: not a toolledger store.
    let url = fresh("foreign");
    let mut client = raw(&url);
    client
        .batch_execute(
            "CREATE TABLE meta (name TEXT, setting TEXT); INSERT INTO meta VALUES ('a', 'b');",
        )
        .unwrap();
    for open in [PgStore::connect, PgStore::connect_existing] {
        assert_eq!(open(&url, Waits::default()).unwrap_err(), StoreError::SchemaUnsupported);
    }
    assert_eq!(count(&mut client, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"), 1);

    // A toolledger-looking store of another schema id.
    let url = fresh("other_id");
    let mut client = raw(&url);
    drop(PgStore::connect(&url, Waits::default()).unwrap());
    client.batch_execute("UPDATE meta SET value = 'toolledger-store-v9'").unwrap();
    assert_eq!(
        PgStore::connect(&url, Waits::default()).unwrap_err(),
        StoreError::SchemaUnsupported
    );
    let id: String = client.query_one("SELECT value FROM meta", &[]).unwrap().get(0);
    assert_eq!(id, "toolledger-store-v9");

    // Some of toolledger's tables but no `meta` at all.
    let url = fresh("no_meta");
    raw(&url).batch_execute("CREATE TABLE operations (id BIGINT)").unwrap();
    assert_eq!(
        PgStore::connect(&url, Waits::default()).unwrap_err(),
        StoreError::SchemaUnsupported
    );
}

#[test]
fn other_tables_beside_none_of_ours_get_a_store_created() {
    let url = fresh("beside");
    raw(&url).batch_execute("CREATE TABLE invoices (id BIGINT PRIMARY KEY)").unwrap();
    let mut store = PgStore::connect(&url, Waits::default()).unwrap();
    assert_audit_passes(&mut store);
}

#[test]
fn a_damaged_store_is_refused_but_audited() {
    let url = fresh("damaged");
    drop(PgStore::connect(&url, Waits::default()).unwrap());
    let mut client = raw(&url);
    // A CHECK dropped by hand, and the append-only trigger disabled.
    client
        .batch_execute(
            "ALTER TABLE outbox DROP CONSTRAINT outbox_attempt_count_check; \
             ALTER TABLE operator_log DISABLE TRIGGER operator_log_no_update;",
        )
        .unwrap();
    assert_eq!(
        PgStore::connect(&url, Waits::default()).unwrap_err(),
        StoreError::SchemaUnsupported
    );
    // Nothing but the audit reads it: a reader refuses it as a writer does.
    assert_eq!(
        PgStore::connect_existing(&url, Waits::default()).unwrap_err(),
        StoreError::SchemaUnsupported
    );
    let mut store = PgStore::connect_for_audit(&url, Waits::default()).unwrap();
    let report = store.audit().unwrap();
    assert!(!report.passed());
    let failed: Vec<_> =
        report.checks.iter().filter(|(_, passed)| !passed).map(|(check, _)| *check).collect();
    assert_eq!(failed, ["schema_matches"]);
}

/// A replay record's trigger recreated under its own name and function, but without its
/// condition (so it would fire on every update), is a damaged store: a trigger is
/// compared by its definition too.
#[test]
fn a_trigger_recreated_with_another_definition_is_refused() {
    let url = fresh("trigger_changed");
    drop(PgStore::connect(&url, Waits::default()).unwrap());
    raw(&url)
        .batch_execute(
            "DROP TRIGGER replays_event_changed ON outbox; \
             CREATE TRIGGER replays_event_changed AFTER UPDATE ON outbox \
             FOR EACH ROW EXECUTE FUNCTION replays_forget_old();",
        )
        .unwrap();
    assert_eq!(
        PgStore::connect_existing(&url, Waits::default()).unwrap_err(),
        StoreError::SchemaUnsupported
    );
}

#[test]
fn a_dropped_table_is_a_finding_and_every_other_check_still_runs() {
    let url = fresh("dropped");
    drop(PgStore::connect(&url, Waits::default()).unwrap());
    raw(&url).batch_execute("DROP TABLE tombstones").unwrap();
    assert_eq!(
        PgStore::connect_existing(&url, Waits::default()).unwrap_err(),
        StoreError::SchemaUnsupported
    );
    let mut store = PgStore::connect_for_audit(&url, Waits::default()).unwrap();
    let report = store.audit().unwrap();
    let failed: Vec<_> =
        report.checks.iter().filter(|(_, passed)| !passed).map(|(check, _)| *check).collect();
    assert_eq!(failed, ["schema_matches", "tombstones_retired"]);
    let tombstones = report.counts.iter().find(|(table, _)| *table == "tombstones").unwrap();
    assert_eq!(tombstones.1, None);
    let operations = report.counts.iter().find(|(table, _)| *table == "operations").unwrap();
    assert_eq!(operations.1, Some(0));
}

/// A new store taken back to version 5: no trace contexts; its id and creation step.
const AS_V5: &str = "\
DROP TABLE trace_contexts;
UPDATE meta SET value = 'toolledger-store-v5' WHERE key = 'schema_id';
UPDATE migrations SET version = 5, to_schema = 'toolledger-store-v5';
";

/// A version 5 store ([`AS_V5`]) taken back to version 4: no replay records, nor the
/// triggers and functions that invalidate them; its id and creation step.
const AS_V4: &str = "\
DROP TRIGGER replays_operation_changed ON operations;
DROP TRIGGER replays_operation_deleted ON operations;
DROP TRIGGER replays_event_changed ON outbox;
DROP TRIGGER replays_event_deleted ON outbox;
DROP TRIGGER replays_receipt_changed ON local_receipts;
DROP TRIGGER replays_call_changed ON call_identities;
DROP TRIGGER replays_outcome_added ON terminal_outcomes;
DROP FUNCTION replays_forget_operation();
DROP FUNCTION replays_forget_old();
DROP FUNCTION replays_forget_new();
DROP TABLE replays;
UPDATE meta SET value = 'toolledger-store-v4' WHERE key = 'schema_id';
UPDATE migrations SET version = 4, to_schema = 'toolledger-store-v4';
";

/// A store taken back to `version` by `setup` is refused until migrated; `migrate`
/// upgrades it in one transaction to exactly a new store's objects (every definition
/// compared) and records `steps`, then leaves the current store alone.
fn migrated_from(name: &str, setup: &[&str], version: i64, steps: &[&str]) {
    let url = fresh(name);
    drop(PgStore::connect(&url, Waits::default()).unwrap());
    let mut client = raw(&url);
    for sql in setup {
        client.batch_execute(sql).unwrap();
    }
    let refused = PgStore::connect_existing(&url, Waits::default()).map(drop);
    assert!(
        matches!(refused, Err(StoreError::SchemaOutdated { version: found }) if found == version),
        "{refused:?}"
    );
    let migrate = || toolledger_store_postgres::migrate(&url, Waits::default());
    assert_eq!(migrate().unwrap(), Some((version, 0)));
    assert_eq!(migrate().unwrap(), None);
    let mut store = PgStore::connect_existing(&url, Waits::default()).unwrap();
    assert_audit_passes(&mut store);
    let recorded: Vec<String> = client
        .query("SELECT from_schema || '>' || to_schema FROM migrations ORDER BY version", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(recorded, steps);
}

#[test]
fn a_v5_store_is_refused_until_migrated_then_is_a_new_stores_equal() {
    migrated_from(
        "v5_migrated",
        &[AS_V5],
        5,
        &["none>toolledger-store-v5", "toolledger-store-v5>toolledger-store-v6"],
    );
}

#[test]
fn a_v4_store_is_refused_until_migrated_then_is_a_new_stores_equal() {
    migrated_from(
        "v4_migrated",
        &[AS_V5, AS_V4],
        4,
        &[
            "none>toolledger-store-v4",
            "toolledger-store-v4>toolledger-store-v5",
            "toolledger-store-v5>toolledger-store-v6",
        ],
    );
}

/// What a v3 store holds that a v4 one does not: its four CHECKs, its id and its
/// creation step (the only differences between the two versions), after [`AS_V4`].
const AS_V3: &str = "\
ALTER TABLE local_receipts DROP CONSTRAINT local_receipts_finalized_by_check, \
    ADD CONSTRAINT local_receipts_finalized_by_check CHECK (finalized_by IN ('worker', 'status_query'));
ALTER TABLE terminal_outcomes DROP CONSTRAINT terminal_outcomes_finalized_by_check, \
    ADD CONSTRAINT terminal_outcomes_finalized_by_check CHECK (finalized_by IN ('worker', 'status_query'));
ALTER TABLE operator_log DROP CONSTRAINT operator_log_action_check, \
    ADD CONSTRAINT operator_log_action_check CHECK (action IN ('requeue'));
ALTER TABLE operator_log DROP CONSTRAINT operator_log_from_state_check, \
    ADD CONSTRAINT operator_log_from_state_check CHECK (from_state IN ('failed', 'dead'));
UPDATE meta SET value = 'toolledger-store-v3' WHERE key = 'schema_id';
UPDATE migrations SET version = 3, to_schema = 'toolledger-store-v3';
";

/// A v3 store is migrated through v4 to a new store's equal; a v3 store changed by
/// hand is not migrated.
#[test]
fn a_v3_store_is_refused_until_migrated_then_is_a_new_stores_equal() {
    migrated_from(
        "v3_migrated",
        &[AS_V5, AS_V4, AS_V3],
        3,
        &[
            "none>toolledger-store-v3",
            "toolledger-store-v3>toolledger-store-v4",
            "toolledger-store-v4>toolledger-store-v5",
            "toolledger-store-v5>toolledger-store-v6",
        ],
    );

    let changed = fresh("v3_changed");
    drop(PgStore::connect(&changed, Waits::default()).unwrap());
    let mut client = raw(&changed);
    client.batch_execute(AS_V5).unwrap();
    client.batch_execute(AS_V4).unwrap();
    client.batch_execute(AS_V3).unwrap();
    client
        .batch_execute("ALTER TABLE operator_log DROP CONSTRAINT operator_log_was_check")
        .unwrap();
    let refused = toolledger_store_postgres::migrate(&changed, Waits::default());
    assert!(matches!(refused, Err(StoreError::SchemaUnsupported)), "{refused:?}");
    let id: String =
        client.query_one("SELECT value FROM meta WHERE key = 'schema_id'", &[]).unwrap().get(0);
    assert_eq!(id, "toolledger-store-v3", "a refused migration writes nothing");
}
