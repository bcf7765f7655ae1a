//! The explicit, purpose-bound status query: the only way an unknown outcome is settled.

use std::sync::Arc;

use toolledger_contract::{
    BlockCode, Case, Delivery, PrincipalResolver, Purpose, StatusRef,
    digest::{StatusQueryPart, request_sha256, status_query_id},
};
use toolledger_store::{CallIdentity, Finalize, Finalizer, LedgerStore, OperationStatus};

use crate::{
    Downstream, Engine, EngineError, Lookup,
    answers::{Answer, Answering, block, call_reused, pass},
    dispatch::{call_of, ended, same_intent},
    worker::{Checked, check_receipt, request_of},
};

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
    pub fn status(&mut self, case: &Case, status_ref: &StatusRef) -> Result<Answer, EngineError> {
        let registry = Arc::clone(&self.registry);
        let tool = match self.admit(&registry, case)? {
            Ok((tool, _)) => tool,
            Err(refused) => return Ok(refused),
        };
        let (tenant, subject) = (&case.principal.tenant_id, &case.principal.subject_id);
        // The host-owned identity this query answers under: derived, never reusable for
        // a dispatch.
        let identity = CallIdentity {
            profile: case.host.profile.clone(),
            provider_response_id: status_query_id(
                StatusQueryPart::Response,
                &case.host.provider_response_id,
                status_ref,
            ),
            provider_call_id: status_query_id(
                StatusQueryPart::Call,
                &case.host.provider_call_id,
                status_ref,
            ),
        };
        let Some(operation) = self.store.operation_by_status_ref(status_ref)? else {
            // Removed by retention: said so to the principal whose scope it was.
            let own = toolledger_contract::digest::status_ref(&toolledger_contract::Scope {
                tenant_id: tenant.clone(),
                subject_id: subject.clone(),
                tool_name: tool.name.clone(),
                idempotency_key: case.host.idempotency_key.clone(),
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
        if operation.intent.downstream != *self.downstream.identity() {
            return Ok(block(BlockCode::DownstreamMismatch, Some(&operation)));
        }
        // The model call asking is one intent too: if it already dispatched another
        // operation, it may not query this one.
        if let Some(recorded) = self.store.recorded_call(&call_of(case))? {
            if recorded.purpose == Purpose::Dispatch && recorded.status_ref != *status_ref {
                return Ok(call_reused(&recorded, tenant, subject));
            }
        }
        if let Some(recorded) =
            self.store.record_status_query(&identity, status_ref, case.clock.now)?
        {
            if recorded.purpose != Purpose::QueryStatus {
                return Ok(block(BlockCode::CallPurposeConflict, None));
            }
            if recorded.status_ref != *status_ref {
                return Ok(call_reused(&recorded, tenant, subject));
            }
        }
        let expected_request =
            request_sha256(tenant, subject, &tool.name, &case.proposal.arguments, &tool.revisions);
        if !same_intent(&operation.intent, &expected_request, tool, case) {
            return Ok(block(BlockCode::IdempotencyConflict, Some(&operation)));
        }
        let answering = Answering {
            response: &identity.provider_response_id,
            call: &identity.provider_call_id,
            purpose: Purpose::QueryStatus,
        };
        match operation.status {
            OperationStatus::Succeeded => return self.replay(&operation, &answering),
            OperationStatus::Failed | OperationStatus::Quarantined | OperationStatus::Dead => {
                return Ok(ended(&operation));
            }
            OperationStatus::Pending | OperationStatus::Processing => {}
        }
        let now = case.clock.now;
        // Whichever way the operation ends (by this query or a racer), the answer is
        // what the ledger says afterwards.
        match self.downstream.lookup(&request_of(&operation)) {
            Ok(Lookup::Done(receipt)) => match check_receipt(&operation, tool, receipt.clone())? {
                Checked::Valid(local) => {
                    let by = Finalizer::StatusQuery;
                    if self.store.finalize(status_ref, &by, &local, now)? == Finalize::Finalized {
                        return Ok(pass(
                            Delivery::ReceiptReconciled,
                            &operation,
                            &local,
                            &answering,
                        ));
                    }
                }
                Checked::Broken(reason) => {
                    let by = Finalizer::StatusQuery;
                    self.store.quarantine(status_ref, &by, &receipt.receipt, reason, now)?;
                }
            },
            Ok(Lookup::Refused { reason }) => {
                self.store.fail(status_ref, &Finalizer::StatusQuery, &reason, now)?;
            }
            Err(crate::DownstreamError::Conflict) => {
                let kept = crate::worker::conflict_kept(&operation);
                let reason = crate::worker::CONFLICT_REASON;
                self.store.quarantine(status_ref, &Finalizer::StatusQuery, &kept, reason, now)?;
            }
            // No record, or the downstream cannot be asked: still unknown.
            Ok(Lookup::NotFound) | Err(_) => {
                return Ok(block(BlockCode::OutcomeUnknown, Some(&operation)));
            }
        }
        let operation = self.reread(status_ref)?;
        match operation.status {
            OperationStatus::Succeeded => self.replay(&operation, &answering),
            OperationStatus::Failed | OperationStatus::Quarantined | OperationStatus::Dead => {
                Ok(ended(&operation))
            }
            OperationStatus::Pending | OperationStatus::Processing => {
                Ok(block(BlockCode::OutcomeUnknown, Some(&operation)))
            }
        }
    }
}
