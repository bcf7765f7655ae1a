//! The one integration-test binary of the engine with its stores: a test matrix, one
//! module per row (idempotency, crash recovery, rechecks, races, tampering, schema, audit,
//! v2 compatibility). The conformance suite (`suite!` below) runs on every backend; the
//! other modules prove the flows and the embedded store on real SQLite files.

mod audit;
mod faults;
mod groupcommit;
mod idempotency;
mod rechecks;
mod schema;
mod simulation;
mod suite;
mod tampering;
mod v2;

use std::path::{Path, PathBuf};

use serde_json::Value;
use toolledger_contract::{
    Clock, HostCall, Identifier, PrincipalResolver, Registry, StatusRef, UnixSeconds, load_case,
};
use toolledger_engine::{
    Answer, Downstream, Engine, EngineError, StandIn,
    drill::{self, Interrupt, Switch},
};
use toolledger_store_sqlite::SqliteStore;

/// The engine every test drives: a SQLite ledger, and the stand-in downstream on its own
/// connection behind a recovery-drill switch.
pub type SqliteEngine<R> = Engine<SqliteStore, Interrupt<StandIn<SqliteStore>>, R>;

/// Opens the test engine on the file at `path`.
pub fn open_sqlite<R: PrincipalResolver>(
    path: &Path,
    resolver: R,
    registry: Registry,
) -> Result<SqliteEngine<R>, EngineError> {
    let ledger = SqliteStore::open(path)?;
    let downstream = Interrupt::new(StandIn::new(SqliteStore::open(path)?), Switch::default());
    Ok(Engine::new(ledger, downstream, resolver, registry))
}

/// An audit's verdict and its checks, counts and findings.
#[derive(Debug)]
pub struct Audited {
    passed: bool,
    package: Value,
}

impl Audited {
    pub fn code(&self) -> &'static str {
        if self.passed { "OK" } else { "AUDIT_FAILED" }
    }

    pub fn package(&self) -> &Value {
        &self.package
    }
}

/// The audit of the file at `path`: `code()` OK or AUDIT_FAILED, and a package of its
/// checks, counts and findings.
pub fn audit_sqlite(path: &Path) -> Result<Audited, EngineError> {
    Ok(audited(&SqliteStore::audit_path(path, toolledger_store::Waits::default())?))
}

/// An audit report as a verdict and a package of its checks, counts and findings.
pub fn audited(report: &toolledger_store::AuditReport) -> Audited {
    let checks: serde_json::Map<String, Value> = report
        .checks
        .iter()
        .map(|(name, passed)| ((*name).to_owned(), Value::from(*passed)))
        .collect();
    let counts: serde_json::Map<String, Value> = report
        .counts
        .iter()
        .map(|(table, count)| ((*table).to_owned(), serde_json::json!(count)))
        .collect();
    let findings: Vec<Value> = report
        .findings
        .iter()
        .map(|finding| serde_json::json!({"check": finding.check, "ref": finding.reference}))
        .collect();
    let package = serde_json::json!({"checks": checks, "counts": counts, "findings": findings});
    Audited { passed: report.passed(), package }
}

/// Where a test stops a flow, as a crash would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePoint {
    /// After commit A: `enqueue`.
    AfterIntentCommit,
    /// After the claim: the drill answers unknown without sending.
    AfterClaim,
    /// After the downstream's commit: the drill drops the receipt.
    AfterDownstreamCommit,
}

impl FailurePoint {
    pub const ALL: [FailurePoint; 3] = [
        FailurePoint::AfterIntentCommit,
        FailurePoint::AfterClaim,
        FailurePoint::AfterDownstreamCommit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailurePoint::AfterIntentCommit => "after_intent_commit",
            FailurePoint::AfterClaim => "after_claim",
            FailurePoint::AfterDownstreamCommit => "after_downstream_commit",
        }
    }

    fn drill(self) -> Option<drill::FailurePoint> {
        match self {
            FailurePoint::AfterIntentCommit => None,
            FailurePoint::AfterClaim => Some(drill::FailurePoint::AfterClaim),
            FailurePoint::AfterDownstreamCommit => Some(drill::FailurePoint::AfterDownstreamCommit),
        }
    }
}

