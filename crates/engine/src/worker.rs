//! The directed worker (`process`), and the steps it shares with dispatch: claim the
//! lease, recheck the contract, authorization and business state, call the downstream,
//! and end the operation one way or another (commit C).

use std::sync::Arc;

use serde_json::Value;
use toolledger_contract::{
    ApprovalValidAt, BlockCode, Clock, Delivery, Identifier, PrincipalResolver, StatusRef,
    ToolSpec, Verdict,
    digest::{request_sha256, result_sha256, short_ref_of_canonical},
};
use toolledger_json::{Limits, is_canonical_v2};
use toolledger_store::{
    Claim, Claimed, DownstreamReceipt, Ending, Finalize, Finalizer, LedgerStore, LocalReceipt,
    NewOperation, Operation, OperationStatus, Release, StoreError,
};

use crate::{
    Caller, Downstream, DownstreamError, DownstreamRequest, Engine, EngineError, Judged, Lookup,
    answers::{Answer, Answering, block, pass, pass_read, violation},
    dispatch::ended,
};

/// What a downstream receipt proves once checked.
pub(crate) enum Checked {
    /// It is bound to the operation and keeps the output contract.
    Valid(LocalReceipt),
    /// It is bound to the operation but its output breaks the contract: quarantine it.
    Broken(&'static str),
}

/// Checks a downstream receipt against the operation and the output contract (schema
/// and input binding) before it may become a local receipt. A receipt of another
/// request is a contract violation (the downstream is not idempotent on its scope).
pub(crate) fn check_receipt(
    operation: &Operation,
    tool: &ToolSpec,
    receipt: DownstreamReceipt,
) -> Result<Checked, EngineError> {
    // The ledger writes the receipt's text as it comes, and its ref names that text: a
    // receipt built by hand must hold both as `DownstreamReceipt::new` makes them, or a
    // success would be answered that every later read refuses.
    if !is_canonical_v2(&receipt.receipt_json, &Limits::default())
        || short_ref_of_canonical("rc_", &receipt.receipt_json) != receipt.receipt_ref.as_str()
    {
        return Err(violation("the downstream receipt is not its own canonical text"));
    }
    let intent = &operation.intent;
    let object = receipt.receipt();
    let text = |name: &str| object.get(name).and_then(Value::as_str);
    if receipt.request_sha256 != intent.request_sha256
        || receipt.downstream_request_ref != operation.downstream_request_ref
        || text("tool_name") != Some(tool.name.as_str())
        || text("output_revision") != Some(intent.revisions.output.as_str())
    {
        return Err(violation("the downstream receipt is not bound to the operation"));
    }
    let output = match object {
        Value::Object(mut members) => members.remove("output").unwrap_or(Value::Null),
        _ => Value::Null,
    };
    if let Err(broken) = tool.output.validate(&output, Some(&intent.arguments)) {
        return Ok(Checked::Broken(if broken.is_binding() {
            BINDING_REASON
        } else {
            OUTPUT_SCHEMA_REASON
        }));
    }
    let result = result_sha256(&tool.name, &intent.revisions.output, &output);
    Ok(Checked::Valid(LocalReceipt { downstream: receipt, output, result_sha256: result }))
}

/// The request the downstream is asked to perform (or asked about), from the ledger.
pub(crate) fn request_of(operation: &Operation) -> DownstreamRequest {
    let intent = &operation.intent;
    DownstreamRequest {
        downstream_request_ref: operation.downstream_request_ref.clone(),
        request_sha256: intent.request_sha256.clone(),
        tool_name: intent.scope.tool_name.clone(),
        output_revision: intent.revisions.output.clone(),
        arguments: intent.arguments.clone(),
    }
}

impl<S: LedgerStore, D: Downstream, R: PrincipalResolver> Engine<S, D, R> {
    /// Works the operation named by `status_ref`: the directed worker. Reads only the
    /// instant, the lease length and the business context from its caller: tenant,
    /// subject and arguments come from the ledger.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the store fails before the lease is claimed. After the claim
    /// no error is returned: a failure is `OUTCOME_UNKNOWN`.
    pub fn process(
        &mut self,
        status_ref: &StatusRef,
        clock: &Clock,
        context: &Value,
        worker: &Identifier,
    ) -> Result<Answer, EngineError> {
        self.work(status_ref, clock, context, worker, Caller::Worker, None)
    }

