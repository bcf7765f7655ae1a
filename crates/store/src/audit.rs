//! The audit's backend-neutral half: the invariants every store must hold, the
//! standard SQL that lists the rows breaking them, and the row checks shared with every
//! read. A backend runs these statements inside one read snapshot of its own, adds its
//! health checks (`integrity_check` for SQLite, the server's settings for PostgreSQL)
//! in front, and builds the report with [`report`].
//!
//! Findings name rows by `sr_`/`rc_` ref only, never by tenant, subject or argument
//! values. The audit reports; it does not abort: a check that cannot run is itself a
//! finding of that check, and every other check still runs on what can be read.

pub use crate::ledger::REPLAYS_DIFFER;
use crate::{
    AuditFinding, AuditReport,
    verify::{self, Flaw, RawOperation},
};

/// The invariants, in the order they are reported (after the backend's health checks).
pub const INVARIANTS: [&str; 13] = [
    "rows_decode",
    "outbox_one_per_operation",
    "succeeded_iff_local_receipt_iff_delivered",
    "states_in_step",
    "json_canonical",
    "digests_recompute",
    "call_identities_bound",
    "downstream_receipts_have_operation",
    "local_receipts_have_downstream_receipt",
    "finished_by_accepted_downstream",
    "operations_quarantined",
    "tombstones_retired",
    "replay_records_match",
];

