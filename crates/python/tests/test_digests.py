"""Digests from Python are the Rust API's: the contract's vectors reproduced through the
Python package, and (hypothesis) any call the schema accepts bound by the digests an
independent implementation of the contract computes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolledger as tl
from conftest import ROOT, Payments, payment_tool

# The contract's independent implementation (Python's standard library only, written
# from docs/contract.md): its RFC 8785 serializer, not this package's.
_spec = importlib.util.spec_from_file_location(
    "contract", ROOT / "scripts/check_contract_vectors.py"
)
contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(contract)

VECTORS = json.loads((ROOT / "docs/contract-vectors.json").read_text())


def H(preimage: dict) -> str:
    return hashlib.sha256(contract.canonical(preimage).encode("utf-8")).hexdigest()


def vector(kind: str) -> dict:
    return next(v for v in VECTORS if v["kind"] == kind and v["name"].startswith("pass case"))


def test_the_contract_vectors_reproduced_through_the_python_api(tmp_path):
    request = vector("request")["preimage"]
    approval = vector("approval")["preimage"]
    orders = {"orders": [{"order_id": "ord-1001", "tenant_id": "tenant-a",
                          "owner_subject_id": "user-1", "status": "paid",
                          "amount_minor": 2599, "currency": "USD"}]}
    with tl.Ledger.open(str(tmp_path / "ledger.sqlite3")) as ledger:
        call = tl.Call(
            "refund_order", request["arguments"], key=approval["idempotency_key"],
            tenant="tenant-a", subject="user-1",
            model_call=tl.ModelCall("openai", "responses", "openai-responses-2026-05",
                                    approval["provider_response_id"], approval["provider_call_id"]),
            operation_id=approval["operation_id"],
            approval=tl.Approval(approval["approval_id"], approval["approver_id"],
                                 approval["approved_at"], approval["expires_at"],
                                 eligible_approvers=[approval["approver_id"]]),
            context=orders, at=approval["approved_at"] + 100,
        )
        reply = ledger.dispatch(call)
        fresh = reply.outcome
        assert isinstance(fresh, tl.Fresh), reply.package
        assert fresh.request_sha256 == vector("request")["sha256"]
        assert fresh.status_ref == vector("status_ref")["value"]
        assert fresh.result_sha256 == vector("result")["sha256"]
        assert fresh.receipt_ref == vector("downstream_receipt_ref")["value"]
        assert fresh.output == vector("result")["preimage"]["output"]
        digests = reply.package["result"]["digests"]
        assert digests["call_binding_sha256"] == vector("call_binding")["sha256"]
        host = reply.package["result"]["host_view"]
        assert host["downstream_request_ref"] == vector("downstream_request_ref")["value"]


SAFE_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40
)
PAYERS = st.from_regex(r"\A[a-z0-9-]{1,32}\Z")
ARGUMENTS = st.fixed_dictionaries(
    {
        "payer": PAYERS,
        "amount_minor": st.integers(min_value=1, max_value=100_000_000),
        "currency": st.sampled_from(["EUR", "USD"]),
    },
    optional={"note": SAFE_TEXT.filter(lambda text: len(text) <= 200)},
)
IDS = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,40}\Z")

_dir = tempfile.mkdtemp(prefix="toolledger-hypothesis-")
_payments = Payments()
_ledger = tl.Ledger.open(os.path.join(_dir, "ledger.sqlite3"), tools=[payment_tool()],
                         downstream=_payments)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=ARGUMENTS, tenant=IDS, subject=IDS, key=IDS)
def test_any_accepted_call_round_trips_with_the_contracts_digests(arguments, tenant, subject, key):
    key = f"{key}-{len(_payments.effects)}"
    reply = _ledger.dispatch(tl.Call("pay", arguments, key=key, tenant=tenant, subject=subject))
    fresh = reply.outcome
    assert isinstance(fresh, tl.Fresh), reply.package
    revisions = _ledger.show(fresh.status_ref)["revisions"]
    request_sha256 = H({
        "domain": "tool-result-v2/request", "tenant_id": tenant, "subject_id": subject,
        "tool_name": "pay", "arguments": arguments, "input_revision": revisions["input"],
        "output_revision": revisions["output"], "effect_revision": revisions["effect"],
    })
    assert fresh.request_sha256 == request_sha256
    assert fresh.status_ref == "sr_" + H({
        "domain": "tool-result-v2/status-ref", "tenant_id": tenant, "subject_id": subject,
        "tool_name": "pay", "idempotency_key": key,
    })[:32]
    request_ref = "dr_" + H({
        "domain": "tool-result-v2/downstream-request", "tenant_id": tenant,
        "subject_id": subject, "tool_name": "pay", "idempotency_key": key,
        "request_sha256": request_sha256,
    })[:32]
    # The downstream was handed exactly that scope, and the output it answered.
    assert _payments.effects[-1] == request_ref
    output = _payments.by_ref[request_ref]
    assert fresh.output == output
    assert fresh.result_sha256 == H({
        "domain": "tool-result-v2/result", "tool_name": "pay",
        "output_revision": revisions["output"], "output": output,
    })
    assert fresh.receipt_ref == "rc_" + H({
        "domain": "tool-result-v2/downstream-receipt", "downstream_request_ref": request_ref,
        "request_sha256": request_sha256, "tool_name": "pay",
        "output_revision": revisions["output"], "output": output,
    })[:32]
    # And a retry is the same receipt.
    again = _ledger.dispatch(tl.Call("pay", arguments, key=key, tenant=tenant, subject=subject))
    assert isinstance(again.outcome, tl.Replayed)
    assert again.outcome.result_sha256 == fresh.result_sha256
