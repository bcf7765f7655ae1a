//! The explicit, purpose-bound status query: the only way an unknown outcome is settled.

use std::sync::Arc;

use serde_json::Value;
use toolledger_contract::{
    BlockCode, Delivery, HostCall, Identifier, PrincipalResolver, Purpose, StatusRef, UnixSeconds,
    digest::{StatusQueryPart, status_query_id},
};
use toolledger_store::{CallIdentity, Ending, Finalize, Finalizer, LedgerStore, OperationStatus};

use crate::{
    Downstream, Engine, EngineError, Lookup,
    answers::{Answer, Answering, block, call_reused, pass},
    dispatch::{ended, identity_of, same_intent},
    worker::{Checked, check_receipt, request_of},
};

/// The host-owned identity a status query answers under: derived from the asking call
/// and the ref, never reusable for a dispatch.
fn query_identity(asking: &CallIdentity, status_ref: &StatusRef) -> CallIdentity {
    CallIdentity {
        profile: asking.profile.clone(),
        provider_response_id: status_query_id(
            StatusQueryPart::Response,
            &asking.provider_response_id,
            status_ref,
        ),
        provider_call_id: status_query_id(
            StatusQueryPart::Call,
            &asking.provider_call_id,
            status_ref,
        ),
    }
}

/// Who asks in a status query that names only the operation ([`Engine::status_by_ref`]).
#[derive(Debug, Clone, Copy)]
pub struct Asking<'a> {
    /// The principal's tenant.
    pub tenant_id: &'a Identifier,
    /// The principal.
    pub subject_id: &'a Identifier,
    /// The asking model call's own identity (the query is answered under identities
    /// derived from it and the ref).
    pub call: &'a CallIdentity,
    /// The instant the query is judged at.
    pub now: UnixSeconds,
    /// The business context the tool's rules judge (`null` when none).
    pub context: &'a Value,
}

impl<S: LedgerStore, D: Downstream, R: PrincipalResolver> Engine<S, D, R> {
    /// Reconciles the operation named by `status_ref` on the evidence of the
    /// downstream: the explicit, purpose-bound status query. A receipt settles it
    /// (`receipt_reconciled`), a definite refusal ends it `failed`, no record keeps it
    /// unknown.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the resolver or the store fails. A status query causes no
    /// side effect and every write it makes is all or nothing, so running it again is
    /// always safe.
    pub fn status(
        &mut self,
        call: &HostCall,
        status_ref: &StatusRef,
    ) -> Result<Answer, EngineError> {
        let registry = Arc::clone(&self.registry);
        let tool = match self.admit(&registry, call)? {
            Ok((tool, _)) => tool,
            Err(refused) => return Ok(refused),
        };
        let (tenant, subject) = (&call.principal.tenant_id, &call.principal.subject_id);
        let asking = identity_of(call);
        let identity = query_identity(&asking, status_ref);
        let Some(operation) = self.store.operation_by_status_ref(status_ref)? else {
            // Removed by retention: said so to the principal whose scope it was.
            let own = toolledger_contract::digest::status_ref(&toolledger_contract::Scope {
                tenant_id: tenant.clone(),
                subject_id: subject.clone(),
                tool_name: tool.name.clone(),
                idempotency_key: call.host.idempotency_key.clone(),
            }) == *status_ref;
            if own && self.store.retired(status_ref)? {
                return Ok(block(BlockCode::KeyRetired, None));
            }
            return Ok(block(BlockCode::NotFound, None));
        };
        if operation.intent.scope.tenant_id != *tenant
            || operation.intent.scope.subject_id != *subject
        {
            return Ok(block(BlockCode::NotFound, None));
        }
        self.check_stored_arguments(&operation)?;
        if operation.intent.downstream
            != *self.downstream.identity_for(&operation.intent.scope.tool_name)
        {
            return Ok(block(BlockCode::DownstreamMismatch, Some(&operation)));
        }
        self.answer_query(&operation, tool, &asking, &identity, call.clock.now, Some(call))
    }

    /// The explicit status query of a host that holds only the operation's ref: the
    /// principal asking, the asking call's own identity (the query stays a
    /// purpose-bound call of its own) and the business context its rules judge
    /// (`null` when they consult the host's own systems). The tool, the arguments and
    /// the approval come from the ledger; the principal must be the one whose scope it
    /// is, and is authorized again, with the roles it holds now.
    ///
    /// A key removed by retention answers `NOT_FOUND` here: without the key, the ledger
    /// cannot tell whose tombstone it is.
    ///
    /// # Errors
    ///
    /// As [`Engine::status`].
    pub fn status_by_ref(
        &mut self,
        asking: &Asking<'_>,
        status_ref: &StatusRef,
    ) -> Result<Answer, EngineError> {
        let Some(operation) = self.store.operation_by_status_ref(status_ref)? else {
            return Ok(block(BlockCode::NotFound, None));
        };
        let intent = &operation.intent;
        if intent.scope.tenant_id != *asking.tenant_id
            || intent.scope.subject_id != *asking.subject_id
        {
            return Ok(block(BlockCode::NotFound, None));
        }
        let registry = Arc::clone(&self.registry);
        let Some(tool) = registry.tool(&intent.scope.tool_name) else {
            return Ok(block(BlockCode::ContractDrift, Some(&operation)));
        };
        if tool.revisions != intent.revisions {
            return Ok(block(BlockCode::ContractDrift, Some(&operation)));
        }
        self.check_stored_arguments(&operation)?;
        let judged = crate::Judged {
            tenant_id: asking.tenant_id,
            subject_id: asking.subject_id,
            arguments: &intent.arguments,
            context: asking.context,
        };
        if !self.authorize(tool, &judged)?.1 {
            return Ok(block(BlockCode::NotFound, None));
        }
        if intent.downstream != *self.downstream.identity_for(&intent.scope.tool_name) {
            return Ok(block(BlockCode::DownstreamMismatch, Some(&operation)));
        }
        let identity = query_identity(asking.call, status_ref);
        self.answer_query(&operation, tool, asking.call, &identity, asking.now, None)
    }

