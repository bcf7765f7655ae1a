//! PASS and BLOCK packages: shape, verification, and tamper evidence.

use serde_json::{Value, json};
use toolledger_contract::{
    BlockCode, Delivery, HostView, IdempotencyKey, Identifier, PackageError, Purpose, Registry,
    Sha256Hex, StatusRef, block_package, pass_package, verify_package,
};
use toolledger_json::canonicalize;

fn sample() -> (HostView, Value, Sha256Hex) {
    let revisions = Registry::builtin().tool("refund_order").unwrap().revisions.clone();
    let host_view = HostView {
        provider: "openai".to_owned(),
        api_family: "responses".to_owned(),
        adapter_revision: "openai-responses-2026-05".to_owned(),
        provider_response_id: Identifier::new("resp-001").unwrap(),
        provider_call_id: Identifier::new("call-001").unwrap(),
        purpose: Purpose::Dispatch,
        operation_id: Identifier::new("op-001").unwrap(),
        idempotency_key: IdempotencyKey::new("refund-ord-1001-a").unwrap(),
        revisions,
        downstream_request_ref: toolledger_contract::DownstreamRequestRef::new(&format!(
            "dr_{}",
            "a".repeat(32)
        ))
        .unwrap(),
        downstream_receipt_ref: toolledger_contract::ReceiptRef::new(&format!(
            "rc_{}",
            "b".repeat(32)
        ))
        .unwrap(),
        status_ref: StatusRef::new(&format!("sr_{}", "c".repeat(32))).unwrap(),
    };
    let output = json!({"refund_id": format!("rf_{}", "d".repeat(32)), "order_id": "ord-1001",
        "amount_minor": 2599, "currency": "USD", "status": "refunded"});
    (host_view, output, Sha256Hex::new(&"e".repeat(64)).unwrap())
}

#[test]
fn a_pass_package_has_exactly_the_documented_members_and_verifies() {
    let (host_view, output, request) = sample();
    for delivery in [Delivery::Fresh, Delivery::ReceiptReconciled, Delivery::LocalReplay] {
        let package = pass_package(delivery, "refund_order", &output, &host_view, &request);
        let keys: Vec<&String> = package.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["code", "delivery", "gate", "result", "status", "status_ref"]);
        let host_keys: Vec<&String> =
            package["result"]["host_view"].as_object().unwrap().keys().collect();
        assert_eq!(host_keys.len(), 12);
        assert_eq!(package["delivery"], delivery.as_str());
        assert_eq!(verify_package(&package), Ok(()));
        // It survives the canonical round trip the CLI puts it through.
        let text = canonicalize(&package);
        let back = toolledger_json::parse_strict(text.as_bytes(), &Default::default()).unwrap();
        assert_eq!(verify_package(&back), Ok(()));
    }
}

#[test]
fn moving_a_package_to_another_key_call_or_delivery_fails() {
    let (host_view, output, request) = sample();
    let package = pass_package(Delivery::Fresh, "refund_order", &output, &host_view, &request);
    let moves: [(&str, &str, Value); 5] = [
        ("host_view", "idempotency_key", json!("refund-ord-1001-b")),
        ("host_view", "provider_call_id", json!("call-002")),
        ("host_view", "provider_response_id", json!("resp-002")),
        ("host_view", "purpose", json!("query_status")),
        ("host_view", "operation_id", json!("op-002")),
    ];
    for (object, member, value) in moves {
        let mut moved = package.clone();
        moved["result"][object][member] = value;
        assert_eq!(verify_package(&moved), Err(PackageError::BindingMismatch), "{member}");
    }
    let mut replayed = package.clone();
    replayed["delivery"] = json!("local_replay");
    assert_eq!(verify_package(&replayed), Err(PackageError::BindingMismatch));
}

/// Every leaf of a PASS package, changed alone, makes verification fail.
#[test]
fn any_single_field_change_to_a_package_breaks_verification() {
    let (host_view, output, request) = sample();
    let package = pass_package(Delivery::Fresh, "refund_order", &output, &host_view, &request);
    let mut leaves = Vec::new();
    collect_leaves(&package, String::new(), &mut leaves);
    assert!(leaves.len() >= 30, "{}", leaves.len());
    for pointer in leaves {
        let mut changed = package.clone();
        let leaf = changed.pointer_mut(&pointer).unwrap();
        *leaf = match leaf {
            Value::String(text) => {
                // Stay in the value's alphabet where it has one, so the change is not
                // merely a malformed digest.
                let last = text.pop().unwrap();
                text.push(if last == '0' { '1' } else { '0' });
                Value::String(text.clone())
            }
            Value::Number(number) => json!(number.as_i64().unwrap() + 1),
            other => panic!("unexpected leaf {other:?}"),
        };
        assert!(verify_package(&changed).is_err(), "changing {pointer} went unnoticed");
    }
}

fn collect_leaves(value: &Value, pointer: String, out: &mut Vec<String>) {
    match value {
        Value::Object(members) => {
            for (name, member) in members {
                collect_leaves(member, format!("{pointer}/{name}"), out);
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                collect_leaves(item, format!("{pointer}/{index}"), out);
            }
        }
        _ => out.push(pointer),
    }
}

#[test]
fn block_packages_carry_a_fixed_message_and_nullable_status() {
    let status_ref = StatusRef::new(&format!("sr_{}", "c".repeat(32))).unwrap();
    let unknown = block_package(BlockCode::OutcomeUnknown, Some("processing"), Some(&status_ref));
    assert_eq!(
        canonicalize(&unknown),
        format!(
            r#"{{"code":"OUTCOME_UNKNOWN","gate":"BLOCK","message":"{}","status":"processing","status_ref":"{}"}}"#,
            BlockCode::OutcomeUnknown.message(),
            status_ref
        )
    );
    let missing = block_package(BlockCode::NotFound, None, None);
    assert_eq!(missing["status"], Value::Null);
    assert_eq!(missing["status_ref"], Value::Null);
    let mut codes: Vec<&str> = BlockCode::ALL.iter().map(|code| code.as_str()).collect();
    codes.dedup();
    assert_eq!(codes.len(), 22);
    assert!(verify_package(&missing).is_err());
}
