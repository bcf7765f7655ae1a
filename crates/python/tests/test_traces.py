"""Traces with the official OpenTelemetry Python SDK as the host: its current span is
the parent of the ledger's ``execute_tool`` span, read back with the SDK's own
in-memory exporter; a replay is the call span alone; no span carries the key, the
arguments or the result."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import toolledger as tl
from conftest import payment_tool

SECRET_KEY = "key-7d1e0b42"
SECRET_PAYER = "payer-5f3a9c"
ARGS = {"payer": SECRET_PAYER, "amount_minor": 98765432, "currency": "EUR"}
MODEL_CALL = tl.ModelCall("openai", "responses", "openai-responses-2026-05", "resp-1", "call-1")

# The one tool the tests define in Python: it sends an email.
EMAIL_INPUT = {"type": "object", "properties": {"to": {"type": "string"}},
               "required": ["to"], "additionalProperties": False}
EMAIL_OUTPUT = {"type": "object", "properties": {"sent": {"type": "boolean"}},
                "required": ["sent"], "additionalProperties": False}

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
trace.set_tracer_provider(_PROVIDER)
HOST = trace.get_tracer("host")


@pytest.fixture
def spans():
    """The spans each test finished, the exporter emptied before it."""
    _EXPORTER.clear()
    return _EXPORTER


def open_ledger(location, payments):
    return tl.Ledger.open(
        location, tools=[payment_tool()], downstream=payments, tenant="acme", subject="user-1"
    )


def call_span(finished, host):
    """The one ``execute_tool`` span of the trace of ``host``, and ``host``'s span."""
    (host_span,) = [span for span in finished if span.name == host]
    calls = [
        span
        for span in finished
        if span.name.startswith("execute_tool")
        and span.context.trace_id == host_span.context.trace_id
    ]
    assert len(calls) == 1, [span.name for span in finished]
    return calls[0], host_span


def test_the_hosts_current_span_is_the_parent_of_the_calls_span(location, payments, spans):
    with open_ledger(location, payments) as ledger:
        call = tl.Call("pay", ARGS, key=SECRET_KEY, model_call=MODEL_CALL)
        with HOST.start_as_current_span("agent turn"):
            first = ledger.dispatch(call)
        with HOST.start_as_current_span("agent retry"):
            again = ledger.dispatch(call)
        assert isinstance(first.outcome, tl.Fresh) and isinstance(again.outcome, tl.Replayed)
        assert len(payments.effects) == 1
    finished = spans.get_finished_spans()
    span, host = call_span(finished, "agent turn")
    assert span.name == "execute_tool pay"
    assert span.kind == SpanKind.INTERNAL
    assert span.parent.span_id == host.context.span_id, "the host's span is the parent"
    assert span.instrumentation_scope.name == "toolledger"
    assert dict(span.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.name": "pay",
        "gen_ai.tool.call.id": "call-1",
        "toolledger.purpose": "dispatch",
        "toolledger.store": location.startswith("postgres") and "postgres" or "sqlite",
        "toolledger.decision": "fresh",
    }
    assert span.status.status_code == StatusCode.UNSET
    replay, _ = call_span(finished, "agent retry")
    assert replay.attributes["toolledger.decision"] == "replay"
    # No span of anything else in the trace: the ledger's own steps are Rust's, and the
    # host has installed no provider there.
    everything = repr([(span.name, dict(span.attributes)) for span in finished])
    for secret in (SECRET_KEY, SECRET_PAYER, "98765432", "pay-1", first.outcome.request_sha256):
        assert secret not in everything, secret


def test_a_tools_own_spans_are_children_of_the_calls_span(sqlite_location, spans):
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        tracer = trace.get_tracer("tool")

        @ledger.tool(input_schema=EMAIL_INPUT, output_schema=EMAIL_OUTPUT)
        def send_email(to):
            "Send one email."
            with tracer.start_as_current_span("smtp send"):
                return {"sent": True}

        with HOST.start_as_current_span("agent turn"):
            reply = send_email.call({"to": "a@example.com"}, key="mail-1")
        assert reply.done
    finished = spans.get_finished_spans()
    span, _ = call_span(finished, "agent turn")
    (smtp,) = [s for s in finished if s.name == "smtp send"]
    assert smtp.parent.span_id == span.context.span_id
    assert "gen_ai.tool.call.id" not in span.attributes, "a key-derived id is never recorded"


def test_an_awaited_call_is_traced_under_the_coroutines_span(location, payments, spans):
    async def turn(ledger):
        with HOST.start_as_current_span("agent turn"):
            return await ledger.adispatch(tl.Call("pay", ARGS, key=SECRET_KEY))

    with open_ledger(location, payments) as ledger:
        reply = asyncio.run(turn(ledger))
        assert isinstance(reply.outcome, tl.Fresh)
    span, host = call_span(spans.get_finished_spans(), "agent turn")
    assert span.parent.span_id == host.context.span_id
    assert span.attributes["toolledger.decision"] == "fresh"


