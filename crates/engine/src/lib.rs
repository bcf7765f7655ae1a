//! toolledger's flows (SPEC §7): `dispatch`, the directed worker `process`, and the
//! explicit status query `status`.
//!
//! The [`Engine`] drives a [`LedgerStore`] (the ledger), a [`Downstream`] (where the side
//! effect happens) and a [`PrincipalResolver`] (the *current* roles, asked at every
//! point SPEC §4.4 names). It reads no clock: every instant comes from the case. It
//! never turns an unknown outcome into a success: after any of the three
//! [`FailurePoint`]s, the answer is `OUTCOME_UNKNOWN` until a status query settles it.
//!
//! Answers are [`Answer`]s (PASS or BLOCK packages); [`EngineError`] is for what is
//! not a business answer (claims unreadable, store failure or contradiction).
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod downstream;
mod error;

use std::{path::Path, sync::Arc};

use serde_json::{Value, json};
use toolledger_contract::{
    ApprovalRefusal, BlockCode, BusinessState, Case, Clock, Delivery, HostView, Identifier, Order,
    PrincipalResolver, Purpose, Registry, Scope, Sha256Hex, StatusRef, ToolSpec, authorize,
    block_package, check_business,
    digest::{
        StatusQueryPart, downstream_request_ref, request_sha256, result_sha256, status_query_id,
        status_ref,
    },
    pass_package_with_result,
};
use toolledger_store::{
    AuditReport, CallIdentity, Claim, DownstreamReceipt, Finalize, Finalizer, LedgerStore,
    LocalReceipt, NewOperation, Operation, OperationStatus, RecordedCall, Reservation, SqliteStore,
    StoreError, approval_binding,
};

pub use toolledger_store::{DEFAULT_BUSY_TIMEOUT_MS, Waits};

pub use crate::{
    downstream::{Downstream, DownstreamRequest, StandIn},
    error::EngineError,
};

/// Where a flow may be stopped on purpose, right after a commit, to prove recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailurePoint {
    /// After commit A: intent and outbox event exist, nothing else.
    AfterIntentCommit,
    /// After the claim: the event is processing under a live lease.
    AfterClaim,
    /// After commit B: the downstream receipt exists, the local receipt does not.
    AfterDownstreamCommit,
}

impl FailurePoint {
    /// Every point, in flow order.
    pub const ALL: [FailurePoint; 3] = [
        FailurePoint::AfterIntentCommit,
        FailurePoint::AfterClaim,
        FailurePoint::AfterDownstreamCommit,
    ];

    /// `after_intent_commit`, `after_claim` or `after_downstream_commit`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePoint::AfterIntentCommit => "after_intent_commit",
            FailurePoint::AfterClaim => "after_claim",
            FailurePoint::AfterDownstreamCommit => "after_downstream_commit",
        }
    }

    /// The point named `text`.
    pub fn parse(text: &str) -> Option<FailurePoint> {
        FailurePoint::ALL.into_iter().find(|point| point.as_str() == text)
    }
}

/// A business answer: the package the caller prints.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The operation succeeded; `package` is a PASS package (or a passing audit).
    Pass {
        /// How the answer came about (`None` for an audit).
        delivery: Option<Delivery>,
        /// The package.
        package: Value,
    },
    /// A refusal or an unknown outcome; `package` is a BLOCK package.
    Block {
        /// Why.
        code: BlockCode,
        /// The package.
        package: Value,
    },
}

impl Answer {
    /// The package to print.
    pub fn package(&self) -> &Value {
        match self {
            Answer::Pass { package, .. } | Answer::Block { package, .. } => package,
        }
    }

    /// `OK` or the BLOCK code.
    pub fn code(&self) -> &'static str {
        match self {
            Answer::Pass { .. } => "OK",
            Answer::Block { code, .. } => code.as_str(),
        }
    }

    /// The delivery of a PASS package.
    pub fn delivery(&self) -> Option<Delivery> {
        match self {
            Answer::Pass { delivery, .. } => *delivery,
            Answer::Block { .. } => None,
        }
    }
}

