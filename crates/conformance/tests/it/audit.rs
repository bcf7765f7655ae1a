//! The audit reports; it does not abort. A damaged file (a dropped table, an undecodable
//! row, a corrupt page) is `AUDIT_FAILED` with findings, never an error; and the blind
//! spots are closed: refs that no longer recompute, call identities, a succeeded
//! operation whose downstream receipt is gone, the schema itself.

use crate::{
    Audited, audit_sqlite, open_sqlite,
    suite::audit::{failed, has, store_after},
};
use serde_json::{Value, json};
use toolledger_contract::Registry;

use crate::{Db, Roles, StoreUnderTest, TempDir, case, dispatch};

fn audited(db: &Db) -> Audited {
    failed(db)
}

#[test]
fn a_missing_table_is_a_finding_and_other_commands_refuse_the_schema() {
    let db = store_after::<Db>("DROP TABLE call_identities");
    let answer = audited(&db);
    has(&answer, "schema_matches");
    // What can still be read is still counted.
    assert_eq!(answer.package()["counts"]["operations"], json!(1));
    let err = open_sqlite(db.path(), Roles::default(), Registry::builtin()).unwrap_err();
    assert_eq!(err.code(), "SCHEMA_UNSUPPORTED");
}

#[test]
fn an_undecodable_row_is_a_finding_named_by_its_ref() {
    let db = store_after::<Db>("UPDATE operations SET provider = CAST(x'ff' AS TEXT)");
    let answer = audited(&db);
    has(&answer, "rows_decode");
    let status_ref = db.text("SELECT status_ref FROM operations");
    assert!(
        answer.package()["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|finding| finding["ref"] == json!(status_ref)),
        "{}",
        answer.package()
    );
}

#[test]
fn a_corrupt_page_is_an_integrity_finding_not_an_error() {
    let db = store_after::<Db>("");
    let root: i64 = db.int("SELECT rootpage FROM sqlite_schema WHERE name = 'call_identities_op'");
    let page_size = db.int("PRAGMA page_size");
    db.raw().execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let mut bytes = std::fs::read(db.path()).unwrap();
    let start = usize::try_from((root - 1) * page_size).unwrap();
    for byte in &mut bytes[start..start + usize::try_from(page_size).unwrap()] {
        *byte = 0xA5;
    }
    std::fs::write(db.path(), bytes).unwrap();
    let answer = audited(&db);
    has(&answer, "integrity_check");
}

#[test]
fn the_schema_itself_is_compared_with_the_expected_ddl() {
    for sql in [
        "CREATE TRIGGER eat_receipts AFTER INSERT ON local_receipts BEGIN DELETE FROM downstream_receipts; END;",
        "CREATE INDEX extra ON operations (created_at)",
        "PRAGMA writable_schema = ON; \
         UPDATE sqlite_schema SET sql = replace(sql, 'CHECK (attempt_count >= 0)', '') WHERE name = 'outbox'; \
         PRAGMA writable_schema = OFF;",
    ] {
        let db = store_after::<Db>(sql);
        let answer = audited(&db);
        has(&answer, "schema_matches");
        let err = open_sqlite(db.path(), Roles::default(), Registry::builtin()).unwrap_err();
        assert_eq!(err.code(), "SCHEMA_UNSUPPORTED", "{sql}");
    }
}

/// A file carrying the schema id but only a `meta` table is not a store: nothing may
/// switch its journal mode or write to it, whichever command meets it.
#[test]
fn a_file_with_only_a_meta_table_is_never_modified() {
    let dir = TempDir::new("test");
    let path = dir.path().join("meta-only.sqlite3");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT; \
         INSERT INTO meta VALUES ('schema_id', 'toolledger-store-v6'); PRAGMA user_version = 6;",
    )
    .unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    let err = open_sqlite(&path, Roles::default(), Registry::builtin()).unwrap_err();
    assert_eq!(err.code(), "SCHEMA_UNSUPPORTED");
    assert_eq!(std::fs::read(&path).unwrap(), before, "open changed the file");
    let answer = audit_sqlite(&path).unwrap();
    assert_eq!(answer.code(), "AUDIT_FAILED");
    assert_eq!(answer.package()["checks"]["schema_matches"], Value::Bool(false));
    assert_eq!(std::fs::read(&path).unwrap(), before, "audit changed the file");
    assert!(!path.with_extension("sqlite3-wal").exists());
}

/// `load_finished` writes finished operations through the commit points' own
/// statements: a ledger loaded from another one's operations audits clean and replays
/// them; loading one twice is refused as a whole and writes nothing.
#[test]
fn loaded_operations_verify_replay_and_are_never_loaded_twice() {
    use toolledger_store::{CallIdentity, LedgerStore};
    use toolledger_store_sqlite::SqliteStore;
    let source = Db::fresh();
    let mut engine = source.engine();
    assert_eq!(dispatch(&mut engine, &case(), None).code(), "OK");
    drop(engine);
    let mut reader = SqliteStore::open(source.path()).unwrap();
    let status_ref =
        toolledger_contract::StatusRef::new(&source.text("SELECT status_ref FROM operations"))
            .unwrap();
    let operation = reader.operation_by_status_ref(&status_ref).unwrap().unwrap();
    let call = CallIdentity {
        profile: operation.intent.profile.clone(),
        provider_response_id: operation.intent.provider_response_id.clone(),
        provider_call_id: operation.intent.provider_call_id.clone(),
    };
    let finished = vec![(operation.intent.clone(), call, operation.receipt.clone().unwrap())];

    let loaded = Db::fresh();
    let mut store = SqliteStore::open(loaded.path()).unwrap();
    let now = toolledger_contract::UnixSeconds::new(operation.created_at).unwrap();
    assert_eq!(store.load_finished(&finished, now).unwrap(), 1);
    assert_eq!(audit_sqlite(loaded.path()).unwrap().code(), "OK");
    let replay = dispatch(&mut loaded.engine(), &case(), None);
    assert_eq!(replay.delivery().unwrap().as_str(), "local_replay", "{}", replay.package());
    assert_eq!(replay.package()["status_ref"], status_ref.as_str());

    let twice = [finished.clone(), finished].concat();
    let refused = Db::fresh();
    let mut store = SqliteStore::open(refused.path()).unwrap();
    assert_eq!(
        store.load_finished(&twice, now).unwrap_err().code().as_str(),
        "STORE_CONTRACT_VIOLATION"
    );
    assert_eq!((refused.count("operations"), refused.count("downstream_receipts")), (0, 0));
}
