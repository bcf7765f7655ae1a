//! Digest properties: key order and whitespace never matter; the request digest ignores
//! the key and call ids while the call binding does not; every approval field is bound.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolledger_contract::{
    Delivery, HostView, IdempotencyKey, Identifier, Purpose, Registry, Scope, UnixSeconds,
    digest::{
        call_binding_sha256, downstream_request_ref, request_sha256, result_sha256, status_ref,
    },
};
use toolledger_json::{Limits, parse_strict};

use crate::pass_case;

fn arguments() -> impl Strategy<Value = Map<String, Value>> {
    proptest::collection::btree_map(
        "[a-z_\u{e9}\u{1f600}]{1,6}",
        prop_oneof![
            any::<i32>().prop_map(|n| json!(n)),
            "[ -~\u{e000}\u{1f4e6}]{0,8}".prop_map(Value::String),
            any::<bool>().prop_map(Value::Bool),
            Just(Value::Null),
        ],
        0..6,
    )
    .prop_map(|members| members.into_iter().collect())
}

/// Writes `members` as JSON text in reverse order with generous whitespace.
fn reversed_text(members: &Map<String, Value>) -> String {
    let parts: Vec<String> = members
        .iter()
        .rev()
        .map(|(name, value)| {
            format!(
                "\n  {} :\t{}",
                serde_json::to_string(name).unwrap(),
                serde_json::to_string_pretty(value).unwrap()
            )
        })
        .collect();
    format!("{{ {} \n}}", parts.join(" ,"))
}

fn host_view(key: &str, call: &str, delivery_ref: &str) -> HostView {
    let tool = Registry::builtin().tool("refund_order").unwrap().clone();
    HostView {
        provider: "openai".to_owned(),
        api_family: "responses".to_owned(),
        adapter_revision: "openai-responses-2026-05".to_owned(),
        provider_response_id: Identifier::new("resp-001").unwrap(),
        provider_call_id: Identifier::new(call).unwrap(),
        purpose: Purpose::Dispatch,
        operation_id: Identifier::new("op-001").unwrap(),
        idempotency_key: IdempotencyKey::new(key).unwrap(),
        revisions: tool.revisions,
        downstream_request_ref: toolledger_contract::DownstreamRequestRef::new(delivery_ref)
            .unwrap(),
        downstream_receipt_ref: toolledger_contract::ReceiptRef::new(&format!(
            "rc_{}",
            "1".repeat(32)
        ))
        .unwrap(),
        status_ref: toolledger_contract::StatusRef::new(&format!("sr_{}", "2".repeat(32))).unwrap(),
    }
}

proptest! {
    #[test]
    fn request_digest_ignores_member_order_and_whitespace(members in arguments()) {
        let compact = serde_json::to_string(&Value::Object(members.clone())).unwrap();
        let loose = reversed_text(&members);
        let a = parse_strict(compact.as_bytes(), &Limits::default()).unwrap();
        let b = parse_strict(loose.as_bytes(), &Limits::default()).unwrap();
        let case = pass_case();
        let registry = Registry::builtin();
        let revisions = &registry.tool("refund_order").unwrap().revisions;
        let tenant = &case.principal.tenant_id;
        let subject = &case.principal.subject_id;
        prop_assert_eq!(
            request_sha256(tenant, subject, "refund_order", &a, revisions),
            request_sha256(tenant, subject, "refund_order", &b, revisions)
        );
        prop_assert_eq!(
            result_sha256("refund_order", "r", &a),
            result_sha256("refund_order", "r", &b)
        );
    }

    #[test]
    fn request_digest_ignores_key_and_call_ids_but_the_binding_does_not(
        key in "[a-z][a-z0-9-]{0,20}",
        call in "[a-z][a-z0-9-]{0,20}",
    ) {
        let mut case = pass_case();
        let registry = Registry::builtin();
        let tool = registry.tool("refund_order").unwrap();
        let before = case.approval_binding(&tool.name, &tool.revisions);
        case.host.idempotency_key = IdempotencyKey::new(&key).unwrap();
        case.host.provider_call_id = Identifier::new(&call).unwrap();
        let after = case.approval_binding(&tool.name, &tool.revisions);
        prop_assert_eq!(&before.request_sha256, &after.request_sha256);

        let request = &before.request_sha256;
        let result = result_sha256("refund_order", "refund_order.output.v2", &json!({}));
        let dr = format!("dr_{}", "3".repeat(32));
        let original = call_binding_sha256(&host_view("refund-ord-1001-a", "call-001", &dr), "refund_order", request, &result, Delivery::Fresh);
        let moved = call_binding_sha256(&host_view(&key, &call, &dr), "refund_order", request, &result, Delivery::Fresh);
        let changed = key != "refund-ord-1001-a" || call != "call-001";
        prop_assert_eq!(original != moved, changed);

        // The key is in the status ref and the downstream request ref too.
        let scope = |key: &str| Scope {
            tenant_id: case.principal.tenant_id.clone(),
            subject_id: case.principal.subject_id.clone(),
            tool_name: "refund_order".to_owned(),
            idempotency_key: IdempotencyKey::new(key).unwrap(),
        };
        let key_changed = key != "refund-ord-1001-a";
        prop_assert_eq!(status_ref(&scope(&key)) != status_ref(&scope("refund-ord-1001-a")), key_changed);
        prop_assert_eq!(
            downstream_request_ref(&scope(&key), request) != downstream_request_ref(&scope("refund-ord-1001-a"), request),
            key_changed
        );
    }
}

