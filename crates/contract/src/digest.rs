//! Every digest and reference of the contract (`docs/contract.md`), each built from an exact preimage.
//!
//! `H(x)` is the lowercase hex SHA-256 of the RFC 8785 canonical bytes of object `x`.
//! Every preimage carries a `"domain"` member, so no two kinds of digest can collide by
//! construction. Each `*_preimage` function returns the exact object hashed; the
//! matching function without the suffix hashes it. `docs/contract.md` lists them all
//! and `docs/contract-vectors.json` pins them with test vectors.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use toolledger_json::{canonicalize_into, canonicalize_str_into};

use crate::{
    DownstreamRequestRef, IdempotencyKey, Identifier, ReceiptRef, Revisions, Sha256Hex, StatusRef,
};

/// One member value of a preimage.
///
/// Each preimage is defined once, as a list of members; the same list yields both the
/// JSON object (`*_preimage`, for documents and test vectors) and its digest, which is
/// written straight into canonical bytes without building that object.
#[derive(Debug, Clone)]
pub(crate) enum Member<'a> {
    Str(&'a str),
    Int(i64),
    Json(&'a Value),
    /// JSON text the caller has proven canonical: written as it is.
    Canonical(&'a str),
    /// The six revisions, as the object of their short names.
    Revisions(&'a Revisions),
}

impl Member<'_> {
    fn to_value(&self) -> Value {
        match self {
            Member::Str(text) => Value::from(*text),
            Member::Int(number) => Value::from(*number),
            Member::Json(value) => (*value).clone(),
            // Only digests are made of `Canonical` members (the `*_of_canonical`
            // functions), never a preimage value; the text is proven canonical JSON.
            Member::Canonical(text) => {
                toolledger_json::parse_strict(text.as_bytes(), &toolledger_json::Limits::default())
                    .unwrap_or(Value::Null)
            }
            Member::Revisions(revisions) => object_value(&revisions_members(revisions)),
        }
    }

    fn write(&self, out: &mut String) {
        match self {
            Member::Str(text) => canonicalize_str_into(text, out),
            Member::Int(number) => canonicalize_into(&Value::from(*number), out),
            Member::Json(value) => canonicalize_into(value, out),
            Member::Canonical(text) => out.push_str(text),
            Member::Revisions(revisions) => write_object(&revisions_members(revisions), out),
        }
    }
}

/// The members of a preimage object, `N` of them on the stack: a digest allocates
/// nothing but its preimage's bytes (a replay recomputes seven). Names are static ASCII,
/// so their byte order is their UTF-16 order, and every list a digest is written from
/// is listed in that order: the canonical form is the list as it stands, with no sort
/// per digest. (A host view's own list keeps the contract's order; the call binding
/// puts its members in place.)
pub(crate) type Members<'a, const N: usize> = [(&'static str, Member<'a>); N];

pub(crate) fn object_value(members: &[(&'static str, Member<'_>)]) -> Value {
    Value::Object(
        members
            .iter()
            .map(|(name, member)| ((*name).to_owned(), member.to_value()))
            .collect::<Map<_, _>>(),
    )
}

/// Writes `members`, listed in canonical order (every test that computes a digest
/// checks it; `tests::every_preimage_lists_its_members_in_canonical_order` names each).
fn write_object(members: &[(&'static str, Member<'_>)], out: &mut String) {
    debug_assert!(
        members.is_sorted_by_key(|(name, _)| *name),
        "a preimage lists its members in canonical order"
    );
    out.push('{');
    write_members(members.iter(), out);
    out.push('}');
}

fn write_members<'m, 'a: 'm>(
    members: impl Iterator<Item = &'m (&'static str, Member<'a>)>,
    out: &mut String,
) {
    for (index, (name, member)) in members.enumerate() {
        if index > 0 {
            out.push(',');
        }
        // A member name is a static word of lowercase letters, digits and underscores,
        // its own canonical string: written as it is, without the escape scan.
        debug_assert!(name.bytes().all(|byte| matches!(byte, b'a'..=b'z' | b'0'..=b'9' | b'_')));
        out.push('"');
        out.push_str(name);
        out.push_str("\":");
        member.write(out);
    }
}

/// Appends `bytes` (at most 32) as lowercase hex digits, written on the stack first and
/// appended at once.
fn push_hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0_u8; 64];
    for (pair, byte) in digits.chunks_exact_mut(2).zip(bytes) {
        for (digit, nibble) in pair.iter_mut().zip([byte >> 4, byte & 0xF]) {
            *digit = DIGITS.get(usize::from(nibble)).copied().unwrap_or(b'0');
        }
    }
    let written = digits.get(..bytes.len().min(32) * 2).unwrap_or_default();
    out.push_str(std::str::from_utf8(written).unwrap_or_else(|_| unreachable!("ASCII digits")));
}

