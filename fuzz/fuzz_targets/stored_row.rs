//! Stored-row verification (`toolledger_store::verify`) on rows a database could hold.
//!
//! The input picks one of three shapes, all decoded through `RawOperation::decode` over
//! the 46 columns of `OPERATION_COLUMNS`, exactly as a backend reads them:
//!
//! - **one column changed** in a valid row (a succeeded operation with an approval and
//!   a local receipt, built once from the contract's own digest functions). The row is
//!   either refused (`STORE_CONTRACT_VIOLATION`, the same flaw each time it is read) or
//!   it verifies to the original operation in every field a digest, a ref or the
//!   status/outbox/receipt invariant binds: scope, status ref, request digest, arguments,
//!   revisions, provider profile and ids, operation id, approval, downstream request ref,
//!   status and outbox state, receipt, output, result digest, outcome. Left free are the
//!   fields nothing binds, checked for their domain only: the downstream's name and
//!   revision, the lease, attempt and scheduling fields, and `created_at`.
//! - **several columns changed** in that row: never a panic, and reading twice gives
//!   the same answer.
//! - **every column arbitrary** (NULL, integer or text): never a panic; the call
//!   identity and downstream receipt checks get arbitrary text too.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::{
    arbitrary::{Result, Unstructured},
    fuzz_target,
};
use serde_json::json;
use toolledger_contract::{
    Approval, DownstreamIdentity, ErrorCode, IdempotencyKey, Identifier, ProviderProfile,
    Revisions, Scope, UnixSeconds, approval_sha256,
    digest::{
        downstream_receipt, downstream_request_ref, request_sha256, result_sha256,
        short_ref_of_canonical, status_ref,
    },
};
use toolledger_json::canonicalize;
use toolledger_store::{
    NewOperation, OPERATION_WIDTH, Operation, StoreError, approval_binding,
    verify::{self, Columns, Flaw, RawLocal, RawOperation},
};

/// One column as a driver hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Column {
    Null,
    Int(i64),
    Text(String),
}

/// A row by position.
#[derive(Debug)]
struct Row(Vec<Column>);

/// A column of another type than asked for, or past the row's end.
#[derive(Debug, PartialEq, Eq)]
struct WrongType;

impl Columns for Row {
    type Error = WrongType;

    fn text(&self, index: usize) -> std::result::Result<String, WrongType> {
        match self.0.get(index) {
            Some(Column::Text(text)) => Ok(text.clone()),
            _ => Err(WrongType),
        }
    }

    fn optional_text(&self, index: usize) -> std::result::Result<Option<String>, WrongType> {
        match self.0.get(index) {
            Some(Column::Null) => Ok(None),
            Some(Column::Text(text)) => Ok(Some(text.clone())),
            _ => Err(WrongType),
        }
    }

    fn optional_int(&self, index: usize) -> std::result::Result<Option<i64>, WrongType> {
        match self.0.get(index) {
            Some(Column::Null) => Ok(None),
            Some(Column::Int(value)) => Ok(Some(*value)),
            _ => Err(WrongType),
        }
    }

    fn int(&self, index: usize) -> std::result::Result<i64, WrongType> {
        match self.0.get(index) {
            Some(Column::Int(value)) => Ok(*value),
            _ => Err(WrongType),
        }
    }
}

fn id(text: &str) -> Identifier {
    Identifier::new(text).expect("a valid identifier")
}