def test_an_unknown_outcome_and_its_status_query_are_each_a_span(location, payments, spans):
    with open_ledger(location, payments) as ledger:
        call = tl.Call("pay", ARGS, key=SECRET_KEY, model_call=MODEL_CALL)
        payments.mode = "drop"
        with HOST.start_as_current_span("agent turn"):
            lost = ledger.dispatch(call)
        payments.mode = None
        with HOST.start_as_current_span("later"):
            settled = ledger.status(lost.status_ref)
        assert isinstance(settled.outcome, tl.Reconciled)
    finished = spans.get_finished_spans()
    span, _ = call_span(finished, "agent turn")
    assert span.attributes["toolledger.decision"] == "outcome_unknown"
    assert span.attributes["error.type"] == "OUTCOME_UNKNOWN"
    assert span.status.status_code == StatusCode.ERROR
    query, _ = call_span(finished, "later")
    assert query.name == "execute_tool", "no tool named before the ledger reads it"
    assert query.attributes["toolledger.purpose"] == "query_status"
    assert query.attributes["toolledger.decision"] == "reconciled"


def test_a_call_refused_before_acceptance_is_an_error_span(sqlite_location, payments, spans):
    with open_ledger(sqlite_location, payments) as ledger:
        with HOST.start_as_current_span("agent turn"):
            with pytest.raises(tl.InvalidError) as raised:
                # A provider profile the ledger has not registered: nothing is accepted.
                unregistered = tl.ModelCall("nobody", "chat", "nobody-1", "resp-1", "call-1")
                ledger.dispatch(tl.Call("pay", ARGS, key="k-1", model_call=unregistered))
    span, _ = call_span(spans.get_finished_spans(), "agent turn")
    assert span.attributes["toolledger.decision"] == "error"
    assert span.attributes["error.type"] == raised.value.code
    assert span.status.status_code == StatusCode.ERROR


EXPORTING_HOST = r'''
import json, os, sys, tempfile
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import toolledger as tl

INPUT, OUTPUT = json.loads(sys.argv[1]), json.loads(sys.argv[2])
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
ledger = tl.Ledger.open(os.path.join(tempfile.mkdtemp(), "l.sqlite3"), tenant="acme", subject="u-1")

@ledger.tool(input_schema=INPUT, output_schema=OUTPUT)
def send_email(to):
    "Send one email."
    return {"sent": True}

with trace.get_tracer("host").start_as_current_span("agent turn"):
    assert send_email.call({"to": "secret-5e1f@example.com"}, key="mail-5e1f").done
(call,) = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
print(json.dumps({"trace_id": format(call.context.trace_id, "032x"),
                  "span_id": format(call.context.span_id, "016x")}))
'''


def test_the_ledgers_own_steps_are_exported_under_the_hosts_tool_span(tmp_path):
    """With the standard OTEL_* variables set, the package's Rust side exports the
    ledger's steps over OTLP/HTTP (to a receiver decoding with the official
    ``opentelemetry-proto`` messages), children of the call's span the host's own
    Python exporter holds: one trace from the host's span through the ledger's."""
    import json
    import os
    import subprocess
    import sys
    import time

    from conftest import ROOT

    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "crates/cli/tests/peers/otlp.py"), str(tmp_path)]
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "port").exists():
            assert time.monotonic() < deadline, "the receiver did not start"
            time.sleep(0.02)
        port = (tmp_path / "port").read_text().strip()
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_SERVICE_NAME": "python-host",
        }
        child = subprocess.run(
            [sys.executable, "-c", EXPORTING_HOST, json.dumps(EMAIL_INPUT), json.dumps(EMAIL_OUTPUT)],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert child.returncode == 0, child.stderr
        host = json.loads(child.stdout.strip().splitlines()[-1])
        spans_file = tmp_path / "spans.jsonl"
        while True:
            spans = [json.loads(line) for line in spans_file.read_text().splitlines()] if spans_file.exists() else []
            steps = [s for s in spans if s["parent_span_id"] == host["span_id"]]
            if len(steps) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sorted(s["name"] for s in steps) == ["commit A", "commit C", "execute"], spans
        assert all(s["trace_id"] == host["trace_id"] for s in steps)
        assert {s["service"] for s in steps} == {"python-host"}
        raw = b"".join(p.read_bytes() for p in tmp_path.glob("raw-*.bin"))
        for secret in (b"mail-5e1f", b"secret-5e1f@example.com", b"acme", b"u-1"):
            assert secret not in raw, secret
    finally:
        receiver.kill()
        receiver.wait()
