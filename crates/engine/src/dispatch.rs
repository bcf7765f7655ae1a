//! `dispatch` and `enqueue`: a call becomes an accepted intent (commit A), or meets the
//! one already in the ledger under its scope.

use std::sync::Arc;

use serde_json::Value;
use toolledger_contract::{
    ApprovalPolicy, ApprovalRefusal, BlockCode, HostCall, Purpose, Registry, Scope, ToolSpec,
    Verdict, block_package,
    digest::{request_sha256, status_ref},
};
use toolledger_store::{
    CallIdentity, LedgerStore, NewOperation, Operation, OperationStatus, Reservation, StoreError,
    TerminalOutcome, approval_binding,
};

use crate::{
    Caller, Downstream, Engine, EngineError, Judged,
    answers::{Answer, Answering, block, call_reused},
    worker::Lease,
};
use toolledger_contract::PrincipalResolver;

/// Whether a stored intent is the call's: the six revisions, arguments, scope, and
/// provider/API/adapter. The one comparison every flow uses.
///
/// The request digests are equal exactly when these are, so neither is computed: the
/// stored digest was recomputed from the stored fields when the row was read (a row
/// whose digest does not recompute never reaches a flow), and the call's would be the
/// same function of the same tenant, subject, tool, revisions and arguments. Arguments
/// equal as values have one canonical form; the comparison is the stricter of the two.
pub(crate) fn same_intent(stored: &NewOperation, tool: &ToolSpec, call: &HostCall) -> bool {
    stored.revisions == tool.revisions
        && stored.arguments == call.proposal.arguments
        && stored.scope.tenant_id == call.principal.tenant_id
        && stored.scope.subject_id == call.principal.subject_id
        && stored.scope.tool_name == tool.name
        && stored.scope.idempotency_key == call.host.idempotency_key
        && stored.profile == call.host.profile
}

fn scope_of(call: &HostCall, tool: &ToolSpec) -> Scope {
    Scope {
        tenant_id: call.principal.tenant_id.clone(),
        subject_id: call.principal.subject_id.clone(),
        tool_name: tool.name.clone(),
        idempotency_key: call.host.idempotency_key.clone(),
    }
}

/// The call's own identity as the model made it.
pub(crate) fn identity_of(call: &HostCall) -> CallIdentity {
    CallIdentity {
        profile: call.host.profile.clone(),
        provider_response_id: call.host.provider_response_id.clone(),
        provider_call_id: call.host.provider_call_id.clone(),
    }
}

/// How far a dispatch goes once its intent is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Work it now, in this call.
    Work,
    /// Stop at commit A: a worker takes it later.
    Stop,
}

impl<S: LedgerStore, D: Downstream, R: PrincipalResolver> Engine<S, D, R> {
    /// Dispatches the call: a new intent is accepted (commit A) and worked in-process;
    /// a known one replays, stays unknown, or answers how it ended; a different one
    /// under the same key conflicts.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the resolver or the store fails before the intent is
    /// accepted. After commit A no error is returned: a failure is `OUTCOME_UNKNOWN`.
    pub fn dispatch(
        &mut self,
        call: &HostCall,
        worker: &toolledger_contract::Identifier,
    ) -> Result<Answer, EngineError> {
        self.accept(call, worker, Then::Work)
    }

    /// Accepts the call (commit A) and stops: the intent and its outbox event exist,
    /// for a worker (`process`, a relay) to take later. Answers `OUTCOME_UNKNOWN` with the
    /// new operation's ref — from the caller's side the outcome is not known yet. A
    /// known intent is answered as [`Engine::dispatch`] would.
    ///
    /// # Errors
    ///
    /// As [`Engine::dispatch`].
    pub fn enqueue(&mut self, call: &HostCall) -> Result<Answer, EngineError> {
        let nobody = toolledger_contract::Identifier::new("enqueue")
            .unwrap_or_else(|_| unreachable!("a literal identifier"));
        self.accept(call, &nobody, Then::Stop)
    }

    /// What [`Engine::dispatch`] answers a call whose scope (or model call) the ledger
    /// already holds: a replay, a conflict, an unknown, how it ended, or the door's
    /// refusal — read alone, writing nothing and asking no downstream. `None` when the
    /// scope is new: only a dispatch accepts it. For a host that answers such calls on a
    /// few reading threads and sends only new intents where they may wait.
    ///
    /// # Errors
    ///
    /// As [`Engine::dispatch`] before an intent is accepted.
    pub fn known(&mut self, call: &HostCall) -> Result<Option<Answer>, EngineError> {
        let registry = Arc::clone(&self.registry);
        match self.admit(&registry, call)? {
            Ok((tool, _)) => self.known_scope(call, tool),
            Err(refused) => Ok(Some(refused)),
        }
    }