/// A succeeded operation with an approval and a local receipt, every digest and ref
/// computed the way the engine computes them.
fn valid_row() -> RawOperation {
    let scope = Scope {
        tenant_id: id("tenant-a"),
        subject_id: id("user-1"),
        tool_name: "refund_order".to_owned(),
        idempotency_key: IdempotencyKey::new("key-1").expect("a valid key"),
    };
    let revisions = Revisions {
        input: "refund_order.input.v1".to_owned(),
        output: "refund_order.output.v1".to_owned(),
        effect: "refund_order.effect.v1".to_owned(),
        handler: "refund_order.handler.v1".to_owned(),
        producer: "refund_order.producer.v1".to_owned(),
        policy: "refund_order.policy.v1".to_owned(),
    };
    let arguments = json!({"amount_cents": 1250, "order_id": "ord-1", "reason": "damaged"});
    let request = request_sha256(
        &scope.tenant_id,
        &scope.subject_id,
        &scope.tool_name,
        &arguments,
        &revisions,
    );
    let dr_ref = String::from(downstream_request_ref(&scope, &request));
    let mut intent = NewOperation {
        status_ref: status_ref(&scope),
        request_sha256: request.clone(),
        arguments: arguments.clone(),
        revisions: revisions.clone(),
        profile: ProviderProfile::new("openai", "responses", "openai-responses-2026-05"),
        provider_response_id: id("resp-1"),
        provider_call_id: id("call-1"),
        operation_id: id("op-1"),
        approval: None,
        downstream: DownstreamIdentity::new("refunds-http", "1").expect("a valid identity"),
        scope: scope.clone(),
    };
    let (approved_at, expires_at) = (1_767_225_000, 1_767_228_600);
    let approval_sha = approval_sha256(
        &id("appr-1"),
        &id("user-2"),
        UnixSeconds::new(approved_at).expect("in range"),
        UnixSeconds::new(expires_at).expect("in range"),
        &approval_binding(&intent),
    );
    intent.approval = Some(Approval {
        approval_id: id("appr-1"),
        approver_id: id("user-2"),
        approved_at: UnixSeconds::new(approved_at).expect("in range"),
        expires_at: UnixSeconds::new(expires_at).expect("in range"),
        approval_sha256: approval_sha.clone(),
    });
    let output = json!({"refund_id": "rf_1", "amount_cents": 1250, "status": "refunded"});
    let receipt =
        downstream_receipt(&dr_ref, &request, &scope.tool_name, &revisions.output, &output);
    let receipt_json = canonicalize(&receipt);
    RawOperation {
        tenant_id: "tenant-a".to_owned(),
        subject_id: "user-1".to_owned(),
        tool_name: scope.tool_name.clone(),
        idempotency_key: "key-1".to_owned(),
        status_ref: intent.status_ref.as_str().to_owned(),
        downstream_request_ref: dr_ref.clone(),
        request_sha256: request.as_str().to_owned(),
        arguments_json: canonicalize(&arguments),
        revisions: [
            revisions.input.clone(),
            revisions.output.clone(),
            revisions.effect.clone(),
            revisions.handler.clone(),
            revisions.producer.clone(),
            revisions.policy.clone(),
        ],
        provider: "openai".to_owned(),
        api_family: "responses".to_owned(),
        adapter_revision: "openai-responses-2026-05".to_owned(),
        provider_response_id: "resp-1".to_owned(),
        provider_call_id: "call-1".to_owned(),
        operation_id: "op-1".to_owned(),
        approval_id: Some("appr-1".to_owned()),
        approver_id: Some("user-2".to_owned()),
        approval_sha256: Some(approval_sha.as_str().to_owned()),
        approved_at: Some(approved_at),
        approval_expires_at: Some(expires_at),
        status: "succeeded".to_owned(),
        created_at: 1_767_225_600,
        outbox_state: Some("delivered".to_owned()),
        lease_owner: None,
        lease_until: None,
        attempt_count: Some(1),
        local: Some(RawLocal {
            receipt_ref: short_ref_of_canonical("rc_", &receipt_json),
            receipt_json,
            output_json: canonicalize(&output),
            result_sha256: result_sha256(&scope.tool_name, &revisions.output, &output)
                .as_str()
                .to_owned(),
            downstream_request_ref: dr_ref,
            finalized_by: "worker".to_owned(),
        }),
        downstream: ("refunds-http".to_owned(), "1".to_owned()),
        outcome: None,
        next_attempt_at: Some(1_767_225_600),
        last_reason: None,
        attempts_before: None,
    }
}

/// `raw` as the columns [`RawOperation::decode`] reads it from: its inverse.
fn columns(raw: &RawOperation) -> Vec<Column> {
    let text = |text: &str| Column::Text(text.to_owned());
    let optional_text = |text: &Option<String>| {
        text.as_deref().map_or(Column::Null, |text| Column::Text(text.to_owned()))
    };
    let optional_int = |value: Option<i64>| value.map_or(Column::Null, Column::Int);
    let mut row = vec![
        text(&raw.tenant_id),
        text(&raw.subject_id),
        text(&raw.tool_name),
        text(&raw.idempotency_key),
        text(&raw.status_ref),
        text(&raw.downstream_request_ref),
        text(&raw.request_sha256),
        text(&raw.arguments_json),
    ];
    row.extend(raw.revisions.iter().map(|revision| text(revision)));
    row.extend([
        text(&raw.provider),
        text(&raw.api_family),
        text(&raw.adapter_revision),
        text(&raw.provider_response_id),
        text(&raw.provider_call_id),
        text(&raw.operation_id),
        optional_text(&raw.approval_id),
        optional_text(&raw.approver_id),
        optional_text(&raw.approval_sha256),
        optional_int(raw.approved_at),
        optional_int(raw.approval_expires_at),
        text(&raw.status),
        Column::Int(raw.created_at),
        optional_text(&raw.outbox_state),
        optional_text(&raw.lease_owner),
        optional_int(raw.lease_until),
        optional_int(raw.attempt_count),
    ]);
    match &raw.local {
        Some(local) => row.extend([
            text(&local.receipt_ref),
            text(&local.receipt_json),
            text(&local.output_json),
            text(&local.result_sha256),
            text(&local.downstream_request_ref),
            text(&local.finalized_by),
        ]),
        None => row.extend(std::iter::repeat_n(Column::Null, 6)),
    }
    row.extend([text(&raw.downstream.0), text(&raw.downstream.1)]);
    match &raw.outcome {
        Some(outcome) => row.extend([
            text(&outcome.kind),
            text(&outcome.reason),
            optional_text(&outcome.receipt_json),
            text(&outcome.finalized_by),
        ]),
        None => row.extend(std::iter::repeat_n(Column::Null, 4)),
    }
    row.extend([
        optional_int(raw.next_attempt_at),
        optional_text(&raw.last_reason),
        optional_int(raw.attempts_before),
    ]);
    assert_eq!(row.len(), OPERATION_WIDTH);
    row
}