/// A BLOCK answer; `operation` supplies `status` and `status_ref` where SPEC §10 says
/// the ledger's are shown.
fn block(code: BlockCode, operation: Option<&Operation>) -> Answer {
    let package = block_package(
        code,
        operation.map(|operation| operation.status.as_str()),
        operation.map(|operation| &operation.intent.status_ref),
    );
    Answer::Block { code, package }
}

/// `CALL_REUSED`: the model call is already the dispatch of another operation. That
/// operation's status and ref are shown only to a principal who may see it (its own
/// tenant and subject, the scope of a status query).
fn call_reused(recorded: &RecordedCall, tenant: &Identifier, subject: &Identifier) -> Answer {
    let visible = recorded.tenant_id == *tenant && recorded.subject_id == *subject;
    let package = block_package(
        BlockCode::CallReused,
        visible.then(|| recorded.status.as_str()),
        visible.then_some(&recorded.status_ref),
    );
    Answer::Block { code: BlockCode::CallReused, package }
}

/// Who is working an operation: it decides how a lost lease is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// Dispatch's in-process worker, right after its own commit A: anything short of a
    /// receipt is `OUTCOME_UNKNOWN` to the model's host.
    Dispatch,
    /// The directed worker `process`: a lease another worker holds is `LEASE_HELD`.
    Worker,
}

fn violation(what: &'static str) -> EngineError {
    EngineError::Store(StoreError::ContractViolation(what))
}

/// The call a package answers.
struct Answering<'a> {
    response: &'a Identifier,
    call: &'a Identifier,
    purpose: Purpose,
}

fn pass(
    delivery: Delivery,
    operation: &Operation,
    receipt: &LocalReceipt,
    answering: &Answering<'_>,
) -> Answer {
    let intent = &operation.intent;
    let host_view = HostView {
        provider: intent.profile.provider.clone(),
        api_family: intent.profile.api_family.clone(),
        adapter_revision: intent.profile.adapter_revision.clone(),
        provider_response_id: answering.response.clone(),
        provider_call_id: answering.call.clone(),
        purpose: answering.purpose,
        operation_id: intent.operation_id.clone(),
        idempotency_key: intent.scope.idempotency_key.clone(),
        revisions: intent.revisions.clone(),
        downstream_request_ref: receipt.downstream.downstream_request_ref.clone(),
        downstream_receipt_ref: receipt.downstream.receipt_ref.clone(),
        status_ref: intent.status_ref.clone(),
    };
    let package = pass_package_with_result(
        delivery,
        &intent.scope.tool_name,
        &receipt.output,
        &receipt.result_sha256,
        &host_view,
        &intent.request_sha256,
    );
    Answer::Pass { delivery: Some(delivery), package }
}

/// Whether a stored intent is the case's: request digest, the six revisions, canonical
/// arguments, scope, and provider/API/adapter.
fn same_intent(stored: &NewOperation, request: &Sha256Hex, tool: &ToolSpec, case: &Case) -> bool {
    stored.request_sha256 == *request
        && stored.revisions == tool.revisions
        && stored.arguments == case.proposal.arguments
        && stored.scope.tenant_id == case.principal.tenant_id
        && stored.scope.subject_id == case.principal.subject_id
        && stored.scope.tool_name == tool.name
        && stored.scope.idempotency_key == case.host.idempotency_key
        && stored.profile == case.host.profile
}

fn scope_of(case: &Case, tool: &ToolSpec) -> Scope {
    Scope {
        tenant_id: case.principal.tenant_id.clone(),
        subject_id: case.principal.subject_id.clone(),
        tool_name: tool.name.clone(),
        idempotency_key: case.host.idempotency_key.clone(),
    }
}

/// The intent a case proposes, under `tool`, with its scope and request digest.
fn intent_of(
    case: &Case,
    tool: &ToolSpec,
    scope: Scope,
    request_sha256: Sha256Hex,
) -> NewOperation {
    NewOperation {
        status_ref: status_ref(&scope),
        request_sha256,
        arguments: case.proposal.arguments.clone(),
        revisions: tool.revisions.clone(),
        profile: case.host.profile.clone(),
        provider_response_id: case.host.provider_response_id.clone(),
        provider_call_id: case.host.provider_call_id.clone(),
        operation_id: case.host.operation_id.clone(),
        approval: case.approval.clone(),
        scope,
    }
}