fn hex(bytes: &[u8; 32]) -> Sha256Hex {
    let mut text = String::with_capacity(64);
    push_hex(bytes, &mut text);
    Sha256Hex::try_from(text).unwrap_or_else(|_| unreachable!("64 lowercase hex digits"))
}

/// `prefix` and the first 32 hex digits of `digest`.
fn short_hex(prefix: &str, digest: &[u8; 32]) -> String {
    let mut text = String::with_capacity(prefix.len() + 32);
    text.push_str(prefix);
    push_hex(digest.get(..16).unwrap_or_default(), &mut text);
    text
}

/// SHA-256 of a preimage given as members, written into one buffer per thread
/// instead of a new string per digest (a replay recomputes six).
fn sha256_members(members: &[(&'static str, Member<'_>)]) -> [u8; 32] {
    thread_local! {
        static PREIMAGE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    PREIMAGE.with_borrow_mut(|canonical| {
        canonical.clear();
        write_object(members, canonical);
        let digest = Sha256::digest(canonical.as_bytes()).into();
        // A huge preimage leaves no huge buffer behind.
        if canonical.capacity() > 1 << 16 {
            *canonical = String::new();
        }
        digest
    })
}

/// `H(x)` of a preimage given as members.
pub(crate) fn hash_members(members: &[(&'static str, Member<'_>)]) -> Sha256Hex {
    hex(&sha256_members(members))
}

fn short_members(prefix: &str, members: &[(&'static str, Member<'_>)]) -> String {
    short_hex(prefix, &sha256_members(members))
}

/// `H(x)`: SHA-256 of the canonical form of `preimage`, as lowercase hex.
pub fn sha256_canonical(preimage: &Value) -> Sha256Hex {
    hex(&Sha256::digest(toolledger_json::canonicalize(preimage).as_bytes()).into())
}

/// `prefix` + the first 32 hex digits of `H(preimage)`.
pub fn short_ref(prefix: &str, preimage: &Value) -> String {
    short_hex(prefix, &Sha256::digest(toolledger_json::canonicalize(preimage).as_bytes()).into())
}

fn revisions_members(revisions: &Revisions) -> Members<'_, 6> {
    [
        ("effect", Member::Str(&revisions.effect)),
        ("handler", Member::Str(&revisions.handler)),
        ("input", Member::Str(&revisions.input)),
        ("output", Member::Str(&revisions.output)),
        ("policy", Member::Str(&revisions.policy)),
        ("producer", Member::Str(&revisions.producer)),
    ]
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

fn request_members<'a>(
    tenant_id: &'a Identifier,
    subject_id: &'a Identifier,
    tool_name: &'a str,
    arguments: &'a Value,
    revisions: &'a Revisions,
) -> Members<'a, 8> {
    request_members_with(tenant_id, subject_id, tool_name, Member::Json(arguments), revisions)
}

fn request_members_with<'a>(
    tenant_id: &'a Identifier,
    subject_id: &'a Identifier,
    tool_name: &'a str,
    arguments: Member<'a>,
    revisions: &'a Revisions,
) -> Members<'a, 8> {
    [
        ("arguments", arguments),
        ("domain", Member::Str("tool-result-v2/request")),
        ("effect_revision", Member::Str(&revisions.effect)),
        ("input_revision", Member::Str(&revisions.input)),
        ("output_revision", Member::Str(&revisions.output)),
        ("subject_id", Member::Str(subject_id.as_str())),
        ("tenant_id", Member::Str(tenant_id.as_str())),
        ("tool_name", Member::Str(tool_name)),
    ]
}

