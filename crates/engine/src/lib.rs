//! toolledger's flows: `dispatch` (and `enqueue`), the directed worker `process`, the
//! explicit status query `status`, a relay's batch (`relay_batch`) and an operator's
//! settlement (`resolve`).
//!
//! The [`Engine`] drives a [`LedgerStore`] (the ledger), a [`Downstream`] (where the side
//! effect happens) and a [`PrincipalResolver`] (the *current* roles, asked at every
//! check). Each tool's [`ToolRules`](toolledger_contract::ToolRules) judge authorization,
//! the business precondition and the approval policy. The engine reads no clock: every
//! instant is handed in (a call's clock, a relay's or an operator's instant). It never
//! turns an unknown outcome into a success, and once an intent is accepted in a call, no
//! failure is answered as an error.
//!
//! Answers are [`Answer`]s (PASS or BLOCK packages); [`EngineError`] is for what is not
//! a business answer (the resolver or the store failed before anything was accepted).
//! Opening a ledger (a SQLite file or a PostgreSQL database) and rendering the audit
//! belong to the composition root, the `toolledger` facade; the command line reaches
//! both through it.
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod answers;
mod dispatch;
mod downstream;
mod error;
mod relay;
mod resolve;
mod status;
mod worker;

use std::sync::Arc;

use serde_json::Value;
use toolledger_contract::{Identifier, PrincipalResolver, Registry, RuleCall, ToolSpec, Verdict};
use toolledger_store::LedgerStore;
pub use toolledger_store::{DEFAULT_BUSY_TIMEOUT_MS, Waits};

pub use crate::{
    answers::{Answer, input_invalid},
    downstream::{
        AsyncDownstream, Downstream, DownstreamError, DownstreamRequest, Faults, Lookup, StandIn,
        StandInReceipts, drill, reserved_identity, simulated_refund,
    },
    error::EngineError,
    relay::{Backoff, Drained},
    resolve::{Evidence, Resolution},
    status::Asking,
};

/// Who is working an operation: it decides how a lost lease is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// Dispatch's in-process worker, right after its own commit A: anything short of a
    /// receipt is `OUTCOME_UNKNOWN` to the model's host.
    Dispatch,
    /// The directed worker `process`: a lease another worker holds is `LEASE_HELD`; a
    /// request not sent is pending again at once.
    Worker,
    /// A relay draining the outbox: a request not sent is retried after a backoff, and
    /// dead once the tool's attempts are spent.
    Relay(Backoff),
}

/// toolledger's flows over a store, a downstream and a principal resolver.
#[derive(Debug)]
pub struct Engine<S, D, R> {
    store: S,
    downstream: D,
    resolver: R,
    registry: Arc<Registry>,
}

impl<S: LedgerStore, D: Downstream, R: PrincipalResolver> Engine<S, D, R> {
    /// An engine over these parts. `registry` is the *current* contract (a
    /// [`Registry`], or one shared by several engines).
    pub fn new(
        store: S,
        downstream: D,
        resolver: R,
        registry: impl Into<Arc<Registry>>,
    ) -> Engine<S, D, R> {
        Engine { store, downstream, resolver, registry: registry.into() }
    }

    /// The store back, once the engine's work is done: a ledger shared by many callers
    /// gives each call an engine over a connection of its own, borrowing the downstream
    /// and the resolver, and keeps the connection for the next call.
    pub fn into_store(self) -> S {
        self.store
    }

    /// The ledger, for callers that read it directly (tests, tools).
    pub fn store(&mut self) -> &mut S {
        &mut self.store
    }

    /// The downstream (a drill's switch, a test's counters).
    pub fn downstream(&self) -> &D {
        &self.downstream
    }

    /// The registry the engine judges calls by.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The roles the principal holds *now*, and whether with them it may make this call
    /// of `tool` in `context`.
    fn authorize(
        &self,
        tool: &ToolSpec,
        call: &Judged<'_>,
    ) -> Result<(Vec<String>, bool), EngineError> {
        let roles = self.resolver.current_roles(call.tenant_id, call.subject_id)?;
        let allowed = tool.rules.authorize(&call.with(&roles)).is_ok();
        Ok((roles, allowed))
    }
}

/// A call as the rules judge it, before the roles are known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judged<'a> {
    pub(crate) tenant_id: &'a Identifier,
    pub(crate) subject_id: &'a Identifier,
    pub(crate) arguments: &'a Value,
    pub(crate) context: &'a Value,
}

impl<'a> Judged<'a> {
    fn with(&self, roles: &'a [String]) -> RuleCall<'a> {
        RuleCall {
            tenant_id: self.tenant_id,
            subject_id: self.subject_id,
            roles,
            arguments: self.arguments,
            context: self.context,
        }
    }

    /// Whether the business allows the call now, judged with `roles`.
    fn precondition(&self, tool: &ToolSpec, roles: &'a [String]) -> Verdict {
        tool.rules.precondition(&self.with(roles))
    }
}