    /// Claims and works the operation. Dispatch's in-process worker starts from the
    /// operation it has just reserved; `process` reads it.
    pub(crate) fn work(
        &mut self,
        status_ref: &StatusRef,
        clock: &Clock,
        context: &Value,
        worker: &Identifier,
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
        if operation.intent.downstream
            != *self.downstream.identity_for(&operation.intent.scope.tool_name)
        {
            return Ok(block(BlockCode::DownstreamMismatch, Some(operation)));
        }
        match operation.status {
            OperationStatus::Succeeded => return self.worker_replay(operation, context),
            OperationStatus::Failed | OperationStatus::Quarantined | OperationStatus::Dead => {
                return Ok(ended(operation));
            }
            OperationStatus::Pending | OperationStatus::Processing => {}
        }
        let (attempt, reclaimed, claimed) =
            match self.store.claim(status_ref, worker, clock.now, clock.lease_seconds)? {
                Claim::Claimed(claimed) => {
                    let Claimed { attempt, reclaimed, operation } = *claimed;
                    (attempt, reclaimed, operation)
                }
                Claim::LeaseHeld if caller == Caller::Dispatch => {
                    return Ok(block(BlockCode::OutcomeUnknown, Some(operation)));
                }
                Claim::LeaseHeld => return Ok(block(BlockCode::LeaseHeld, Some(operation))),
                Claim::Final => return self.reread_and_answer(status_ref, context),
                Claim::Missing => return Ok(block(BlockCode::NotFound, None)),
            };
        // This call now holds the lease, and may be about to cause the side effect: from
        // here on a failure of the store, the resolver or the downstream is answered
        // OUTCOME_UNKNOWN with the operation's ref, never as an error.
        let lease = Lease { owner: worker, attempt, caller, reclaimed };
        let worked = self.work_claimed(status_ref, &claimed, &lease, clock, context);
        Ok(worked.unwrap_or_else(|_| block(BlockCode::OutcomeUnknown, Some(&claimed))))
    }

    /// The worker's steps after its claim: rechecks, the downstream, commit C.
    pub(crate) fn work_claimed(
        &mut self,
        status_ref: &StatusRef,
        claimed: &Operation,
        lease: &Lease<'_>,
        clock: &Clock,
        context: &Value,
    ) -> Result<Answer, EngineError> {
        let operation = claimed;
        match self.recheck(operation, context, clock.now)? {
            Recheck::Send => {}
            Recheck::Refused(refused) => return Ok(refused),
            Recheck::Unsent(unsent) => {
                return self.conclude(status_ref, operation, lease, Err(unsent), clock, context);
            }
        }
        let finalizer = Finalizer::Lease(lease.fenced());
        // A lease taken over from a worker that vanished: its attempt may have acted, so
        // the downstream is asked first. Only "no record of it" lets this attempt send:
        // otherwise a later "not sent" would bury as dead what may have happened.
        let receipt = if lease.reclaimed {
            match self.downstream.lookup(&request_of(operation)) {
                Ok(Lookup::Done(receipt)) => Some(receipt),
                Ok(Lookup::Refused { reason }) => {
                    let refused = Ending::Failed(&reason);
                    let ending = self.store.end(status_ref, &finalizer, &refused, clock.now)?;
                    return self.after_ending(ending, status_ref, lease.caller, context);
                }
                Ok(Lookup::NotFound) => None,
                Err(DownstreamError::Conflict) => {
                    return self.conflicted(operation, &finalizer, lease, clock, context);
                }
                Err(_) => return Ok(block(BlockCode::OutcomeUnknown, Some(operation))),
            }
        } else {
            None
        };
        let executed = match receipt {
            Some(receipt) => Ok(receipt),
            None => self.downstream.execute(&request_of(operation), clock.now),
        };
        self.conclude(status_ref, operation, lease, executed, clock, context)
    }