/// toolledger's flows over a store, a downstream and a principal resolver.
#[derive(Debug)]
pub struct Engine<S, D, R> {
    store: S,
    downstream: D,
    resolver: R,
    registry: Arc<Registry>,
}

/// The engine every command uses: a SQLite ledger and the offline stand-in downstream
/// on a second connection to the same file.
pub type SqliteEngine<R> = Engine<SqliteStore, StandIn<SqliteStore>, R>;

/// Opens the store at `path` (creating it where SPEC §10 says so) twice: once for the
/// ledger, once for the downstream stand-in.
///
/// # Errors
///
/// [`EngineError::Store`] when the file cannot be a store.
pub fn open_sqlite<R: PrincipalResolver>(
    path: &Path,
    resolver: R,
    registry: Registry,
) -> Result<SqliteEngine<R>, EngineError> {
    open_sqlite_with(path, resolver, registry, Waits::default())
}

/// [`open_sqlite`] with a bound on waiting for other connections' locks.
///
/// # Errors
///
/// As [`open_sqlite`]; `STORE_BUSY` when a lock outlasts the bound.
pub fn open_sqlite_with<R: PrincipalResolver>(
    path: &Path,
    resolver: R,
    registry: Registry,
    waits: Waits,
) -> Result<SqliteEngine<R>, EngineError> {
    let ledger = SqliteStore::open_with(path, waits)?;
    let downstream = StandIn::new(SqliteStore::open_with(path, waits)?);
    Ok(Engine::new(ledger, downstream, resolver, registry))
}

/// Audits the store at `path` without creating or changing anything.
///
/// # Errors
///
/// [`EngineError::Store`] when there is no store at `path` to audit.
pub fn audit_sqlite(path: &Path) -> Result<Answer, EngineError> {
    audit_sqlite_with(path, Waits::default())
}

/// [`audit_sqlite`] with a bound on waiting for other connections' locks.
///
/// # Errors
///
/// As [`audit_sqlite`]; `STORE_BUSY` when a lock outlasts the bound.
pub fn audit_sqlite_with(path: &Path, waits: Waits) -> Result<Answer, EngineError> {
    Ok(audit_answer(&SqliteStore::audit_path(path, waits)?))
}

/// The audit package of SPEC §10: PASS with `checks`, `counts` and the unreconciled
/// receipts, or BLOCK `AUDIT_FAILED` with the same plus `findings`.
pub fn audit_answer(report: &AuditReport) -> Answer {
    let checks: serde_json::Map<String, Value> =
        report.checks.iter().map(|(name, passed)| ((*name).to_owned(), json!(passed))).collect();
    let counts: serde_json::Map<String, Value> =
        report.counts.iter().map(|(table, count)| ((*table).to_owned(), json!(count))).collect();
    if report.passed() {
        let package = json!({
            "gate": "PASS",
            "code": "OK",
            "checks": checks,
            "counts": counts,
            "unreconciled_downstream_receipts": report.unreconciled_downstream_receipts,
        });
        return Answer::Pass { delivery: None, package };
    }
    let findings: Vec<Value> = report
        .findings
        .iter()
        .map(|finding| json!({"check": finding.check, "ref": finding.reference}))
        .collect();
    let package = json!({
        "gate": "BLOCK",
        "code": BlockCode::AuditFailed.as_str(),
        "status": null,
        "status_ref": null,
        "message": BlockCode::AuditFailed.message(),
        "checks": checks,
        "counts": counts,
        "unreconciled_downstream_receipts": report.unreconciled_downstream_receipts,
        "findings": findings,
    });
    Answer::Block { code: BlockCode::AuditFailed, package }
}

impl<S: LedgerStore, D: Downstream, R: PrincipalResolver> Engine<S, D, R> {
    /// An engine over these parts. `registry` is the *current* contract.
    pub fn new(store: S, downstream: D, resolver: R, registry: Registry) -> Engine<S, D, R> {
        Engine { store, downstream, resolver, registry: Arc::new(registry) }
    }

