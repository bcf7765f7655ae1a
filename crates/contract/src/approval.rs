//! Approvals (`docs/contract.md`): who may approve, what an approval is bound to, and when it
//! is valid.
//!
//! An approval is consumed when its intent is accepted: a queued event is not re-judged
//! for expiry. The worker instead recomputes the digest from what the ledger stored, so
//! any swapped field fails closed before the side effect.

use serde_json::Value;

use crate::{
    IdempotencyKey, Identifier, ProviderProfile, Revisions, Sha256Hex, UnixSeconds,
    digest::{Member, Members, hash_members, object_value},
};

/// An approval as the host supplies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The approval's id.
    pub approval_id: Identifier,
    /// Who approved.
    pub approver_id: Identifier,
    /// Valid from (inclusive).
    pub approved_at: UnixSeconds,
    /// Valid until (exclusive).
    pub expires_at: UnixSeconds,
    /// The digest the approver signed off on.
    pub approval_sha256: Sha256Hex,
}

/// Everything of the call an approval is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalBinding {
    /// The tenant.
    pub tenant_id: Identifier,
    /// The subject whose call it is.
    pub subject_id: Identifier,
    /// Provider, API family, adapter revision.
    pub profile: ProviderProfile,
    /// The model response that proposed the call.
    pub provider_response_id: Identifier,
    /// The call.
    pub provider_call_id: Identifier,
    /// The host's operation id.
    pub operation_id: Identifier,
    /// The key.
    pub idempotency_key: IdempotencyKey,
    /// The tool.
    pub tool_name: String,
    /// The request digest.
    pub request_sha256: Sha256Hex,
    /// All six revisions.
    pub revisions: Revisions,
}

/// [`ApprovalBinding`]'s members borrowed from wherever they are held (a stored intent),
/// for checking an approval without copying each of them first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs, reason = "each field is the ApprovalBinding field of the same name")]
pub struct ApprovalBindingRef<'a> {
    pub tenant_id: &'a Identifier,
    pub subject_id: &'a Identifier,
    pub profile: &'a ProviderProfile,
    pub provider_response_id: &'a Identifier,
    pub provider_call_id: &'a Identifier,
    pub operation_id: &'a Identifier,
    pub idempotency_key: &'a IdempotencyKey,
    pub tool_name: &'a str,
    pub request_sha256: &'a Sha256Hex,
    pub revisions: &'a Revisions,
}

impl ApprovalBinding {
    /// The same binding, borrowed.
    pub fn as_ref(&self) -> ApprovalBindingRef<'_> {
        ApprovalBindingRef {
            tenant_id: &self.tenant_id,
            subject_id: &self.subject_id,
            profile: &self.profile,
            provider_response_id: &self.provider_response_id,
            provider_call_id: &self.provider_call_id,
            operation_id: &self.operation_id,
            idempotency_key: &self.idempotency_key,
            tool_name: &self.tool_name,
            request_sha256: &self.request_sha256,
            revisions: &self.revisions,
        }
    }
}

impl From<ApprovalBindingRef<'_>> for ApprovalBinding {
    fn from(binding: ApprovalBindingRef<'_>) -> ApprovalBinding {
        ApprovalBinding {
            tenant_id: binding.tenant_id.clone(),
            subject_id: binding.subject_id.clone(),
            profile: binding.profile.clone(),
            provider_response_id: binding.provider_response_id.clone(),
            provider_call_id: binding.provider_call_id.clone(),
            operation_id: binding.operation_id.clone(),
            idempotency_key: binding.idempotency_key.clone(),
            tool_name: binding.tool_name.to_owned(),
            request_sha256: binding.request_sha256.clone(),
            revisions: binding.revisions.clone(),
        }
    }
}