    /// What the worker does with the downstream's answer: give the lease back (not sent),
    /// end the operation failed (refused), leave it unknown, or check the receipt and end
    /// it succeeded — or quarantined when it breaks the output contract.
    pub(crate) fn conclude(
        &mut self,
        status_ref: &StatusRef,
        operation: &Operation,
        lease: &Lease<'_>,
        executed: Result<DownstreamReceipt, DownstreamError>,
        clock: &Clock,
        context: &Value,
    ) -> Result<Answer, EngineError> {
        let registry = Arc::clone(&self.registry);
        let Some(tool) = registry.tool(&operation.intent.scope.tool_name) else {
            return Ok(block(BlockCode::ContractDrift, Some(operation)));
        };
        let finalizer = Finalizer::Lease(lease.fenced());
        let receipt = match executed {
            Ok(receipt) => receipt,
            Err(DownstreamError::NotSent { reason }) => {
                // Certainly not sent: give the lease back, so the operation can be worked
                // again — at once for a directed worker, after a backoff for a relay, and
                // never again once the tool's attempts are spent.
                let release = match lease.caller {
                    Caller::Relay(_)
                        if lease.attempt - operation.outbox.attempts_before
                            >= i64::from(tool.max_attempts) =>
                    {
                        Release::Dead { reason: &reason }
                    }
                    Caller::Relay(backoff) => Release::Retry {
                        at: backoff.due(status_ref, lease.attempt, clock.now),
                        reason: &reason,
                    },
                    Caller::Dispatch | Caller::Worker => {
                        Release::Retry { at: clock.now, reason: &reason }
                    }
                };
                return match self.store.release(status_ref, &lease.fenced(), &release, clock.now)? {
                    Finalize::Finalized => {
                        let released = self.reread(status_ref)?;
                        Ok(block(BlockCode::DownstreamUnavailable, Some(&released)))
                    }
                    Finalize::AlreadyFinal => self.reread_and_answer(status_ref, context),
                    Finalize::LeaseLost => self.lease_lost(status_ref, lease.caller),
                };
            }
            Err(DownstreamError::Refused { reason }) => {
                let refused = Ending::Failed(&reason);
                let ending = self.store.end(status_ref, &finalizer, &refused, clock.now)?;
                return self.after_ending(ending, status_ref, lease.caller, context);
            }
            Err(DownstreamError::Unknown { .. }) => {
                return Ok(block(BlockCode::OutcomeUnknown, Some(operation)));
            }
            Err(DownstreamError::Conflict) => {
                return self.conflicted(operation, &finalizer, lease, clock, context);
            }
        };
        match check_receipt(operation, tool, receipt.clone())? {
            Checked::Valid(local) => {
                let succeeded = if self.downstream.can_look_up(&tool.name) {
                    Ending::Succeeded(&local)
                } else {
                    Ending::SucceededSynced(&local)
                };
                match self.store.end(status_ref, &finalizer, &succeeded, clock.now)? {
                    Finalize::Finalized => Ok(pass(
                        Delivery::Fresh,
                        operation,
                        &local,
                        &Answering::first_call(operation),
                    )),
                    Finalize::AlreadyFinal => self.reread_and_answer(status_ref, context),
                    Finalize::LeaseLost => self.lease_lost(status_ref, lease.caller),
                }
            }
            Checked::Broken(reason) => {
                let broken = Ending::Quarantined { receipt: &receipt.receipt_json, reason };
                let ending = self.store.end(status_ref, &finalizer, &broken, clock.now)?;
                self.after_ending(ending, status_ref, lease.caller, context)
            }
        }
    }

    /// The worker's rechecks right before the side effect, on the operation as its
    /// claim read it back (every stored digest, the approval's included, recomputed from
    /// the ledger): the contract's revisions, the principal's current authorization, the
    /// business state. `Some` refusal, or `None` when the downstream may be asked.
    pub(crate) fn recheck(
        &mut self,
        operation: &Operation,
        context: &Value,
        now: toolledger_contract::UnixSeconds,
    ) -> Result<Recheck, EngineError> {
        self.check_stored_arguments(operation)?;
        let intent = &operation.intent;
        let registry = Arc::clone(&self.registry);
        let Some(tool) = registry.tool(&intent.scope.tool_name) else {
            return Ok(Recheck::Refused(block(BlockCode::ContractDrift, Some(operation))));
        };
        let current_request = request_sha256(
            &intent.scope.tenant_id,
            &intent.scope.subject_id,
            &tool.name,
            &intent.arguments,
            &tool.revisions,
        );
        if tool.revisions != intent.revisions || current_request != intent.request_sha256 {
            return Ok(Recheck::Refused(block(BlockCode::ContractDrift, Some(operation))));
        }
        // A definition may ask for the approval to be valid at the side effect too: one
        // that expired while the event waited ends the operation, with nothing sent.
        if tool.approval.valid_at == ApprovalValidAt::Effect
            && intent.approval.as_ref().is_some_and(|approval| now >= approval.expires_at)
        {
            let reason = APPROVAL_EXPIRED_REASON.to_owned();
            return Ok(Recheck::Unsent(DownstreamError::Refused { reason }));
        }
        let judged = judged(intent, context);
        let (roles, allowed) = self.authorize(tool, &judged)?;
        if !allowed {
            return Ok(Recheck::Refused(block(BlockCode::AuthorizationDenied, Some(operation))));
        }
        match judged.precondition(tool, &roles) {
            Verdict::Allow => {}
            Verdict::Refuse { .. } => {
                return Ok(Recheck::Refused(block(
                    BlockCode::BusinessStateInvalid,
                    Some(operation),
                )));
            }
            Verdict::Unavailable { reason } => {
                return Ok(Recheck::Unsent(DownstreamError::NotSent { reason }));
            }
        }
        Ok(Recheck::Send)
    }