    /// The ledger, for callers that read it directly (tests, tools).
    pub fn store(&mut self) -> &mut S {
        &mut self.store
    }

    /// Dispatches the case's proposal: a new intent is accepted (commit A) and worked
    /// in-process; a known one replays or stays unknown; a different one conflicts.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the resolver or the store fails.
    pub fn dispatch(
        &mut self,
        case: &Case,
        worker: &Identifier,
        failure: Option<FailurePoint>,
    ) -> Result<Answer, EngineError> {
        let registry = Arc::clone(&self.registry);
        let (tool, order) = match self.admit(&registry, case)? {
            Ok(admitted) => admitted,
            Err(refused) => return Ok(refused),
        };
        let (tenant, subject) = (&case.principal.tenant_id, &case.principal.subject_id);
        let arguments = &case.proposal.arguments;
        let scope = scope_of(case, tool);
        let request = request_sha256(tenant, subject, &tool.name, arguments, &tool.revisions);
        let call = CallIdentity {
            profile: case.host.profile.clone(),
            provider_response_id: case.host.provider_response_id.clone(),
            provider_call_id: case.host.provider_call_id.clone(),
        };
        let lookup = self.store.dispatch_lookup(&scope, &call)?;
        match &lookup.call {
            Some(recorded) if recorded.purpose == Purpose::QueryStatus => {
                return Ok(block(BlockCode::CallPurposeConflict, None));
            }
            // One model call, one intent: this call already dispatched another scope.
            // (A stored operation's ref was verified to recompute from this scope, so a
            // replay compares with it and computes no digest.)
            Some(recorded)
                if match &lookup.operation {
                    Some(stored) => stored.intent.status_ref != recorded.status_ref,
                    None => recorded.status_ref != status_ref(&scope),
                } =>
            {
                return Ok(call_reused(recorded, tenant, subject));
            }
            _ => {}
        }
        if let Some(stored) = lookup.operation {
            return self.settled(&stored, &request, tool, case);
        }

        // A new intent: business state, approval, and authorization once more just
        // before the reservation transaction.
        if check_business(arguments, order).is_err() {
            return Ok(block(BlockCode::BusinessStateInvalid, None));
        }
        let intent = intent_of(case, tool, scope, request);
        match case.approval.admits(
            &approval_binding(&intent),
            &case.eligible_approvers,
            case.clock.now,
        ) {
            Ok(()) => {}
            Err(ApprovalRefusal::Invalid) => return Ok(block(BlockCode::ApprovalInvalid, None)),
            Err(ApprovalRefusal::Expired) => return Ok(block(BlockCode::ApprovalExpired, None)),
        }
        let roles = self.resolver.current_roles(tenant, subject)?;
        if authorize(tool, arguments, tenant, subject, &roles, &case.business_state).is_err() {
            return Ok(block(BlockCode::NotFound, None));
        }
        let reserved = match self.store.reserve(&intent, &call, case.clock.now)? {
            Reservation::Reserved(operation) => operation,
            Reservation::Exists(stored) => {
                return self.settled(&stored, &intent.request_sha256, tool, case);
            }
            Reservation::CallPurposeConflict => {
                return Ok(block(BlockCode::CallPurposeConflict, None));
            }
            Reservation::CallReused(recorded) => {
                return Ok(call_reused(&recorded, tenant, subject));
            }
        };
        if failure == Some(FailurePoint::AfterIntentCommit) {
            return Ok(block(BlockCode::OutcomeUnknown, Some(&reserved)));
        }
        // Commit A has succeeded in this call: from here on no failure may be answered
        // as "nothing happened". Whatever fails (store, resolver, downstream), the
        // answer is the crash table's: OUTCOME_UNKNOWN with the operation's ref.
        let worked = self.work(
            &intent.status_ref,
            &case.clock,
            &case.business_state,
            worker,
            failure,
            Caller::Dispatch,
            Some(&reserved),
        );
        Ok(worked.unwrap_or_else(|_| block(BlockCode::OutcomeUnknown, Some(&reserved))))
    }

