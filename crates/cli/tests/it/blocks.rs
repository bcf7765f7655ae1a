//! Every BLOCK code, reached from the command line, each a single JSON
//! object of the documented shape on stdout with exit 1.

use std::collections::BTreeSet;

use serde_json::Value;
use toolledger_contract::{Registry, load_case};

use crate::{Dir, Run};

const NOW: i64 = 1_767_225_600;

/// Checks the BLOCK shape and returns the code.
fn block(run: &Run) -> String {
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stderr, "");
    let answer = run.answer();
    let object = answer.as_object().unwrap();
    let code = object["code"].as_str().unwrap().to_owned();
    let mut members: Vec<&str> = object.keys().map(String::as_str).collect();
    members.sort_unstable();
    if code == "AUDIT_FAILED" {
        for member in ["checks", "counts", "findings", "unreconciled_downstream_receipts"] {
            assert!(object.contains_key(member), "{member}");
        }
    } else if code == "RECEIPT_QUARANTINED" {
        assert_eq!(members, ["code", "gate", "message", "reason", "status", "status_ref"]);
    } else if code == "INPUT_INVALID" && object.contains_key("detail") {
        // Arguments a JSON Schema refused: where, and which keyword, never the value.
        assert_eq!(members, ["code", "detail", "gate", "message", "status", "status_ref"]);
        let detail = object["detail"].as_object().unwrap();
        assert!(detail["pointer"].as_str().unwrap().starts_with('/'), "{detail:?}");
        assert!(!detail["keyword"].as_str().unwrap().is_empty(), "{detail:?}");
    } else {
        assert_eq!(members, ["code", "gate", "message", "status", "status_ref"], "{code}");
    }
    assert_eq!(object["gate"], "BLOCK");
    assert!(object["message"].as_str().is_some_and(|message| !message.is_empty()));
    assert!(object["status"].is_null() || object["status"].is_string());
    code
}