    /// [`Engine::known`] for an admitted call of `tool`.
    fn known_scope(
        &mut self,
        call: &HostCall,
        tool: &ToolSpec,
    ) -> Result<Option<Answer>, EngineError> {
        let (tenant, subject) = (&call.principal.tenant_id, &call.principal.subject_id);
        let scope = scope_of(call, tool);
        let identity = identity_of(call);
        let lookup = self.store.dispatch_lookup(&scope, &identity)?;
        match &lookup.call {
            Some(recorded) if recorded.purpose == Purpose::QueryStatus => {
                return Ok(Some(block(BlockCode::CallPurposeConflict, None)));
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
                return Ok(Some(call_reused(recorded, tenant, subject)));
            }
            _ => {}
        }
        match lookup.operation {
            Some(stored) => self.settled(stored, tool, call).map(Some),
            None => Ok(None),
        }
    }

    fn accept(
        &mut self,
        call: &HostCall,
        worker: &toolledger_contract::Identifier,
        then: Then,
    ) -> Result<Answer, EngineError> {
        let registry = Arc::clone(&self.registry);
        let (tool, roles) = match self.admit(&registry, call)? {
            Ok(admitted) => admitted,
            Err(refused) => return Ok(refused),
        };
        if let Some(known) = self.known_scope(call, tool)? {
            return Ok(known);
        }
        let (tenant, subject) = (&call.principal.tenant_id, &call.principal.subject_id);
        let arguments = &call.proposal.arguments;
        let scope = scope_of(call, tool);
        let identity = identity_of(call);
        if self.store.retired(&status_ref(&scope))? {
            return Ok(block(BlockCode::KeyRetired, None));
        }

        // A new intent: business state, approval, and authorization once more just
        // before the reservation transaction.
        let judged = Judged {
            tenant_id: tenant,
            subject_id: subject,
            arguments,
            context: &call.business_state,
        };
        match judged.precondition(tool, &roles) {
            Verdict::Allow => {}
            Verdict::Refuse { .. } => return Ok(block(BlockCode::BusinessStateInvalid, None)),
            // Nothing is written: the judge could not be asked, so nothing is decided.
            Verdict::Unavailable { .. } => {
                return Ok(block(BlockCode::DownstreamUnavailable, None));
            }
        }
        let mut intent = NewOperation {
            status_ref: status_ref(&scope),
            request_sha256: request_sha256(tenant, subject, &tool.name, arguments, &tool.revisions),
            arguments: arguments.clone(),
            revisions: tool.revisions.clone(),
            profile: call.host.profile.clone(),
            provider_response_id: call.host.provider_response_id.clone(),
            provider_call_id: call.host.provider_call_id.clone(),
            operation_id: call.host.operation_id.clone(),
            approval: None,
            downstream: self.downstream.identity_for(&tool.name).clone(),
            scope,
        };
        if tool.rules.approval(arguments) == ApprovalPolicy::Required {
            let Some(approval) = &call.approval else {
                return Ok(block(BlockCode::ApprovalInvalid, None));
            };
            // A definition's policy: the approver holds one of its roles now (asked of
            // the resolver, never stored), and the approval is valid no longer than it
            // allows. Without roles, the call's list of eligible approvers decides.
            let rule = &tool.approval;
            let by_roles;
            let eligible = if rule.approver_roles.is_empty() {
                &call.eligible_approvers
            } else {
                let roles = self.resolver.current_roles(tenant, &approval.approver_id)?;
                let holds = roles.iter().any(|role| rule.approver_roles.contains(role));
                by_roles = if holds { vec![approval.approver_id.clone()] } else { Vec::new() };
                &by_roles
            };
            let validity = approval.expires_at.get() - approval.approved_at.get();
            if rule.max_validity_seconds.is_some_and(|max| validity > max) {
                return Ok(block(BlockCode::ApprovalInvalid, None));
            }
            match approval.admits(&approval_binding(&intent), eligible, call.clock.now) {
                Ok(()) => {}
                Err(ApprovalRefusal::Invalid) => {
                    return Ok(block(BlockCode::ApprovalInvalid, None));
                }
                Err(ApprovalRefusal::Expired) => {
                    return Ok(block(BlockCode::ApprovalExpired, None));
                }
            }
            intent.approval = Some(approval.clone());
        }
        if !self.authorize(tool, &judged)?.1 {
            return Ok(block(BlockCode::NotFound, None));
        }
        // A dispatch that works the operation itself takes the lease in commit A (one
        // commit fewer); `enqueue` stops at A, leaving the event pending for a worker.
        let clock = &call.clock;
        let reserved = match then {
            Then::Work => self.store.reserve_claimed(
                &intent,
                &identity,
                clock.now,
                worker,
                clock.lease_seconds,
            ),
            Then::Stop => self.store.reserve(&intent, &identity, clock.now),
        };
        let reservation = match reserved {
            Ok(reservation) => reservation,
            // Commit A failed while committing: the intent may be accepted. That is not
            // "nothing happened"; a status query under its ref tells which.
            Err(StoreError::CommitUnknown { .. }) => {
                let package =
                    block_package(BlockCode::OutcomeUnknown, None, Some(&intent.status_ref));
                return Ok(Answer::Block { code: BlockCode::OutcomeUnknown, package, ended: None });
            }
            Err(err) => return Err(err.into()),
        };
        let reserved = match reservation {
            Reservation::Reserved(operation) => operation,
            Reservation::Exists(stored) => {
                return self.settled(*stored, tool, call);
            }
            Reservation::CallPurposeConflict => {
                return Ok(block(BlockCode::CallPurposeConflict, None));
            }
            Reservation::CallReused(recorded) => {
                return Ok(call_reused(&recorded, tenant, subject));
            }
            Reservation::Retired => return Ok(block(BlockCode::KeyRetired, None)),
        };
        if then == Then::Stop {
            // Commit A alone: accepted, and certainly not sent.
            return Ok(block(BlockCode::Accepted, Some(&reserved)));
        }
        // Commit A (with the claim) has succeeded in this call: from here on no failure
        // may be answered as "nothing happened". Whatever fails (store, resolver,
        // downstream), the answer is the crash table's: OUTCOME_UNKNOWN with the
        // operation's ref.
        let lease = Lease {
            owner: worker,
            attempt: reserved.outbox.attempt_count,
            caller: Caller::Dispatch,
            reclaimed: false,
        };
        let worked =
            self.work_claimed(&intent.status_ref, &reserved, &lease, clock, &call.business_state);
        Ok(worked.unwrap_or_else(|_| block(BlockCode::OutcomeUnknown, Some(&reserved))))
    }

