//! The case-file and claims-file loaders: the PASS fixture, every bad fixture refused
//! with `FIXTURE_INVALID`, and proposals that load but fail the input schema.

use serde_json::json;
use toolledger_contract::{
    ApprovalPolicy, ApprovalRefusal, Identifier, NoRoles, PrincipalResolver, RefundOrder, Registry,
    RuleCall, ToolRules, UnixSeconds, load_case, load_claims,
};

use crate::{bless, pass_case, pass_case_bytes, workspace};

fn files(folder: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(workspace(folder))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&path).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_pass_fixture_carries_a_correct_approval_digest() {
    let bytes = pass_case_bytes();
    let case = load_case(&bytes, &Registry::builtin(), None).unwrap();
    let registry = Registry::builtin();
    let tool = registry.tool(&case.proposal.tool_name).unwrap();
    let binding = case.approval_binding(&tool.name, &tool.revisions);
    let expected = case.approval.as_ref().unwrap().digest_for(&binding);
    if bless() && expected != case.approval.as_ref().unwrap().approval_sha256 {
        let text = String::from_utf8(bytes).unwrap();
        let text = text
            .replace(case.approval.as_ref().unwrap().approval_sha256.as_str(), expected.as_str());
        std::fs::write(workspace("fixtures/persistence-case.json"), text).unwrap();
        return;
    }
    assert_eq!(
        case.approval.as_ref().unwrap().approval_sha256,
        expected,
        "run with TOOLLEDGER_BLESS=1 to update"
    );
    assert_eq!(
        case.approval.as_ref().unwrap().admits(&binding, &case.eligible_approvers, case.clock.now),
        Ok(())
    );
}

#[test]
fn the_pass_fixture_loads_as_spec_section_5_says() {
    let case = pass_case();
    assert_eq!(case.clock.now.get(), 1_767_225_600);
    assert_eq!(case.clock.lease_seconds.get(), 30);
    assert_eq!(case.principal.tenant_id.as_str(), "tenant-a");
    assert_eq!(case.host.idempotency_key.as_str(), "refund-ord-1001-a");
    assert_eq!(case.host.profile.adapter_revision, "openai-responses-2026-05");
    assert_eq!(case.proposal.arguments["amount_minor"], json!(2599));
    assert_eq!(case.eligible_approvers, [Identifier::new("approver-1").unwrap()]);
    assert_eq!(case.business_state["orders"].as_array().unwrap().len(), 1);
    // `--now` replaces the clock before the time rules apply.
    let later = load_case(&pass_case_bytes(), &Registry::builtin(), Some(1_767_229_100)).unwrap();
    assert_eq!(later.clock.now.get(), 1_767_229_100);
}

/// Every file of `fixtures/bad-cases/` is refused with `FIXTURE_INVALID`, and the error
/// never carries input text.
#[test]
fn every_bad_case_file_is_fixture_invalid() {
    let files = files("fixtures/bad-cases");
    assert!(files.len() >= 25, "only {} bad case files", files.len());
    for (name, bytes) in files {
        let err = load_case(&bytes, &Registry::builtin(), None).unwrap_err();
        assert_eq!(err.code(), "FIXTURE_INVALID", "{name}: {err}");
        let message = err.to_string();
        for secret in ["ord-1001", "tenant-a", "user-1", "approver-1", "fixtures", "/"] {
            assert!(!message.contains(secret), "{name}: message {message:?} echoes {secret:?}");
        }
    }
}

#[test]
fn now_override_is_range_checked_after_it_is_applied() {
    let registry = Registry::builtin();
    let bytes = pass_case_bytes();
    for now in [-1, UnixSeconds::MAX - 29, UnixSeconds::MAX, UnixSeconds::MAX + 1, i64::MAX] {
        let err = load_case(&bytes, &registry, Some(now)).unwrap_err();
        assert_eq!(err.code(), "FIXTURE_INVALID", "--now {now}");
    }
    assert!(load_case(&bytes, &registry, Some(UnixSeconds::MAX - 30)).is_ok());
}

/// Files of `fixtures/input-invalid/` load (they are valid case files) but their
/// proposal names an unknown tool or fails the input schema: a BLOCK `INPUT_INVALID`.
#[test]
fn input_invalid_proposals_load_and_fail_the_registry() {
    let registry = Registry::builtin();
    let files = files("fixtures/input-invalid");
    assert!(files.len() >= 10, "only {} input-invalid files", files.len());
    for (name, bytes) in files {
        let case = load_case(&bytes, &registry, None).unwrap_or_else(|err| panic!("{name}: {err}"));
        let verdict = registry
            .tool(&case.proposal.tool_name)
            .map(|tool| tool.input.validate(&case.proposal.arguments, None));
        assert!(!matches!(verdict, Some(Ok(()))), "{name} passed the input schema");
    }
}

fn with_approval_change(
    change: impl FnOnce(&mut toolledger_contract::HostCall),
) -> Result<(), ApprovalRefusal> {
    let mut case = pass_case();
    change(&mut case);
    let registry = Registry::builtin();
    let tool = registry.tool("refund_order").unwrap();
    let binding = case.approval_binding(&tool.name, &tool.revisions);
    case.approval.as_ref().unwrap().admits(&binding, &case.eligible_approvers, case.clock.now)
}