/// The request preimage: intent only, **without** the idempotency key.
pub fn request_preimage(
    tenant_id: &Identifier,
    subject_id: &Identifier,
    tool_name: &str,
    arguments: &Value,
    revisions: &Revisions,
) -> Value {
    object_value(&request_members(tenant_id, subject_id, tool_name, arguments, revisions))
}

/// `request_sha256`.
pub fn request_sha256(
    tenant_id: &Identifier,
    subject_id: &Identifier,
    tool_name: &str,
    arguments: &Value,
    revisions: &Revisions,
) -> Sha256Hex {
    hash_members(&request_members(tenant_id, subject_id, tool_name, arguments, revisions))
}

fn downstream_request_members<'a>(
    scope: &'a Scope,
    request_sha256: &'a Sha256Hex,
) -> Members<'a, 6> {
    [
        ("domain", Member::Str("tool-result-v2/downstream-request")),
        ("idempotency_key", Member::Str(scope.idempotency_key.as_str())),
        ("request_sha256", Member::Str(request_sha256.as_str())),
        ("subject_id", Member::Str(scope.subject_id.as_str())),
        ("tenant_id", Member::Str(scope.tenant_id.as_str())),
        ("tool_name", Member::Str(&scope.tool_name)),
    ]
}

/// `downstream_request_ref` preimage.
pub fn downstream_request_preimage(scope: &Scope, request_sha256: &Sha256Hex) -> Value {
    object_value(&downstream_request_members(scope, request_sha256))
}

/// `dr_` + 32 hex: the scope the downstream is idempotent on.
pub fn downstream_request_ref(scope: &Scope, request_sha256: &Sha256Hex) -> DownstreamRequestRef {
    let text = short_members("dr_", &downstream_request_members(scope, request_sha256));
    DownstreamRequestRef::new(&text)
        .unwrap_or_else(|_| unreachable!("dr_ and 32 lowercase hex digits"))
}

fn status_ref_members(scope: &Scope) -> Members<'_, 5> {
    [
        ("domain", Member::Str("tool-result-v2/status-ref")),
        ("idempotency_key", Member::Str(scope.idempotency_key.as_str())),
        ("subject_id", Member::Str(scope.subject_id.as_str())),
        ("tenant_id", Member::Str(scope.tenant_id.as_str())),
        ("tool_name", Member::Str(&scope.tool_name)),
    ]
}

/// `status_ref` preimage.
pub fn status_ref_preimage(scope: &Scope) -> Value {
    object_value(&status_ref_members(scope))
}

/// `sr_` + 32 hex: the opaque name of an operation.
pub fn status_ref(scope: &Scope) -> StatusRef {
    let text = short_members("sr_", &status_ref_members(scope));
    StatusRef::new(&text).unwrap_or_else(|_| unreachable!("sr_ and 32 lowercase hex digits"))
}

fn result_members<'a>(
    tool_name: &'a str,
    output_revision: &'a str,
    output: &'a Value,
) -> Members<'a, 4> {
    [
        ("domain", Member::Str("tool-result-v2/result")),
        ("output", Member::Json(output)),
        ("output_revision", Member::Str(output_revision)),
        ("tool_name", Member::Str(tool_name)),
    ]
}

/// `result_sha256` preimage.
pub fn result_preimage(tool_name: &str, output_revision: &str, output: &Value) -> Value {
    object_value(&result_members(tool_name, output_revision, output))
}

/// `result_sha256`.
pub fn result_sha256(tool_name: &str, output_revision: &str, output: &Value) -> Sha256Hex {
    hash_members(&result_members(tool_name, output_revision, output))
}