    /// The checks every case-driven flow starts with: the tool is registered and the
    /// arguments pass its input schema (`INPUT_INVALID`), then the current principal may
    /// act on the resource (`NOT_FOUND`, alike for missing and not theirs). On success,
    /// the tool and the order it concerns.
    #[allow(clippy::type_complexity, reason = "a refusal is an answer, an error is not")]
    fn admit<'r, 'c>(
        &mut self,
        registry: &'r Registry,
        case: &'c Case,
    ) -> Result<Result<(&'r ToolSpec, &'c Order), Answer>, EngineError> {
        let Some(tool) = registry.tool(&case.proposal.tool_name) else {
            return Ok(Err(block(BlockCode::InputInvalid, None)));
        };
        if tool.input.validate(&case.proposal.arguments, None).is_err() {
            return Ok(Err(block(BlockCode::InputInvalid, None)));
        }
        let (tenant, subject) = (&case.principal.tenant_id, &case.principal.subject_id);
        let roles = self.resolver.current_roles(tenant, subject)?;
        match authorize(
            tool,
            &case.proposal.arguments,
            tenant,
            subject,
            &roles,
            &case.business_state,
        ) {
            Ok(order) => Ok(Ok((tool, order))),
            Err(_) => Ok(Err(block(BlockCode::NotFound, None))),
        }
    }

    /// The answer for a scope already in the ledger: conflict, replay, or unknown —
    /// touching nothing (no worker, no receipt lookup, no approval or business check).
    fn settled(
        &mut self,
        stored: &Operation,
        request: &Sha256Hex,
        tool: &ToolSpec,
        case: &Case,
    ) -> Result<Answer, EngineError> {
        self.check_stored_arguments(stored)?;
        if !same_intent(&stored.intent, request, tool, case) {
            return Ok(block(BlockCode::IdempotencyConflict, Some(stored)));
        }
        if stored.status != OperationStatus::Succeeded {
            return Ok(block(BlockCode::OutcomeUnknown, Some(stored)));
        }
        let answering = Answering {
            response: &case.host.provider_response_id,
            call: &case.host.provider_call_id,
            purpose: Purpose::Dispatch,
        };
        self.replay(stored, &answering)
    }

    /// Works the operation named by `status_ref`: the directed worker of SPEC §7.
    /// Reads only `clock` and `business_state` from the case: tenant, subject and
    /// arguments come from the ledger. `after_intent_commit` does not apply here.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the resolver, the downstream or the store fails.
    pub fn process(
        &mut self,
        status_ref: &str,
        clock: &Clock,
        state: &BusinessState,
        worker: &Identifier,
        failure: Option<FailurePoint>,
    ) -> Result<Answer, EngineError> {
        let Ok(status_ref) = StatusRef::new(status_ref) else {
            return Ok(block(BlockCode::NotFound, None));
        };
        self.work(&status_ref, clock, state, worker, failure, Caller::Worker, None)
    }

    /// Claims and works the operation. Dispatch's in-process worker starts from the
    /// operation it has just reserved; `process` reads it.
    #[allow(clippy::too_many_arguments, reason = "the one worker of both flows")]
    fn work(
        &mut self,
        status_ref: &StatusRef,
        clock: &Clock,
        state: &BusinessState,
        worker: &Identifier,
        failure: Option<FailurePoint>,
        caller: Caller,
        reserved: Option<&Operation>,
    ) -> Result<Answer, EngineError> {
        let read;
        let operation = match reserved {
            Some(operation) => operation,
            None => match self.store.operation_by_status_ref(status_ref)? {
                Some(operation) => {
                    read = operation;
                    &read
                }
                None => return Ok(block(BlockCode::NotFound, None)),
            },
        };
        self.check_stored_arguments(operation)?;
        if operation.status == OperationStatus::Succeeded {
            return self.worker_replay(operation, state);
        }
        let (attempt, claimed) =
            match self.store.claim(status_ref, worker, clock.now, clock.lease_seconds)? {
                Claim::Claimed { attempt, operation } => (attempt, *operation),
                Claim::LeaseHeld if caller == Caller::Dispatch => {
                    return Ok(block(BlockCode::OutcomeUnknown, Some(operation)));
                }
                Claim::LeaseHeld => return Ok(block(BlockCode::LeaseHeld, Some(operation))),
                Claim::Delivered => return self.reread_and_replay(status_ref, state),
                Claim::Missing => return Ok(block(BlockCode::NotFound, None)),
            };
        // This call now holds the lease, and may be about to cause the side effect: from
        // here on a failure of the store, the resolver or the downstream is answered
        // OUTCOME_UNKNOWN with the operation's ref, never as an error.
        let worked =
            self.work_claimed(status_ref, &claimed, attempt, clock, state, worker, failure, caller);
        Ok(worked.unwrap_or_else(|_| block(BlockCode::OutcomeUnknown, Some(&claimed))))
    }

