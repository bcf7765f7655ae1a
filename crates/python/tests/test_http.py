"""The built-in HTTP downstream from Python, unchanged: the configuration's services and
routes, against the reference service in its own process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import toolledger as tl
from conftest import ROOT, free_port, refundd_binary


@pytest.fixture
def reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    service = subprocess.Popen(
        [refundd_binary(), "--listen", f"127.0.0.1:{free_port()}",
         "--db", str(tmp_path / "reference.sqlite3"),
         "--tools", str(ROOT / "fixtures/tools/refundd-recipes.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    first = service.stdout.readline() if service.stdout else ""
    assert first.startswith("listening on "), service.stderr.read() if service.stderr else ""
    url = "http://" + first.split()[-1]
    monkeypatch.setenv("TOOLLEDGER_REFERENCE_URL", url)
    yield service
    service.kill()
    service.wait()


def test_a_configured_http_service_performs_the_tool_once(location, reference):
    config = ROOT / "examples/toolledger.toml"
    with tl.Ledger.open(location, config=config, tenant="acme", subject="user-1") as ledger:
        assert "open_ticket" in ledger.tools
        call = tl.Call("open_ticket", {"queue": "billing", "summary": "refund please",
                                       "priority": "high"}, key="ticket-1")
        first = ledger.dispatch(call)
        assert isinstance(first.outcome, tl.Fresh), first.package
        assert first.output["queue"] == "billing" and first.output["state"] == "open"
        again = ledger.dispatch(call)
        assert isinstance(again.outcome, tl.Replayed)
        assert again.output == first.output
        other = ledger.dispatch(tl.Call("open_ticket", {"queue": "billing", "summary": "other",
                                                        "priority": "low"}, key="ticket-1"))
        assert other.code == "IDEMPOTENCY_CONFLICT"
        assert ledger.audit().passed


def test_a_service_that_is_down_loses_nothing(location, reference):
    reference.kill()
    reference.wait()
    config = ROOT / "examples/toolledger.toml"
    with tl.Ledger.open(location, config=config, tenant="acme", subject="user-1") as ledger:
        call = tl.Call("open_ticket", {"queue": "billing", "summary": "down", "priority": "low"},
                       key="ticket-2")
        reply = ledger.dispatch(call)
        # Connection refused: certainly not sent, and still accepted.
        assert reply.code == "DOWNSTREAM_UNAVAILABLE"
        assert [row["status_ref"] for row in ledger.list()] == [reply.status_ref]


def test_a_python_downstream_serves_the_tools_no_service_performs(sqlite_location, reference, payments):
    from conftest import payment_tool

    config = ROOT / "examples/toolledger.toml"
    with tl.Ledger.open(sqlite_location, config=config, tools=[payment_tool()],
                        downstream=payments, tenant="acme", subject="user-1") as ledger:
        paid = ledger.dispatch(tl.Call("pay", {"payer": "bob", "amount_minor": 5,
                                              "currency": "EUR"}, key="p-1"))
        ticket = ledger.dispatch(tl.Call("open_ticket", {"queue": "ops", "summary": "s",
                                                        "priority": "low"}, key="t-1"))
        assert paid.done and ticket.done
        assert len(payments.effects) == 1
        assert ledger.show(ticket.status_ref)["downstream"] == "reference-tools@1"
        assert ledger.show(paid.status_ref)["downstream"] == "payments@1"


def test_a_missing_config_is_an_invalid_error(sqlite_location):
    with pytest.raises(tl.InvalidError) as refused:
        tl.Ledger.open(sqlite_location, config="/nonexistent/toolledger.toml")
    assert refused.value.code == "USAGE_ERROR"