pub(crate) fn approval_members<'a>(
    approval_id: &'a Identifier,
    approver_id: &'a Identifier,
    approved_at: UnixSeconds,
    expires_at: UnixSeconds,
    binding: ApprovalBindingRef<'a>,
) -> Members<'a, 17> {
    [
        ("adapter_revision", Member::Str(&binding.profile.adapter_revision)),
        ("api_family", Member::Str(&binding.profile.api_family)),
        ("approval_id", Member::Str(approval_id.as_str())),
        ("approved_at", Member::Int(approved_at.get())),
        ("approver_id", Member::Str(approver_id.as_str())),
        ("domain", Member::Str("tool-result-v2/approval")),
        ("expires_at", Member::Int(expires_at.get())),
        ("idempotency_key", Member::Str(binding.idempotency_key.as_str())),
        ("operation_id", Member::Str(binding.operation_id.as_str())),
        ("provider", Member::Str(&binding.profile.provider)),
        ("provider_call_id", Member::Str(binding.provider_call_id.as_str())),
        ("provider_response_id", Member::Str(binding.provider_response_id.as_str())),
        ("request_sha256", Member::Str(binding.request_sha256.as_str())),
        ("revisions", Member::Revisions(binding.revisions)),
        ("subject_id", Member::Str(binding.subject_id.as_str())),
        ("tenant_id", Member::Str(binding.tenant_id.as_str())),
        ("tool_name", Member::Str(binding.tool_name)),
    ]
}

/// The approval preimage (`docs/contract.md`).
pub fn approval_preimage(
    approval_id: &Identifier,
    approver_id: &Identifier,
    approved_at: UnixSeconds,
    expires_at: UnixSeconds,
    binding: &ApprovalBinding,
) -> Value {
    object_value(&approval_members(
        approval_id,
        approver_id,
        approved_at,
        expires_at,
        binding.as_ref(),
    ))
}

/// `approval_sha256`.
pub fn approval_sha256(
    approval_id: &Identifier,
    approver_id: &Identifier,
    approved_at: UnixSeconds,
    expires_at: UnixSeconds,
    binding: &ApprovalBinding,
) -> Sha256Hex {
    approval_digest(approval_id, approver_id, approved_at, expires_at, binding.as_ref())
}

/// [`approval_sha256`] of a borrowed binding: the one place its digest is computed.
fn approval_digest(
    approval_id: &Identifier,
    approver_id: &Identifier,
    approved_at: UnixSeconds,
    expires_at: UnixSeconds,
    binding: ApprovalBindingRef<'_>,
) -> Sha256Hex {
    hash_members(&approval_members(approval_id, approver_id, approved_at, expires_at, binding))
}

/// Why an approval was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalRefusal {
    /// Not eligible, the subject approving themself, not bound to this call, an empty or
    /// inverted interval, or not valid yet: `APPROVAL_INVALID`.
    Invalid,
    /// `now >= expires_at`: `APPROVAL_EXPIRED`.
    Expired,
}

impl Approval {
    /// Whether this approval admits the call `binding` at `now`.
    ///
    /// In order: the approver is eligible and is not the subject; the digest recomputes
    /// from `binding`; `approved_at < expires_at`; `approved_at <= now` (else invalid);
    /// `now < expires_at` (else expired). The interval is right-open.
    ///
    /// # Errors
    ///
    /// The [`ApprovalRefusal`] that applies.
    pub fn admits(
        &self,
        binding: &ApprovalBinding,
        eligible_approvers: &[Identifier],
        now: UnixSeconds,
    ) -> Result<(), ApprovalRefusal> {
        if !eligible_approvers.contains(&self.approver_id) || self.approver_id == binding.subject_id
        {
            return Err(ApprovalRefusal::Invalid);
        }
        if !self.is_bound_to(binding) {
            return Err(ApprovalRefusal::Invalid);
        }
        if self.approved_at >= self.expires_at || now < self.approved_at {
            return Err(ApprovalRefusal::Invalid);
        }
        if now >= self.expires_at {
            return Err(ApprovalRefusal::Expired);
        }
        Ok(())
    }

    /// The `approval_sha256` this approval's own fields yield when bound to `binding`:
    /// what an approver of that exact call signs off on.
    pub fn digest_for(&self, binding: &ApprovalBinding) -> Sha256Hex {
        self.digest_for_ref(binding.as_ref())
    }

    fn digest_for_ref(&self, binding: ApprovalBindingRef<'_>) -> Sha256Hex {
        approval_digest(
            &self.approval_id,
            &self.approver_id,
            self.approved_at,
            self.expires_at,
            binding,
        )
    }

    /// Whether `approval_sha256` recomputes from this approval and `binding`. The worker
    /// uses this alone: the approval was consumed when the intent was accepted.
    pub fn is_bound_to(&self, binding: &ApprovalBinding) -> bool {
        self.is_bound_to_ref(binding.as_ref())
    }

    /// [`Approval::is_bound_to`] of a borrowed binding.
    pub fn is_bound_to_ref(&self, binding: ApprovalBindingRef<'_>) -> bool {
        self.digest_for_ref(binding) == self.approval_sha256
    }
}