/// Every field an approval carries or is bound to, changed alone, breaks it.
#[test]
fn any_single_approval_field_change_breaks_the_binding() {
    let case = pass_case();
    let registry = Registry::builtin();
    let tool = registry.tool("refund_order").unwrap();
    let binding = case.approval_binding(&tool.name, &tool.revisions);
    assert!(case.approval.as_ref().unwrap().is_bound_to(&binding));
    let id = |text: &str| Identifier::new(text).unwrap();

    let mut approvals = Vec::new();
    let mut approval = case.approval.clone().unwrap();
    approval.approval_id = id("appr-002");
    approvals.push(("approval_id", approval));
    let mut approval = case.approval.clone().unwrap();
    approval.approver_id = id("approver-2");
    approvals.push(("approver_id", approval));
    let mut approval = case.approval.clone().unwrap();
    approval.approved_at = UnixSeconds::new(approval.approved_at.get() - 1).unwrap();
    approvals.push(("approved_at", approval));
    let mut approval = case.approval.clone().unwrap();
    approval.expires_at = UnixSeconds::new(approval.expires_at.get() + 1).unwrap();
    approvals.push(("expires_at", approval));
    for (field, approval) in approvals {
        assert!(!approval.is_bound_to(&binding), "{field}");
    }

    let mut bindings = Vec::new();
    let mut changed = binding.clone();
    changed.tenant_id = id("tenant-b");
    bindings.push(("tenant_id", changed));
    let mut changed = binding.clone();
    changed.subject_id = id("user-2");
    bindings.push(("subject_id", changed));
    let mut changed = binding.clone();
    changed.profile.provider = "anthropic".to_owned();
    bindings.push(("provider", changed));
    let mut changed = binding.clone();
    changed.profile.api_family = "chat_completions".to_owned();
    bindings.push(("api_family", changed));
    let mut changed = binding.clone();
    changed.profile.adapter_revision = "openai-responses-2026-06".to_owned();
    bindings.push(("adapter_revision", changed));
    let mut changed = binding.clone();
    changed.provider_response_id = id("resp-002");
    bindings.push(("provider_response_id", changed));
    let mut changed = binding.clone();
    changed.provider_call_id = id("call-002");
    bindings.push(("provider_call_id", changed));
    let mut changed = binding.clone();
    changed.operation_id = id("op-002");
    bindings.push(("operation_id", changed));
    let mut changed = binding.clone();
    changed.idempotency_key = IdempotencyKey::new("refund-ord-1001-b").unwrap();
    bindings.push(("idempotency_key", changed));
    let mut changed = binding.clone();
    changed.tool_name = "refund_order_v3".to_owned();
    bindings.push(("tool_name", changed));
    let mut changed = binding.clone();
    changed.request_sha256 = toolledger_contract::Sha256Hex::new(&"0".repeat(64)).unwrap();
    bindings.push(("request_sha256", changed));
    for revision in 0..6 {
        let mut changed = binding.clone();
        let field = match revision {
            0 => &mut changed.revisions.input,
            1 => &mut changed.revisions.output,
            2 => &mut changed.revisions.effect,
            3 => &mut changed.revisions.handler,
            4 => &mut changed.revisions.producer,
            _ => &mut changed.revisions.policy,
        };
        field.push('x');
        bindings.push(("a revision", changed));
    }
    for (field, changed) in bindings {
        assert!(!case.approval.as_ref().unwrap().is_bound_to(&changed), "{field}");
    }
}