    /// The checks every call-driven flow starts with: the tool is registered and the
    /// arguments pass its input schema (`INPUT_INVALID`), then the current principal may
    /// act on the resource (`NOT_FOUND`, alike for missing and not theirs). On success,
    /// the tool and the roles the principal holds now.
    #[allow(clippy::type_complexity, reason = "a refusal is an answer, an error is not")]
    pub(crate) fn admit<'r>(
        &mut self,
        registry: &'r Registry,
        call: &HostCall,
    ) -> Result<Result<(&'r ToolSpec, Vec<String>), Answer>, EngineError> {
        let Some(tool) = registry.tool(&call.proposal.tool_name) else {
            return Ok(Err(block(BlockCode::InputInvalid, None)));
        };
        if let Err(refused) = tool.input.validate(&call.proposal.arguments, None) {
            return Ok(Err(crate::answers::input_invalid(refused.rejection())));
        }
        let judged = Judged {
            tenant_id: &call.principal.tenant_id,
            subject_id: &call.principal.subject_id,
            arguments: &call.proposal.arguments,
            context: &call.business_state,
        };
        match self.authorize(tool, &judged)? {
            (roles, true) => Ok(Ok((tool, roles))),
            (_, false) => Ok(Err(block(BlockCode::NotFound, None))),
        }
    }

    /// The answer for a scope already in the ledger: conflict, replay, unknown, or how
    /// it ended — touching nothing (no worker, no receipt lookup, no approval or
    /// business check).
    fn settled(
        &mut self,
        stored: Operation,
        tool: &ToolSpec,
        call: &HostCall,
    ) -> Result<Answer, EngineError> {
        // Stored arguments equal to the call's passed the same schema a moment ago (the
        // call's, in `admit`, when the revisions match; otherwise none is checked): only
        // arguments that differ are validated again, before they are answered a conflict.
        if stored.intent.arguments != call.proposal.arguments {
            self.check_stored_arguments(&stored)?;
        }
        if !same_intent(&stored.intent, tool, call) {
            return Ok(block(BlockCode::IdempotencyConflict, Some(&stored)));
        }
        if stored.intent.downstream != *self.downstream.identity_for(&stored.intent.scope.tool_name)
        {
            return Ok(block(BlockCode::DownstreamMismatch, Some(&stored)));
        }
        match stored.status {
            OperationStatus::Succeeded => {
                let answering = Answering {
                    response: &call.host.provider_response_id,
                    call: &call.host.provider_call_id,
                    purpose: Purpose::Dispatch,
                };
                self.replay_read(stored, &answering)
            }
            OperationStatus::Failed | OperationStatus::Quarantined | OperationStatus::Dead => {
                Ok(ended(&stored))
            }
            OperationStatus::Pending | OperationStatus::Processing => {
                Ok(block(BlockCode::OutcomeUnknown, Some(&stored)))
            }
        }
    }
}

/// How an operation that did not succeed ended, answered the same way on every read. A
/// quarantine names its reason's kind (`reason`): the service holds another request
/// under the key, its output broke the tool's schema, or it broke an input binding.
pub(crate) fn ended(operation: &Operation) -> Answer {
    let code = match operation.status {
        OperationStatus::Quarantined => BlockCode::ReceiptQuarantined,
        OperationStatus::Dead => BlockCode::DownstreamUnavailable,
        _ => BlockCode::DownstreamRefused,
    };
    let mut answer = block(code, Some(operation));
    if let Answer::Block { package, ended, .. } = &mut answer {
        match &operation.outcome {
            Some(TerminalOutcome::Quarantined { reason, .. }) => {
                let kind = crate::worker::quarantine_kind(reason);
                if let Some(members) = package.as_object_mut() {
                    members.insert("reason".to_owned(), Value::from(kind));
                }
                *ended = Some(reason.clone());
            }
            Some(TerminalOutcome::Failed { reason }) => *ended = Some(reason.clone()),
            None => {}
        }
    }
    answer
}
