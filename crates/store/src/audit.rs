//! The audit: one explicit read transaction, so every check and every count comes from
//! the same snapshot. Findings name rows by `sr_`/`rc_` ref only, never by tenant,
//! subject or argument values.
//!
//! The audit reports; it does not abort. A check that cannot run (a missing table, an
//! unreadable page) is itself a finding of that check, and every other check still
//! runs on what can be read.

use rusqlite::{Connection, TransactionBehavior};

use crate::{
    AuditFinding, AuditReport, STAND_IN_NAME, STAND_IN_REVISION, StoreError,
    error::sqlite,
    schema::{expected_schema, schema_rows},
    sqlite::{OPERATION_COLUMNS, OPERATION_FROM, raw_operation},
    verify::{self, Flaw},
};

/// The checks, in the order they are reported.
pub const CHECKS: [&str; 16] = [
    "integrity_check",
    "foreign_key_check",
    "journal_mode_wal",
    "synchronous_full",
    "schema_matches",
    "rows_decode",
    "outbox_one_per_operation",
    "succeeded_iff_local_receipt_iff_delivered",
    "states_in_step",
    "json_canonical",
    "digests_recompute",
    "call_identities_bound",
    "downstream_receipts_have_operation",
    "local_receipts_have_downstream_receipt",
    "operations_quarantined",
    "tombstones_retired",
];

/// The tables counted, in the order they are reported.
pub const TABLES: [&str; 11] = [
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
];

/// Operations whose dispatch call identity is missing, doubled, or does not name the
/// operation's own first call.
const UNBOUND_OPERATIONS: &str = "SELECT o.status_ref FROM operations o WHERE \
     (SELECT count(*) FROM call_identities c WHERE c.op_id = o.id AND c.purpose = 'dispatch') <> 1 \
     OR NOT EXISTS (SELECT 1 FROM call_identities c WHERE c.op_id = o.id AND c.purpose = 'dispatch' \
     AND c.provider = o.provider AND c.api_family = o.api_family AND c.adapter_revision = o.adapter_revision \
     AND c.provider_response_id = o.provider_response_id AND c.provider_call_id = o.provider_call_id) \
     ORDER BY o.id";

/// Call identities of no operation, or of a purpose outside the domain.
const UNBOUND_CALLS: &str = "SELECT o.status_ref FROM call_identities c LEFT JOIN operations o ON o.id = c.op_id \
     WHERE o.id IS NULL OR c.purpose NOT IN ('dispatch', 'query_status') ORDER BY c.id";

/// Local receipts whose downstream receipt is gone or differs: the evidence a
/// succeeded operation rests on. The table is the stand-in's own storage, so an
/// operation of another downstream is held to it only when a receipt is there.
const RECEIPTS_WITHOUT_EVIDENCE: &str = "SELECT o.status_ref FROM local_receipts l JOIN operations o ON o.id = l.op_id \
     LEFT JOIN downstream_receipts d ON d.downstream_request_ref = l.downstream_request_ref \
     WHERE (d.downstream_request_ref IS NULL AND o.downstream_name = ?1 AND o.downstream_revision = ?2) \
     OR d.receipt_ref <> l.receipt_ref OR d.receipt_json <> l.receipt_json \
     ORDER BY o.id";

/// Tombstones whose scope holds an operation again: retention must have removed it.
const RESURRECTED: &str = "SELECT t.status_ref FROM tombstones t JOIN operations o \
     ON o.status_ref = t.status_ref ORDER BY t.status_ref";

/// Quarantined operations: each needs a person.
const QUARANTINED: &str =
    "SELECT status_ref FROM operations WHERE status = 'quarantined' ORDER BY id";

/// Collects findings; a check that could not run at all is a finding without a ref.
#[derive(Default)]
struct Findings(Vec<AuditFinding>);

impl Findings {
    fn add(&mut self, check: &'static str, reference: Option<String>) {
        self.0.push(AuditFinding { check, reference });
    }

    /// Runs a check that lists failing refs; an error is a finding of the check.
    fn refs(&mut self, check: &'static str, listed: Result<Vec<Option<String>>, StoreError>) {
        match listed {
            Ok(references) => {
                for reference in references {
                    self.add(check, reference);
                }
            }
            Err(_) => self.add(check, None),
        }
    }
}

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
    let findings = vec![AuditFinding { check: "integrity_check", reference: None }];
    report(findings, TABLES.iter().map(|table| (*table, None)).collect(), Vec::new())
}