    /// The answer after this worker tried to end the operation as failed or
    /// quarantined.
    /// The downstream holds a different request under the operation's key: the
    /// operation ends quarantined (see [`conflict_kept`]).
    fn conflicted(
        &mut self,
        operation: &Operation,
        finalizer: &Finalizer,
        lease: &Lease<'_>,
        clock: &Clock,
        context: &Value,
    ) -> Result<Answer, EngineError> {
        let status_ref = &operation.intent.status_ref;
        let kept = conflict_kept(operation);
        let broken = Ending::Quarantined { receipt: &kept, reason: CONFLICT_REASON };
        let ending = self.store.end(status_ref, finalizer, &broken, clock.now)?;
        self.after_ending(ending, status_ref, lease.caller, context)
    }

    pub(crate) fn after_ending(
        &mut self,
        ending: Finalize,
        status_ref: &StatusRef,
        caller: Caller,
        context: &Value,
    ) -> Result<Answer, EngineError> {
        match ending {
            Finalize::Finalized | Finalize::AlreadyFinal => {
                self.reread_and_answer(status_ref, context)
            }
            Finalize::LeaseLost => self.lease_lost(status_ref, caller),
        }
    }

    /// Another worker took the lease over while this one worked.
    fn lease_lost(
        &mut self,
        status_ref: &StatusRef,
        caller: Caller,
    ) -> Result<Answer, EngineError> {
        let operation = self.reread(status_ref)?;
        let code = match caller {
            Caller::Dispatch => BlockCode::OutcomeUnknown,
            Caller::Worker | Caller::Relay(_) => BlockCode::LeaseHeld,
        };
        Ok(block(code, Some(&operation)))
    }

    pub(crate) fn reread(&mut self, status_ref: &StatusRef) -> Result<Operation, EngineError> {
        self.store
            .operation_by_status_ref(status_ref)?
            .ok_or(EngineError::Store(StoreError::Internal("the operation vanished")))
    }

    /// The operation has ended: a worker answers how, re-authorizing a success first.
    fn reread_and_answer(
        &mut self,
        status_ref: &StatusRef,
        context: &Value,
    ) -> Result<Answer, EngineError> {
        let operation = self.reread(status_ref)?;
        match operation.status {
            OperationStatus::Succeeded => self.worker_replay(&operation, context),
            OperationStatus::Failed | OperationStatus::Quarantined | OperationStatus::Dead => {
                Ok(ended(&operation))
            }
            OperationStatus::Pending | OperationStatus::Processing => {
                Ok(block(BlockCode::OutcomeUnknown, Some(&operation)))
            }
        }
    }

    /// A worker meeting a finished operation re-authorizes, then answers `local_replay`
    /// with the ledger's first call ids and purpose `dispatch`.
    fn worker_replay(
        &mut self,
        operation: &Operation,
        context: &Value,
    ) -> Result<Answer, EngineError> {
        let intent = &operation.intent;
        let registry = Arc::clone(&self.registry);
        let Some(tool) = registry.tool(&intent.scope.tool_name) else {
            return Ok(block(BlockCode::ContractDrift, Some(operation)));
        };
        if !self.authorize(tool, &judged(intent, context))?.1 {
            return Ok(block(BlockCode::AuthorizationDenied, Some(operation)));
        }
        self.replay(operation, &Answering::first_call(operation))
    }

    pub(crate) fn replay(
        &mut self,
        operation: &Operation,
        answering: &Answering<'_>,
    ) -> Result<Answer, EngineError> {
        let receipt = operation.receipt.as_ref().ok_or(violation(NO_LOCAL_RECEIPT))?;
        self.check_output(&operation.intent, &receipt.output)?;
        Ok(pass(Delivery::LocalReplay, operation, receipt, answering))
    }

