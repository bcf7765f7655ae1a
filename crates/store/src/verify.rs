//! Re-verification of what is read back: every JSON column checked to be strict,
//! canonical v2 JSON over its own bytes; every stored digest and ref recomputed
//! from the row's own fields. Any difference is `STORE_CONTRACT_VIOLATION`.
//!
//! Every backend decodes its rows into the plain structs here and hands them to the
//! same functions, so a row is held to the same contract whichever database kept it.

use serde_json::Value;
use toolledger_contract::{
    Approval, ApprovalBinding, ApprovalBindingRef, DownstreamIdentity, DownstreamRequestRef,
    IdempotencyKey, Identifier, ProviderProfile, Purpose, ReceiptRef, Revisions, Scope, Sha256Hex,
    StatusRef, UnixSeconds,
    digest::{
        downstream_request_ref, request_sha256_of_canonical, result_sha256_of_canonical,
        short_ref_of_canonical, status_ref,
    },
};
use toolledger_json::{Limits, canonicalize_into, check_v2_domain, is_canonical_v2, parse_strict};

use crate::{
    DownstreamReceipt, LocalReceipt, NewOperation, Operation, OperationStatus, OutboxEvent,
    OutboxState, REASON_BYTES_MAX, RecordedCall, StoreError, TerminalOutcome,
};

