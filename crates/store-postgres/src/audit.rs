//! The PostgreSQL audit: one `REPEATABLE READ READ ONLY` transaction, so every check and
//! every count comes from the same snapshot. The invariants and their SQL are the
//! backend-neutral ones of [`toolledger_store::audit`]; in front of them come the
//! server's health checks: `synchronous_commit` on for the store's sessions, `fsync`
//! on, and the schema object for object.
//!
//! A statement that fails inside a PostgreSQL transaction ends it, so every check runs
//! in its own savepoint: one that cannot run (a table dropped by hand) is a finding of
//! that check, and the rest still run on the same snapshot.

use tokio_postgres::{IsolationLevel, Row};
use toolledger_store::{
    OPERATION_COLUMNS, OPERATION_FROM,
    audit::{
        DOWNSTREAM_ROWS, Findings, LISTINGS, RESOLVED_BY_OPERATOR, RawDownstream,
        STAND_IN_LISTINGS, TABLES, UNRECONCILED, report,
    },
};

use crate::{
    AuditReport, STAND_IN_NAME, STAND_IN_REVISION, StoreError,
    error::is_lost,
    pg::raw_operation,
    schema,
    session::{Conn, Db, Params, Transaction, get},
};

/// PostgreSQL's health checks, reported before the invariants.
pub const HEALTH: [&str; 3] = ["synchronous_commit_on", "fsync_on", "schema_matches"];

/// The checks, in the order they are reported: [`HEALTH`], then the invariants.
pub const CHECKS: [&str; 16] = toolledger_store::audit::checks(HEALTH);

type Tx<'d, 't> = Db<'d, Transaction<'t>>;

/// Runs `check` in its own savepoint: `None` when it failed (the snapshot goes on), an
/// error only when nothing more can be read (the connection lost, a lock past the bound).
fn guarded<T>(
    db: &mut Tx<'_, '_>,
    check: impl FnOnce(&mut Tx<'_, '_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    match db.savepoint(|db| check(db).map(|value| (value, true))) {
        Ok(value) => Ok(Some(value)),
        Err(err) if is_lost(&err) || err == StoreError::Busy => Err(err),
        Err(_) => Ok(None),
    }
}

/// Column 0 of every row of `sql`.
fn strings(
    db: &mut Tx<'_, '_>,
    sql: &str,
    params: &Params<'_>,
) -> Result<Vec<Option<String>>, StoreError> {
    db.query(sql, params)?.iter().map(|row| get(row, 0)).collect()
}

/// Hands each row of `sql` to `each`, streamed as the server sends them (the whole
/// listing never held in memory), in one exchange bounded by the audit's bound.
fn each_row(db: &mut Tx<'_, '_>, sql: &str, each: impl FnMut(&Row)) -> Result<(), StoreError> {
    db.c.stream(sql, each)
}

/// A server setting, as the session sees it.
fn setting(db: &mut Tx<'_, '_>, name: &str) -> Result<Option<String>, StoreError> {
    db.value("SELECT current_setting($1)", &[&name])
}

/// The longest one of the audit's exchanges may take: its listings scan whole tables
/// (a 1M-operation ledger's take seconds each), so they get far longer than a lock wait,
/// but still a bound: a server that stopped answering ends the audit with `STORE_BUSY`.
const AUDIT_ANSWER_BOUND: std::time::Duration = std::time::Duration::from_secs(600);

pub(crate) fn run(conn: &mut Conn) -> Result<AuditReport, StoreError> {
    let bound = conn.client.bound();
    conn.client.set_bound(bound.max(AUDIT_ANSWER_BOUND));
    let report = audit(conn);
    conn.client.set_bound(bound);
    report
}

fn audit(conn: &mut Conn) -> Result<AuditReport, StoreError> {
    let Conn { client, cache } = conn;
    let mut tx = client.begin(IsolationLevel::RepeatableRead, true)?;
    let db = &mut Db::new(&mut tx, cache);
    let mut findings = Findings::default();

    // Counts first: this read starts the snapshot every later check shares.
    let mut counts = Vec::new();
    for table in TABLES {
        let sql = format!("SELECT count(*) FROM {table}");
        let count = guarded(db, |db| db.value::<i64>(&sql, &[]))?.flatten();
        counts.push((table, count));
    }

    if guarded(db, |db| setting(db, "synchronous_commit"))?.flatten().as_deref() != Some("on") {
        findings.add("synchronous_commit_on", None);
    }
    if guarded(db, |db| setting(db, "fsync"))?.flatten().as_deref() != Some("on") {
        findings.add("fsync_on", None);
    }
    // Every table, column, index, constraint and trigger, and the schema id: a dropped
    // CHECK, an added index or a disabled trigger is a finding (and every other command
    // refuses the store).
    #[allow(
        clippy::redundant_closure,
        reason = "the closure is general over the savepoint's lifetime"
    )]
    let matches = guarded(db, |db| schema::matches(db))?;
    if matches != Some(true) {
        findings.add("schema_matches", None);
    }

    let sql = format!("SELECT {OPERATION_COLUMNS} {OPERATION_FROM} ORDER BY o.id");
    let passed = guarded(db, |db| {
        each_row(db, &sql, |row| {
            findings.operation_row(row.try_get::<_, String>(4).ok(), raw_operation(row));
        })
    })?;
    if passed.is_none() {
        findings.add("rows_decode", None);
    }
    let passed = guarded(db, |db| {
        each_row(db, DOWNSTREAM_ROWS, |row| {
            findings.downstream_row(row.try_get::<_, String>(2).ok(), raw_downstream(row));
        })
    })?;
    if passed.is_none() {
        findings.add("rows_decode", None);
    }
    for (check, sql) in LISTINGS {
        let listed = guarded(db, |db| strings(db, sql, &[]))?;
        findings.refs(check, listed.ok_or(()));
    }
    for (check, sql) in STAND_IN_LISTINGS {
        let listed = guarded(db, |db| strings(db, sql, &[&STAND_IN_NAME, &STAND_IN_REVISION]))?;
        findings.refs(check, listed.ok_or(()));
    }
    let unreconciled = guarded(db, |db| strings(db, UNRECONCILED, &[]))?
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect();
    let resolved = guarded(db, |db| strings(db, RESOLVED_BY_OPERATOR, &[]))?
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect();
    // Nothing was written; ending the read transaction cannot lose anything.
    tx.rollback()?;
    Ok(report(&CHECKS, findings, counts, unreconciled, resolved))
}

fn raw_downstream(row: &Row) -> Result<RawDownstream, postgres::Error> {
    Ok(RawDownstream {
        dr_ref: row.try_get(0)?,
        request: row.try_get(1)?,
        receipt_ref: row.try_get(2)?,
        receipt_json: row.try_get(3)?,
        local_ref: row.try_get(4)?,
        local_json: row.try_get(5)?,
    })
}