fn report(
    findings: Vec<AuditFinding>,
    counts: Vec<(&'static str, Option<i64>)>,
    unreconciled: Vec<String>,
) -> AuditReport {
    let checks = CHECKS
        .iter()
        .map(|check| (*check, !findings.iter().any(|finding| finding.check == *check)))
        .collect();
    AuditReport { checks, counts, unreconciled_downstream_receipts: unreconciled, findings }
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
    findings.refs(
        "outbox_one_per_operation",
        strings(
            &tx,
            "SELECT o.status_ref FROM operations o LEFT JOIN outbox b ON b.op_id = o.id WHERE b.op_id IS NULL ORDER BY o.id",
        ),
    );
    findings.refs(
        "succeeded_iff_local_receipt_iff_delivered",
        strings(
            &tx,
            "SELECT o.status_ref FROM operations o JOIN outbox b ON b.op_id = o.id \
             LEFT JOIN local_receipts l ON l.op_id = o.id \
             WHERE (o.status = 'succeeded') <> (l.op_id IS NOT NULL) OR (o.status = 'succeeded') <> (b.state = 'delivered') \
             ORDER BY o.id",
        ),
    );

    operations(&tx, &mut findings);
    downstream_receipts(&tx, &mut findings);

    findings.refs("call_identities_bound", strings(&tx, UNBOUND_OPERATIONS));
    findings.refs("call_identities_bound", strings(&tx, UNBOUND_CALLS));
    findings.refs(
        "downstream_receipts_have_operation",
        strings(
            &tx,
            "SELECT d.receipt_ref FROM downstream_receipts d LEFT JOIN operations o \
             ON o.downstream_request_ref = d.downstream_request_ref WHERE o.id IS NULL ORDER BY d.rowid",
        ),
    );
    findings.refs(
        "digests_recompute",
        strings(
            &tx,
            "SELECT d.receipt_ref FROM downstream_receipts d JOIN operations o \
             ON o.downstream_request_ref = d.downstream_request_ref WHERE d.request_sha256 <> o.request_sha256 ORDER BY d.rowid",
        ),
    );
    findings.refs(
        "local_receipts_have_downstream_receipt",
        strings_with(&tx, RECEIPTS_WITHOUT_EVIDENCE, &[&STAND_IN_NAME, &STAND_IN_REVISION]),
    );
    findings.refs("operations_quarantined", strings(&tx, QUARANTINED));
    findings.refs("tombstones_retired", strings(&tx, RESURRECTED));
    let unreconciled = strings(
        &tx,
        "SELECT d.receipt_ref FROM downstream_receipts d JOIN operations o \
         ON o.downstream_request_ref = d.downstream_request_ref WHERE o.status IN ('pending', 'processing') ORDER BY d.rowid",
    )
    .unwrap_or_default()
    .into_iter()
    .flatten()
    .collect();
    // Nothing was written; ending the read transaction cannot lose anything.
    drop(tx);
    Ok(report(findings.0, counts, unreconciled))
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
        let status_ref = row.get::<_, String>(4).ok();
        let Ok(raw) = raw_operation(row) else {
            findings.add("rows_decode", status_ref);
            return;
        };
        match verify::operation(raw) {
            Ok(_) => {}
            Err(Flaw::NotCanonical(_)) => findings.add("json_canonical", status_ref),
            Err(Flaw::Contradiction(_)) => findings.add("digests_recompute", status_ref),
            Err(Flaw::OutOfStep(_)) => findings.add("states_in_step", status_ref),
        }
    });
}

/// A downstream receipt row and, when there is one, its local receipt's copy.
struct RawDownstream {
    dr_ref: String,
    request: String,
    receipt_ref_text: String,
    receipt_json: String,
    local_ref: Option<String>,
    local_json: Option<String>,
}

fn raw_downstream(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawDownstream> {
    Ok(RawDownstream {
        dr_ref: row.get(0)?,
        request: row.get(1)?,
        receipt_ref_text: row.get(2)?,
        receipt_json: row.get(3)?,
        local_ref: row.get(4)?,
        local_json: row.get(5)?,
    })
}

/// Downstream receipts: one byte-identical to its operation's local receipt was
/// verified with it; every other one is verified on its own.
fn downstream_receipts(tx: &Connection, findings: &mut Findings) {
    let sql = "SELECT d.downstream_request_ref, d.request_sha256, d.receipt_ref, d.receipt_json, \
         l.receipt_ref, l.receipt_json FROM downstream_receipts d \
         LEFT JOIN local_receipts l ON l.downstream_request_ref = d.downstream_request_ref ORDER BY d.rowid";
    each_row(tx, sql, findings, |row, findings| {
        let receipt_ref = row.get::<_, String>(2).ok();
        let Ok(receipt) = raw_downstream(row) else {
            findings.add("rows_decode", receipt_ref);
            return;
        };
        let RawDownstream {
            dr_ref,
            request,
            receipt_ref_text,
            receipt_json,
            local_ref,
            local_json,
        } = receipt;
        if local_ref.as_deref() == Some(receipt_ref_text.as_str())
            && local_json.as_deref() == Some(receipt_json.as_str())
        {
            return;
        }
        match verify::downstream(dr_ref, &request, receipt_ref_text, &receipt_json) {
            Ok(_) => {}
            Err(Flaw::NotCanonical(_)) => findings.add("json_canonical", receipt_ref),
            Err(Flaw::Contradiction(_) | Flaw::OutOfStep(_)) => {
                findings.add("digests_recompute", receipt_ref);
            }
        }
    });
}