#[test]
fn every_block_code_is_reachable_from_the_command_line() {
    let mut seen = BTreeSet::new();
    let dir = Dir::new();
    let now = |seconds: i64| seconds.to_string();

    // INPUT_INVALID: an unknown tool; arguments outside the schema.
    for name in ["unknown-tool", "amount-zero"] {
        let bytes = std::fs::read(crate::workspace(&format!("fixtures/input-invalid/{name}.json")))
            .unwrap();
        dir.write("input.json", &bytes);
        seen.insert(block(&dir.run(&["--fixture", "input.json", "dispatch"])));
    }
    // APPROVAL_INVALID (before approved_at) and APPROVAL_EXPIRED (at expires_at).
    seen.insert(block(&dir.run(&[
        "--fixture",
        "case.json",
        "dispatch",
        "--now",
        &now(1_767_225_499),
    ])));
    seen.insert(block(&dir.run(&[
        "--fixture",
        "case.json",
        "dispatch",
        "--now",
        &now(1_767_229_100),
    ])));
    // BUSINESS_STATE_INVALID: the order was already refunded.
    dir.write_case("refunded.json", |case| {
        case["business_state"]["orders"][0]["status"] = Value::from("refunded")
    });
    seen.insert(block(&dir.run(&["--fixture", "refunded.json", "dispatch"])));
    // NOT_FOUND: someone else's order.
    dir.write_case("other.json", |case| case["principal"]["subject_id"] = Value::from("user-2"));
    seen.insert(block(&dir.run(&["--fixture", "other.json", "dispatch"])));
    assert!(dir.ledger_is_empty());

    // OUTCOME_UNKNOWN, then IDEMPOTENCY_CONFLICT on the same key.
    let unknown = dir.run(&["--fixture", "case.json", "dispatch", "--failure", "after_claim"]);
    seen.insert(block(&unknown));
    let status_ref = unknown.text("/status_ref");
    dir.write_case("conflict.json", |case| {
        case["proposal"]["arguments"]["amount_minor"] = Value::from(100)
    });
    seen.insert(block(&dir.run(&["--fixture", "conflict.json", "dispatch"])));
    // LEASE_HELD: another worker while the lease lives.
    seen.insert(block(&dir.run(&[
        "--fixture",
        "case.json",
        "process",
        "--status-ref",
        &status_ref,
    ])));
    // AUTHORIZATION_DENIED: the worker checks the order's current state of ownership.
    dir.write_case("moved.json", |case| {
        case["business_state"]["orders"][0]["owner_subject_id"] = Value::from("user-9")
    });
    let later = now(NOW + 30);
    seen.insert(block(&dir.run(&[
        "--fixture",
        "moved.json",
        "process",
        "--status-ref",
        &status_ref,
        "--now",
        &later,
    ])));

    // CALL_PURPOSE_CONFLICT: a dispatch under the identity a status query derived.
    let reconcile = dir.run(&["--fixture", "case.json", "status", "--status-ref", &status_ref]);
    assert_eq!(reconcile.text("/code"), "OUTCOME_UNKNOWN");
    let query_call = {
        let case =
            load_case(&std::fs::read(dir.join("case.json")).unwrap(), &Registry::builtin(), None)
                .unwrap();
        let status_ref = toolledger_contract::StatusRef::new(&status_ref).unwrap();
        use toolledger_contract::digest::{StatusQueryPart, status_query_id};
        (
            status_query_id(
                StatusQueryPart::Response,
                &case.host.provider_response_id,
                &status_ref,
            ),
            status_query_id(StatusQueryPart::Call, &case.host.provider_call_id, &status_ref),
        )
    };
    dir.write_case("squat.json", |case| {
        case["host_context"]["provider_response_id"] = Value::from(query_call.0.as_str());
        case["host_context"]["provider_call_id"] = Value::from(query_call.1.as_str());
        case["host_context"]["idempotency_key"] = Value::from("refund-ord-1001-z");
    });
    seen.insert(block(&dir.run(&["--fixture", "squat.json", "dispatch"])));

    // CALL_REUSED: the case's own model call, dispatched again under a new key.
    dir.write_case("again.json", |case| {
        case["host_context"]["idempotency_key"] = Value::from("refund-ord-1001-y");
    });
    let reused = dir.run(&["--fixture", "again.json", "dispatch"]);
    assert_eq!(reused.text("/status_ref"), status_ref, "the principal may see its own operation");
    seen.insert(block(&reused));

    // CONTRACT_DRIFT: a self-consistent row accepted under another handler revision
    // (its approval digest rewritten to match), as if the registry had moved on.
    let drift = Dir::new();
    let accepted =
        drift.run(&["--fixture", "case.json", "dispatch", "--failure", "after_intent_commit"]);
    let drift_ref = accepted.text("/status_ref");
    let case =
        load_case(&std::fs::read(drift.join("case.json")).unwrap(), &Registry::builtin(), None)
            .unwrap();
    let mut revisions = Registry::builtin().tool("refund_order").unwrap().revisions.clone();
    revisions.handler = "refund_order.handler.v0".to_owned();
    let digest = case
        .approval
        .as_ref()
        .unwrap()
        .digest_for(&case.approval_binding("refund_order", &revisions));
    drift.db_execute(&format!(
        "UPDATE operations SET handler_revision = 'refund_order.handler.v0', approval_sha256 = '{}'",
        digest.as_str()
    ));
    seen.insert(block(&drift.run(&[
        "--fixture",
        "case.json",
        "process",
        "--status-ref",
        &drift_ref,
    ])));

    // ACCEPTED: enqueued, nothing sent.
    drift.write_case("queued.json", |case| {
        case["host_context"]["idempotency_key"] = Value::from("refund-ord-1001-q");
        case["host_context"]["provider_call_id"] = Value::from("call-queued");
    });
    let queued = drift.run(&["--fixture", "queued.json", "enqueue"]);
    assert_eq!(queued.text("/status"), "pending");
    seen.insert(block(&queued));

    // AUDIT_FAILED: an orphan downstream receipt.
    drift.db_execute(&format!(
        "INSERT INTO downstream_receipts VALUES ('dr_00000000000000000000000000000000', '{}', \
         'rc_00000000000000000000000000000000', '{{}}', 0)",
        "0".repeat(64)
    ));
    seen.insert(block(&drift.run(&["audit"])));

    // DOWNSTREAM_REFUSED, RECEIPT_QUARANTINED and DOWNSTREAM_UNAVAILABLE need a downstream
    // that refuses, garbles or cannot be reached: the library's tests reach them with a
    // host's own (`crates/toolledger/tests/it/host.rs`), and DOWNSTREAM_MISMATCH is
    // reached from this command line in `library.rs`.
    let expected: BTreeSet<String> = [
        "OUTCOME_UNKNOWN",
        "IDEMPOTENCY_CONFLICT",
        "CALL_PURPOSE_CONFLICT",
        "NOT_FOUND",
        "AUTHORIZATION_DENIED",
        "APPROVAL_INVALID",
        "APPROVAL_EXPIRED",
        "BUSINESS_STATE_INVALID",
        "INPUT_INVALID",
        "CONTRACT_DRIFT",
        "LEASE_HELD",
        "AUDIT_FAILED",
        "CALL_REUSED",
        "ACCEPTED",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(seen, expected);
}
