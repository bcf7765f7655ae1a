//! The SQLite audit: one explicit read transaction, so every check and every count
//! comes from the same snapshot. The invariants and their SQL are the backend-neutral
//! ones of [`toolledger_store::audit`]; in front of them come SQLite's own health
//! checks: `integrity_check`, `foreign_key_check`, WAL, `synchronous=FULL`, and the
//! schema byte for byte.

use rusqlite::{Connection, TransactionBehavior};
use toolledger_store::{
    OPERATION_COLUMNS, OPERATION_FROM,
    audit::{
        DOWNSTREAM_ROWS, Findings, LISTINGS, RESOLVED_BY_OPERATOR, RawDownstream,
        STAND_IN_LISTINGS, TABLES, UNRECONCILED, report,
    },
};

use crate::{
    AuditReport, STAND_IN_NAME, STAND_IN_REVISION, StoreError,
    error::sqlite,
    schema::{expected_schema, schema_rows},
    sqlite::raw_operation,
};

/// SQLite's health checks, reported before the invariants.
pub const HEALTH: [&str; 5] = [
    "integrity_check",
    "foreign_key_check",
    "journal_mode_wal",
    "synchronous_full",
    "schema_matches",
];

/// The checks, in the order they are reported: [`HEALTH`], then the invariants.
pub const CHECKS: [&str; 18] = toolledger_store::audit::checks(HEALTH);

fn strings(tx: &Connection, sql: &str) -> Result<Vec<Option<String>>, StoreError> {
    strings_with(tx, sql, &[])
}

fn strings_with(
    tx: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<Vec<Option<String>>, StoreError> {
    let mut statement = tx.prepare(sql).map_err(sqlite)?;
    let rows =
        statement.query_map(params, |row| row.get::<_, Option<String>>(0)).map_err(sqlite)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(sqlite)
}

/// The report for a file SQLite finds corrupt before a snapshot can even start: every
/// check that needs the file is failed, nothing is counted.
pub(crate) fn corrupt() -> AuditReport {
    let mut findings = Findings::default();
    findings.add("integrity_check", None);
    report(
        &CHECKS,
        findings,
        TABLES.iter().map(|table| (*table, None)).collect(),
        Vec::new(),
        Vec::new(),
    )
}

pub(crate) fn run(conn: &mut Connection) -> Result<AuditReport, StoreError> {
    // The connection was opened by the store's own opener, so this reads the
    // synchronous level every store connection gets.
    let synchronous: i64 =
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).map_err(sqlite)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(sqlite)?;
    let mut findings = Findings::default();

    // Counts first: this read starts the snapshot every later check shares. A busy
    // file is an answer of its own (nothing could be read), not a finding.
    let mut counts = Vec::new();
    for table in TABLES {
        match tx.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0)) {
            Ok(count) => counts.push((table, Some(count))),
            Err(err) => match sqlite(err) {
                StoreError::Busy => return Err(StoreError::Busy),
                _ => counts.push((table, None)),
            },
        }
    }

    match strings(&tx, "PRAGMA integrity_check") {
        Ok(lines) if lines == [Some("ok".to_owned())] => {}
        _ => findings.add("integrity_check", None),
    }
    match tx
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| row.get::<_, i64>(0))
    {
        Ok(0) => {}
        _ => findings.add("foreign_key_check", None),
    }
    match tx.query_row("PRAGMA journal_mode", [], |row| row.get::<_, String>(0)) {
        Ok(mode) if mode.eq_ignore_ascii_case("wal") => {}
        _ => findings.add("journal_mode_wal", None),
    }
    if synchronous != 2 {
        findings.add("synchronous_full", None);
    }
    // Every table, index and trigger, byte for byte: an added trigger, a dropped CHECK
    // or a missing table is a finding (and every other command refuses the file).
    match schema_rows(&tx) {
        Ok(rows) if rows == expected_schema() => {}
        _ => findings.add("schema_matches", None),
    }
    operations(&tx, &mut findings);
    downstream_receipts(&tx, &mut findings);
    for (check, sql) in LISTINGS {
        findings.refs(check, strings(&tx, sql));
    }

    for (check, sql) in STAND_IN_LISTINGS {
        findings.refs(check, strings_with(&tx, sql, &[&STAND_IN_NAME, &STAND_IN_REVISION]));
    }
    let unreconciled =
        strings(&tx, UNRECONCILED).unwrap_or_default().into_iter().flatten().collect();
    let resolved =
        strings(&tx, RESOLVED_BY_OPERATOR).unwrap_or_default().into_iter().flatten().collect();
    // Nothing was written; ending the read transaction cannot lose anything.
    drop(tx);
    Ok(report(&CHECKS, findings, counts, unreconciled, resolved))
}

/// Hands each row of `sql` to `each`. A statement that cannot run, or a page that
/// cannot be read, is a `rows_decode` finding and ends the pass.
fn each_row(
    tx: &Connection,
    sql: &str,
    findings: &mut Findings,
    mut each: impl FnMut(&rusqlite::Row<'_>, &mut Findings),
) {
    let Ok(mut statement) = tx.prepare(sql) else {
        findings.add("rows_decode", None);
        return;
    };
    let Ok(mut rows) = statement.query([]) else {
        findings.add("rows_decode", None);
        return;
    };
    loop {
        match rows.next() {
            Ok(Some(row)) => each(row, findings),
            Ok(None) => break,
            Err(_) => {
                findings.add("rows_decode", None);
                break;
            }
        }
    }
}

/// Every operation re-verified as a read would, its outbox event and local receipt
/// with it. A row that cannot even be decoded is `rows_decode`, by its ref when that
/// column still reads.
fn operations(tx: &Connection, findings: &mut Findings) {
    let sql = format!("SELECT {OPERATION_COLUMNS} {OPERATION_FROM} ORDER BY o.id");
    each_row(tx, &sql, findings, |row, findings| {
        findings.operation_row(row.get::<_, String>(4).ok(), raw_operation(row));
    });
}

fn raw_downstream(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawDownstream> {
    Ok(RawDownstream {
        dr_ref: row.get(0)?,
        request: row.get(1)?,
        receipt_ref: row.get(2)?,
        receipt_json: row.get(3)?,
        local_ref: row.get(4)?,
        local_json: row.get(5)?,
    })
}

/// Downstream receipts, each verified unless it is its local receipt's byte-identical copy.
fn downstream_receipts(tx: &Connection, findings: &mut Findings) {
    each_row(tx, DOWNSTREAM_ROWS, findings, |row, findings| {
        findings.downstream_row(row.get::<_, String>(2).ok(), raw_downstream(row));
    });
}