/// [`result_sha256`] of an output given as text the caller has already proven to be
/// canonical JSON (a stored column read back and compared byte for byte): the same
/// digest without canonicalizing the output again.
///
/// ```
/// use toolledger_contract::digest::{result_sha256, result_sha256_of_canonical};
/// let output = serde_json::json!({"b": 1, "a": "x"});
/// let canonical = toolledger_json::canonicalize(&output);
/// assert_eq!(result_sha256_of_canonical("t", "t.output.v1", &canonical), result_sha256("t", "t.output.v1", &output));
/// ```
pub fn result_sha256_of_canonical(
    tool_name: &str,
    output_revision: &str,
    canonical: &str,
) -> Sha256Hex {
    hash_members(&[
        ("domain", Member::Str("tool-result-v2/result")),
        ("output", Member::Canonical(canonical)),
        ("output_revision", Member::Str(output_revision)),
        ("tool_name", Member::Str(tool_name)),
    ])
}

/// [`request_sha256`] of arguments given as text the caller has already proven to be
/// canonical JSON: the same digest without canonicalizing them again.
///
/// ```
/// use toolledger_contract::{Identifier, Revisions, digest::{request_sha256, request_sha256_of_canonical}};
/// let (tenant, subject) = (Identifier::new("t").unwrap(), Identifier::new("s").unwrap());
/// let revisions = Revisions {
///     input: "i".into(), output: "o".into(), effect: "e".into(),
///     handler: "h".into(), producer: "p".into(), policy: "y".into(),
/// };
/// let arguments = serde_json::json!({"z": [1, 2], "a": "x"});
/// let canonical = toolledger_json::canonicalize(&arguments);
/// assert_eq!(
///     request_sha256_of_canonical(&tenant, &subject, "tool", &canonical, &revisions),
///     request_sha256(&tenant, &subject, "tool", &arguments, &revisions),
/// );
/// ```
pub fn request_sha256_of_canonical(
    tenant_id: &Identifier,
    subject_id: &Identifier,
    tool_name: &str,
    canonical: &str,
    revisions: &Revisions,
) -> Sha256Hex {
    hash_members(&request_members_with(
        tenant_id,
        subject_id,
        tool_name,
        Member::Canonical(canonical),
        revisions,
    ))
}

/// The downstream receipt the stand-in stores and returns.
pub fn downstream_receipt(
    downstream_request_ref: &str,
    request_sha256: &Sha256Hex,
    tool_name: &str,
    output_revision: &str,
    output: &Value,
) -> Value {
    object_value(&[
        ("domain", Member::Str("tool-result-v2/downstream-receipt")),
        ("downstream_request_ref", Member::Str(downstream_request_ref)),
        ("output", Member::Json(output)),
        ("output_revision", Member::Str(output_revision)),
        ("request_sha256", Member::Str(request_sha256.as_str())),
        ("tool_name", Member::Str(tool_name)),
    ])
}

/// `rc_` + 32 hex of the receipt itself.
pub fn downstream_receipt_ref(receipt: &Value) -> ReceiptRef {
    ReceiptRef::new(&short_ref("rc_", receipt))
        .unwrap_or_else(|_| unreachable!("rc_ and 32 lowercase hex digits"))
}

/// `prefix` + the first 32 hex digits of the SHA-256 of `canonical`, which the caller
/// has already established is the canonical form of a preimage (a stored column read
/// back and compared byte for byte): the same ref without canonicalizing again.
pub fn short_ref_of_canonical(prefix: &str, canonical: &str) -> String {
    short_hex(prefix, &Sha256::digest(canonical.as_bytes()).into())
}

fn refund_id_members(downstream_request_ref: &str) -> Members<'_, 2> {
    [
        ("domain", Member::Str("tool-result-v2/refund-id")),
        ("downstream_request_ref", Member::Str(downstream_request_ref)),
    ]
}

/// `refund_id` preimage (the stand-in derives the refund id from the request scope, so
/// the same request always yields the same refund).
pub fn refund_id_preimage(downstream_request_ref: &str) -> Value {
    object_value(&refund_id_members(downstream_request_ref))
}

/// `rf_` + 32 hex.
pub fn refund_id(downstream_request_ref: &str) -> String {
    short_members("rf_", &refund_id_members(downstream_request_ref))
}

/// Which half of a call identity a status-query id replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusQueryPart {
    /// `provider_response_id`.
    Response,
    /// `provider_call_id`.
    Call,
}