/// The flows with a failure point and string refs, as the tests drive them.
pub trait Flows {
    fn dispatch_at(
        &mut self,
        case: &HostCall,
        worker: &Identifier,
        failure: Option<FailurePoint>,
    ) -> Result<Answer, EngineError>;

    fn process_at(
        &mut self,
        status_ref: &str,
        clock: &Clock,
        state: &Value,
        worker: &Identifier,
        failure: Option<FailurePoint>,
    ) -> Result<Answer, EngineError>;

    fn status_of(&mut self, case: &HostCall, status_ref: &str) -> Result<Answer, EngineError>;
}

impl<S: toolledger_store::LedgerStore, D: Downstream, R: PrincipalResolver> Flows
    for Engine<S, Interrupt<D>, R>
{
    fn dispatch_at(
        &mut self,
        case: &HostCall,
        worker: &Identifier,
        failure: Option<FailurePoint>,
    ) -> Result<Answer, EngineError> {
        match failure {
            // A crash right after commit A: the host learns nothing, and must assume the
            // outcome unknown (the library's `enqueue` itself answers ACCEPTED).
            Some(FailurePoint::AfterIntentCommit) => {
                return self.enqueue(case).map(Answer::as_if_lost);
            }
            Some(point) => self.downstream().switch().arm(point.drill().unwrap()),
            None => {}
        }
        self.dispatch(case, worker)
    }

    fn process_at(
        &mut self,
        status_ref: &str,
        clock: &Clock,
        state: &Value,
        worker: &Identifier,
        failure: Option<FailurePoint>,
    ) -> Result<Answer, EngineError> {
        let Ok(status_ref) = StatusRef::new(status_ref) else { return Ok(Answer::not_found()) };
        if let Some(point) = failure.and_then(FailurePoint::drill) {
            self.downstream().switch().arm(point);
        }
        self.process(&status_ref, clock, state, worker)
    }

    fn status_of(&mut self, case: &HostCall, status_ref: &str) -> Result<Answer, EngineError> {
        let Ok(status_ref) = StatusRef::new(status_ref) else { return Ok(Answer::not_found()) };
        self.status(case, &status_ref)
    }
}

/// The identity every stand-in operation records.
pub fn stand_in_identity() -> toolledger_contract::DownstreamIdentity {
    toolledger_contract::DownstreamIdentity::new("toolledger-stand-in", "1").unwrap()
}

#[allow(dead_code, reason = "keeps the Downstream trait in scope for tests that name it")]
fn _downstream_in_scope<D: Downstream>(_: &D) {}

pub use toolledger_conformance::{Roles, StoreUnderTest};

/// A SQLite ledger in its own temporary directory.
pub type Db = toolledger_conformance::Sqlite;

/// A directory removed when dropped.
pub use toolledger_testkit::TempDir;

pub fn workspace(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// The PASS case (`docs/contract.md`, Case file).
pub fn case() -> HostCall {
    load_case(
        &std::fs::read(workspace("fixtures/persistence-case.json")).unwrap(),
        &Registry::builtin(),
        None,
    )
    .unwrap()
}

/// The PASS case changed by `change`, with its approval digest recomputed so the
/// approval still binds the changed call.
pub fn case_with(change: impl FnOnce(&mut HostCall)) -> HostCall {
    let mut case = case();
    change(&mut case);
    rebind(&mut case);
    case
}

pub fn rebind(case: &mut HostCall) {
    let registry = Registry::builtin();
    let tool = registry.tool("refund_order").unwrap();
    let binding = case.approval_binding(&tool.name, &tool.revisions);
    let approval = case.approval.as_mut().unwrap();
    approval.approval_sha256 = approval.digest_for(&binding);
}

pub fn id(text: &str) -> Identifier {
    Identifier::new(text).unwrap()
}

pub fn at(seconds: i64) -> UnixSeconds {
    UnixSeconds::new(seconds).unwrap()
}

pub fn dispatch(engine: &mut impl Flows, case: &HostCall, failure: Option<FailurePoint>) -> Answer {
    engine.dispatch_at(case, &id("worker-dispatch"), failure).unwrap()
}

pub fn status_ref_of(answer: &Answer) -> String {
    answer.package()["status_ref"].as_str().unwrap().to_owned()
}

pub fn field<'a>(answer: &'a Answer, pointer: &str) -> &'a Value {
    answer.package().pointer(pointer).unwrap_or(&Value::Null)
}
