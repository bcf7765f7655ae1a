//! The case file (`docs/contract.md`) and the claims file: strict loaders into typed values.
//!
//! Both files are read with `toolledger-json`'s default limits, the whole document must
//! lie in the v2 domain, every member is required and no other is allowed. A loader
//! error names only schema members, never values and never a path.

use std::collections::BTreeSet;

use serde_json::{Map, Value};
use toolledger_json::{Limits, check_v2_domain, parse_strict};

use crate::{
    Approval, Clock, ContractError, HostCall, HostContext, IdempotencyKey, Identifier,
    LeaseSeconds, Principal, PrincipalResolver, Proposal, ProviderProfile, Registry, ResolverError,
    Sha256Hex, UnixSeconds,
};

/// The only `case_version` accepted.
pub const CASE_VERSION: &str = "persistence-case/v1";

/// Reads an object's members one by one, then refuses any it was not asked for.
pub(crate) struct Members<'v> {
    object: &'v Map<String, Value>,
    path: &'static str,
    taken: usize,
    fail: fn(String) -> ContractError,
}

impl<'v> Members<'v> {
    pub(crate) fn of(
        value: &'v Value,
        path: &'static str,
        fail: fn(String) -> ContractError,
    ) -> Result<Members<'v>, ContractError> {
        let object = value.as_object().ok_or_else(|| fail(format!("{path} must be an object")))?;
        Ok(Members { object, path, taken: 0, fail })
    }

    fn error(&self, name: &str, rule: &str) -> ContractError {
        (self.fail)(format!("{}.{name} {rule}", self.path))
    }

    fn get(&mut self, name: &'static str) -> Result<&'v Value, ContractError> {
        let value = self.object.get(name).ok_or_else(|| self.error(name, "is missing"))?;
        self.taken += 1;
        Ok(value)
    }

    /// The member `name`, when present.
    fn optional(&mut self, name: &'static str) -> Option<&'v Value> {
        let value = self.object.get(name)?;
        self.taken += 1;
        Some(value)
    }

    pub(crate) fn text(&mut self, name: &'static str) -> Result<&'v str, ContractError> {
        let value = self.get(name)?;
        value.as_str().ok_or_else(|| self.error(name, "must be a string"))
    }

    pub(crate) fn id(&mut self, name: &'static str) -> Result<Identifier, ContractError> {
        let text = self.text(name)?;
        Identifier::new(text).map_err(|_| self.error(name, "must be an identifier"))
    }

    /// A JSON integer; a bool is not one.
    pub(crate) fn integer(&mut self, name: &'static str) -> Result<i64, ContractError> {
        let value = self.get(name)?;
        value.as_i64().ok_or_else(|| self.error(name, "must be an integer"))
    }

    fn instant(&mut self, name: &'static str) -> Result<UnixSeconds, ContractError> {
        let seconds = self.integer(name)?;
        UnixSeconds::new(seconds).map_err(|_| self.error(name, "is out of the timestamp range"))
    }

    pub(crate) fn array(&mut self, name: &'static str) -> Result<&'v Vec<Value>, ContractError> {
        let value = self.get(name)?;
        value.as_array().ok_or_else(|| self.error(name, "must be an array"))
    }

    pub(crate) fn finish(self) -> Result<(), ContractError> {
        if self.taken == self.object.len() {
            Ok(())
        } else {
            Err((self.fail)(format!("{} has a member the schema does not name", self.path)))
        }
    }
}

fn fixture(reason: String) -> ContractError {
    ContractError::FixtureInvalid { reason }
}

fn claims(reason: String) -> ContractError {
    ContractError::ClaimsInvalid { reason }
}

/// Parses strictly under the default limits and checks the whole document is in the v2
/// domain.
fn strict_document(
    bytes: &[u8],
    fail: fn(String) -> ContractError,
) -> Result<Value, ContractError> {
    let value = parse_strict(bytes, &Limits::default())
        .map_err(|err| fail(format!("not strict JSON ({})", err.code())))?;
    check_v2_domain(&value).map_err(|err| fail(format!("not strict JSON ({})", err.code())))?;
    Ok(value)
}

/// Loads a case file.
///
/// `now_override` (the CLI's `--now`) replaces `clock.now` *before* the time rules are
/// checked: every instant in range, `approved_at`/`expires_at` in range, and
/// `now + lease_seconds` in range.
///
/// # Errors
///
/// [`ContractError::FixtureInvalid`] for anything the case-file format refuses: duplicate keys,
/// NaN, non-UTF-8, more than 65,536 bytes or 32 levels, a value outside the v2 domain,
/// a missing or extra member, a bool where an integer belongs, an unregistered provider
/// profile, a malformed identifier, a duplicate order, or a time out of range.
pub fn load_case(
    bytes: &[u8],
    registry: &Registry,
    now_override: Option<i64>,
) -> Result<HostCall, ContractError> {
    let document = strict_document(bytes, fixture)?;
    let mut top = Members::of(&document, "case", fixture)?;

    if top.text("case_version")? != CASE_VERSION {
        return Err(fixture("case.case_version is not the supported version".to_owned()));
    }

    let mut clock = Members::of(top.get("clock")?, "clock", fixture)?;
    let case_now = clock.integer("now")?;
    let lease_seconds = clock.integer("lease_seconds")?;
    clock.finish()?;
    let now = UnixSeconds::new(now_override.unwrap_or(case_now))
        .map_err(|_| fixture("clock.now is out of the timestamp range".to_owned()))?;
    let lease_seconds = LeaseSeconds::new(lease_seconds)
        .map_err(|_| fixture("clock.lease_seconds must be 1..=3600".to_owned()))?;
    if now.checked_add(lease_seconds).is_none() {
        return Err(fixture(
            "clock.now + clock.lease_seconds is out of the timestamp range".to_owned(),
        ));
    }

    let mut principal = Members::of(top.get("principal")?, "principal", fixture)?;
    let principal_value = Principal {
        tenant_id: principal.id("tenant_id")?,
        subject_id: principal.id("subject_id")?,
    };
    principal.finish()?;

    let mut host = Members::of(top.get("host_context")?, "host_context", fixture)?;
    let mut profile =
        Members::of(host.get("provider_profile")?, "host_context.provider_profile", fixture)?;
    let profile_value = ProviderProfile {
        provider: profile.text("provider")?.to_owned(),
        api_family: profile.text("api_family")?.to_owned(),
        adapter_revision: profile.text("adapter_revision")?.to_owned(),
    };
    profile.finish()?;
    if !registry.has_profile(&profile_value) {
        return Err(fixture("host_context.provider_profile is not registered".to_owned()));
    }
    let idempotency_key = host.text("idempotency_key")?;
    let host_value = HostContext {
        profile: profile_value,
        provider_response_id: host.id("provider_response_id")?,
        provider_call_id: host.id("provider_call_id")?,
        operation_id: host.id("operation_id")?,
        idempotency_key: IdempotencyKey::new(idempotency_key).map_err(|_| {
            fixture("host_context.idempotency_key must be an identifier".to_owned())
        })?,
    };
    host.finish()?;

    let mut proposal = Members::of(top.get("proposal")?, "proposal", fixture)?;
    let proposal_value = Proposal {
        tool_name: proposal.text("tool_name")?.to_owned(),
        arguments: proposal.get("arguments")?.clone(),
    };
    proposal.finish()?;

    // A call whose tool needs no approval (for these arguments) may leave out the
    // approval and the tenant's approvers; every other call carries both.
    let needs_approval = registry.tool(&proposal_value.tool_name).is_none_or(|tool| {
        tool.rules.approval(&proposal_value.arguments) == crate::ApprovalPolicy::Required
    });
    let approval_member =
        if needs_approval { Some(top.get("approval")?) } else { top.optional("approval") };
    let approval_value = match approval_member {
        None => None,
        Some(member) => Some(approval_of(member)?),
    };
    let policy_member = if needs_approval {
        Some(top.get("tenant_policy")?)
    } else {
        top.optional("tenant_policy")
    };
    let eligible_approvers = match policy_member {
        None => Vec::new(),
        Some(member) => eligible_approvers_of(member)?,
    };

    // The business context is the tool's to judge: the proposal's tool checks it (the
    // refund tool: its orders); for an unknown tool it need only be an object.
    let business_state = top.get("business_state")?.clone();
    let checked = match registry.tool(&proposal_value.tool_name) {
        Some(tool) => tool.rules.check_context(&business_state),
        None if business_state.is_object() => Ok(()),
        None => Err("business_state must be an object".to_owned()),
    };
    checked.map_err(fixture)?;
    top.finish()?;

    Ok(HostCall {
        clock: Clock { now, lease_seconds },
        principal: principal_value,
        host: host_value,
        proposal: proposal_value,
        approval: approval_value,
        eligible_approvers,
        business_state,
    })
}

fn approval_of(member: &Value) -> Result<Approval, ContractError> {
    let mut approval = Members::of(member, "approval", fixture)?;
    let approval_sha256 = approval.text("approval_sha256")?;
    let approval_value = Approval {
        approval_id: approval.id("approval_id")?,
        approver_id: approval.id("approver_id")?,
        approved_at: approval.instant("approved_at")?,
        expires_at: approval.instant("expires_at")?,
        approval_sha256: Sha256Hex::new(approval_sha256).map_err(|_| {
            fixture("approval.approval_sha256 must be 64 lowercase hex digits".to_owned())
        })?,
    };
    approval.finish()?;

    Ok(approval_value)
}

fn eligible_approvers_of(member: &Value) -> Result<Vec<Identifier>, ContractError> {
    let mut policy = Members::of(member, "tenant_policy", fixture)?;
    let eligible_approvers = policy
        .array("eligible_approvers")?
        .iter()
        .map(|approver| approver.as_str().and_then(|text| Identifier::new(text).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            fixture("tenant_policy.eligible_approvers must hold identifiers".to_owned())
        })?;
    policy.finish()?;

    Ok(eligible_approvers)
}

/// The claims file: current roles per subject. It is a [`PrincipalResolver`]; a
/// resolver that re-reads the file at every call wraps [`load_claims`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claims {
    subjects: Vec<(Identifier, Identifier, Vec<String>)>,
}

/// Loads a claims file: `{"subjects":[{"tenant_id","subject_id","roles":[…]}]}`.
///
/// # Errors
///
/// [`ContractError::ClaimsInvalid`] when it is not strict JSON in the v2 domain, a
/// member is missing or extra, an id is malformed, a role is not a non-empty string, or
/// a subject appears twice.
pub fn load_claims(bytes: &[u8]) -> Result<Claims, ContractError> {
    let document = strict_document(bytes, claims)?;
    let mut top = Members::of(&document, "claims", claims)?;
    let mut subjects = Vec::new();
    let mut seen = BTreeSet::new();
    for entry in top.array("subjects")? {
        let mut members = Members::of(entry, "claims.subjects[]", claims)?;
        let tenant_id = members.id("tenant_id")?;
        let subject_id = members.id("subject_id")?;
        let roles = members
            .array("roles")?
            .iter()
            .map(|role| role.as_str().filter(|role| !role.is_empty()).map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                claims("claims.subjects[].roles must hold non-empty strings".to_owned())
            })?;
        members.finish()?;
        if !seen.insert((tenant_id.clone(), subject_id.clone())) {
            return Err(claims("claims.subjects[] names a subject twice".to_owned()));
        }
        subjects.push((tenant_id, subject_id, roles));
    }
    top.finish()?;
    Ok(Claims { subjects })
}

impl PrincipalResolver for Claims {
    fn current_roles(
        &self,
        tenant_id: &Identifier,
        subject_id: &Identifier,
    ) -> Result<Vec<String>, ResolverError> {
        Ok(self
            .subjects
            .iter()
            .find(|(tenant, subject, _)| tenant == tenant_id && subject == subject_id)
            .map(|(_, _, roles)| roles.clone())
            .unwrap_or_default())
    }
}