fn status_query_members<'a>(
    part: StatusQueryPart,
    case_id: &'a Identifier,
    status_ref: &'a StatusRef,
) -> Members<'a, 4> {
    let (kind, id_name) = match part {
        StatusQueryPart::Response => ("response", "provider_response_id"),
        StatusQueryPart::Call => ("call", "provider_call_id"),
    };
    [
        ("domain", Member::Str("tool-result-v2/status-query")),
        ("kind", Member::Str(kind)),
        (id_name, Member::Str(case_id.as_str())),
        ("status_ref", Member::Str(status_ref.as_str())),
    ]
}

/// The preimage of a status query's derived response or call id.
pub fn status_query_preimage(
    part: StatusQueryPart,
    case_id: &Identifier,
    status_ref: &StatusRef,
) -> Value {
    object_value(&status_query_members(part, case_id, status_ref))
}

/// `qs_` + 32 hex: the host-owned id a status query answers under.
pub fn status_query_id(
    part: StatusQueryPart,
    case_id: &Identifier,
    status_ref: &StatusRef,
) -> Identifier {
    let text = short_members("qs_", &status_query_members(part, case_id, status_ref));
    Identifier::new(&text).unwrap_or_else(|_| unreachable!("qs_ and 32 lowercase hex digits"))
}

/// What the host audits about a call: exactly the `host_view` members of a package (`docs/contract.md`).
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
    pub downstream_request_ref: DownstreamRequestRef,
    /// `rc_…`.
    pub downstream_receipt_ref: ReceiptRef,
    /// `sr_…`.
    pub status_ref: StatusRef,
}

/// The twelve `host_view` member names, in the contract's order.
pub(crate) const HOST_VIEW_MEMBERS: [&str; 12] = [
    "provider",
    "api_family",
    "adapter_revision",
    "provider_response_id",
    "provider_call_id",
    "purpose",
    "operation_id",
    "idempotency_key",
    "revisions",
    "downstream_request_ref",
    "downstream_receipt_ref",
    "status_ref",
];

impl HostView {
    fn members(&self) -> Members<'_, 12> {
        [
            ("provider", Member::Str(&self.provider)),
            ("api_family", Member::Str(&self.api_family)),
            ("adapter_revision", Member::Str(&self.adapter_revision)),
            ("provider_response_id", Member::Str(self.provider_response_id.as_str())),
            ("provider_call_id", Member::Str(self.provider_call_id.as_str())),
            ("purpose", Member::Str(self.purpose.as_str())),
            ("operation_id", Member::Str(self.operation_id.as_str())),
            ("idempotency_key", Member::Str(self.idempotency_key.as_str())),
            ("revisions", Member::Revisions(&self.revisions)),
            ("downstream_request_ref", Member::Str(self.downstream_request_ref.as_str())),
            ("downstream_receipt_ref", Member::Str(self.downstream_receipt_ref.as_str())),
            ("status_ref", Member::Str(self.status_ref.as_str())),
        ]
    }

    /// The `host_view` object.
    pub fn to_json(&self) -> Value {
        object_value(&self.members())
    }

    /// The `host_view` object made of this view's own strings, moved instead of copied:
    /// the same value as [`HostView::to_json`].
    ///
    /// ```
    /// # use toolledger_contract::{HostView, Purpose, Revisions, Identifier, IdempotencyKey,
    /// #     DownstreamRequestRef, ReceiptRef, StatusRef};
    /// # let id = |text: &str| Identifier::new(text).unwrap();
    /// # let hex = "0123456789abcdef0123456789abcdef";
    /// let view = HostView {
    ///     provider: "openai".into(), api_family: "responses".into(), adapter_revision: "a1".into(),
    ///     provider_response_id: id("resp-1"), provider_call_id: id("call-1"),
    ///     purpose: Purpose::Dispatch, operation_id: id("op-1"),
    ///     idempotency_key: IdempotencyKey::new("k-1").unwrap(),
    ///     revisions: Revisions {
    ///         input: "i".into(), output: "o".into(), effect: "e".into(),
    ///         handler: "h".into(), producer: "p".into(), policy: "y".into(),
    ///     },
    ///     downstream_request_ref: DownstreamRequestRef::new(&format!("dr_{hex}")).unwrap(),
    ///     downstream_receipt_ref: ReceiptRef::new(&format!("rc_{hex}")).unwrap(),
    ///     status_ref: StatusRef::new(&format!("sr_{hex}")).unwrap(),
    /// };
    /// assert_eq!(view.to_json(), view.clone().into_json());
    /// ```
    pub fn into_json(self) -> Value {
        let text = |text: String| Value::String(text);
        let Revisions { input, output, effect, handler, producer, policy } = self.revisions;
        let revisions = Map::from_iter([
            ("effect".to_owned(), text(effect)),
            ("handler".to_owned(), text(handler)),
            ("input".to_owned(), text(input)),
            ("output".to_owned(), text(output)),
            ("policy".to_owned(), text(policy)),
            ("producer".to_owned(), text(producer)),
        ]);
        // Listed in name order, as the map keeps them: its sort then only checks.
        Value::Object(Map::from_iter([
            ("adapter_revision".to_owned(), text(self.adapter_revision)),
            ("api_family".to_owned(), text(self.api_family)),
            ("downstream_receipt_ref".to_owned(), text(self.downstream_receipt_ref.into())),
            ("downstream_request_ref".to_owned(), text(self.downstream_request_ref.into())),
            ("idempotency_key".to_owned(), text(self.idempotency_key.into())),
            ("operation_id".to_owned(), text(self.operation_id.into())),
            ("provider".to_owned(), text(self.provider)),
            ("provider_call_id".to_owned(), text(self.provider_call_id.into())),
            ("provider_response_id".to_owned(), text(self.provider_response_id.into())),
            ("purpose".to_owned(), Value::from(self.purpose.as_str())),
            ("revisions".to_owned(), Value::Object(revisions)),
            ("status_ref".to_owned(), text(self.status_ref.into())),
        ]))
    }
}

