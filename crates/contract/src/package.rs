//! Packages (`docs/contract.md`): the one JSON object a caller receives.
//!
//! A PASS package binds the model's view of the result to the host's view of the call
//! with `call_binding_sha256`, which anyone can recompute from the package alone; moving
//! a valid package to another key, call or delivery breaks it.

use serde_json::{Map, Value, json};

use crate::{
    BlockCode, Delivery, HostView, Sha256Hex, StatusRef,
    digest::{HOST_VIEW_MEMBERS, call_binding_sha256, call_binding_sha256_of_json, result_sha256},
};

/// The `contract` member of every PASS result.
pub const CONTRACT: &str = "tool-result-v2";

/// Builds a PASS package for `output` of `tool_name`, answered under `host_view`.
pub fn pass_package(
    delivery: Delivery,
    tool_name: &str,
    output: &Value,
    host_view: &HostView,
    request_sha256: &Sha256Hex,
) -> Value {
    let result_sha256 = result_sha256(tool_name, &host_view.revisions.output, output);
    pass_package_with_result(delivery, tool_name, output, &result_sha256, host_view, request_sha256)
}

/// [`pass_package`] for a caller that already holds `result_sha256` of `output`, verified
/// (a local receipt read back from the ledger).
pub fn pass_package_with_result(
    delivery: Delivery,
    tool_name: &str,
    output: &Value,
    result_sha256: &Sha256Hex,
    host_view: &HostView,
    request_sha256: &Sha256Hex,
) -> Value {
    // The view's strings are copied once either way: here by `clone`, in `to_json` by
    // writing each into a `Value`.
    pass_package_from_view(
        delivery,
        tool_name,
        output.clone(),
        result_sha256,
        host_view.clone(),
        request_sha256,
    )
}

/// [`pass_package_with_result`] taking the output and the host view by value: their
/// strings become the package's own instead of being copied (a replay builds one view
/// per answer, and reads an output it has no other use for).
pub fn pass_package_from_view(
    delivery: Delivery,
    tool_name: &str,
    output: Value,
    result_sha256: &Sha256Hex,
    host_view: HostView,
    request_sha256: &Sha256Hex,
) -> Value {
    let call_binding =
        call_binding_sha256(&host_view, tool_name, request_sha256, result_sha256, delivery);
    let status_ref = string(host_view.status_ref.as_str());
    // Built member by member: `json!` would re-serialize the output and the host view,
    // which are `Value`s already. Each map's members are listed in name order, as the
    // map keeps them: its sort then only checks.
    let digests = Map::from_iter([
        ("call_binding_sha256".to_owned(), string(call_binding.as_str())),
        ("request_sha256".to_owned(), string(request_sha256.as_str())),
        ("result_sha256".to_owned(), string(result_sha256.as_str())),
    ]);
    let result = Map::from_iter([
        ("contract".to_owned(), string(CONTRACT)),
        ("digests".to_owned(), Value::Object(digests)),
        ("host_view".to_owned(), host_view.into_json()),
        ("model_view".to_owned(), output),
        ("tool_name".to_owned(), string(tool_name)),
    ]);
    Value::Object(Map::from_iter([
        ("code".to_owned(), string("OK")),
        ("delivery".to_owned(), string(delivery.as_str())),
        ("gate".to_owned(), string("PASS")),
        ("result".to_owned(), Value::Object(result)),
        ("status".to_owned(), string("succeeded")),
        ("status_ref".to_owned(), status_ref),
    ]))
}

fn string(text: &str) -> Value {
    Value::String(text.to_owned())
}

/// Builds a BLOCK package. `status` and `status_ref` are the ledger's where the contract
/// says so, else `None` (written `null`).
pub fn block_package(
    code: BlockCode,
    status: Option<&str>,
    status_ref: Option<&StatusRef>,
) -> Value {
    json!({
        "gate": "BLOCK",
        "code": code.as_str(),
        "status": status,
        "status_ref": status_ref.map(StatusRef::as_str),
        "message": code.message(),
    })
}

/// Why a package failed verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PackageError {
    /// The package does not have the shape of a PASS package.
    #[error("not a PASS package: {0}")]
    Malformed(&'static str),
    /// `result_sha256` does not recompute from the model view.
    #[error("result digest does not recompute")]
    ResultMismatch,
    /// `call_binding_sha256` does not recompute from the host view.
    #[error("call binding does not recompute")]
    BindingMismatch,
}

fn object_with<'v>(
    value: &'v Value,
    members: &[&str],
    what: &'static str,
) -> Result<&'v Map<String, Value>, PackageError> {
    let object = value.as_object().ok_or(PackageError::Malformed(what))?;
    if object.len() != members.len() || !members.iter().all(|member| object.contains_key(*member)) {
        return Err(PackageError::Malformed(what));
    }
    Ok(object)
}

fn text<'v>(
    object: &'v Map<String, Value>,
    member: &str,
    what: &'static str,
) -> Result<&'v str, PackageError> {
    object.get(member).and_then(Value::as_str).ok_or(PackageError::Malformed(what))
}

/// Recomputes a PASS package's result digest and call binding from its own members.
///
/// # Errors
///
/// [`PackageError`] when the shape is wrong or either digest does not recompute.
pub fn verify_package(package: &Value) -> Result<(), PackageError> {
    let top = object_with(
        package,
        &["gate", "code", "status", "delivery", "status_ref", "result"],
        "top level",
    )?;
    if text(top, "gate", "gate")? != "PASS"
        || text(top, "code", "code")? != "OK"
        || text(top, "status", "status")? != "succeeded"
    {
        return Err(PackageError::Malformed("gate, code or status"));
    }
    let delivery = text(top, "delivery", "delivery")?;
    Delivery::parse(delivery).ok_or(PackageError::Malformed("delivery"))?;
    let result = object_with(
        &top["result"],
        &["contract", "tool_name", "model_view", "host_view", "digests"],
        "result",
    )?;
    if text(result, "contract", "contract")? != CONTRACT {
        return Err(PackageError::Malformed("contract"));
    }
    let tool_name = text(result, "tool_name", "tool_name")?;
    let host_view = object_with(&result["host_view"], &HOST_VIEW_MEMBERS, "host_view")?;
    if text(host_view, "status_ref", "host_view.status_ref")?
        != text(top, "status_ref", "status_ref")?
    {
        return Err(PackageError::Malformed("status_ref differs from host_view"));
    }
    let revisions = host_view
        .get("revisions")
        .and_then(Value::as_object)
        .ok_or(PackageError::Malformed("revisions"))?;
    let output_revision = text(revisions, "output", "revisions.output")?;
    let digests = object_with(
        &result["digests"],
        &["request_sha256", "result_sha256", "call_binding_sha256"],
        "digests",
    )?;
    let request_sha256 = text(digests, "request_sha256", "request_sha256")?;
    Sha256Hex::new(request_sha256).map_err(|_| PackageError::Malformed("request_sha256"))?;

    let result_sha256 = result_sha256(tool_name, output_revision, &result["model_view"]);
    if text(digests, "result_sha256", "result_sha256")? != result_sha256.as_str() {
        return Err(PackageError::ResultMismatch);
    }
    let binding = call_binding_sha256_of_json(
        host_view,
        tool_name,
        request_sha256,
        result_sha256.as_str(),
        delivery,
    );
    if text(digests, "call_binding_sha256", "call_binding_sha256")? != binding.as_str() {
        return Err(PackageError::BindingMismatch);
    }
    Ok(())
}
