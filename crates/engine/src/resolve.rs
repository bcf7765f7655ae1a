//! An operator settling by hand what no status query could: the downstream's result
//! they found (checked as a downstream's own would be), or that it did not happen.

use std::sync::Arc;

use serde_json::Value;
use toolledger_contract::{PrincipalResolver, StatusRef, UnixSeconds};
use toolledger_store::{LedgerStore, OperatorStore, Resolved, Settlement};

use crate::{
    Downstream, Engine, EngineError,
    worker::{Checked, check_receipt, request_of},
};

/// What the operator found became of an operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Evidence {
    /// It happened, and this is the downstream's result (the tool's output).
    Output(Value),
    /// It did not happen.
    NotHappened,
}

/// What [`Engine::resolve`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The store's answer: settled, or why not ([`Resolved`]).
    Store(Resolved),
    /// The result breaks the tool's output contract (the reason): nothing written.
    OutputInvalid(&'static str),
    /// The tool's contract changed since the operation was accepted (or the tool is no
    /// longer configured): its result cannot be checked, so nothing written.
    ContractDrift,
}

impl<S: LedgerStore + OperatorStore, D: Downstream, R: PrincipalResolver> Engine<S, D, R> {
    /// Settles the operation named by `status_ref` on the operator's `evidence`, with
    /// their `reason`, at `now`: a result is checked against the operation and the tool's
    /// output contract exactly as a downstream's receipt is, then written as commit C by
    /// the operator; "not happened" ends it `failed`. Both are logged in the operator
    /// log, in the same transaction; an operation that ended, or that a worker holds
    /// under a live lease, is left alone.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when the store fails; nothing is then written.
    pub fn resolve(
        &mut self,
        status_ref: &StatusRef,
        evidence: &Evidence,
        reason: &str,
        now: UnixSeconds,
    ) -> Result<Resolution, EngineError> {
        let Some(operation) = self.store.operation_by_status_ref(status_ref)? else {
            return Ok(Resolution::Store(Resolved::Missing));
        };
        let settlement = match evidence {
            Evidence::NotHappened => Settlement::NotHappened,
            Evidence::Output(output) => {
                let registry = Arc::clone(&self.registry);
                let Some(tool) = registry.tool(&operation.intent.scope.tool_name) else {
                    return Ok(Resolution::ContractDrift);
                };
                if tool.revisions != operation.intent.revisions {
                    return Ok(Resolution::ContractDrift);
                }
                let receipt = request_of(&operation).receipt(output.clone());
                match check_receipt(&operation, tool, receipt)? {
                    Checked::Valid(local) => Settlement::Receipt(local),
                    Checked::Broken(reason) => return Ok(Resolution::OutputInvalid(reason)),
                }
            }
        };
        Ok(Resolution::Store(self.store.resolve(status_ref, &settlement, reason, now)?))
    }
}
