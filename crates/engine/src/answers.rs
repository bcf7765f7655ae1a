//! What the flows answer: PASS and BLOCK packages, built one way everywhere.

use serde_json::Value;
use toolledger_contract::{
    BlockCode, Delivery, HostView, Identifier, Purpose, block_package, pass_package_from_view,
};
use toolledger_store::{
    DownstreamReceipt, LocalReceipt, NewOperation, Operation, RecordedCall, StoreError,
};

use crate::EngineError;

/// A business answer: the package the caller prints.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The operation succeeded; `package` is a PASS package.
    Pass {
        /// How the answer came about.
        delivery: Delivery,
        /// The package.
        package: Value,
    },
    /// A refusal, a terminal failure or an unknown outcome; `package` is a BLOCK package.
    Block {
        /// Why.
        code: BlockCode,
        /// The package.
        package: Value,
        /// For an operation that ended without success: why, as the ledger recorded it
        /// (the downstream's refusal, a quarantine's reason). Not in the package, which
        /// carries fixed sentences only; a frontend shows it where its caller may see
        /// it, without reading the ledger again.
        ended: Option<String>,
    },
}

impl Answer {
    /// The package to print.
    pub fn package(&self) -> &Value {
        match self {
            Answer::Pass { package, .. } | Answer::Block { package, .. } => package,
        }
    }

    /// `OK` or the BLOCK code.
    pub fn code(&self) -> &'static str {
        match self {
            Answer::Pass { .. } => "OK",
            Answer::Block { code, .. } => code.as_str(),
        }
    }

    /// The delivery of a PASS package.
    pub fn delivery(&self) -> Option<Delivery> {
        match self {
            Answer::Pass { delivery, .. } => Some(*delivery),
            Answer::Block { .. } => None,
        }
    }

    /// What a host that crashed right after commit A must assume of this `ACCEPTED`
    /// answer, which it never saw: `OUTCOME_UNKNOWN`, with the same status and ref (the
    /// recovery drills answer this). Any other answer is returned as it is.
    pub fn as_if_lost(self) -> Answer {
        match self {
            Answer::Block { code: BlockCode::Accepted, mut package, ended } => {
                if let Some(members) = package.as_object_mut() {
                    let unknown = BlockCode::OutcomeUnknown;
                    members.insert("code".to_owned(), Value::from(unknown.as_str()));
                    members.insert("message".to_owned(), Value::from(unknown.message()));
                }
                Answer::Block { code: BlockCode::OutcomeUnknown, package, ended }
            }
            other => other,
        }
    }

    /// `NOT_FOUND` with no operation shown: what a status ref that is not even well
    /// formed is answered, exactly like one that names nothing.
    pub fn not_found() -> Answer {
        block(BlockCode::NotFound, None)
    }
}

/// A BLOCK answer; `operation` supplies `status` and `status_ref` where the ledger's
/// are shown.
pub(crate) fn block(code: BlockCode, operation: Option<&Operation>) -> Answer {
    let package = block_package(
        code,
        operation.map(|operation| operation.status.as_str()),
        operation.map(|operation| &operation.intent.status_ref),
    );
    Answer::Block { code, package, ended: None }
}

/// `INPUT_INVALID` for arguments a JSON Schema (or the facade's value domain) refused:
/// the package names where (`detail.pointer`, a JSON pointer into the arguments) and
/// which keyword failed (`detail.keyword`), never the value, so the model can correct
/// its call.
pub fn input_invalid(rejection: Option<&toolledger_contract::Rejection>) -> Answer {
    let mut answer = block(BlockCode::InputInvalid, None);
    if let (Some(rejection), Answer::Block { package, .. }) = (rejection, &mut answer) {
        if let Some(members) = package.as_object_mut() {
            members.insert(
                "detail".to_owned(),
                serde_json::json!({"pointer": rejection.pointer, "keyword": rejection.keyword}),
            );
        }
    }
    answer
}

