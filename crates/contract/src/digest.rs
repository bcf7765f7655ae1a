//! Every digest and reference of SPEC §4.2 and §7, each built from an exact preimage.
//!
//! `H(x)` is the lowercase hex SHA-256 of the RFC 8785 canonical bytes of object `x`.
//! Every preimage carries a `"domain"` member, so no two kinds of digest can collide by
//! construction. Each `*_preimage` function returns the exact object hashed; the
//! matching function without the suffix hashes it. `docs/contract.md` lists them all
//! and `docs/contract-vectors.json` pins them with test vectors.

use std::fmt::Write as _;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use toolledger_json::canonicalize;

use crate::{IdempotencyKey, Identifier, Revisions, Sha256Hex, StatusRef};

/// `H(x)`: SHA-256 of the canonical form of `preimage`, as lowercase hex.
pub fn sha256_canonical(preimage: &Value) -> Sha256Hex {
    let digest = Sha256::digest(canonicalize(preimage).as_bytes());
    let mut hex = String::with_capacity(64);
    for byte in digest {
        let _ = write!(hex, "{byte:02x}");
    }
    Sha256Hex::new(&hex).unwrap_or_else(|_| unreachable!("64 lowercase hex digits"))
}

/// `prefix` + the first 32 hex digits of `H(preimage)`.
pub fn short_ref(prefix: &str, preimage: &Value) -> String {
    let digest = sha256_canonical(preimage);
    format!("{prefix}{}", digest.as_str().get(..32).unwrap_or_default())
}

/// Why a call is being answered: dispatching it, or querying an earlier one's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// The call that asked for the side effect.
    Dispatch,
    /// A host-derived call that asks what became of it.
    QueryStatus,
}

impl Purpose {
    /// `dispatch` or `query_status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Dispatch => "dispatch",
            Purpose::QueryStatus => "query_status",
        }
    }

    /// The purpose named `text`, if any.
    pub fn parse(text: &str) -> Option<Purpose> {
        match text {
            "dispatch" => Some(Purpose::Dispatch),
            "query_status" => Some(Purpose::QueryStatus),
            _ => None,
        }
    }
}

/// How a PASS answer came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// A worker finished the operation just now.
    Fresh,
    /// A status query reconciled a downstream receipt just now.
    ReceiptReconciled,
    /// The ledger already held the local receipt.
    LocalReplay,
}

impl Delivery {
    /// `fresh`, `receipt_reconciled` or `local_replay`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Fresh => "fresh",
            Delivery::ReceiptReconciled => "receipt_reconciled",
            Delivery::LocalReplay => "local_replay",
        }
    }

    /// The delivery named `text`, if any.
    pub fn parse(text: &str) -> Option<Delivery> {
        match text {
            "fresh" => Some(Delivery::Fresh),
            "receipt_reconciled" => Some(Delivery::ReceiptReconciled),
            "local_replay" => Some(Delivery::LocalReplay),
            _ => None,
        }
    }
}

/// The scope of an operation: who, which tool, which key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// The tenant.
    pub tenant_id: Identifier,
    /// The subject acting within it.
    pub subject_id: Identifier,
    /// The tool.
    pub tool_name: String,
    /// The retry identity.
    pub idempotency_key: IdempotencyKey,
}

/// The request preimage: intent only, **without** the idempotency key.
pub fn request_preimage(
    tenant_id: &Identifier,
    subject_id: &Identifier,
    tool_name: &str,
    arguments: &Value,
    revisions: &Revisions,
) -> Value {
    json!({
        "domain": "tool-result-v2/request",
        "tenant_id": tenant_id.as_str(),
        "subject_id": subject_id.as_str(),
        "tool_name": tool_name,
        "arguments": arguments,
        "input_revision": revisions.input,
        "output_revision": revisions.output,
        "effect_revision": revisions.effect,
    })
}

/// `request_sha256`.
pub fn request_sha256(
    tenant_id: &Identifier,
    subject_id: &Identifier,
    tool_name: &str,
    arguments: &Value,
    revisions: &Revisions,
) -> Sha256Hex {
    sha256_canonical(&request_preimage(tenant_id, subject_id, tool_name, arguments, revisions))
}

/// `downstream_request_ref` preimage.
pub fn downstream_request_preimage(scope: &Scope, request_sha256: &Sha256Hex) -> Value {
    json!({
        "domain": "tool-result-v2/downstream-request",
        "tenant_id": scope.tenant_id.as_str(),
        "subject_id": scope.subject_id.as_str(),
        "tool_name": scope.tool_name,
        "idempotency_key": scope.idempotency_key.as_str(),
        "request_sha256": request_sha256.as_str(),
    })
}

/// `dr_` + 32 hex: the scope the downstream is idempotent on.
pub fn downstream_request_ref(scope: &Scope, request_sha256: &Sha256Hex) -> String {
    short_ref("dr_", &downstream_request_preimage(scope, request_sha256))
}

/// `status_ref` preimage.
pub fn status_ref_preimage(scope: &Scope) -> Value {
    json!({
        "domain": "tool-result-v2/status-ref",
        "tenant_id": scope.tenant_id.as_str(),
        "subject_id": scope.subject_id.as_str(),
        "tool_name": scope.tool_name,
        "idempotency_key": scope.idempotency_key.as_str(),
    })
}

/// `sr_` + 32 hex: the opaque name of an operation.
pub fn status_ref(scope: &Scope) -> StatusRef {
    let text = short_ref("sr_", &status_ref_preimage(scope));
    StatusRef::new(&text).unwrap_or_else(|_| unreachable!("sr_ and 32 lowercase hex digits"))
}

