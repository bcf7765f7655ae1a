//! The host's call: one side-effecting tool call as the engine takes it.
//!
//! A host library builds it from its own call; the command line loads it from a case
//! file ([`load_case`](crate::load_case)). Either way the engine sees the same value.

use serde_json::Value;

use crate::{
    Approval, IdempotencyKey, Identifier, LeaseSeconds, ProviderProfile, UnixSeconds,
    approval::ApprovalBinding, digest::request_sha256,
};

/// The host's clock for this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// The instant the call is judged at (after `--now` is applied).
    pub now: UnixSeconds,
    /// How long a worker's claim lasts.
    pub lease_seconds: LeaseSeconds,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant.
    pub tenant_id: Identifier,
    /// The subject.
    pub subject_id: Identifier,
}

/// The host-owned identity of the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostContext {
    /// A registered provider profile.
    pub profile: ProviderProfile,
    /// The model response that proposed the call.
    pub provider_response_id: Identifier,
    /// The call.
    pub provider_call_id: Identifier,
    /// The host's operation id.
    pub operation_id: Identifier,
    /// The retry identity.
    pub idempotency_key: IdempotencyKey,
}

/// What the model proposed: untrusted until the registry's input schema says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The tool named (maybe unknown: that is `INPUT_INVALID`, not a case error).
    pub tool_name: String,
    /// The arguments (maybe failing the schema: `INPUT_INVALID`).
    pub arguments: Value,
}

/// One call as the engine takes it: what a host's library call describes, once its
/// defaults are filled in, or what a loaded case file (`persistence-case/v1`) holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCall {
    /// The clock.
    pub clock: Clock,
    /// The caller.
    pub principal: Principal,
    /// The call's identity.
    pub host: HostContext,
    /// The proposal.
    pub proposal: Proposal,
    /// The approval, when the call presents one (a case file always does; a tool whose
    /// policy needs none may be called without).
    pub approval: Option<Approval>,
    /// `tenant_policy.eligible_approvers`.
    pub eligible_approvers: Vec<Identifier>,
    /// The business context the tool's rules judge (`business_state`), a JSON object.
    pub business_state: Value,
}

impl HostCall {
    /// What an approval of this call is bound to, given the request digest the
    /// registry yields for it.
    pub fn approval_binding(
        &self,
        tool_name: &str,
        revisions: &crate::Revisions,
    ) -> ApprovalBinding {
        ApprovalBinding {
            tenant_id: self.principal.tenant_id.clone(),
            subject_id: self.principal.subject_id.clone(),
            profile: self.host.profile.clone(),
            provider_response_id: self.host.provider_response_id.clone(),
            provider_call_id: self.host.provider_call_id.clone(),
            operation_id: self.host.operation_id.clone(),
            idempotency_key: self.host.idempotency_key.clone(),
            tool_name: tool_name.to_owned(),
            request_sha256: request_sha256(
                &self.principal.tenant_id,
                &self.principal.subject_id,
                tool_name,
                &self.proposal.arguments,
                revisions,
            ),
            revisions: revisions.clone(),
        }
    }
}