    /// [`Engine::replay`] of an operation read only to be answered: the package takes
    /// its strings and output instead of copies.
    pub(crate) fn replay_read(
        &mut self,
        operation: Operation,
        answering: &Answering<'_>,
    ) -> Result<Answer, EngineError> {
        let Operation { intent, receipt, .. } = operation;
        let receipt = receipt.ok_or(violation(NO_LOCAL_RECEIPT))?;
        self.check_output(&intent, &receipt.output)?;
        Ok(pass_read(Delivery::LocalReplay, intent, receipt, answering))
    }

    /// Stored arguments that fail the input schema of their own revision contradict the
    /// row: `STORE_CONTRACT_VIOLATION`. (A row whose revision is not the current one is
    /// drift, judged by each flow.)
    pub(crate) fn check_stored_arguments(&self, operation: &Operation) -> Result<(), EngineError> {
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
    fn check_output(&self, intent: &NewOperation, output: &Value) -> Result<(), EngineError> {
        match self.registry.tool(&intent.scope.tool_name) {
            Some(tool) if tool.revisions.output == intent.revisions.output => tool
                .output
                .validate(output, Some(&intent.arguments))
                .map_err(|_| violation("stored output fails the output contract")),
            _ => Ok(()),
        }
    }
}

/// What the worker's rechecks decided.
pub(crate) enum Recheck {
    /// The downstream may be asked.
    Send,
    /// Refused before the downstream (drift, authorization, business state).
    Refused(Answer),
    /// Stopped before the downstream, nothing sent: `NotSent` when the business
    /// precondition could not be asked (tried again later), `Refused` when the request
    /// may never be sent (the operation ends `failed` with the reason).
    Unsent(DownstreamError),
}

/// What a replay of a `succeeded` operation without its local receipt answers.
const NO_LOCAL_RECEIPT: &str = "a succeeded operation has no local receipt";

/// Why an operation whose approval had to be valid at the side effect ended.
pub(crate) const APPROVAL_EXPIRED_REASON: &str =
    "the approval expired before the side effect; nothing was sent";

/// The worker's lease: its fencing token, and who it works for.
pub(crate) struct Lease<'a> {
    pub(crate) owner: &'a Identifier,
    pub(crate) attempt: i64,
    pub(crate) caller: Caller,
    /// The claim took over an ended lease: an earlier attempt may have acted.
    pub(crate) reclaimed: bool,
}

impl Lease<'_> {
    /// The lease as the store fences a write under it: owner and attempt.
    pub(crate) fn fenced(&self) -> toolledger_store::Lease {
        toolledger_store::Lease { owner: self.owner.clone(), attempt: self.attempt }
    }
}

/// The stored intent as the rules judge it: tenant, subject and arguments from the
/// ledger, never from the caller.
fn judged<'a>(intent: &'a NewOperation, context: &'a Value) -> Judged<'a> {
    Judged {
        tenant_id: &intent.scope.tenant_id,
        subject_id: &intent.scope.subject_id,
        arguments: &intent.arguments,
        context,
    }
}

/// Why an operation whose key the downstream holds for another request is quarantined.
pub(crate) const CONFLICT_REASON: &str =
    "the downstream holds a different request under this operation's key";

/// Why a receipt that breaks the tool's output schema is quarantined.
pub(crate) const OUTPUT_SCHEMA_REASON: &str =
    "the receipt's output breaks the tool's output schema";

/// Why a receipt whose output differs from the arguments it is bound to is quarantined.
pub(crate) const BINDING_REASON: &str =
    "the receipt's output is not bound to the request's arguments";

/// The stable kind of a quarantine's reason, as BLOCK packages name it:
/// `fingerprint_conflict` (the service holds another request under the key),
/// `output_schema`, `input_binding`, or `contract_broken` for any other reason.
pub(crate) fn quarantine_kind(reason: &str) -> &'static str {
    match reason {
        CONFLICT_REASON => "fingerprint_conflict",
        OUTPUT_SCHEMA_REASON => "output_schema",
        BINDING_REASON => "input_binding",
        _ => "contract_broken",
    }
}

/// What a quarantine keeps when the downstream answered a conflict: the key it holds
/// for another request. No retry can change it and nothing may send the intent under
/// another key: an operator decides. As canonical JSON text, as every kept receipt.
pub(crate) fn conflict_kept(operation: &Operation) -> String {
    toolledger_json::canonicalize(
        &serde_json::json!({"downstream_conflict": operation.downstream_request_ref.as_str()}),
    )
}