/// `result_sha256` preimage.
pub fn result_preimage(tool_name: &str, output_revision: &str, output: &Value) -> Value {
    json!({
        "domain": "tool-result-v2/result",
        "tool_name": tool_name,
        "output_revision": output_revision,
        "output": output,
    })
}

/// `result_sha256`.
pub fn result_sha256(tool_name: &str, output_revision: &str, output: &Value) -> Sha256Hex {
    sha256_canonical(&result_preimage(tool_name, output_revision, output))
}

/// The downstream receipt the stand-in stores and returns.
pub fn downstream_receipt(
    downstream_request_ref: &str,
    request_sha256: &Sha256Hex,
    tool_name: &str,
    output_revision: &str,
    output: &Value,
) -> Value {
    json!({
        "domain": "tool-result-v2/downstream-receipt",
        "downstream_request_ref": downstream_request_ref,
        "request_sha256": request_sha256.as_str(),
        "tool_name": tool_name,
        "output_revision": output_revision,
        "output": output,
    })
}

/// `rc_` + 32 hex of the receipt itself.
pub fn downstream_receipt_ref(receipt: &Value) -> String {
    short_ref("rc_", receipt)
}

/// `refund_id` preimage (the stand-in derives the refund id from the request scope, so
/// the same request always yields the same refund).
pub fn refund_id_preimage(downstream_request_ref: &str) -> Value {
    json!({"domain": "tool-result-v2/refund-id", "downstream_request_ref": downstream_request_ref})
}

/// `rf_` + 32 hex.
pub fn refund_id(downstream_request_ref: &str) -> String {
    short_ref("rf_", &refund_id_preimage(downstream_request_ref))
}

/// Which half of a call identity a status-query id replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusQueryPart {
    /// `provider_response_id`.
    Response,
    /// `provider_call_id`.
    Call,
}

/// The preimage of a status query's derived response or call id.
pub fn status_query_preimage(
    part: StatusQueryPart,
    case_id: &Identifier,
    status_ref: &StatusRef,
) -> Value {
    match part {
        StatusQueryPart::Response => json!({
            "domain": "tool-result-v2/status-query",
            "kind": "response",
            "provider_response_id": case_id.as_str(),
            "status_ref": status_ref.as_str(),
        }),
        StatusQueryPart::Call => json!({
            "domain": "tool-result-v2/status-query",
            "kind": "call",
            "provider_call_id": case_id.as_str(),
            "status_ref": status_ref.as_str(),
        }),
    }
}

/// `qs_` + 32 hex: the host-owned id a status query answers under.
pub fn status_query_id(
    part: StatusQueryPart,
    case_id: &Identifier,
    status_ref: &StatusRef,
) -> Identifier {
    let text = short_ref("qs_", &status_query_preimage(part, case_id, status_ref));
    Identifier::new(&text).unwrap_or_else(|_| unreachable!("qs_ and 32 lowercase hex digits"))
}

/// What the host audits about a call: exactly the `host_view` members of SPEC §4.5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// Provider, API family and adapter revision.
    pub provider: String,
    /// API family.
    pub api_family: String,
    /// Adapter revision.
    pub adapter_revision: String,
    /// The response being answered.
    pub provider_response_id: Identifier,
    /// The call being answered.
    pub provider_call_id: Identifier,
    /// Dispatch or status query.
    pub purpose: Purpose,
    /// The ledger's operation id.
    pub operation_id: Identifier,
    /// The key.
    pub idempotency_key: IdempotencyKey,
    /// The six revisions of the operation.
    pub revisions: Revisions,
    /// `dr_…`.
    pub downstream_request_ref: String,
    /// `rc_…`.
    pub downstream_receipt_ref: String,
    /// `sr_…`.
    pub status_ref: StatusRef,
}

impl HostView {
    /// The `host_view` object.
    pub fn to_json(&self) -> Value {
        json!({
            "provider": self.provider,
            "api_family": self.api_family,
            "adapter_revision": self.adapter_revision,
            "provider_response_id": self.provider_response_id.as_str(),
            "provider_call_id": self.provider_call_id.as_str(),
            "purpose": self.purpose.as_str(),
            "operation_id": self.operation_id.as_str(),
            "idempotency_key": self.idempotency_key.as_str(),
            "revisions": self.revisions.to_json(),
            "downstream_request_ref": self.downstream_request_ref,
            "downstream_receipt_ref": self.downstream_receipt_ref,
            "status_ref": self.status_ref.as_str(),
        })
    }
}

/// The call-binding preimage: the host view's members plus `domain`, `tool_name`,
/// `request_sha256`, `result_sha256` and `delivery`. Takes the host view as JSON so a
/// package can be checked from its own bytes.
pub fn call_binding_preimage(
    host_view: &Value,
    tool_name: &str,
    request_sha256: &str,
    result_sha256: &str,
    delivery: &str,
) -> Value {
    let mut preimage = host_view.as_object().cloned().unwrap_or_default();
    preimage.insert("domain".to_owned(), json!("tool-result-v2/call-binding"));
    preimage.insert("tool_name".to_owned(), json!(tool_name));
    preimage.insert("request_sha256".to_owned(), json!(request_sha256));
    preimage.insert("result_sha256".to_owned(), json!(result_sha256));
    preimage.insert("delivery".to_owned(), json!(delivery));
    Value::Object(preimage)
}

/// `call_binding_sha256`.
pub fn call_binding_sha256(
    host_view: &HostView,
    tool_name: &str,
    request_sha256: &Sha256Hex,
    result_sha256: &Sha256Hex,
    delivery: Delivery,
) -> Sha256Hex {
    sha256_canonical(&call_binding_preimage(
        &host_view.to_json(),
        tool_name,
        request_sha256.as_str(),
        result_sha256.as_str(),
        delivery.as_str(),
    ))
}