/// The host view's members taken from a JSON object that has exactly the twelve names
/// (a package being verified from its own bytes).
pub(crate) fn host_view_members(host_view: &Map<String, Value>) -> Members<'_, 12> {
    HOST_VIEW_MEMBERS.map(|name| (name, Member::Json(host_view.get(name).unwrap_or(&Value::Null))))
}

fn call_binding_members<'a>(
    host_view: Members<'a, 12>,
    tool_name: &'a str,
    request_sha256: &'a str,
    result_sha256: &'a str,
    delivery: &'a str,
) -> Members<'a, 17> {
    let [
        provider,
        api_family,
        adapter_revision,
        provider_response_id,
        provider_call_id,
        purpose,
        operation_id,
        idempotency_key,
        revisions,
        downstream_request_ref,
        downstream_receipt_ref,
        status_ref,
    ] = host_view;
    [
        adapter_revision,
        api_family,
        ("delivery", Member::Str(delivery)),
        ("domain", Member::Str("tool-result-v2/call-binding")),
        downstream_receipt_ref,
        downstream_request_ref,
        idempotency_key,
        operation_id,
        provider,
        provider_call_id,
        provider_response_id,
        purpose,
        ("request_sha256", Member::Str(request_sha256)),
        ("result_sha256", Member::Str(result_sha256)),
        revisions,
        status_ref,
        ("tool_name", Member::Str(tool_name)),
    ]
}

/// The call-binding preimage: the host view's members plus `domain`, `tool_name`,
/// `request_sha256`, `result_sha256` and `delivery`. Takes the host view as JSON so a
/// package can be checked from its own bytes; a host view lacking one of the twelve
/// members has `null` in its place.
pub fn call_binding_preimage(
    host_view: &Value,
    tool_name: &str,
    request_sha256: &str,
    result_sha256: &str,
    delivery: &str,
) -> Value {
    let empty = Map::new();
    let host_view = host_view.as_object().unwrap_or(&empty);
    object_value(&call_binding_members(
        host_view_members(host_view),
        tool_name,
        request_sha256,
        result_sha256,
        delivery,
    ))
}