/// The valid row, its columns and its verified operation, built and checked once.
static VALID: LazyLock<(Vec<Column>, Operation)> = LazyLock::new(|| {
    let raw = valid_row();
    let row = columns(&raw);
    assert_eq!(RawOperation::decode(&Row(row.clone())).as_ref(), Ok(&raw));
    let operation = verify::operation(raw).expect("the valid row verifies");
    (row, operation)
});

/// Decodes and verifies a row: `Err(None)` when a column has the wrong type.
fn read(row: &[Column]) -> std::result::Result<Operation, Option<Flaw>> {
    let raw = RawOperation::decode(&Row(row.to_vec())).map_err(|WrongType| None)?;
    verify::operation(raw).map_err(Some)
}

/// `operation` with the fields no digest, ref or invariant binds set to `original`'s.
fn bound_part(mut operation: Operation, original: &Operation) -> Operation {
    operation.intent.downstream = original.intent.downstream.clone();
    operation.outbox.lease_owner = original.outbox.lease_owner.clone();
    operation.outbox.lease_until = original.outbox.lease_until;
    operation.outbox.attempt_count = original.outbox.attempt_count;
    operation.outbox.next_attempt_at = original.outbox.next_attempt_at;
    operation.outbox.last_reason = original.outbox.last_reason.clone();
    operation.outbox.attempts_before = original.outbox.attempts_before;
    operation.created_at = original.created_at;
    operation
}

/// A new value for a column, often a small edit of the one it replaces.
fn mutated(u: &mut Unstructured<'_>, original: &Column) -> Result<Column> {
    Ok(match (u.int_in_range(0..=5u8)?, original) {
        (0, _) => Column::Null,
        (1, Column::Int(value)) => Column::Int(value.wrapping_add(u.int_in_range(-3..=3)?)),
        (1 | 2, _) => Column::Int(u.arbitrary()?),
        (3, Column::Text(text)) => {
            let mut chars: Vec<char> = text.chars().collect();
            let at = u.int_in_range(0..=chars.len())?;
            match u.int_in_range(0..=2u8)? {
                0 if at < chars.len() => {
                    chars.remove(at);
                }
                1 if at < chars.len() => chars[at] = u.arbitrary()?,
                _ => chars.insert(at, u.arbitrary()?),
            }
            Column::Text(chars.into_iter().collect())
        }
        (4, Column::Text(text)) => {
            let keep = u.int_in_range(0..=text.len())?;
            let mut text: String =
                text.char_indices().take_while(|(at, _)| *at < keep).map(|(_, c)| c).collect();
            text.push_str(u.arbitrary()?);
            Column::Text(text)
        }
        _ => Column::Text(u.arbitrary()?),
    })
}

fn arbitrary_column(u: &mut Unstructured<'_>) -> Result<Column> {
    Ok(match u.int_in_range(0..=2u8)? {
        0 => Column::Null,
        1 => Column::Int(u.arbitrary()?),
        _ => Column::Text(u.arbitrary()?),
    })
}

fn check(data: &[u8]) -> Result<()> {
    let (valid, original) = &*VALID;
    let mut u = Unstructured::new(data);
    match u.int_in_range(0..=2u8)? {
        0 => {
            let index = u.int_in_range(0..=OPERATION_WIDTH - 1)?;
            let mut row = valid.clone();
            row[index] = mutated(&mut u, &row[index])?;
            match read(&row) {
                Ok(operation) => assert_eq!(
                    bound_part(operation, original),
                    *original,
                    "column {index} changed to {:?} and the row still verified, to another operation",
                    row[index],
                ),
                Err(Some(flaw)) => {
                    assert_eq!(read(&row).err(), Some(Some(flaw)), "a second read differs");
                    assert_eq!(StoreError::from(flaw).code(), ErrorCode::StoreContractViolation);
                }
                Err(None) => {}
            }
        }
        1 => {
            let mut row = valid.clone();
            for _ in 0..u.int_in_range(2..=8u8)? {
                let index = u.int_in_range(0..=OPERATION_WIDTH - 1)?;
                row[index] = mutated(&mut u, &row[index])?;
            }
            assert_eq!(read(&row), read(&row), "a second read differs");
        }
        _ => {
            let row = (0..OPERATION_WIDTH)
                .map(|_| arbitrary_column(&mut u))
                .collect::<Result<Vec<_>>>()?;
            assert_eq!(read(&row), read(&row), "a second read differs");
            let texts: [&str; 5] =
                [u.arbitrary()?, u.arbitrary()?, u.arbitrary()?, u.arbitrary()?, u.arbitrary()?];
            let [purpose, status_ref, tenant, subject, status] = texts;
            let _ = verify::recorded_call(purpose, status_ref, tenant, subject, status);
            let _ = verify::downstream(tenant, subject, status_ref.to_owned(), purpose);
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    // Running out of input mid-way is a shorter case, not a failure.
    let _ = check(data);
});
