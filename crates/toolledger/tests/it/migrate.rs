//! Migrations on real stores written by earlier versions (`fixtures/v1-store.sqlite3`
//! and `fixtures/v2-store.sqlite3`, each with an operation in every state its version
//! can leave behind): refused until migrated, then upgraded with a backup first, every
//! row and digest kept, the audit passing, every operation still answerable.

use std::sync::{Arc, Mutex};

use serde_json::json;
use toolledger::{
    BlockCode, Call, DownstreamIdentity, ErrorCode, Ledger, Migrated, ModelCall, NoRoles, Outcome,
    RefundOrder, StatusRef, Waits,
};

use crate::{
    TempDir, blocked, dump, int, text,
    tickets::{TicketService, Tickets, open_ticket},
    workspace,
};

fn stand_in() -> DownstreamIdentity {
    DownstreamIdentity::new("toolledger-stand-in", "1").unwrap()
}

/// A refund of a paid order of 2599 USD by `user-1` of `tenant-a`, as the fixtures'
/// cases are: the order and the model's response id are what differ between them.
fn paid_refund(key: &str, order_id: &str, response_id: &str) -> Call {
    Call::new(
        "refund_order",
        json!({"order_id": order_id, "amount_minor": 2599, "currency": "USD", "reason": "damaged"}),
    )
    .principal("tenant-a", "user-1")
    .idempotency_key(key)
    .model_call(ModelCall::new(
        "openai",
        "responses",
        "openai-responses-2026-05",
        response_id,
        &format!("call-{key}"),
    ))
    .context(json!({"orders": [{"order_id": order_id, "tenant_id": "tenant-a",
        "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}))
}

/// The v1 fixture's case for one of its keys (it was written from the PASS case with
/// the key, call id and operation id changed).
fn v1_call(key: &str) -> Call {
    paid_refund(key, "ord-1001", "resp-001").operation_id(&format!("op-{key}")).at(1_767_225_700)
}

/// The rows whose bytes must survive the migration: every digest and ref, the JSON.
const KEPT: [&str; 5] = [
    "SELECT group_concat(status_ref || request_sha256 || downstream_request_ref || ifnull(approval_sha256, '-') || arguments_json || status, '|') FROM (SELECT * FROM operations ORDER BY id)",
    "SELECT group_concat(op_id || state || attempt_count, '|') FROM (SELECT * FROM outbox ORDER BY op_id)",
    "SELECT group_concat(receipt_ref || receipt_json, '|') FROM (SELECT * FROM downstream_receipts ORDER BY rowid)",
    "SELECT group_concat(receipt_ref || output_json || result_sha256, '|') FROM (SELECT * FROM local_receipts ORDER BY op_id)",
    "SELECT group_concat(provider_call_id || purpose || op_id, '|') FROM (SELECT * FROM call_identities ORDER BY id)",
];

#[test]
fn a_v1_store_is_refused_then_migrated_with_everything_kept() {
    let dir = TempDir::new("migrate");
    let path = dir.join("ledger.sqlite3");
    std::fs::copy(workspace("fixtures/v1-store.sqlite3"), &path).unwrap();
    let original = std::fs::read(&path).unwrap();
    let kept: Vec<String> = KEPT.iter().map(|sql| text(&path, sql)).collect();
    assert_eq!(int(&path, "SELECT count(*) FROM operations"), 5);

    // Every command refuses it, naming `migrate`, and leaves it as it was.
    let refused =
        Ledger::builder(&path).tool(RefundOrder::default().tool()).open_simulated(NoRoles);
    let err = refused.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaUnsupported);
    assert!(err.to_string().contains("toolledger migrate"), "{err}");
    assert_eq!(toolledger::audit(&path).unwrap_err().code(), ErrorCode::SchemaUnsupported);
    assert_eq!(std::fs::read(&path).unwrap(), original);

    let Migrated::Upgraded { from, to, backup: Some(backup), operations } =
        toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap()
    else {
        panic!("not upgraded")
    };
    assert_eq!((from, to, operations), (1, 6, 5));
    // The backup is the v1 store, beside it.
    assert_eq!(backup.parent(), path.parent());
    assert_eq!(int(&backup, "PRAGMA user_version"), 1);
    assert_eq!(dump(&backup), dump(&workspace("fixtures/v1-store.sqlite3")));

    // Every row and every digest kept; the downstream recorded; the step logged.
    let after: Vec<String> = KEPT.iter().map(|sql| text(&path, sql)).collect();
    assert_eq!(after, kept);
    assert_eq!(int(&path, "PRAGMA user_version"), 6);
    assert_eq!(text(&path, "PRAGMA journal_mode"), "wal");
    assert_eq!(
        int(
            &path,
            "SELECT count(*) FROM operations WHERE downstream_name = 'toolledger-stand-in' AND downstream_revision = '1'"
        ),
        5
    );
    // Each step of the chain is recorded.
    assert_eq!(
        text(
            &path,
            "SELECT group_concat(from_schema || '>' || to_schema, ' ') FROM (SELECT * FROM migrations ORDER BY version)"
        ),
        "toolledger-store-v1>toolledger-store-v2 toolledger-store-v2>toolledger-store-v3 toolledger-store-v3>toolledger-store-v4 toolledger-store-v4>toolledger-store-v5 toolledger-store-v5>toolledger-store-v6"
    );
    let audit = toolledger::audit(&path).unwrap();
    assert!(audit.passed(), "{}", audit.package());

    // Every v1 operation is answerable under v3.
    refunds_answer(&path, v1_call, "v1");
    assert!(toolledger::audit(&path).unwrap().passed());

    // Migrating again is a no-op.
    assert_eq!(
        toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap(),
        Migrated::Current
    );
}

/// The refunds a fixture left behind, answered after the migration: `{prefix}-fresh`
/// replays, `{prefix}-unknown` reconciles through a status query, `{prefix}-pending` is
/// worked to the end.
fn refunds_answer(path: &std::path::Path, call: fn(&str) -> Call, prefix: &str) {
    let ledger =
        Ledger::builder(path).tool(RefundOrder::default().tool()).open_simulated(NoRoles).unwrap();
    let key = |state: &str| format!("{prefix}-{state}");
    assert!(matches!(
        ledger.dispatch(&call(&key("fresh"))).unwrap().outcome(),
        Outcome::Replayed(_)
    ));
    let unknown = ledger.dispatch(&call(&key("unknown"))).unwrap();
    let Outcome::Unknown { status_ref } = unknown.outcome().clone() else { panic!("{unknown:?}") };
    assert!(matches!(
        ledger.status(&call(&key("unknown")), &status_ref).unwrap().outcome(),
        Outcome::Reconciled(_)
    ));
    let pending = ledger.dispatch(&call(&key("pending"))).unwrap();
    let pending_ref: StatusRef = pending.status_ref().unwrap().clone();
    assert!(ledger.process(&pending_ref, &call(&key("pending"))).unwrap().outcome().is_done());
}

#[test]
fn a_v1_store_changed_by_hand_is_not_migrated() {
    let dir = TempDir::new("migrate-bad");
    let path = dir.join("ledger.sqlite3");
    std::fs::copy(workspace("fixtures/v1-store.sqlite3"), &path).unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TRIGGER extra AFTER INSERT ON outbox BEGIN SELECT 1; END;")
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaUnsupported);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let backups = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(backups, 1, "a refused migration made a backup");
}

/// The v2 fixture's calls (it was written by version 2 through the engine's flows:
/// refunds through the simulation, tickets through the example's ticket service).
fn v2_refund(key: &str) -> Call {
    paid_refund(key, "ord-1", "resp-1").at(1_767_225_600)
}

fn v2_ticket(key: &str, queue: &str) -> Call {
    Call::new("open_ticket", json!({"queue": queue, "summary": "v2", "priority": "low"}))
        .principal("acme", "user-7")
        .idempotency_key(key)
        .model_call(ModelCall::new(
            "openai",
            "responses",
            "openai-responses-2026-05",
            "resp-1",
            &format!("call-{key}"),
        ))
        .at(1_767_225_600)
}

#[test]
fn a_v2_store_is_migrated_with_every_state_kept_and_due() {
    let dir = TempDir::new("migrate-v2");
    let path = dir.join("ledger.sqlite3");
    std::fs::copy(workspace("fixtures/v2-store.sqlite3"), &path).unwrap();
    let kept: Vec<String> = KEPT.iter().map(|sql| text(&path, sql)).collect();
    let states = "SELECT group_concat(o.idempotency_key || ':' || o.status || ':' || x.state, ' ') \
        FROM (SELECT * FROM operations ORDER BY id) o JOIN outbox x ON x.op_id = o.id";
    let before_states = text(&path, states);
    assert_eq!(int(&path, "PRAGMA user_version"), 2);
    let err = toolledger::audit(&path).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaUnsupported);

    let Migrated::Upgraded { from, to, backup: Some(backup), operations } =
        toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap()
    else {
        panic!("not upgraded")
    };
    assert_eq!((from, to, operations), (2, 6, 8));
    assert_eq!(dump(&backup), dump(&workspace("fixtures/v2-store.sqlite3")));
    assert_eq!(KEPT.iter().map(|sql| text(&path, sql)).collect::<Vec<_>>(), kept);
    assert_eq!(text(&path, states), before_states);
    // Each downstream stays its own: v2 already recorded them.
    assert_eq!(
        text(
            &path,
            "SELECT group_concat(n, ' ') FROM (SELECT downstream_name || '=' || count(*) AS n \
             FROM operations GROUP BY downstream_name ORDER BY downstream_name)"
        ),
        "acme-tickets=4 toolledger-stand-in=4"
    );
    // Every event is due: at its lease end while processing, at its last change otherwise.
    assert_eq!(
        int(
            &path,
            "SELECT count(*) FROM outbox WHERE next_attempt_at = \
             CASE state WHEN 'processing' THEN lease_until ELSE updated_at END"
        ),
        8
    );
    assert_eq!(
        text(
            &path,
            "SELECT from_schema || '>' || to_schema FROM migrations ORDER BY version DESC LIMIT 1"
        ),
        "toolledger-store-v5>toolledger-store-v6"
    );
    // The one quarantined receipt is the audit's only finding, as it was under v2.
    let audit = toolledger::audit(&path).unwrap();
    let findings = audit.package()["findings"].clone();
    assert_eq!(findings.as_array().unwrap().len(), 1, "{findings}");
    assert_eq!(findings[0]["check"], "operations_quarantined");

    // Every refund is answerable under v3.
    refunds_answer(&path, v2_refund, "v2");

    // Every ticket too, through the host's downstream; terminal ones stay terminal.
    let service = Arc::new(Mutex::new(TicketService::default()));
    let tickets = Ledger::builder(&path)
        .tool(open_ticket())
        .open(Tickets::new(Arc::clone(&service)), NoRoles)
        .unwrap();
    assert!(matches!(
        tickets.dispatch(&v2_ticket("v2-ticket", "acme-it")).unwrap().outcome(),
        Outcome::Replayed(_)
    ));
    assert_eq!(
        blocked(tickets.dispatch(&v2_ticket("v2-failed", "acme-old")).unwrap().outcome()),
        BlockCode::DownstreamRefused
    );
    assert_eq!(
        blocked(tickets.dispatch(&v2_ticket("v2-quarantined", "acme-it")).unwrap().outcome()),
        BlockCode::ReceiptQuarantined
    );
    let unsent = tickets.dispatch(&v2_ticket("v2-unsent", "acme-it")).unwrap();
    let unsent_ref: StatusRef = unsent.status_ref().unwrap().clone();
    let worked = tickets.process(&unsent_ref, &v2_ticket("v2-unsent", "acme-it")).unwrap();
    assert!(matches!(worked.outcome(), Outcome::Fresh(_)), "{worked:?}");
    assert_eq!(service.lock().unwrap().tickets.len(), 1);
    assert_eq!(int(&path, "SELECT count(*) FROM operations WHERE status = 'succeeded'"), 5);
}

/// `migrate`'s backup is a file it creates itself: a symlink under a backup name, dangling
/// or not, is never followed (before: the copy was written to the link's target), and
/// neither an empty file a killed migrate left nor a name taken in the same second stops
/// the next one.
#[test]
fn the_backup_never_follows_a_symlink_and_a_killed_migrate_leaves_no_obstacle() {
    let dir = TempDir::new("migrate-backup");
    let path = dir.join("ledger.sqlite3");
    std::fs::copy(workspace("fixtures/v1-store.sqlite3"), &path).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    // Every name the backup could take in the next seconds is a dangling symlink.
    let target = dir.join("elsewhere");
    for second in now..now + 10 {
        std::os::unix::fs::symlink(
            target.join(second.to_string()),
            dir.join(&format!("ledger.sqlite3.v1-backup-{second}")),
        )
        .unwrap();
    }
    // What a migrate killed before its copy began leaves: an empty backup-named file.
    let leftover = dir.join(&format!("ledger.sqlite3.v1-backup-{}", now - 1));
    std::fs::write(&leftover, b"").unwrap();

    let Migrated::Upgraded { backup: Some(backup), .. } =
        toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap()
    else {
        panic!("not upgraded")
    };
    let name = backup.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-2"), "{name}");
    assert!(std::fs::symlink_metadata(&backup).unwrap().file_type().is_file());
    assert_eq!(dump(&backup), dump(&workspace("fixtures/v1-store.sqlite3")));
    // Nothing was written through a link, and the leftover is gone.
    assert!(!target.exists());
    assert!(!leftover.exists());
    for second in now..now + 10 {
        let link = dir.join(&format!("ledger.sqlite3.v1-backup-{second}"));
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    }
    assert!(toolledger::audit(&path).unwrap().passed());
}

/// One of `fixtures/v3-store.sqlite3`'s refunds, as the code before tool definitions
/// (commit `33e2ec5`) accepted it.
fn v3_refund(n: u32) -> Call {
    let order = format!("ord-300{n}");
    Call::new(
        "refund_order",
        json!({"order_id": order, "amount_minor": 2599, "currency": "USD", "reason": "damaged"}),
    )
    .principal("tenant-a", "user-1")
    .idempotency_key(&format!("v3-refund-{n}"))
    .model_call(ModelCall::new(
        "openai",
        "responses",
        "openai-responses-2026-05",
        "resp-v3",
        &format!("call-v3-{n}"),
    ))
    .context(json!({"orders": [{"order_id": order, "tenant_id": "tenant-a",
        "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}))
    .approval(
        toolledger::Grant {
            approval_id: format!("appr-v3-{n}"),
            approver_id: "approver-1".to_owned(),
            approved_at: 1_767_225_500,
            expires_at: 1_767_229_100,
        },
        &["approver-1"],
    )
    .at(1_767_225_600)
}

/// A v3 store written before `refund_order` became a definition replays, reconciles,
/// works and audits unchanged through the definition: the same digests, byte for byte.
#[test]
fn a_v3_store_written_before_tool_definitions_answers_unchanged_through_the_definition() {
    let dir = TempDir::new("v3-definitions");
    let path = dir.join("ledger.sqlite3");
    std::fs::copy(workspace("fixtures/v3-store.sqlite3"), &path).unwrap();
    let kept: Vec<String> = KEPT.iter().map(|sql| text(&path, sql)).collect();
    // v3 is refused until migrated; the steps to v4, v5 and v6 only widen checks and add
    // the replay records and trace contexts (none for what came before), every row kept.
    assert_eq!(toolledger::audit(&path).unwrap_err().code(), ErrorCode::SchemaUnsupported);
    let Migrated::Upgraded { from: 3, to: 6, operations: 4.., .. } =
        toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap()
    else {
        panic!("not upgraded from v3")
    };
    assert_eq!(KEPT.iter().map(|sql| text(&path, sql)).collect::<Vec<_>>(), kept);
    let audit = toolledger::audit(&path).unwrap();
    assert!(audit.passed(), "{}", audit.package());
    assert_eq!(audit.package()["unreconciled_downstream_receipts"].as_array().unwrap().len(), 1);
    let stored = |key: &str, column: &str, table: &str| {
        text(
            &path,
            &format!(
                "SELECT t.{column} FROM {table} t JOIN operations o ON o.id = t.op_id \
                 WHERE o.idempotency_key = '{key}'"
            ),
        )
    };
    let result_1 = stored("v3-refund-1", "result_sha256", "local_receipts");
    let request_1 =
        text(&path, "SELECT request_sha256 FROM operations WHERE idempotency_key = 'v3-refund-1'");

    let tool = RefundOrder::default().tool();
    assert!(matches!(tool.input, toolledger::Schema::Json { .. }), "through the definition");
    let ledger = Ledger::builder(&path).tool(tool).open_simulated(NoRoles).unwrap();
    // Succeeded: replayed, the same digests.
    let replayed = ledger.dispatch(&v3_refund(1)).unwrap();
    let Outcome::Replayed(receipt) = replayed.outcome() else { panic!("{replayed:?}") };
    assert_eq!((receipt.result_sha256(), receipt.request_sha256()), (&*result_1, &*request_1));
    // Unknown with the simulation's receipt: reconciled by the status query.
    let lost = v3_refund(2);
    let lost_ref = ledger.dispatch(&lost).unwrap().status_ref().unwrap().clone();
    let reconciled = ledger.status(&lost, &lost_ref).unwrap();
    assert!(matches!(reconciled.outcome(), Outcome::Reconciled(_)), "{reconciled:?}");
    // Accepted and never worked: worked now.
    let queued = v3_refund(3);
    let queued_ref = ledger.dispatch(&queued).unwrap().status_ref().unwrap().clone();
    assert!(matches!(ledger.process(&queued_ref, &queued).unwrap().outcome(), Outcome::Fresh(_)));
    // Claimed, then the worker vanished: unknown until its lease ends, then worked.
    let claimed = v3_refund(4);
    let claimed_ref = ledger.dispatch(&claimed).unwrap().status_ref().unwrap().clone();
    let asked = ledger.status(&claimed, &claimed_ref).unwrap();
    assert!(matches!(asked.outcome(), Outcome::Unknown { .. }), "{asked:?}");
    let later = claimed.clone().at(1_767_225_700);
    assert!(matches!(ledger.process(&claimed_ref, &later).unwrap().outcome(), Outcome::Fresh(_)));
    drop(ledger);
    // The first refund's rows are byte for byte what the old code wrote.
    let now: Vec<String> = KEPT.iter().map(|sql| text(&path, sql)).collect();
    for (before, after) in kept.iter().zip(&now) {
        let first = before.split('|').next().unwrap();
        assert!(after.contains(first), "{first} kept");
    }
    let audit = toolledger::audit(&path).unwrap();
    assert!(audit.passed(), "{}", audit.package());
    assert_eq!(audit.package()["unreconciled_downstream_receipts"], json!([]));
    assert_eq!(int(&path, "SELECT count(*) FROM operations WHERE status = 'succeeded'"), 4);
}

/// A v4 store (here a new store taken back to version 4: its trace contexts, its replay
/// records, their triggers and its id removed) is refused until migrated; the step to
/// v5 adds the
/// replay records' table and triggers, byte for byte a new store's, and writes no
/// record: an operation that finished before replays through its own rows, unchanged,
/// and one that finishes after gets its record.
#[test]
fn a_v4_store_is_migrated_and_what_finished_before_replays_without_a_record() {
    let dir = TempDir::new("v4-replays");
    let path = dir.join("ledger.sqlite3");
    let open = || {
        Ledger::builder(&path).tool(RefundOrder::default().tool()).open_simulated(NoRoles).unwrap()
    };
    let first = open().dispatch(&v3_refund(1)).unwrap();
    assert!(first.outcome().is_done(), "{first:?}");
    let from_record = open().dispatch(&v3_refund(1)).unwrap();
    assert!(matches!(from_record.outcome(), Outcome::Replayed(_)), "{from_record:?}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let triggers: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'trigger' AND name LIKE 'replays_%'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(triggers.len(), 9);
    for trigger in triggers {
        conn.execute_batch(&format!("DROP TRIGGER {trigger}")).unwrap();
    }
    conn.execute_batch(
        "DROP TABLE trace_contexts; DROP TABLE replays; \
         UPDATE meta SET value = 'toolledger-store-v4' WHERE key = 'schema_id'; \
         PRAGMA user_version = 4;",
    )
    .unwrap();
    drop(conn);
    assert_eq!(toolledger::audit(&path).unwrap_err().code(), ErrorCode::SchemaUnsupported);
    let Migrated::Upgraded { from: 4, to: 6, operations: 1, .. } =
        toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap()
    else {
        panic!("not upgraded from v4")
    };
    assert_eq!(int(&path, "SELECT count(*) FROM replays"), 0);
    let ledger = open();
    let again = ledger.dispatch(&v3_refund(1)).unwrap();
    assert!(matches!(again.outcome(), Outcome::Replayed(_)), "{again:?}");
    assert_eq!(again.package(), from_record.package());
    assert!(ledger.dispatch(&v3_refund(2)).unwrap().outcome().is_done());
    assert_eq!(int(&path, "SELECT count(*) FROM replays"), 1);
    let audit = toolledger::audit(&path).unwrap();
    assert!(audit.passed(), "{}", audit.package());
}

/// A v5 store (a new store taken back to version 5: its trace contexts' table and its id
/// removed) is refused until migrated; the step to v6 adds the table, byte for byte a
/// new store's, and what was accepted before has no trace context: it replays unchanged.
#[test]
fn a_v5_store_is_migrated_and_its_operations_keep_answering() {
    let dir = TempDir::new("v5-traces");
    let path = dir.join("ledger.sqlite3");
    let open = || {
        Ledger::builder(&path).tool(RefundOrder::default().tool()).open_simulated(NoRoles).unwrap()
    };
    let first = open().dispatch(&v3_refund(1)).unwrap();
    assert!(first.outcome().is_done(), "{first:?}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP TABLE trace_contexts; \
         UPDATE meta SET value = 'toolledger-store-v5' WHERE key = 'schema_id'; \
         PRAGMA user_version = 5;",
    )
    .unwrap();
    drop(conn);
    assert_eq!(toolledger::audit(&path).unwrap_err().code(), ErrorCode::SchemaUnsupported);
    let Migrated::Upgraded { from: 5, to: 6, operations: 1, .. } =
        toolledger::migrate(&path, &stand_in(), Waits::default()).unwrap()
    else {
        panic!("not upgraded from v5")
    };
    assert_eq!(int(&path, "SELECT count(*) FROM trace_contexts"), 0);
    let again = open().dispatch(&v3_refund(1)).unwrap();
    assert!(matches!(again.outcome(), Outcome::Replayed(_)), "{again:?}");
    let audit = toolledger::audit(&path).unwrap();
    assert!(audit.passed(), "{}", audit.package());
}
