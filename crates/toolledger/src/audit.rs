//! The audit of a ledger, rendered as the package the command line prints.

use serde_json::{Map, Value, json};
use toolledger_contract::BlockCode;
use toolledger_store::{AuditReport, LedgerStore, Waits};
use toolledger_store_sqlite::SqliteStore;

use crate::{Error, Location};

/// The audit of one read snapshot: every check, the counts, what needs attention.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("audit-type");
/// # ledger.dispatch(&call)?;
/// let audit = toolledger::audit(&dir.join("ledger.sqlite3"))?;
/// for (check, passed) in &audit.report().checks {
///     assert!(passed, "{check}");
/// }
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Audit {
    report: AuditReport,
}

/// Audits the ledger at `location` without creating or changing anything.
///
/// # Errors
///
/// An [`Error`] when there is no store at `location` to audit (missing, not a database,
/// another schema) or a lock outlasts the default wait. A damaged store is an [`Audit`] that did
/// not pass, never an error.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("audit");
/// ledger.dispatch(&call)?;
/// let audit = toolledger::audit(&dir.join("ledger.sqlite3"))?;
/// assert!(audit.passed(), "{}", audit.package());
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn audit(location: impl Into<Location>) -> Result<Audit, Error> {
    audit_with(location, Waits::default())
}

/// [`audit`] with a bound on waiting for other connections' locks.
///
/// # Errors
///
/// As [`audit`].
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("audit-with");
/// # ledger.dispatch(&call)?;
/// let waits = toolledger::Waits::total(std::time::Duration::from_secs(1));
/// assert!(toolledger::audit_with(&dir.join("ledger.sqlite3"), waits)?.passed());
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn audit_with(location: impl Into<Location>, waits: Waits) -> Result<Audit, Error> {
    let report = match location.into() {
        // A damaged file is audited as far as it can be read, never refused.
        Location::Sqlite(path) => SqliteStore::audit_path(&path, waits)?,
        Location::Postgres(url) => {
            toolledger_store_postgres::PgStore::connect_for_audit(&url, waits)
                .map_err(Error::from)?
                .audit()?
        }
    };
    Ok(Audit { report })
}

impl Audit {
    /// Whether every check passed.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("audit-passed");
    /// # ledger.dispatch(&call)?;
    /// assert!(toolledger::audit(&dir.join("ledger.sqlite3"))?.passed());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn passed(&self) -> bool {
        self.report.passed()
    }

    /// The report: checks, counts, findings by opaque ref.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("audit-report");
    /// # ledger.dispatch(&call)?;
    /// let audit = toolledger::audit(&dir.join("ledger.sqlite3"))?;
    /// assert!(audit.report().findings.is_empty());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn report(&self) -> &AuditReport {
        &self.report
    }

    /// The audit package: PASS with `checks`, `counts`, the unreconciled receipts and
    /// the operations an operator resolved by hand, or BLOCK `AUDIT_FAILED` with the
    /// same plus `findings`.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("audit-package");
    /// # ledger.dispatch(&call)?;
    /// let audit = toolledger::audit(&dir.join("ledger.sqlite3"))?;
    /// assert_eq!(audit.package()["gate"], "PASS");
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn package(&self) -> Value {
        let report = &self.report;
        let checks: Map<String, Value> = report
            .checks
            .iter()
            .map(|(name, passed)| ((*name).to_owned(), json!(passed)))
            .collect();
        let counts: Map<String, Value> = report
            .counts
            .iter()
            .map(|(table, count)| ((*table).to_owned(), json!(count)))
            .collect();
        if report.passed() {
            return json!({
                "gate": "PASS",
                "code": "OK",
                "checks": checks,
                "counts": counts,
                "unreconciled_downstream_receipts": report.unreconciled_downstream_receipts,
                "resolved_by_operator": report.resolved_by_operator,
            });
        }
        let findings: Vec<Value> = report
            .findings
            .iter()
            .map(|finding| json!({"check": finding.check, "ref": finding.reference}))
            .collect();
        json!({
            "gate": "BLOCK",
            "code": BlockCode::AuditFailed.as_str(),
            "status": null,
            "status_ref": null,
            "message": BlockCode::AuditFailed.message(),
            "checks": checks,
            "counts": counts,
            "unreconciled_downstream_receipts": report.unreconciled_downstream_receipts,
            "resolved_by_operator": report.resolved_by_operator,
            "findings": findings,
        })
    }
}
