//! The ledger inputs both report benches share: distinct valid cases, what a finished
//! dispatch of one writes (for building large ledgers through a store), and the raw
//! baselines' row values.

use toolledger_contract::{
    HostCall, IdempotencyKey, Registry, Scope, digest::downstream_request_ref, load_case,
};
use toolledger_json::canonicalize;
use toolledger_store::{CallIdentity, LocalReceipt, NewOperation};

/// The PASS case (`fixtures/persistence-case.json`).
pub const CASE: &[u8] = include_bytes!("../../../fixtures/persistence-case.json");

/// Distinct, valid cases: the PASS case under key `k-<index>`, its approval rebound.
#[derive(Debug)]
pub struct Cases {
    /// The PASS case.
    pub base: HostCall,
    /// The built-in registry.
    pub registry: Registry,
}

impl Cases {
    /// The PASS case and the built-in registry.
    #[allow(clippy::new_without_default, reason = "it parses a file")]
    pub fn new() -> Cases {
        Cases {
            base: load_case(CASE, &Registry::builtin(), None).unwrap(),
            registry: Registry::builtin(),
        }
    }

    /// The case under key `k-<index>`.
    pub fn get(&self, index: usize) -> HostCall {
        self.keyed(&format!("k-{index}"))
    }

    /// The case under idempotency key `key`, its own model call `call-<key>`.
    pub fn keyed(&self, key: &str) -> HostCall {
        let mut case = self.base.clone();
        case.host.idempotency_key = IdempotencyKey::new(key).unwrap();
        // Each intent is its own model call: one call is one intent.
        case.host.provider_call_id =
            toolledger_contract::Identifier::new(&format!("call-{key}")).unwrap();
        let tool = self.registry.tool("refund_order").unwrap();
        let binding = case.approval_binding(&tool.name, &tool.revisions);
        let approval = case.approval.as_mut().unwrap();
        approval.approval_sha256 = approval.digest_for(&binding);
        case
    }
}

/// The bench's worker id.
pub fn worker() -> toolledger_contract::Identifier {
    toolledger_contract::Identifier::new("bench-worker").unwrap()
}

/// The raw baselines' values for one case: the same rows a dispatch writes, as the text
/// their plain SQL binds.
#[derive(Debug, Clone)]
#[allow(missing_docs, reason = "each field is the column of the same name")]
pub struct Row {
    pub scope: Scope,
    pub status_ref: String,
    pub downstream_request_ref: String,
    pub request_sha256: String,
    pub arguments_json: String,
    pub receipt_ref: String,
    pub receipt_json: String,
    pub output_json: String,
    pub result_sha256: String,
    pub approval_sha256: String,
}

/// What a dispatch of the case under `key` writes once it has finished, built here
/// with the contract's own digests: the intent, its call identity, and the local
/// receipt of the stand-in's refund.
pub fn finished(cases: &Cases, key: &str) -> (NewOperation, CallIdentity, LocalReceipt) {
    let case = cases.keyed(key);
    let tool = cases.registry.tool("refund_order").unwrap();
    let downstream = toolledger::DownstreamIdentity::new(
        toolledger_store::STAND_IN_NAME,
        toolledger_store::STAND_IN_REVISION,
    )
    .unwrap();
    let (intent, call) =
        toolledger_testkit::intent_of(&case, &tool.name, &tool.revisions, downstream);
    // The stand-in's refund of this request, as a dispatch would have received it.
    let receipt = toolledger_engine::simulated_refund(&toolledger_engine::DownstreamRequest {
        downstream_request_ref: downstream_request_ref(&intent.scope, &intent.request_sha256),
        request_sha256: intent.request_sha256.clone(),
        tool_name: tool.name.clone(),
        output_revision: tool.revisions.output.clone(),
        arguments: intent.arguments.clone(),
    });
    let output = receipt.receipt()["output"].clone();
    let local = LocalReceipt {
        result_sha256: toolledger_contract::digest::result_sha256(
            &tool.name,
            &tool.revisions.output,
            &output,
        ),
        output,
        downstream: receipt,
    };
    (intent, call, local)
}

/// The raw baselines' values for the case under key `k-<index>`: the same rows a
/// dispatch writes, as the text their plain SQL binds.
pub fn row(cases: &Cases, index: usize) -> Row {
    let (intent, _, local) = finished(cases, &format!("k-{index}"));
    Row {
        status_ref: intent.status_ref.as_str().to_owned(),
        downstream_request_ref: local.downstream.downstream_request_ref.as_str().to_owned(),
        request_sha256: intent.request_sha256.as_str().to_owned(),
        arguments_json: canonicalize(&intent.arguments),
        receipt_ref: local.downstream.receipt_ref.as_str().to_owned(),
        receipt_json: local.downstream.receipt_json.clone(),
        output_json: canonicalize(&local.output),
        result_sha256: local.result_sha256.as_str().to_owned(),
        approval_sha256: intent.approval.as_ref().unwrap().approval_sha256.as_str().to_owned(),
        scope: intent.scope,
    }
}