/// What is wrong with a stored row. The audit reports the two kinds under different
/// checks; every other reader answers `STORE_CONTRACT_VIOLATION` for either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// A JSON column is not strict, canonical JSON in the v2 domain.
    NotCanonical(&'static str),
    /// A digest, ref or binding does not recompute from the row's own fields.
    Contradiction(&'static str),
    /// The operation's status, its outbox event and its local receipt are not in
    /// step (invariant 2), or a state or lease field is outside its domain.
    OutOfStep(&'static str),
}

impl From<Flaw> for StoreError {
    fn from(flaw: Flaw) -> StoreError {
        match flaw {
            Flaw::NotCanonical(what) | Flaw::Contradiction(what) | Flaw::OutOfStep(what) => {
                StoreError::ContractViolation(what)
            }
        }
    }
}

fn violation(what: &'static str) -> Flaw {
    Flaw::Contradiction(what)
}

/// Strict, in the v2 domain, and byte for byte its own canonical form: checked over the
/// text's bytes first, so a column that passes is parsed once and never written back.
pub fn canonical_json(text: &str) -> Result<Value, Flaw> {
    if !is_canonical_v2(text, &Limits::default()) {
        return Err(not_canonical(text));
    }
    // Canonical text is strict JSON whose integers fit an i64: serde_json reads it into
    // the same value the strict parser would.
    serde_json::from_str(text).map_err(|_| Flaw::NotCanonical("stored JSON is not strict"))
}

/// Why `text`, already refused, is not canonical v2 JSON: the long way round, taken
/// only for a column that is about to be refused.
fn not_canonical(text: &str) -> Flaw {
    let Ok(value) = parse_strict(text.as_bytes(), &Limits::default()) else {
        return Flaw::NotCanonical("stored JSON is not strict");
    };
    if check_v2_domain(&value).is_err() {
        return Flaw::NotCanonical("stored JSON is outside the v2 domain");
    }
    Flaw::NotCanonical("stored JSON is not canonical")
}

/// Whether `text` is byte for byte the canonical form of `value`, written into one
/// buffer per thread instead of a new string per column read.
fn is_canonical_form(value: &Value, text: &str) -> bool {
    thread_local! {
        static CANONICAL: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    CANONICAL.with_borrow_mut(|canonical| {
        canonical.clear();
        canonicalize_into(value, canonical);
        let same = canonical == text;
        // A huge column leaves no huge buffer behind.
        if canonical.capacity() > 1 << 16 {
            *canonical = String::new();
        }
        same
    })
}

/// An `operations` row with its outbox event, local receipt and terminal outcome, as
/// a backend decoded it from the columns of [`OPERATION_COLUMNS`](crate::OPERATION_COLUMNS),
/// before any check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "each field is the column of the same name")]
pub struct RawOperation {
    pub tenant_id: String,
    pub subject_id: String,
    pub tool_name: String,
    pub idempotency_key: String,
    pub status_ref: String,
    pub downstream_request_ref: String,
    pub request_sha256: String,
    pub arguments_json: String,
    pub revisions: [String; 6],
    pub provider: String,
    pub api_family: String,
    pub adapter_revision: String,
    pub provider_response_id: String,
    pub provider_call_id: String,
    pub operation_id: String,
    pub approval_id: Option<String>,
    pub approver_id: Option<String>,
    pub approval_sha256: Option<String>,
    pub approved_at: Option<i64>,
    pub approval_expires_at: Option<i64>,
    pub status: String,
    pub created_at: i64,
    pub outbox_state: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<i64>,
    pub attempt_count: Option<i64>,
    /// The local receipt, when the operation has one.
    pub local: Option<RawLocal>,
    /// The downstream's name and revision.
    pub downstream: (String, String),
    /// The terminal outcome, when the operation failed or was quarantined.
    pub outcome: Option<RawOutcome>,
    /// The event's due time, last reason and attempts before its last requeue.
    pub next_attempt_at: Option<i64>,
    pub last_reason: Option<String>,
    pub attempts_before: Option<i64>,
}

/// A row's columns by position, as a backend's driver hands them over: what
/// [`RawOperation::decode`] reads the columns of
/// [`OPERATION_COLUMNS`](crate::OPERATION_COLUMNS) through.
pub trait Columns {
    /// The driver's error for a column that is missing or of another type.
    type Error;

    /// A `TEXT NOT NULL` column.
    ///
    /// # Errors
    ///
    /// The driver's, when the column is not text.
    fn text(&self, index: usize) -> Result<String, Self::Error>;

    /// A text column that may be NULL.
    ///
    /// # Errors
    ///
    /// As [`Columns::text`].
    fn optional_text(&self, index: usize) -> Result<Option<String>, Self::Error>;

    /// An integer column that may be NULL.
    ///
    /// # Errors
    ///
    /// The driver's, when the column is not an integer.
    fn optional_int(&self, index: usize) -> Result<Option<i64>, Self::Error>;

    /// An `INTEGER NOT NULL` column.
    ///
    /// # Errors
    ///
    /// As [`Columns::optional_int`].
    fn int(&self, index: usize) -> Result<i64, Self::Error>;
}

impl RawOperation {
    /// The operation a row of [`OPERATION_COLUMNS`](crate::OPERATION_COLUMNS) holds,
    /// before any check.
    ///
    /// # Errors
    ///
    /// The driver's, when a column cannot be read as its type.
    pub fn decode<C: Columns + ?Sized>(row: &C) -> Result<RawOperation, C::Error> {
        Ok(RawOperation {
            tenant_id: row.text(0)?,
            subject_id: row.text(1)?,
            tool_name: row.text(2)?,
            idempotency_key: row.text(3)?,
            status_ref: row.text(4)?,
            downstream_request_ref: row.text(5)?,
            request_sha256: row.text(6)?,
            arguments_json: row.text(7)?,
            revisions: [
                row.text(8)?,
                row.text(9)?,
                row.text(10)?,
                row.text(11)?,
                row.text(12)?,
                row.text(13)?,
            ],
            provider: row.text(14)?,
            api_family: row.text(15)?,
            adapter_revision: row.text(16)?,
            provider_response_id: row.text(17)?,
            provider_call_id: row.text(18)?,
            operation_id: row.text(19)?,
            approval_id: row.optional_text(20)?,
            approver_id: row.optional_text(21)?,
            approval_sha256: row.optional_text(22)?,
            approved_at: row.optional_int(23)?,
            approval_expires_at: row.optional_int(24)?,
            status: row.text(25)?,
            created_at: row.int(26)?,
            outbox_state: row.optional_text(27)?,
            lease_owner: row.optional_text(28)?,
            lease_until: row.optional_int(29)?,
            attempt_count: row.optional_int(30)?,
            local: match row.optional_text(31)? {
                Some(receipt_ref) => Some(RawLocal {
                    receipt_ref,
                    receipt_json: row.text(32)?,
                    output_json: row.text(33)?,
                    result_sha256: row.text(34)?,
                    downstream_request_ref: row.text(35)?,
                    finalized_by: row.text(36)?,
                }),
                None => None,
            },
            downstream: (row.text(37)?, row.text(38)?),
            outcome: match row.optional_text(39)? {
                Some(kind) => Some(RawOutcome {
                    kind,
                    reason: row.text(40)?,
                    receipt_json: row.optional_text(41)?,
                    finalized_by: row.text(42)?,
                }),
                None => None,
            },
            next_attempt_at: row.optional_int(43)?,
            last_reason: row.optional_text(44)?,
            attempts_before: row.optional_int(45)?,
        })
    }
}

/// A `terminal_outcomes` row as a backend decoded it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "each field is the column of the same name")]
pub struct RawOutcome {
    pub kind: String,
    pub reason: String,
    pub receipt_json: Option<String>,
    pub finalized_by: String,
}

/// A `local_receipts` row as a backend decoded it, before any check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "each field is the column of the same name")]
pub struct RawLocal {
    pub receipt_ref: String,
    pub receipt_json: String,
    pub output_json: String,
    pub result_sha256: String,
    pub downstream_request_ref: String,
    pub finalized_by: String,
}

// The row's strings are moved into their checked types, not copied: a replay reads a
// whole operation, and every copy is an allocation.
fn id(text: String) -> Result<Identifier, Flaw> {
    Identifier::try_from(text).map_err(|_| violation("stored identifier is malformed"))
}

fn digest(text: String) -> Result<Sha256Hex, Flaw> {
    Sha256Hex::try_from(text).map_err(|_| violation("stored digest is malformed"))
}

fn instant(seconds: i64) -> Result<UnixSeconds, Flaw> {
    UnixSeconds::new(seconds).map_err(|_| violation("stored instant is out of range"))
}

/// Checks a raw row against itself and returns the typed operation.
pub fn operation(raw: RawOperation) -> Result<Operation, Flaw> {
    let [input, output, effect, handler, producer, policy] = raw.revisions;
    let revisions = Revisions { input, output, effect, handler, producer, policy };
    let scope = Scope {
        tenant_id: id(raw.tenant_id)?,
        subject_id: id(raw.subject_id)?,
        tool_name: raw.tool_name,
        idempotency_key: IdempotencyKey::try_from(raw.idempotency_key)
            .map_err(|_| violation("stored idempotency key is malformed"))?,
    };
    let arguments = canonical_json(&raw.arguments_json)?;
    let request = digest(raw.request_sha256)?;
    // The column was just proven canonical: its bytes are the preimage's arguments.
    let recomputed = request_sha256_of_canonical(
        &scope.tenant_id,
        &scope.subject_id,
        &scope.tool_name,
        &raw.arguments_json,
        &revisions,
    );
    if recomputed != request {
        return Err(violation("stored request digest does not recompute"));
    }
    let stored_ref = StatusRef::try_from(raw.status_ref)
        .map_err(|_| violation("stored status ref is malformed"))?;
    if status_ref(&scope) != stored_ref {
        return Err(violation("stored status ref does not recompute"));
    }
    let downstream_request_ref = downstream_request_ref(&scope, &request);
    if downstream_request_ref.as_str() != raw.downstream_request_ref {
        return Err(violation("stored downstream request ref does not recompute"));
    }
    let profile = ProviderProfile {
        provider: raw.provider,
        api_family: raw.api_family,
        adapter_revision: raw.adapter_revision,
    };
    let approval = match (
        raw.approval_id,
        raw.approver_id,
        raw.approved_at,
        raw.approval_expires_at,
        raw.approval_sha256,
    ) {
        (None, None, None, None, None) => None,
        (Some(approval_id), Some(approver_id), Some(approved_at), Some(expires_at), Some(sha)) => {
            Some(Approval {
                approval_id: id(approval_id)?,
                approver_id: id(approver_id)?,
                approved_at: instant(approved_at)?,
                expires_at: instant(expires_at)?,
                approval_sha256: digest(sha)?,
            })
        }
        _ => return Err(violation("stored approval is partly missing")),
    };
    let performer = DownstreamIdentity::new(&raw.downstream.0, &raw.downstream.1)
        .map_err(|_| violation("stored downstream identity is malformed"))?;
    let intent = NewOperation {
        status_ref: stored_ref,
        request_sha256: request,
        arguments,
        revisions,
        profile,
        provider_response_id: id(raw.provider_response_id)?,
        provider_call_id: id(raw.provider_call_id)?,
        operation_id: id(raw.operation_id)?,
        approval,
        downstream: performer,
        scope,
    };
    if intent
        .approval
        .as_ref()
        .is_some_and(|approval| !approval.is_bound_to_ref(approval_binding_ref(&intent)))
    {
        return Err(violation("stored approval digest does not recompute"));
    }
    let status =
        OperationStatus::parse(&raw.status).ok_or(Flaw::OutOfStep("stored status is unknown"))?;
    let (Some(state), Some(attempt_count), Some(next_attempt_at)) =
        (raw.outbox_state, raw.attempt_count, raw.next_attempt_at)
    else {
        return Err(Flaw::OutOfStep("operation has no outbox event"));
    };
    let state =
        OutboxState::parse(&state).ok_or(Flaw::OutOfStep("stored outbox state is unknown"))?;
    // The same range `UnixSeconds` checks, without building a civil date per read.
    let in_range = |seconds: i64| (0..=UnixSeconds::MAX).contains(&seconds);
    if !in_range(raw.created_at)
        || !in_range(next_attempt_at)
        || raw.lease_until.is_some_and(|until| !in_range(until))
        || raw
            .last_reason
            .as_ref()
            .is_some_and(|reason| !(1..=REASON_BYTES_MAX).contains(&reason.len()))
    {
        return Err(Flaw::OutOfStep("stored instant is out of range"));
    }
    let outcome_kind = raw.outcome.as_ref().map(|outcome| outcome.kind.as_str());
    in_step(
        status,
        state,
        &raw.lease_owner,
        raw.lease_until,
        attempt_count,
        raw.local.is_some(),
        outcome_kind,
    )?;
    let mut operation = Operation {
        intent,
        downstream_request_ref,
        status,
        outbox: OutboxEvent {
            state,
            lease_owner: raw
                .lease_owner
                .map(Identifier::try_from)
                .transpose()
                .map_err(|_| violation("stored lease owner is malformed"))?,
            lease_until: raw.lease_until,
            attempt_count,
            next_attempt_at,
            last_reason: raw.last_reason,
            attempts_before: raw.attempts_before.unwrap_or_default(),
        },
        receipt: None,
        outcome: raw.outcome.map(outcome).transpose()?,
        created_at: raw.created_at,
    };
    if let Some(raw_local) = raw.local {
        if raw_local.downstream_request_ref != operation.downstream_request_ref.as_str() {
            return Err(violation("local receipt names another downstream request"));
        }
        if !matches!(raw_local.finalized_by.as_str(), "worker" | "status_query" | "operator") {
            return Err(Flaw::OutOfStep("local receipt's finalizer is unknown"));
        }
        operation.receipt = Some(local_receipt(&operation, raw_local)?);
    }
    Ok(operation)
}

/// Checks a stored local receipt against its (verified) operation: by the receipt's
/// own text when it is the one the operation and the output column make
/// ([`written_receipt`]), else the long way round, which says what is wrong.
fn local_receipt(operation: &Operation, raw: RawLocal) -> Result<LocalReceipt, Flaw> {
    let Some(output) = written_receipt(operation, &raw) else {
        return long_way(operation, raw);
    };
    let receipt_ref = checked_ref(raw.receipt_ref, &raw.receipt_json)?;
    let result_sha256 = checked_result(operation, raw.result_sha256, &raw.output_json)?;
    Ok(LocalReceipt {
        downstream: DownstreamReceipt {
            downstream_request_ref: operation.downstream_request_ref.clone(),
            request_sha256: operation.intent.request_sha256.clone(),
            receipt_json: raw.receipt_json,
            receipt_ref,
        },
        output,
        result_sha256,
    })
}

/// The receipt parsed and checked member by member ([`downstream`]), then against its
/// operation ([`local`]).
fn long_way(operation: &Operation, raw: RawLocal) -> Result<LocalReceipt, Flaw> {
    let (receipt, object) = checked_downstream(
        operation.downstream_request_ref.as_str(),
        operation.intent.request_sha256.as_str(),
        raw.receipt_ref,
        &raw.receipt_json,
    )?;
    local(operation, receipt, &object, &raw.output_json, raw.result_sha256)
}

/// The stored output of a local receipt whose receipt column is, byte for byte, the
/// receipt `operation` and the output column make, read without parsing the receipt;
/// `None` sends the caller the long way round ([`downstream`], then [`local`]), which
/// says what is wrong, or accepts a receipt whose strings this check leaves to it.
///
/// Canonical members come in name order: `domain`, `downstream_request_ref`, `output`,
/// `output_revision`, `request_sha256`, `tool_name`. The operation's refs and digest
/// are hex; its tool name and output revision are compared only when they need no
/// escape. So a receipt column equal to that text, around an output column that is
/// canonical one level shallower, is canonical, holds exactly the six members, is
/// bound to this operation, and holds the output column as its output: every check of
/// the long way but the two digests, which the caller recomputes as it does.
fn written_receipt(operation: &Operation, raw: &RawLocal) -> Option<Value> {
    let plain = |text: &str| !text.bytes().any(|byte| matches!(byte, b'"' | b'\\' | 0x00..=0x1F));
    let intent = &operation.intent;
    let (tool_name, output_revision) = (&intent.scope.tool_name, &intent.revisions.output);
    let limits = Limits::default();
    if raw.receipt_json.len() > limits.size_bytes_max
        || !plain(tool_name)
        || !plain(output_revision)
    {
        return None;
    }
    let rest = raw
        .receipt_json
        .strip_prefix(
            r#"{"domain":"tool-result-v2/downstream-receipt","downstream_request_ref":""#,
        )?
        .strip_prefix(operation.downstream_request_ref.as_str())?
        .strip_prefix(r#"","output":"#)?
        .strip_prefix(raw.output_json.as_str())?
        .strip_prefix(r#","output_revision":""#)?
        .strip_prefix(output_revision.as_str())?
        .strip_prefix(r#"","request_sha256":""#)?
        .strip_prefix(intent.request_sha256.as_str())?
        .strip_prefix(r#"","tool_name":""#)?
        .strip_prefix(tool_name.as_str())?;
    // The receipt nests the output one level deeper.
    let output_limits = Limits { depth_max: limits.depth_max - 1, ..limits };
    if rest != r#""}"# || !is_canonical_v2(&raw.output_json, &output_limits) {
        return None;
    }
    serde_json::from_str(&raw.output_json).ok()
}

/// The stored receipt ref, recomputed from `receipt_json`, already proven canonical.
fn checked_ref(receipt_ref: String, receipt_json: &str) -> Result<ReceiptRef, Flaw> {
    if short_ref_of_canonical("rc_", receipt_json) != receipt_ref {
        return Err(violation("receipt ref does not recompute"));
    }
    ReceiptRef::try_from(receipt_ref).map_err(|_| violation("stored receipt ref is malformed"))
}

/// The stored result digest, recomputed from `output_json`, already proven the
/// output's canonical form.
fn checked_result(
    operation: &Operation,
    result: String,
    output_json: &str,
) -> Result<Sha256Hex, Flaw> {
    let intent = &operation.intent;
    let result = digest(result)?;
    if result_sha256_of_canonical(&intent.scope.tool_name, &intent.revisions.output, output_json)
        != result
    {
        return Err(violation("stored result digest does not recompute"));
    }
    Ok(result)
}

/// Invariant 2, and the lease fields of each state: `pending`/`pending` with no lease
/// and no attempt; `processing`/`processing` with an owner, an end and an attempt;
/// `succeeded`/`delivered` with a local receipt. Nothing else.
#[allow(clippy::ref_option, reason = "the row's own field, borrowed")]
fn in_step(
    status: OperationStatus,
    state: OutboxState,
    owner: &Option<String>,
    until: Option<i64>,
    attempts: i64,
    has_receipt: bool,
    outcome: Option<&str>,
) -> Result<(), Flaw> {
    let leased = owner.is_some() && until.is_some() && attempts > 0;
    let unleased = owner.is_none() && until.is_none() && attempts >= 0;
    let fine = match (status, state) {
        (OperationStatus::Pending, OutboxState::Pending) => {
            unleased && !has_receipt && outcome.is_none()
        }
        (OperationStatus::Processing, OutboxState::Processing) => {
            leased && !has_receipt && outcome.is_none()
        }
        (OperationStatus::Dead, OutboxState::Dead) => unleased && !has_receipt && outcome.is_none(),
        (OperationStatus::Succeeded, OutboxState::Delivered) => {
            has_receipt && attempts >= 0 && outcome.is_none()
        }
        (OperationStatus::Failed, OutboxState::Failed) => {
            !has_receipt && attempts >= 0 && outcome == Some("failed")
        }
        (OperationStatus::Quarantined, OutboxState::Quarantined) => {
            !has_receipt && attempts >= 0 && outcome == Some("quarantined")
        }
        _ => false,
    };
    if fine {
        Ok(())
    } else {
        Err(Flaw::OutOfStep("status, outbox event and receipt are not in step"))
    }
}

/// What the approval of a stored intent is bound to: everything from the ledger.
pub fn approval_binding(intent: &NewOperation) -> ApprovalBinding {
    approval_binding_ref(intent).into()
}

/// [`approval_binding`], borrowed: what a read checks a stored approval against.
pub fn approval_binding_ref(intent: &NewOperation) -> ApprovalBindingRef<'_> {
    ApprovalBindingRef {
        tenant_id: &intent.scope.tenant_id,
        subject_id: &intent.scope.subject_id,
        profile: &intent.profile,
        provider_response_id: &intent.provider_response_id,
        provider_call_id: &intent.provider_call_id,
        operation_id: &intent.operation_id,
        idempotency_key: &intent.scope.idempotency_key,
        tool_name: &intent.scope.tool_name,
        request_sha256: &intent.request_sha256,
        revisions: &intent.revisions,
    }
}

const RECEIPT_MEMBERS: [&str; 6] = [
    "domain",
    "downstream_request_ref",
    "request_sha256",
    "tool_name",
    "output_revision",
    "output",
];

/// Checks a stored terminal outcome: its kind, finalizer, reason and kept receipt.
fn outcome(raw: RawOutcome) -> Result<TerminalOutcome, Flaw> {
    if !matches!(raw.finalized_by.as_str(), "worker" | "status_query" | "operator")
        || !(1..=REASON_BYTES_MAX).contains(&raw.reason.len())
    {
        return Err(Flaw::OutOfStep("terminal outcome's finalizer or reason is out of domain"));
    }
    match (raw.kind.as_str(), raw.receipt_json) {
        ("failed", None) => Ok(TerminalOutcome::Failed { reason: raw.reason }),
        ("quarantined", Some(receipt)) => Ok(TerminalOutcome::Quarantined {
            reason: raw.reason,
            receipt: canonical_json(&receipt)?,
        }),
        _ => Err(Flaw::OutOfStep("terminal outcome's kind and receipt are not in step")),
    }
}

/// Checks a stored downstream receipt against itself.
pub fn downstream(
    downstream_request_ref: &str,
    request: &str,
    receipt_ref: String,
    receipt_json: &str,
) -> Result<DownstreamReceipt, Flaw> {
    checked_downstream(downstream_request_ref, request, receipt_ref, receipt_json)
        .map(|(receipt, _)| receipt)
}

/// [`downstream`], and the receipt object it parsed.
fn checked_downstream(
    downstream_request_ref: &str,
    request: &str,
    receipt_ref: String,
    receipt_json: &str,
) -> Result<(DownstreamReceipt, Value), Flaw> {
    let receipt = canonical_json(receipt_json)?;
    let members = receipt.as_object().ok_or(violation("receipt is not an object"))?;
    if members.len() != RECEIPT_MEMBERS.len()
        || !RECEIPT_MEMBERS.iter().all(|name| members.contains_key(*name))
    {
        return Err(violation("receipt does not have the receipt members"));
    }
    let text = |name: &str| members.get(name).and_then(Value::as_str);
    if text("domain") != Some("tool-result-v2/downstream-receipt")
        || text("downstream_request_ref") != Some(downstream_request_ref)
        || text("request_sha256") != Some(request)
        || text("tool_name").is_none()
        || text("output_revision").is_none()
    {
        return Err(violation("receipt is not bound to its request"));
    }
    // The column was just proven canonical, so its bytes are the preimage's.
    let receipt_ref = checked_ref(receipt_ref, receipt_json)?;
    let checked = DownstreamReceipt {
        downstream_request_ref: DownstreamRequestRef::new(downstream_request_ref)
            .map_err(|_| violation("stored downstream request ref is malformed"))?,
        request_sha256: digest(request.to_owned())?,
        receipt_json: receipt_json.to_owned(),
        receipt_ref,
    };
    Ok((checked, receipt))
}

/// Checks a stored local receipt against itself and its (verified) operation.
fn local(
    operation: &Operation,
    receipt: DownstreamReceipt,
    object: &Value,
    output_json: &str,
    result: String,
) -> Result<LocalReceipt, Flaw> {
    let intent = &operation.intent;
    if receipt.request_sha256 != intent.request_sha256
        || receipt.downstream_request_ref != operation.downstream_request_ref
        || object.get("tool_name").and_then(Value::as_str) != Some(intent.scope.tool_name.as_str())
        || object.get("output_revision").and_then(Value::as_str)
            != Some(intent.revisions.output.as_str())
    {
        return Err(violation("local receipt is not bound to its operation"));
    }
    // The receipt was read strictly and canonically, so its output's canonical form
    // equal to the stored column proves the column canonical and the same.
    let output = object.get("output").cloned().unwrap_or(Value::Null);
    if !is_canonical_form(&output, output_json) {
        return Err(if !is_canonical_v2(output_json, &Limits::default()) {
            Flaw::NotCanonical("stored output is not canonical")
        } else {
            violation("local receipt output differs from its receipt")
        });
    }
    // The column was just proven the output's canonical form.
    let result_sha256 = checked_result(operation, result, output_json)?;
    Ok(LocalReceipt { downstream: receipt, output, result_sha256 })
}

/// A recorded call identity as a backend read it (its purpose; its operation's status
/// ref, tenant, subject and status), checked.
///
/// # Errors
///
/// `STORE_CONTRACT_VIOLATION` when a value is outside its domain.
pub fn recorded_call(
    purpose: &str,
    status_ref: &str,
    tenant: &str,
    subject: &str,
    status: &str,
) -> Result<RecordedCall, StoreError> {
    let malformed =
        |_| StoreError::ContractViolation("stored call identity's operation is malformed");
    Ok(RecordedCall {
        purpose: Purpose::parse(purpose)
            .ok_or(StoreError::ContractViolation("stored purpose is unknown"))?,
        status_ref: StatusRef::new(status_ref)
            .map_err(|_| StoreError::ContractViolation("stored status ref is malformed"))?,
        tenant_id: Identifier::new(tenant).map_err(malformed)?,
        subject_id: Identifier::new(subject).map_err(malformed)?,
        status: OperationStatus::parse(status)
            .ok_or(StoreError::ContractViolation("stored status is unknown"))?,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use toolledger_contract::{
        IdempotencyKey, Identifier, Revisions, Scope,
        digest::{
            downstream_receipt, downstream_request_ref, request_sha256, result_sha256,
            short_ref_of_canonical, status_ref,
        },
    };
    use toolledger_json::canonicalize;

    use super::{
        Flaw, LocalReceipt, RawLocal, RawOperation, local_receipt, long_way, operation,
        written_receipt,
    };

    /// A finished operation's row, its receipt made of `output`, with `output_revision`.
    fn finished(output: &Value, output_revision: &str) -> RawOperation {
        let revisions = Revisions {
            input: "in".to_owned(),
            output: output_revision.to_owned(),
            effect: "ef".to_owned(),
            handler: "ha".to_owned(),
            producer: "pr".to_owned(),
            policy: "po".to_owned(),
        };
        let scope = Scope {
            tenant_id: Identifier::new("tenant-a").unwrap(),
            subject_id: Identifier::new("user-1").unwrap(),
            tool_name: "refund_order".to_owned(),
            idempotency_key: IdempotencyKey::new("key-1").unwrap(),
        };
        let arguments = json!({"order_id": "ord-1"});
        let request = request_sha256(
            &scope.tenant_id,
            &scope.subject_id,
            &scope.tool_name,
            &arguments,
            &revisions,
        );
        let dr = downstream_request_ref(&scope, &request);
        let receipt = canonicalize(&downstream_receipt(
            dr.as_str(),
            &request,
            &scope.tool_name,
            output_revision,
            output,
        ));
        let [input, output_rev, effect, handler, producer, policy] = [
            &revisions.input,
            &revisions.output,
            &revisions.effect,
            &revisions.handler,
            &revisions.producer,
            &revisions.policy,
        ]
        .map(Clone::clone);
        RawOperation {
            status_ref: status_ref(&scope).as_str().to_owned(),
            downstream_request_ref: dr.as_str().to_owned(),
            request_sha256: request.as_str().to_owned(),
            arguments_json: canonicalize(&arguments),
            revisions: [input, output_rev, effect, handler, producer, policy],
            provider: "openai".to_owned(),
            api_family: "responses".to_owned(),
            adapter_revision: "1".to_owned(),
            provider_response_id: "resp-1".to_owned(),
            provider_call_id: "call-1".to_owned(),
            operation_id: "op-1".to_owned(),
            approval_id: None,
            approver_id: None,
            approval_sha256: None,
            approved_at: None,
            approval_expires_at: None,
            status: "succeeded".to_owned(),
            created_at: 1_700_000_000,
            outbox_state: Some("delivered".to_owned()),
            lease_owner: None,
            lease_until: None,
            attempt_count: Some(1),
            local: Some(RawLocal {
                receipt_ref: short_ref_of_canonical("rc_", &receipt),
                output_json: canonicalize(output),
                result_sha256: result_sha256(&scope.tool_name, output_revision, output)
                    .as_str()
                    .to_owned(),
                receipt_json: receipt,
                downstream_request_ref: dr.as_str().to_owned(),
                finalized_by: "worker".to_owned(),
            }),
            downstream: ("stand-in".to_owned(), "1".to_owned()),
            outcome: None,
            next_attempt_at: Some(1_700_000_000),
            last_reason: None,
            attempts_before: Some(0),
            tenant_id: scope.tenant_id.as_str().to_owned(),
            subject_id: scope.subject_id.as_str().to_owned(),
            tool_name: scope.tool_name,
            idempotency_key: scope.idempotency_key.as_str().to_owned(),
        }
    }

    /// What the receipt columns `raw` hold answer for the operation of `row` (verified
    /// with its own receipt), read by the receipt's text where it can be, and the long
    /// way round.
    fn both_ways(
        row: RawOperation,
        raw: RawLocal,
    ) -> (bool, Result<Value, Flaw>, Result<Value, Flaw>) {
        let mut verified = operation(row).unwrap();
        verified.receipt = None;
        let by_text = written_receipt(&verified, &raw).is_some();
        let shown = |receipt: LocalReceipt| {
            json!([
                receipt.downstream.receipt_json,
                receipt.downstream.receipt_ref.as_str(),
                receipt.output,
                receipt.result_sha256.as_str()
            ])
        };
        (
            by_text,
            local_receipt(&verified, raw.clone()).map(shown),
            long_way(&verified, raw).map(shown),
        )
    }

    /// A receipt read by its own text answers what the long way round answers: for
    /// outputs holding the receipt's member names, for strings the text check leaves to
    /// the long way, at the depth limit and past it, and for changed columns.
    #[test]
    fn a_receipt_read_by_its_text_answers_what_the_long_way_answers() {
        // Another hex digit at `at`.
        fn flip(text: &mut String, at: usize) {
            let other = if &text[at..=at] == "0" { "1" } else { "0" };
            text.replace_range(at..=at, other);
        }
        let deep = |levels: usize| (0..levels).fold(json!(1), |inner, _| json!([inner]));
        let mut cases = Vec::new();
        for output in [
            json!({"refund_id": "rf_1"}),
            json!({"output_revision": "x", "z": {"output_revision": [",", "\","]}}),
            json!(["\",\"output_revision\":\"", {"tool_name": "\\"}]),
            json!(null),
            deep(31),
            deep(32),
        ] {
            // A revision with characters the text check leaves to the long way, too.
            for revision in ["out", "o\"\\\n"] {
                let local = finished(&output, revision).local.unwrap();
                cases.push((finished(&json!(null), revision), local));
            }
        }
        let changed = |change: fn(&mut RawLocal)| {
            let row = finished(&json!({"refund_id": "rf_1"}), "out");
            let mut local = row.local.clone().unwrap();
            change(&mut local);
            (row, local)
        };
        cases.push(changed(|local| local.receipt_json.insert(0, ' ')));
        cases.push(changed(|local| local.output_json = r#"{"refund_id":"rf_2"}"#.to_owned()));
        cases.push(changed(|local| local.output_json = r#"{ "refund_id":"rf_1"}"#.to_owned()));
        cases.push(changed(|local| flip(&mut local.receipt_ref, 3)));
        cases.push(changed(|local| flip(&mut local.result_sha256, 0)));
        let (mut by_text, mut accepted) = (0, 0);
        for (row, local) in cases {
            let (text, short, long) = both_ways(row, local);
            assert_eq!(short, long);
            by_text += usize::from(text);
            accepted += usize::from(short.is_ok());
        }
        // Both ways accept the five outputs within the limit, under either revision. The
        // receipt's text is read for those under the plain revision, and for the two
        // changed digests, which the recomputation then refuses.
        assert_eq!((by_text, accepted), (7, 10));
    }
}