/// A backend's checks in the order they are reported: its own health checks, then
/// [`INVARIANTS`]. `N` is `H` plus the invariants' count; another `N` fails the build.
#[allow(
    clippy::indexing_slicing,
    reason = "evaluated at compile time: an index out of bounds fails the build"
)]
pub const fn checks<const H: usize, const N: usize>(
    health: [&'static str; H],
) -> [&'static str; N] {
    assert!(
        N == H + INVARIANTS.len(),
        "a backend's checks are its health checks and the invariants"
    );
    let mut all = [""; N];
    let mut at = 0;
    while at < N {
        all[at] = if at < H { health[at] } else { INVARIANTS[at - H] };
        at += 1;
    }
    all
}

/// The tables counted, in the order they are reported.
pub const TABLES: [&str; 13] = [
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

/// Operations without their outbox event.
pub const WITHOUT_OUTBOX: &str = "SELECT o.status_ref FROM operations o LEFT JOIN outbox b ON b.op_id = o.id \
     WHERE b.op_id IS NULL ORDER BY o.id";

/// Operations whose status, local receipt and event disagree on success.
pub const SUCCESS_OUT_OF_STEP: &str = "SELECT o.status_ref FROM operations o JOIN outbox b ON b.op_id = o.id \
     LEFT JOIN local_receipts l ON l.op_id = o.id \
     WHERE (o.status = 'succeeded') <> (l.op_id IS NOT NULL) OR (o.status = 'succeeded') <> (b.state = 'delivered') \
     ORDER BY o.id";

/// Operations whose dispatch call identity is missing, doubled, or does not name the
/// operation's own first call.
pub const UNBOUND_OPERATIONS: &str = "SELECT o.status_ref FROM operations o WHERE \
     (SELECT count(*) FROM call_identities c WHERE c.op_id = o.id AND c.purpose = 'dispatch') <> 1 \
     OR NOT EXISTS (SELECT 1 FROM call_identities c WHERE c.op_id = o.id AND c.purpose = 'dispatch' \
     AND c.provider = o.provider AND c.api_family = o.api_family AND c.adapter_revision = o.adapter_revision \
     AND c.provider_response_id = o.provider_response_id AND c.provider_call_id = o.provider_call_id) \
     ORDER BY o.id";

/// Call identities of no operation, or of a purpose outside the domain.
pub const UNBOUND_CALLS: &str = "SELECT o.status_ref FROM call_identities c LEFT JOIN operations o ON o.id = c.op_id \
     WHERE o.id IS NULL OR c.purpose NOT IN ('dispatch', 'query_status') ORDER BY c.id";

/// Downstream receipts of no operation.
pub const RECEIPTS_WITHOUT_OPERATION: &str = "SELECT d.receipt_ref FROM downstream_receipts d LEFT JOIN operations o \
     ON o.downstream_request_ref = d.downstream_request_ref WHERE o.id IS NULL ORDER BY d.receipt_ref";

/// Downstream receipts whose request digest is not their operation's.
pub const RECEIPT_DIGESTS_DIFFER: &str = "SELECT d.receipt_ref FROM downstream_receipts d JOIN operations o \
     ON o.downstream_request_ref = d.downstream_request_ref WHERE d.request_sha256 <> o.request_sha256 \
     ORDER BY d.receipt_ref";

/// Local receipts whose downstream receipt is gone or differs: the evidence a
/// succeeded operation rests on. The table is the stand-in's own storage, so an
/// operation of another downstream is held to it only when a receipt is there. `$1`,
/// `$2`: the stand-in's name and revision.
pub const RECEIPTS_WITHOUT_EVIDENCE: &str = "SELECT o.status_ref FROM local_receipts l JOIN operations o ON o.id = l.op_id \
     LEFT JOIN downstream_receipts d ON d.downstream_request_ref = l.downstream_request_ref \
     WHERE (d.downstream_request_ref IS NULL AND o.downstream_name = $1 AND o.downstream_revision = $2) \
     OR d.receipt_ref <> l.receipt_ref OR d.receipt_json <> l.receipt_json \
     ORDER BY o.id";

/// Operations finished by a downstream other than the one they were accepted for, as far
/// as the ledger can tell: one of another downstream whose request the simulation
/// performed (its receipt is in the simulation's own table), and a succeeded one of the
/// simulation with no receipt of the simulation's (another downstream answered it).
/// `$1`, `$2`: the stand-in's name and revision.
pub const FINISHED_BY_ANOTHER: &str = "SELECT o.status_ref FROM operations o JOIN downstream_receipts d \
     ON d.downstream_request_ref = o.downstream_request_ref \
     WHERE NOT (o.downstream_name = $1 AND o.downstream_revision = $2) \
     UNION ALL SELECT o.status_ref FROM operations o JOIN local_receipts l ON l.op_id = o.id \
     LEFT JOIN downstream_receipts d ON d.downstream_request_ref = o.downstream_request_ref \
     WHERE o.downstream_name = $1 AND o.downstream_revision = $2 AND d.downstream_request_ref IS NULL \
     ORDER BY 1";

/// Quarantined operations: each needs a person.
pub const QUARANTINED: &str =
    "SELECT status_ref FROM operations WHERE status = 'quarantined' ORDER BY id";

/// Tombstones whose scope holds an operation again: retention must have removed it.
pub const RESURRECTED: &str = "SELECT t.status_ref FROM tombstones t JOIN operations o \
     ON o.status_ref = t.status_ref ORDER BY t.status_ref";

/// Downstream receipts whose operation has not succeeded yet.
pub const UNRECONCILED: &str = "SELECT d.receipt_ref FROM downstream_receipts d JOIN operations o \
     ON o.downstream_request_ref = d.downstream_request_ref WHERE o.status IN ('pending', 'processing') \
     ORDER BY d.receipt_ref";

/// The operations an operator settled by hand, in the order they were.
pub const RESOLVED_BY_OPERATOR: &str =
    "SELECT status_ref FROM operator_log WHERE action = 'resolve' ORDER BY id";

/// Every downstream receipt with its local receipt's copy, for [`Findings::downstream_row`]:
/// columns `downstream_request_ref, request_sha256, receipt_ref, receipt_json`, then the
/// local receipt's `receipt_ref, receipt_json` (NULL when there is none).
pub const DOWNSTREAM_ROWS: &str = "SELECT d.downstream_request_ref, d.request_sha256, d.receipt_ref, d.receipt_json, \
     l.receipt_ref, l.receipt_json FROM downstream_receipts d \
     LEFT JOIN local_receipts l ON l.downstream_request_ref = d.downstream_request_ref ORDER BY d.receipt_ref";

/// The listing checks: each statement's rows are refs that break the check. Every
/// statement is standard SQL, run as is by every backend (and those of
/// [`STAND_IN_LISTINGS`] with the stand-in's name and revision).
pub const LISTINGS: [(&str, &str); 9] = [
    ("outbox_one_per_operation", WITHOUT_OUTBOX),
    ("succeeded_iff_local_receipt_iff_delivered", SUCCESS_OUT_OF_STEP),
    ("call_identities_bound", UNBOUND_OPERATIONS),
    ("call_identities_bound", UNBOUND_CALLS),
    ("downstream_receipts_have_operation", RECEIPTS_WITHOUT_OPERATION),
    ("digests_recompute", RECEIPT_DIGESTS_DIFFER),
    ("operations_quarantined", QUARANTINED),
    ("tombstones_retired", RESURRECTED),
    ("replay_records_match", REPLAYS_DIFFER),
];

/// The listing checks that take the stand-in's name and revision as `$1` and `$2`.
pub const STAND_IN_LISTINGS: [(&str, &str); 2] = [
    ("local_receipts_have_downstream_receipt", RECEIPTS_WITHOUT_EVIDENCE),
    ("finished_by_accepted_downstream", FINISHED_BY_ANOTHER),
];

/// A downstream receipt row and, when there is one, its local receipt's copy: a row of
/// [`DOWNSTREAM_ROWS`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "each field is the column of the same position")]
pub struct RawDownstream {
    pub dr_ref: String,
    pub request: String,
    pub receipt_ref: String,
    pub receipt_json: String,
    pub local_ref: Option<String>,
    pub local_json: Option<String>,
}

/// What the audit found, in the order found.
#[derive(Debug, Default)]
pub struct Findings(Vec<AuditFinding>);

impl Findings {
    /// `check` failed, for the row `reference` (or as a whole).
    pub fn add(&mut self, check: &'static str, reference: Option<String>) {
        self.0.push(AuditFinding { check, reference });
    }

    /// A check that lists failing refs: each ref is a finding, and a listing that could
    /// not run is one finding without a ref.
    pub fn refs<E>(&mut self, check: &'static str, listed: Result<Vec<Option<String>>, E>) {
        match listed {
            Ok(references) => {
                for reference in references {
                    self.add(check, reference);
                }
            }
            Err(_) => self.add(check, None),
        }
    }

    /// One operation row, re-verified as a read would: a row that could not be decoded
    /// is `rows_decode`, by its ref when that column still reads.
    pub fn operation_row<E>(&mut self, status_ref: Option<String>, raw: Result<RawOperation, E>) {
        let Ok(raw) = raw else {
            self.add("rows_decode", status_ref);
            return;
        };
        match verify::operation(raw) {
            Ok(_) => {}
            Err(Flaw::NotCanonical(_)) => self.add("json_canonical", status_ref),
            Err(Flaw::Contradiction(_)) => self.add("digests_recompute", status_ref),
            Err(Flaw::OutOfStep(_)) => self.add("states_in_step", status_ref),
        }
    }

    /// One downstream receipt: one byte-identical to its operation's local receipt was
    /// verified with it; every other one is verified on its own.
    pub fn downstream_row<E>(
        &mut self,
        receipt_ref: Option<String>,
        raw: Result<RawDownstream, E>,
    ) {
        let Ok(row) = raw else {
            self.add("rows_decode", receipt_ref);
            return;
        };
        if row.local_ref.as_deref() == Some(row.receipt_ref.as_str())
            && row.local_json.as_deref() == Some(row.receipt_json.as_str())
        {
            return;
        }
        match verify::downstream(&row.dr_ref, &row.request, row.receipt_ref, &row.receipt_json) {
            Ok(_) => {}
            Err(Flaw::NotCanonical(_)) => self.add("json_canonical", receipt_ref),
            Err(Flaw::Contradiction(_) | Flaw::OutOfStep(_)) => {
                self.add("digests_recompute", receipt_ref);
            }
        }
    }

    /// Whether nothing was found yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The report: `checks` (the backend's health checks, then [`INVARIANTS`]) each passed
/// unless a finding names it.
pub fn report(
    checks: &[&'static str],
    findings: Findings,
    counts: Vec<(&'static str, Option<i64>)>,
    unreconciled: Vec<String>,
    resolved: Vec<String>,
) -> AuditReport {
    let findings = findings.0;
    let checks = checks
        .iter()
        .map(|check| (*check, !findings.iter().any(|finding| finding.check == *check)))
        .collect();
    AuditReport {
        checks,
        counts,
        unreconciled_downstream_receipts: unreconciled,
        resolved_by_operator: resolved,
        findings,
    }
}