    /// The worker's steps after its claim: rechecks, the downstream, commit C.
    #[allow(clippy::too_many_arguments, reason = "the one worker of both flows")]
    fn work_claimed(
        &mut self,
        status_ref: &StatusRef,
        claimed: &Operation,
        attempt: i64,
        clock: &Clock,
        state: &BusinessState,
        worker: &Identifier,
        failure: Option<FailurePoint>,
        caller: Caller,
    ) -> Result<Answer, EngineError> {
        // The operation as the claim read it back: every stored digest, the approval's
        // included, was recomputed from the ledger right before the side effect.
        let operation = claimed;
        self.check_stored_arguments(operation)?;
        if failure == Some(FailurePoint::AfterClaim) {
            return Ok(block(BlockCode::OutcomeUnknown, Some(operation)));
        }
        let intent = &operation.intent;
        let registry = Arc::clone(&self.registry);
        let Some(tool) = registry.tool(&intent.scope.tool_name) else {
            return Ok(block(BlockCode::ContractDrift, Some(operation)));
        };
        let current_request = request_sha256(
            &intent.scope.tenant_id,
            &intent.scope.subject_id,
            &tool.name,
            &intent.arguments,
            &tool.revisions,
        );
        if tool.revisions != intent.revisions || current_request != intent.request_sha256 {
            return Ok(block(BlockCode::ContractDrift, Some(operation)));
        }
        // The approval digest was recomputed from the ledger by the claim's read-back,
        // which refuses a row whose stored approval does not recompute.
        let Some(order) = self.worker_authorize(tool, intent, state)? else {
            return Ok(block(BlockCode::AuthorizationDenied, Some(operation)));
        };
        if check_business(&intent.arguments, order).is_err() {
            return Ok(block(BlockCode::BusinessStateInvalid, Some(operation)));
        }

        let request = DownstreamRequest {
            downstream_request_ref: operation.downstream_request_ref.clone(),
            request_sha256: intent.request_sha256.clone(),
            tool_name: tool.name.clone(),
            output_revision: intent.revisions.output.clone(),
            arguments: intent.arguments.clone(),
        };
        let receipt = self.downstream.execute(&request, clock.now)?;
        if failure == Some(FailurePoint::AfterDownstreamCommit) {
            return Ok(block(BlockCode::OutcomeUnknown, Some(operation)));
        }
        let local = verify_receipt(operation, tool, receipt)?;
        let finalizer = Finalizer::Lease { owner: worker.clone(), attempt };
        match self.store.finalize(status_ref, &finalizer, &local, clock.now)? {
            Finalize::Finalized => {
                let answering = Answering {
                    response: &intent.provider_response_id,
                    call: &intent.provider_call_id,
                    purpose: Purpose::Dispatch,
                };
                Ok(pass(Delivery::Fresh, operation, &local, &answering))
            }
            Finalize::AlreadySucceeded => self.reread_and_replay(status_ref, state),
            Finalize::LeaseLost => {
                let operation = self.reread(status_ref)?;
                let code = match caller {
                    Caller::Dispatch => BlockCode::OutcomeUnknown,
                    Caller::Worker => BlockCode::LeaseHeld,
                };
                Ok(block(code, Some(&operation)))
            }
        }
    }

    fn reread(&mut self, status_ref: &StatusRef) -> Result<Operation, EngineError> {
        self.store
            .operation_by_status_ref(status_ref)?
            .ok_or(EngineError::Store(StoreError::Sqlite("the operation vanished")))
    }