#[test]
fn approvals_are_eligible_bound_and_right_open() {
    let at = |seconds: i64| UnixSeconds::new(seconds).unwrap();
    let approved_at = 1_767_225_500;
    let expires_at = 1_767_229_100;
    assert_eq!(with_approval_change(|_| {}), Ok(()));
    assert_eq!(with_approval_change(|case| case.clock.now = at(approved_at)), Ok(()));
    assert_eq!(
        with_approval_change(|case| case.clock.now = at(approved_at - 1)),
        Err(ApprovalRefusal::Invalid)
    );
    assert_eq!(with_approval_change(|case| case.clock.now = at(expires_at - 1)), Ok(()));
    assert_eq!(
        with_approval_change(|case| case.clock.now = at(expires_at)),
        Err(ApprovalRefusal::Expired)
    );
    // Not eligible; eligible but the subject themself.
    assert_eq!(
        with_approval_change(|case| case.eligible_approvers.clear()),
        Err(ApprovalRefusal::Invalid)
    );
    assert_eq!(
        with_approval_change(
            |case| case.principal.subject_id = Identifier::new("approver-1").unwrap()
        ),
        Err(ApprovalRefusal::Invalid)
    );
    // Any bound field changed: the digest no longer recomputes.
    assert_eq!(
        with_approval_change(
            |case| case.host.provider_call_id = Identifier::new("call-002").unwrap()
        ),
        Err(ApprovalRefusal::Invalid)
    );
    assert_eq!(
        with_approval_change(|case| case.host.profile.api_family = "chat_completions".to_owned()),
        Err(ApprovalRefusal::Invalid)
    );
    assert_eq!(
        with_approval_change(|case| case.proposal.arguments["amount_minor"] = json!(2598)),
        Err(ApprovalRefusal::Invalid)
    );
    assert_eq!(
        with_approval_change(|case| case.approval.as_mut().unwrap().expires_at = at(expires_at + 1)),
        Err(ApprovalRefusal::Invalid)
    );
}

#[test]
fn authorization_is_owner_or_support_admin_and_denied_looks_missing() {
    let case = pass_case();
    let registry = Registry::builtin();
    let rules = &registry.tool("refund_order").unwrap().rules;
    let tenant = &case.principal.tenant_id;
    let owner = &case.principal.subject_id;
    let other = Identifier::new("user-2").unwrap();
    let arguments = &case.proposal.arguments;
    let state = &case.business_state;
    let call = |tenant_id, subject_id, roles, arguments| RuleCall {
        tenant_id,
        subject_id,
        roles,
        arguments,
        context: state,
    };
    let roles = NoRoles.current_roles(tenant, owner).unwrap();
    assert!(roles.is_empty());
    assert!(rules.authorize(&call(tenant, owner, &roles, arguments)).is_ok());
    let denied = rules.authorize(&call(tenant, &other, &[], arguments)).unwrap_err();
    let mut missing_arguments = arguments.clone();
    missing_arguments["order_id"] = json!("ord-9999");
    let missing = rules.authorize(&call(tenant, owner, &[], &missing_arguments)).unwrap_err();
    assert_eq!(denied, missing);
    let admin = vec!["support_admin".to_owned(), "unknown-role".to_owned()];
    assert!(rules.authorize(&call(tenant, &other, &admin, arguments)).is_ok());
    // support_admin does not cross tenants.
    let other_tenant = Identifier::new("tenant-b").unwrap();
    assert!(rules.authorize(&call(&other_tenant, owner, &admin, arguments)).is_err());

    assert!(rules.check_business(&call(tenant, owner, &[], arguments)).is_ok());
    let mut more = arguments.clone();
    more["amount_minor"] = json!(2600);
    assert!(rules.check_business(&call(tenant, owner, &[], &more)).is_err());
    let mut euros = arguments.clone();
    euros["currency"] = json!("EUR");
    assert!(rules.check_business(&call(tenant, owner, &[], &euros)).is_err());
    let mut refunded = state.clone();
    refunded["orders"][0]["status"] = json!("refunded");
    let refunded_call = RuleCall {
        tenant_id: tenant,
        subject_id: owner,
        roles: &[],
        arguments,
        context: &refunded,
    };
    assert!(rules.check_business(&refunded_call).is_err());

    // The policy: an approval always, or above a threshold only.
    assert_eq!(rules.approval(arguments), ApprovalPolicy::Required);
    let threshold = RefundOrder { approval_threshold_minor: Some(2599) };
    assert_eq!(threshold.approval(arguments), ApprovalPolicy::NotRequired);
    assert_eq!(threshold.approval(&more), ApprovalPolicy::Required);
}

#[test]
fn claims_files_are_strict() {
    let good = br#"{"subjects":[{"tenant_id":"tenant-a","subject_id":"user-2","roles":["support_admin"]}]}"#;
    let claims = load_claims(good).unwrap();
    let tenant = Identifier::new("tenant-a").unwrap();
    assert_eq!(
        claims.current_roles(&tenant, &Identifier::new("user-2").unwrap()).unwrap(),
        ["support_admin"]
    );
    assert!(claims.current_roles(&tenant, &Identifier::new("user-1").unwrap()).unwrap().is_empty());

    let bad: [&[u8]; 8] = [
        br#"{"subjects":[{"tenant_id":"tenant-a","subject_id":"user-2","roles":[""]}]}"#,
        br#"{"subjects":[{"tenant_id":"tenant-a","subject_id":"user-2","roles":[1]}]}"#,
        br#"{"subjects":[{"tenant_id":"tenant-a","subject_id":"user-2"}]}"#,
        br#"{"subjects":[{"tenant_id":"tenant a","subject_id":"user-2","roles":[]}]}"#,
        br#"{"subjects":[],"extra":1}"#,
        br#"{"subjects":[{"tenant_id":"t","subject_id":"s","roles":[]},{"tenant_id":"t","subject_id":"s","roles":[]}]}"#,
        br#"{"subjects":[],"subjects":[]}"#,
        b"{\"subjects\":[1.5]}",
    ];
    for bytes in bad {
        let err = load_claims(bytes).unwrap_err();
        assert_eq!(err.code(), "CLAIMS_INVALID", "{}", String::from_utf8_lossy(bytes));
    }
}
