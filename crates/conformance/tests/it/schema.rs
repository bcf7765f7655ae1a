//! Schema row of the matrix: WAL, FULL, STRICT, FK, CHECK; foreign and old schemas
//! refused untouched; time checks before any reservation; injected failures inside
//! commits A and C roll back whole; an orphan downstream receipt is an audit finding.

use crate::StoreUnderTest;
use serde_json::json;
use toolledger_contract::{Registry, Sha256Hex, load_case};
use toolledger_engine::{Downstream, DownstreamRequest, StandIn};

use crate::{Flows, audit_sqlite, open_sqlite};
use toolledger_store_sqlite::SqliteStore;

use crate::{Db, Roles, TempDir, at, case, dispatch, workspace};

const TABLES: [&str; 13] = [
    "meta",
    "operations",
    "outbox",
    "downstream_receipts",
    "local_receipts",
    "terminal_outcomes",
    "call_identities",
    "operator_log",
    "tombstones",
    "counters",
    "migrations",
    "replays",
    "trace_contexts",
];

#[test]
fn a_new_store_is_wal_full_strict_with_foreign_keys_and_checks() {
    let db = Db::fresh();
    let mut engine = db.engine();
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OK");
    let raw = db.raw();
    assert_eq!(db.text("PRAGMA journal_mode"), "wal");
    assert_eq!(db.int("PRAGMA user_version"), 6);
    assert_eq!(db.text("SELECT value FROM meta WHERE key = 'schema_id'"), "toolledger-store-v6");
    for table in TABLES {
        let strict: i64 = raw
            .query_row("SELECT strict FROM pragma_table_list WHERE name = ?1", [table], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(strict, 1, "{table} is not STRICT");
    }
    for (table, parent) in [
        ("outbox", "operations"),
        ("local_receipts", "operations"),
        ("call_identities", "operations"),
        ("replays", "operations"),
        ("trace_contexts", "operations"),
    ] {
        let references: String = raw
            .query_row(
                &format!("SELECT \"table\" FROM pragma_foreign_key_list('{table}')"),
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(references, parent);
    }
    // The audit reads synchronous through the store's own opener.
    let audit = audit_sqlite(db.path()).unwrap();
    assert_eq!(audit.code(), "OK", "{}", audit.package());
    assert_eq!(audit.package()["checks"]["synchronous_full"], json!(true));
    assert_eq!(audit.package()["checks"]["journal_mode_wal"], json!(true));

    // CHECK, STRICT typing and FOREIGN KEY refuse bad writes (foreign keys are on for
    // this raw connection too, as for every store connection).
    raw.execute_batch("PRAGMA foreign_keys = ON").unwrap();
    assert!(raw.execute("UPDATE operations SET status = 'done'", []).is_err());
    assert!(raw.execute("UPDATE outbox SET attempt_count = 'three'", []).is_err());
    assert!(raw.execute("UPDATE outbox SET attempt_count = -1", []).is_err());
    assert!(raw.execute("UPDATE operations SET approved_at = 253402300800", []).is_err());
    assert!(
        raw.execute("INSERT INTO outbox (op_id, state, attempt_count, created_at, updated_at) VALUES (999, 'pending', 0, 0, 0)", [])
            .is_err()
    );
    assert!(raw.execute("UPDATE outbox SET state = 'processing', lease_owner = NULL", []).is_err());
}

fn foreign_store(setup: &str) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new("test");
    let path = dir.path().join("other.sqlite3");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(setup).unwrap();
    drop(conn);
    (dir, path)
}

#[test]
fn foreign_and_old_schemas_are_refused_and_left_untouched() {
    let setups = [
        "CREATE TABLE notes (body TEXT)",
        // An older layout of this product: its schema id and user_version 0.
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT; \
         INSERT INTO meta VALUES ('schema_id', 'persistent-tool-runtime-v3');",
        // The right id with the wrong user_version, and the other way round.
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT; \
         INSERT INTO meta VALUES ('schema_id', 'toolledger-store-v6'); PRAGMA user_version = 7;",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT; PRAGMA user_version = 1;",
        "PRAGMA user_version = 1;",
    ];
    for setup in setups {
        let (_dir, path) = foreign_store(setup);
        let before = std::fs::read(&path).unwrap();
        let err = open_sqlite(&path, Roles::default(), Registry::builtin()).unwrap_err();
        assert_eq!(err.code(), "SCHEMA_UNSUPPORTED", "{setup}");
        assert_eq!(audit_sqlite(&path).unwrap_err().code(), "SCHEMA_UNSUPPORTED", "{setup}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "{setup}: the file changed");
        assert!(!path.with_extension("sqlite3-wal").exists());
    }
}

#[test]
fn a_file_that_is_not_sqlite_is_a_sqlite_error_and_untouched() {
    let dir = TempDir::new("test");
    let path = dir.path().join("notes.txt");
    std::fs::write(
        &path,
        b"these are not the pages you are looking for, not at all, no".repeat(20),
    )
    .unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = open_sqlite(&path, Roles::default(), Registry::builtin()).unwrap_err();
    assert_eq!(err.code(), "STORE_ERROR");
    assert!(!err.to_string().contains("notes"), "{err}");
    assert_eq!(audit_sqlite(&path).unwrap_err().code(), "STORE_ERROR");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn an_empty_file_is_initialised_and_audit_creates_nothing() {
    let dir = TempDir::new("test");
    let missing = dir.path().join("missing.sqlite3");
    assert_eq!(audit_sqlite(&missing).unwrap_err().code(), "STORE_NOT_FOUND");
    assert!(!missing.exists(), "audit created a file");

    let empty = dir.path().join("empty.sqlite3");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(audit_sqlite(&empty).unwrap_err().code(), "STORE_NOT_FOUND");
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "audit wrote to an empty file");

    let mut engine = open_sqlite(&empty, Roles::default(), Registry::builtin()).unwrap();
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OK");
    assert_eq!(audit_sqlite(&empty).unwrap().code(), "OK");

    // A SQLite file with no tables and user_version 0 is initialised too.
    let (_dir, blank) = foreign_store("PRAGMA user_version = 0;");
    let mut engine = open_sqlite(&blank, Roles::default(), Registry::builtin()).unwrap();
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OK");
}

#[test]
fn out_of_range_time_and_lease_overflow_are_refused_before_any_reservation() {
    let db = Db::fresh();
    let bytes = std::fs::read(workspace("fixtures/persistence-case.json")).unwrap();
    for now in [-1, 253_402_300_799, 253_402_300_780] {
        let err = load_case(&bytes, &Registry::builtin(), Some(now)).unwrap_err();
        assert_eq!(err.code(), "FIXTURE_INVALID");
    }
    for name in [
        "lease-overflow",
        "now-after-9999",
        "negative-now",
        "expires-after-9999",
        "boolean-timestamp",
    ] {
        let bad = std::fs::read(workspace(&format!("fixtures/bad-cases/{name}.json"))).unwrap();
        assert_eq!(
            load_case(&bad, &Registry::builtin(), None).unwrap_err().code(),
            "FIXTURE_INVALID",
            "{name}"
        );
    }
    // A case is the engine's only way in, so nothing was opened, let alone reserved.
    assert!(!db.path().exists());
}

#[test]
fn a_trigger_aborting_the_outbox_insert_rolls_back_the_whole_reservation() {
    let db = Db::fresh();
    let mut engine = db.engine();
    db.raw()
        .execute_batch("CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox BEGIN SELECT RAISE(ABORT, 'injected'); END;")
        .unwrap();
    let err = engine.dispatch_at(&case(), &crate::id("worker-1"), None).unwrap_err();
    assert_eq!(err.code(), "STORE_ERROR");
    assert!(!err.to_string().contains("injected"), "{err}");
    assert_eq!(
        (db.count("operations"), db.count("outbox"), db.count("call_identities")),
        (0, 0, 0)
    );

    // With the trigger gone, the same case goes through from scratch.
    db.raw().execute_batch("DROP TRIGGER fail_outbox").unwrap();
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OK");
}

#[test]
fn a_trigger_aborting_the_delivered_update_rolls_back_finalize() {
    let db = Db::fresh();
    let mut engine = db.engine();
    db.raw()
        .execute_batch(
            "CREATE TRIGGER fail_delivered BEFORE UPDATE OF state ON outbox WHEN NEW.state = 'delivered' \
             BEGIN SELECT RAISE(ABORT, 'injected'); END;",
        )
        .unwrap();
    // Commit A succeeded in this call, so the failed commit C is not an error
    // ("nothing happened") but OUTCOME_UNKNOWN with the operation's ref.
    let answer = engine.dispatch_at(&case(), &crate::id("worker-1"), None).unwrap();
    assert_eq!(answer.code(), "OUTCOME_UNKNOWN");
    assert_eq!(answer.package()["status_ref"], json!(db.text("SELECT status_ref FROM operations")));
    // Commit B happened (the side effect may have); commit C did not, in any part.
    assert_eq!(db.state(), ("processing".to_owned(), "processing".to_owned(), 1, 1, 0));

    // The receipt is evidence: once the fault is gone, a status query reconciles it.
    db.raw().execute_batch("DROP TRIGGER fail_delivered").unwrap();
    let answer = engine.status_of(&case(), &db.text("SELECT status_ref FROM operations")).unwrap();
    assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("receipt_reconciled"));
    assert_eq!(db.state(), ("succeeded".to_owned(), "delivered".to_owned(), 1, 1, 1));
}

#[test]
fn an_orphan_downstream_receipt_is_an_audit_finding_named_by_opaque_ref_only() {
    let db = Db::fresh();
    let mut engine = db.engine();
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OK");
    let stand_in = StandIn::new(SqliteStore::open(db.path()).unwrap());
    let orphan = stand_in
        .execute(
            &DownstreamRequest {
                downstream_request_ref: toolledger_contract::DownstreamRequestRef::new(&format!("dr_{}", "0".repeat(32))).unwrap(),
                request_sha256: Sha256Hex::new(&"1".repeat(64)).unwrap(),
                tool_name: "refund_order".to_owned(),
                output_revision: "refund_order.output.v2".to_owned(),
                arguments: json!({"order_id": "ord-secret-77", "amount_minor": 1, "currency": "USD", "reason": "damaged"}),
            },
            at(1_767_225_600),
        )
        .unwrap();
    let audit = audit_sqlite(db.path()).unwrap();
    assert_eq!(audit.code(), "AUDIT_FAILED");
    let package = audit.package();
    assert_eq!(package["checks"]["downstream_receipts_have_operation"], json!(false));
    assert_eq!(
        package["findings"],
        json!([{"check": "downstream_receipts_have_operation", "ref": orphan.receipt_ref.as_str()}])
    );
    let text = package.to_string();
    for secret in ["ord-secret-77", "ord-1001", "tenant-a", "user-1", db.path().to_str().unwrap()] {
        assert!(!text.contains(secret), "the audit names {secret}");
    }
}