/// `call_binding_sha256` of a host view given as JSON (see [`call_binding_preimage`]).
pub(crate) fn call_binding_sha256_of_json(
    host_view: &Map<String, Value>,
    tool_name: &str,
    request_sha256: &str,
    result_sha256: &str,
    delivery: &str,
) -> Sha256Hex {
    hash_members(&call_binding_members(
        host_view_members(host_view),
        tool_name,
        request_sha256,
        result_sha256,
        delivery,
    ))
}

/// `call_binding_sha256`.
pub fn call_binding_sha256(
    host_view: &HostView,
    tool_name: &str,
    request_sha256: &Sha256Hex,
    result_sha256: &Sha256Hex,
    delivery: Delivery,
) -> Sha256Hex {
    hash_members(&call_binding_members(
        host_view.members(),
        tool_name,
        request_sha256.as_str(),
        result_sha256.as_str(),
        delivery.as_str(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted<const N: usize>(members: &Members<'_, N>) -> bool {
        members.is_sorted_by_key(|(name, _)| *name)
    }

    #[test]
    fn every_preimage_lists_its_members_in_canonical_order() {
        let id = |text: &str| Identifier::new(text).unwrap();
        let hex = "0123456789abcdef0123456789abcdef";
        let revisions = Revisions {
            input: "i".into(),
            output: "o".into(),
            effect: "e".into(),
            handler: "h".into(),
            producer: "p".into(),
            policy: "y".into(),
        };
        let scope = Scope {
            tenant_id: id("t"),
            subject_id: id("s"),
            tool_name: "tool".into(),
            idempotency_key: IdempotencyKey::new("k").unwrap(),
        };
        let request = Sha256Hex::new(&"a".repeat(64)).unwrap();
        let status = StatusRef::new(&format!("sr_{hex}")).unwrap();
        let output = Value::Null;
        let view = HostView {
            provider: "openai".into(),
            api_family: "responses".into(),
            adapter_revision: "a1".into(),
            provider_response_id: id("resp-1"),
            provider_call_id: id("call-1"),
            purpose: Purpose::Dispatch,
            operation_id: id("op-1"),
            idempotency_key: IdempotencyKey::new("k").unwrap(),
            revisions: revisions.clone(),
            downstream_request_ref: DownstreamRequestRef::new(&format!("dr_{hex}")).unwrap(),
            downstream_receipt_ref: ReceiptRef::new(&format!("rc_{hex}")).unwrap(),
            status_ref: status.clone(),
        };
        let (tenant, subject) = (&scope.tenant_id, &scope.subject_id);
        assert!(sorted(&request_members(tenant, subject, "tool", &output, &revisions)));
        assert!(sorted(&downstream_request_members(&scope, &request)));
        assert!(sorted(&status_ref_members(&scope)));
        assert!(sorted(&result_members("tool", "o", &output)));
        assert!(sorted(&refund_id_members("dr_1")));
        for part in [StatusQueryPart::Response, StatusQueryPart::Call] {
            assert!(sorted(&status_query_members(part, &id("case"), &status)));
        }
        assert!(sorted(&revisions_members(&revisions)));
        assert!(sorted(&call_binding_members(view.members(), "tool", "r", "s", "fresh")));
        let json = view.to_json();
        let members = host_view_members(json.as_object().unwrap());
        assert!(sorted(&call_binding_members(members, "tool", "r", "s", "fresh")));
        let binding = crate::ApprovalBindingRef {
            tenant_id: tenant,
            subject_id: subject,
            profile: &crate::ProviderProfile {
                provider: "openai".into(),
                api_family: "responses".into(),
                adapter_revision: "a1".into(),
            },
            provider_response_id: &view.provider_response_id,
            provider_call_id: &view.provider_call_id,
            operation_id: &view.operation_id,
            idempotency_key: &scope.idempotency_key,
            tool_name: "tool",
            request_sha256: &request,
            revisions: &revisions,
        };
        let (approval, approver, at) = (id("ap-1"), id("u-2"), crate::UnixSeconds::new(1).unwrap());
        let members = crate::approval::approval_members(&approval, &approver, at, at, binding);
        assert!(sorted(&members));
    }
}
