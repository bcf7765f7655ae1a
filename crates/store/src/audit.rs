//! The audit (SPEC §6): one explicit read transaction, so every check and every count
//! comes from the same snapshot. Findings name rows by `sr_`/`rc_` ref only, never by
//! tenant, subject or argument values.

use rusqlite::{Connection, TransactionBehavior};

use crate::{
    AuditFinding, AuditReport, StoreError,
    error::sqlite,
    sqlite::{OPERATION_COLUMNS, OPERATION_FROM, raw_operation},
    verify::{self, Flaw},
};

/// The checks, in the order they are reported.
pub const CHECKS: [&str; 9] = [
    "integrity_check",
    "foreign_key_check",
    "journal_mode_wal",
    "synchronous_full",
    "outbox_one_per_operation",
    "succeeded_iff_local_receipt_iff_delivered",
    "json_canonical",
    "digests_recompute",
    "downstream_receipts_have_operation",
];

/// The tables counted, in the order they are reported.
pub const TABLES: [&str; 6] =
    ["meta", "operations", "outbox", "downstream_receipts", "local_receipts", "call_identities"];

fn strings(tx: &Connection, sql: &str) -> Result<Vec<String>, StoreError> {
    let mut statement = tx.prepare(sql).map_err(sqlite)?;
    let rows = statement.query_map([], |row| row.get::<_, String>(0)).map_err(sqlite)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(sqlite)
}

pub(crate) fn run(conn: &mut Connection) -> Result<AuditReport, StoreError> {
    // The connection was opened by the store's own opener, so this reads the
    // synchronous level every store connection gets.
    let synchronous: i64 =
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).map_err(sqlite)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(sqlite)?;
    let mut findings = Vec::new();
    let mut failed = |check: &'static str, reference: Option<String>| {
        findings.push(AuditFinding { check, reference });
    };

    // Counts first: this read starts the snapshot every later check shares.
    let mut counts = Vec::new();
    for table in TABLES {
        let count: i64 = tx
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0))
            .map_err(sqlite)?;
        counts.push((table, count));
    }

    let integrity = strings(&tx, "PRAGMA integrity_check")?;
    if integrity != ["ok"] {
        failed("integrity_check", None);
    }
    let foreign_keys: i64 = tx
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| row.get(0))
        .map_err(sqlite)?;
    if foreign_keys != 0 {
        failed("foreign_key_check", None);
    }
    let mode: String = tx.query_row("PRAGMA journal_mode", [], |row| row.get(0)).map_err(sqlite)?;
    if !mode.eq_ignore_ascii_case("wal") {
        failed("journal_mode_wal", None);
    }
    if synchronous != 2 {
        failed("synchronous_full", None);
    }
    for status_ref in strings(
        &tx,
        "SELECT o.status_ref FROM operations o LEFT JOIN outbox b ON b.op_id = o.id WHERE b.op_id IS NULL ORDER BY o.id",
    )? {
        failed("outbox_one_per_operation", Some(status_ref));
    }
    for status_ref in strings(
        &tx,
        "SELECT o.status_ref FROM operations o JOIN outbox b ON b.op_id = o.id \
         LEFT JOIN local_receipts l ON l.op_id = o.id \
         WHERE (o.status = 'succeeded') <> (l.op_id IS NOT NULL) OR (o.status = 'succeeded') <> (b.state = 'delivered') \
         ORDER BY o.id",
    )? {
        failed("succeeded_iff_local_receipt_iff_delivered", Some(status_ref));
    }

    // Every operation re-verified as a read would, its local receipt with it.
    let sql = format!("SELECT {OPERATION_COLUMNS} {OPERATION_FROM} ORDER BY o.id");
    let mut statement = tx.prepare(&sql).map_err(sqlite)?;
    let mut rows = statement.query([]).map_err(sqlite)?;
    while let Some(row) = rows.next().map_err(sqlite)? {
        let raw = raw_operation(row).map_err(sqlite)?;
        let status_ref = raw.status_ref.clone();
        match verify::operation(raw) {
            Ok(_) => {}
            Err(Flaw::NotCanonical(_)) => failed("json_canonical", Some(status_ref)),
            Err(Flaw::Contradiction(_)) => failed("digests_recompute", Some(status_ref)),
        }
    }
    drop(rows);
    drop(statement);

    // Downstream receipts: one byte-identical to its operation's local receipt was
    // verified with it; every other one is verified on its own.
    let mut statement = tx
        .prepare(
            "SELECT d.downstream_request_ref, d.request_sha256, d.receipt_ref, d.receipt_json, \
             l.receipt_ref, l.receipt_json FROM downstream_receipts d \
             LEFT JOIN local_receipts l ON l.downstream_request_ref = d.downstream_request_ref ORDER BY d.rowid",
        )
        .map_err(sqlite)?;
    let mut rows = statement.query([]).map_err(sqlite)?;
    while let Some(row) = rows.next().map_err(sqlite)? {
        let (dr_ref, request, receipt_ref, receipt_json): (String, String, String, String) = (
            row.get(0).map_err(sqlite)?,
            row.get(1).map_err(sqlite)?,
            row.get(2).map_err(sqlite)?,
            row.get(3).map_err(sqlite)?,
        );
        let local: (Option<String>, Option<String>) =
            (row.get(4).map_err(sqlite)?, row.get(5).map_err(sqlite)?);
        if local.0.as_deref() == Some(receipt_ref.as_str())
            && local.1.as_deref() == Some(receipt_json.as_str())
        {
            continue;
        }
        match verify::downstream(dr_ref, &request, receipt_ref.clone(), &receipt_json) {
            Ok(_) => {}
            Err(Flaw::NotCanonical(_)) => failed("json_canonical", Some(receipt_ref)),
            Err(Flaw::Contradiction(_)) => failed("digests_recompute", Some(receipt_ref)),
        }
    }
    drop(rows);
    drop(statement);

    for receipt_ref in strings(
        &tx,
        "SELECT d.receipt_ref FROM downstream_receipts d LEFT JOIN operations o \
         ON o.downstream_request_ref = d.downstream_request_ref WHERE o.id IS NULL ORDER BY d.rowid",
    )? {
        failed("downstream_receipts_have_operation", Some(receipt_ref));
    }
    for receipt_ref in strings(
        &tx,
        "SELECT d.receipt_ref FROM downstream_receipts d JOIN operations o \
         ON o.downstream_request_ref = d.downstream_request_ref WHERE d.request_sha256 <> o.request_sha256 ORDER BY d.rowid",
    )? {
        failed("digests_recompute", Some(receipt_ref));
    }
    let unreconciled = strings(
        &tx,
        "SELECT d.receipt_ref FROM downstream_receipts d JOIN operations o \
         ON o.downstream_request_ref = d.downstream_request_ref WHERE o.status <> 'succeeded' ORDER BY d.rowid",
    )?;
    tx.commit().map_err(sqlite)?;

    let checks = CHECKS
        .iter()
        .map(|check| (*check, !findings.iter().any(|finding| finding.check == *check)))
        .collect();
    Ok(AuditReport { checks, counts, unreconciled_downstream_receipts: unreconciled, findings })
}