    /// A status query's steps once the operation is known to be the asker's: one model
    /// call is one intent, the derived identity recorded, then the downstream asked.
    fn answer_query(
        &mut self,
        operation: &toolledger_store::Operation,
        tool: &toolledger_contract::ToolSpec,
        asking: &CallIdentity,
        identity: &CallIdentity,
        now: toolledger_contract::UnixSeconds,
        intent_check: Option<&HostCall>,
    ) -> Result<Answer, EngineError> {
        let status_ref = &operation.intent.status_ref;
        let (tenant, subject) =
            (&operation.intent.scope.tenant_id, &operation.intent.scope.subject_id);
        // The model call asking is one intent too: if it already dispatched another
        // operation, it may not query this one.
        if let Some(recorded) = self.store.recorded_call(asking)? {
            if recorded.purpose == Purpose::Dispatch && recorded.status_ref != *status_ref {
                return Ok(call_reused(&recorded, tenant, subject));
            }
        }
        if let Some(recorded) = self.store.record_status_query(identity, status_ref, now)? {
            if recorded.purpose != Purpose::QueryStatus {
                return Ok(block(BlockCode::CallPurposeConflict, None));
            }
            if recorded.status_ref != *status_ref {
                return Ok(call_reused(&recorded, tenant, subject));
            }
        }
        if let Some(call) = intent_check {
            if !same_intent(&operation.intent, tool, call) {
                return Ok(block(BlockCode::IdempotencyConflict, Some(operation)));
            }
        }
        let answering = Answering {
            response: &identity.provider_response_id,
            call: &identity.provider_call_id,
            purpose: Purpose::QueryStatus,
        };
        match operation.status {
            OperationStatus::Succeeded => return self.replay(operation, &answering),
            OperationStatus::Failed | OperationStatus::Quarantined | OperationStatus::Dead => {
                return Ok(ended(operation));
            }
            OperationStatus::Pending | OperationStatus::Processing => {}
        }
        // Whichever way the operation ends (by this query or a racer), the answer is
        // what the ledger says afterwards.
        match self.downstream.lookup(&request_of(operation)) {
            Ok(Lookup::Done(receipt)) => match check_receipt(operation, tool, receipt.clone())? {
                Checked::Valid(local) => {
                    let by = Finalizer::StatusQuery;
                    let ending = Ending::Succeeded(&local);
                    if self.store.end(status_ref, &by, &ending, now)? == Finalize::Finalized {
                        return Ok(pass(
                            Delivery::ReceiptReconciled,
                            operation,
                            &local,
                            &answering,
                        ));
                    }
                }
                Checked::Broken(reason) => {
                    let by = Finalizer::StatusQuery;
                    let broken = Ending::Quarantined { receipt: &receipt.receipt_json, reason };
                    self.store.end(status_ref, &by, &broken, now)?;
                }
            },
            Ok(Lookup::Refused { reason }) => {
                self.store.end(
                    status_ref,
                    &Finalizer::StatusQuery,
                    &Ending::Failed(&reason),
                    now,
                )?;
            }
            Err(crate::DownstreamError::Conflict) => {
                let kept = crate::worker::conflict_kept(operation);
                let reason = crate::worker::CONFLICT_REASON;
                let broken = Ending::Quarantined { receipt: &kept, reason };
                self.store.end(status_ref, &Finalizer::StatusQuery, &broken, now)?;
            }
            // No record, or the downstream cannot be asked: still unknown.
            Ok(Lookup::NotFound) | Err(_) => {
                return Ok(block(BlockCode::OutcomeUnknown, Some(operation)));
            }
        }
        let operation = self.reread(status_ref)?;
        match operation.status {
            OperationStatus::Succeeded => self.replay_read(operation, &answering),
            OperationStatus::Failed | OperationStatus::Quarantined | OperationStatus::Dead => {
                Ok(ended(&operation))
            }
            OperationStatus::Pending | OperationStatus::Processing => {
                Ok(block(BlockCode::OutcomeUnknown, Some(&operation)))
            }
        }
    }
}