    fn reread_and_replay(
        &mut self,
        status_ref: &StatusRef,
        state: &BusinessState,
    ) -> Result<Answer, EngineError> {
        let operation = self.reread(status_ref)?;
        self.worker_replay(&operation, state)
    }

    /// The worker's authorization: the *current* roles of the operation's principal
    /// (tenant, subject and arguments from the ledger, never the case) against the
    /// business state it is handed. The order it concerns, or `None` when denied.
    fn worker_authorize<'s>(
        &mut self,
        tool: &ToolSpec,
        intent: &NewOperation,
        state: &'s BusinessState,
    ) -> Result<Option<&'s Order>, EngineError> {
        let (tenant, subject) = (&intent.scope.tenant_id, &intent.scope.subject_id);
        let roles = self.resolver.current_roles(tenant, subject)?;
        Ok(authorize(tool, &intent.arguments, tenant, subject, &roles, state).ok())
    }

    /// A worker meeting a finished operation re-authorizes, then answers `local_replay`
    /// with the ledger's first call ids and purpose `dispatch`.
    fn worker_replay(
        &mut self,
        operation: &Operation,
        state: &BusinessState,
    ) -> Result<Answer, EngineError> {
        let intent = &operation.intent;
        let registry = Arc::clone(&self.registry);
        let Some(tool) = registry.tool(&intent.scope.tool_name) else {
            return Ok(block(BlockCode::ContractDrift, Some(operation)));
        };
        if self.worker_authorize(tool, intent, state)?.is_none() {
            return Ok(block(BlockCode::AuthorizationDenied, Some(operation)));
        }
        let answering = Answering {
            response: &intent.provider_response_id,
            call: &intent.provider_call_id,
            purpose: Purpose::Dispatch,
        };
        self.replay(operation, &answering)
    }

    fn replay(
        &mut self,
        operation: &Operation,
        answering: &Answering<'_>,
    ) -> Result<Answer, EngineError> {
        let receipt = operation
            .receipt
            .as_ref()
            .ok_or(violation("a succeeded operation has no local receipt"))?;
        self.check_output(operation, &receipt.output)?;
        Ok(pass(Delivery::LocalReplay, operation, receipt, answering))
    }

    /// Stored arguments that fail the input schema of their own revision contradict the
    /// row: `STORE_CONTRACT_VIOLATION`. (A row whose revision is not the current one is
    /// drift, judged by each flow.)
    fn check_stored_arguments(&self, operation: &Operation) -> Result<(), EngineError> {
        let intent = &operation.intent;
        match self.registry.tool(&intent.scope.tool_name) {
            Some(tool) if tool.revisions.input == intent.revisions.input => tool
                .input
                .validate(&intent.arguments, None)
                .map_err(|_| violation("stored arguments fail the input schema")),
            _ => Ok(()),
        }
    }

    /// A stored output that fails the output schema or the input binding of its own
    /// revision contradicts the row.
    fn check_output(&self, operation: &Operation, output: &Value) -> Result<(), EngineError> {
        let intent = &operation.intent;
        match self.registry.tool(&intent.scope.tool_name) {
            Some(tool) if tool.revisions.output == intent.revisions.output => tool
                .output
                .validate(output, intent.arguments.as_object())
                .map_err(|_| violation("stored output fails the output contract")),
            _ => Ok(()),
        }
    }

    /// Reconciles the operation named by `status_ref` on the evidence of the
    /// downstream receipt: the explicit, purpose-bound status query of SPEC §7.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the resolver, the downstream or the store fails.
    pub fn status(&mut self, case: &Case, status_ref: &str) -> Result<Answer, EngineError> {
        let registry = Arc::clone(&self.registry);
        let tool = match self.admit(&registry, case)? {
            Ok((tool, _)) => tool,
            Err(refused) => return Ok(refused),
        };
        let (tenant, subject) = (&case.principal.tenant_id, &case.principal.subject_id);
        let Ok(status_ref) = StatusRef::new(status_ref) else {
            return Ok(block(BlockCode::NotFound, None));
        };
        // The host-owned identity this query answers under: derived, never reusable for
        // a dispatch.
        let identity = CallIdentity {
            profile: case.host.profile.clone(),
            provider_response_id: status_query_id(
                StatusQueryPart::Response,
                &case.host.provider_response_id,
                &status_ref,
            ),
            provider_call_id: status_query_id(
                StatusQueryPart::Call,
                &case.host.provider_call_id,
                &status_ref,
            ),
        };
        let Some(operation) = self.store.operation_by_status_ref(&status_ref)? else {
            return Ok(block(BlockCode::NotFound, None));
        };
        if operation.intent.scope.tenant_id != *tenant
            || operation.intent.scope.subject_id != *subject
        {
            return Ok(block(BlockCode::NotFound, None));
        }
        self.check_stored_arguments(&operation)?;
        // The model call asking is one intent too: if it already dispatched another
        // operation, it may not query this one.
        let asking = CallIdentity {
            profile: case.host.profile.clone(),
            provider_response_id: case.host.provider_response_id.clone(),
            provider_call_id: case.host.provider_call_id.clone(),
        };
        if let Some(recorded) = self.store.recorded_call(&asking)? {
            if recorded.purpose == Purpose::Dispatch && recorded.status_ref != status_ref {
                return Ok(call_reused(&recorded, tenant, subject));
            }
        }
        if let Some(recorded) =
            self.store.record_status_query(&identity, &status_ref, case.clock.now)?
        {
            if recorded.purpose != Purpose::QueryStatus {
                return Ok(block(BlockCode::CallPurposeConflict, None));
            }
            if recorded.status_ref != status_ref {
                return Ok(call_reused(&recorded, tenant, subject));
            }
        }
        let expected_request =
            request_sha256(tenant, subject, &tool.name, &case.proposal.arguments, &tool.revisions);
        let stored = &operation.intent;
        if expected_request != stored.request_sha256
            || case.host.idempotency_key != stored.scope.idempotency_key
            || tool.revisions != stored.revisions
            || case.host.profile != stored.profile
        {
            return Ok(block(BlockCode::IdempotencyConflict, Some(&operation)));
        }
        let answering = Answering {
            response: &identity.provider_response_id,
            call: &identity.provider_call_id,
            purpose: Purpose::QueryStatus,
        };
        if operation.status == OperationStatus::Succeeded {
            return self.replay(&operation, &answering);
        }
        let Some(receipt) = self
            .downstream
            .lookup(&downstream_request_ref(&stored.scope, &stored.request_sha256))?
        else {
            return Ok(block(BlockCode::OutcomeUnknown, Some(&operation)));
        };
        let local = verify_receipt(&operation, tool, receipt)?;
        match self.store.finalize(&status_ref, &Finalizer::StatusQuery, &local, case.clock.now)? {
            Finalize::Finalized => {
                Ok(pass(Delivery::ReceiptReconciled, &operation, &local, &answering))
            }
            Finalize::AlreadySucceeded | Finalize::LeaseLost => {
                let operation = self.reread(&status_ref)?;
                self.replay(&operation, &answering)
            }
        }
    }
}

/// Checks a downstream receipt against the operation and the output contract (schema
/// and input binding) before it may become a local receipt.
fn verify_receipt(
    operation: &Operation,
    tool: &ToolSpec,
    receipt: DownstreamReceipt,
) -> Result<LocalReceipt, EngineError> {
    let intent = &operation.intent;
    let text = |name: &str| receipt.receipt.get(name).and_then(Value::as_str);
    if receipt.request_sha256 != intent.request_sha256
        || receipt.downstream_request_ref != operation.downstream_request_ref
        || text("tool_name") != Some(tool.name.as_str())
        || text("output_revision") != Some(intent.revisions.output.as_str())
    {
        return Err(violation("the downstream receipt is not bound to the operation"));
    }
    let output = receipt.receipt.get("output").cloned().unwrap_or(Value::Null);
    tool.output
        .validate(&output, intent.arguments.as_object())
        .map_err(|_| violation("the downstream receipt fails the output contract"))?;
    let result = result_sha256(&tool.name, &intent.revisions.output, &output);
    Ok(LocalReceipt { downstream: receipt, output, result_sha256: result })
}