/// `CALL_REUSED`: the model call is already the dispatch of another operation. That
/// operation's status and ref are shown only to a principal who may see it (its own
/// tenant and subject, the scope of a status query).
pub(crate) fn call_reused(
    recorded: &RecordedCall,
    tenant: &Identifier,
    subject: &Identifier,
) -> Answer {
    let visible = recorded.tenant_id == *tenant && recorded.subject_id == *subject;
    let package = block_package(
        BlockCode::CallReused,
        visible.then(|| recorded.status.as_str()),
        visible.then_some(&recorded.status_ref),
    );
    Answer::Block { code: BlockCode::CallReused, package, ended: None }
}

pub(crate) fn violation(what: &'static str) -> EngineError {
    EngineError::Store(StoreError::ContractViolation(what))
}

/// The call a package answers.
pub(crate) struct Answering<'a> {
    pub(crate) response: &'a Identifier,
    pub(crate) call: &'a Identifier,
    pub(crate) purpose: Purpose,
}

impl<'a> Answering<'a> {
    /// The operation's own first call, purpose `dispatch`.
    pub(crate) fn first_call(operation: &'a Operation) -> Answering<'a> {
        Answering {
            response: &operation.intent.provider_response_id,
            call: &operation.intent.provider_call_id,
            purpose: Purpose::Dispatch,
        }
    }
}

/// A PASS answer for an operation the caller keeps (a fresh result, a reconciled one).
pub(crate) fn pass(
    delivery: Delivery,
    operation: &Operation,
    receipt: &LocalReceipt,
    answering: &Answering<'_>,
) -> Answer {
    let intent = &operation.intent;
    let host_view = HostView {
        provider: intent.profile.provider.clone(),
        api_family: intent.profile.api_family.clone(),
        adapter_revision: intent.profile.adapter_revision.clone(),
        provider_response_id: answering.response.clone(),
        provider_call_id: answering.call.clone(),
        purpose: answering.purpose,
        operation_id: intent.operation_id.clone(),
        idempotency_key: intent.scope.idempotency_key.clone(),
        revisions: intent.revisions.clone(),
        downstream_request_ref: receipt.downstream.downstream_request_ref.clone(),
        downstream_receipt_ref: receipt.downstream.receipt_ref.clone(),
        status_ref: intent.status_ref.clone(),
    };
    let package = pass_package_from_view(
        delivery,
        &intent.scope.tool_name,
        receipt.output.clone(),
        &receipt.result_sha256,
        host_view,
        &intent.request_sha256,
    );
    Answer::Pass { delivery, package }
}

/// [`pass`] for an operation read only to be answered (a replay), given as its intent
/// and local receipt: their strings and the output become the package's own instead of
/// being copied.
pub(crate) fn pass_read(
    delivery: Delivery,
    intent: NewOperation,
    receipt: LocalReceipt,
    answering: &Answering<'_>,
) -> Answer {
    let LocalReceipt { downstream, output, result_sha256 } = receipt;
    let NewOperation {
        scope,
        status_ref,
        request_sha256,
        arguments,
        revisions,
        profile,
        operation_id,
        ..
    } = intent;
    let DownstreamReceipt { downstream_request_ref, receipt_json, receipt_ref, .. } = downstream;
    // What the package does not take is freed before the package is built, so the
    // allocator hands its memory straight back to the package's objects.
    drop((arguments, receipt_json));
    let host_view = HostView {
        provider: profile.provider,
        api_family: profile.api_family,
        adapter_revision: profile.adapter_revision,
        provider_response_id: answering.response.clone(),
        provider_call_id: answering.call.clone(),
        purpose: answering.purpose,
        operation_id,
        idempotency_key: scope.idempotency_key,
        revisions,
        downstream_request_ref,
        downstream_receipt_ref: receipt_ref,
        status_ref,
    };
    let package = pass_package_from_view(
        delivery,
        &scope.tool_name,
        output,
        &result_sha256,
        host_view,
        &request_sha256,
    );
    Answer::Pass { delivery, package }
}
