"""One corpus through every door on one ledger (`fixtures/doors/corpus.json`): the
Python package, the MCP gateway (`toolledger mcp`, driven by the official SDK's client,
in front of a payments server in its own process) and the command line
(`toolledger dispatch --case`). The Rust facade runs the same corpus in
`crates/toolledger/tests/it/doors.rs`.

Each door hands the same amount to a payment tool of its own. For every row, the
Python package and the gateway answer the same code and, for a refusal, the same
pointer and keyword, with nothing written and nothing performed; an integral float
replays its integer twin under the same key. The command line reads a case file, a
document held to its text: every row not written as an integer in range is
`FIXTURE_INVALID` there (the contract's own `fixtures/bad-cases` say so), with nothing
written. At the end the ledger holds one operation per door and its audit passes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import toolledger as tl
from conftest import ROOT, Payments, payment_tool, toolledger_binary

CORPUS = json.loads((ROOT / "fixtures/doors/corpus.json").read_text(encoding="utf-8"))["rows"]
PEERS = ROOT / "crates/mcp/tests/peers"


def key_of(door: str, row: dict) -> str:
    if "key" in row:
        return row["key"]
    name = row.get("twin", row["name"])
    return f"{door}-" + "".join(c if c.isalnum() else "-" for c in name)


def arguments_of(row: dict, base: dict) -> dict:
    arguments = {**base, "amount_minor": row["amount"]}
    if "note_bytes" in row:
        arguments["note"] = "x" * row["note_bytes"]
    return arguments


def expected(row: dict) -> dict:
    return row.get("expect", {"code": "OK"})


def gateway_config(tmp: Path, ledger: str) -> Path:
    config = tmp / "toolledger.toml"
    config.write_text(
        f"""[mcp]
tenant = "acme"
subject = "user-1"

[mcp.upstreams.payments]
command = [{json.dumps(sys.executable)}, {json.dumps(str(PEERS / "payments.py"))}]
env = {{ PAYMENTS_STATE = {json.dumps(str(tmp / "payments.sqlite3"))} }}
timeout_ms = 10000

[mcp.upstreams.payments.tools.create_payment]
lookup = {{ tool = "get_payment_by_key", key_argument = "key", result = "/payment" }}
""",
        encoding="utf-8",
    )
    return config


def through_the_gateway(tmp: Path, ledger: str) -> list[dict]:
    """Every row as a `tools/call` through `toolledger mcp` on `ledger`, in order."""
    steps = []
    for row in CORPUS:
        arguments = arguments_of(row, {"order_id": "ord-7", "currency": "USD"})
        arguments["idempotency_key"] = key_of("mcp", row)
        steps.append({"op": "call", "name": row.get("tool", "create_payment"),
                      "arguments": arguments})
    command = [toolledger_binary(), "mcp", "--config", str(gateway_config(tmp, ledger)),
               "--db", ledger]
    host = subprocess.run(
        [sys.executable, str(PEERS / "host.py"), "--", *command],
        input=json.dumps(steps), capture_output=True, text=True, timeout=300,
    )
    assert host.returncode == 0, host.stderr
    answers = [json.loads(line) for line in host.stdout.splitlines()]
    assert len(answers) == len(steps), host.stdout + host.stderr
    return answers


def gateway_code(answer: dict) -> str:
    if "error" in answer:
        # A JSON-RPC error (an unknown tool): its code, as MCP gives it.
        return str(answer["error"]["code"])
    return answer["structuredContent"]["code"] if answer.get("isError") else "OK"


def through_the_command_line(tmp: Path, ledger: str) -> list[subprocess.CompletedProcess]:
    case = json.loads((ROOT / "fixtures/persistence-case.json").read_text(encoding="utf-8"))
    runs = []
    for row in CORPUS:
        arguments = arguments_of(row, case["proposal"]["arguments"])
        proposal = {"tool_name": row.get("tool", case["proposal"]["tool_name"]),
                    "arguments": arguments}
        host = {**case["host_context"]}
        if "key" in row:
            host["idempotency_key"] = row["key"]
        path = tmp / "case.json"
        path.write_text(json.dumps({**case, "proposal": proposal, "host_context": host}),
                        encoding="utf-8")
        runs.append(subprocess.run(
            [toolledger_binary(), "dispatch", "--db", ledger, "--case", str(path)],
            capture_output=True, text=True, timeout=120,
        ))
    return runs


def test_every_door_answers_the_corpus_alike_on_one_ledger(tmp_path):
    ledger_path = str(tmp_path / "ledger.sqlite3")
    payments = Payments()
    with tl.Ledger.open(ledger_path, tools=[payment_tool()], downstream=payments,
                        tenant="acme", subject="user-1") as ledger:
        python: dict[str, tl.Reply | tl.Error] = {}
        for row in CORPUS:
            arguments = arguments_of(row, {"payer": "bob", "currency": "EUR"})
            call = tl.Call(row.get("tool", "pay"), arguments, key=key_of("py", row))
            try:
                python[row["name"]] = ledger.dispatch(call)
            except tl.Error as refused:
                python[row["name"]] = refused
        gateway = dict(zip((row["name"] for row in CORPUS), through_the_gateway(tmp_path, ledger_path)))
        cli = dict(zip((row["name"] for row in CORPUS), through_the_command_line(tmp_path, ledger_path)))

        for row in CORPUS:
            name, want = row["name"], expected(row)
            reply, answer, run = python[name], gateway[name], cli[name]
            if "by_door" in row:
                # An odd key or tool name: each door's own refusal, nothing written.
                codes = row["by_door"]
                assert reply.code == codes["python"], (name, reply.code)
                assert gateway_code(answer) == codes["mcp"], (name, answer)
                cli_code = (json.loads(run.stdout)["code"] if run.returncode == 1 else
                            json.loads(run.stderr.strip().splitlines()[-1])["error"]["code"])
                assert cli_code == codes["cli"], (name, run.stdout, run.stderr)
                continue
            if "twin" in row:
                twin = row["twin"]
                # The same intent as its twin: a replay, with the twin's digest and ref.
                assert isinstance(reply.outcome, tl.Replayed), (name, reply.code)
                assert reply.outcome.request_sha256 == python[twin].outcome.request_sha256
                assert gateway_code(answer) == "OK", (name, answer)
                assert answer["meta"]["io.toolledger/replayed"] is True, (name, answer)
                assert (answer["meta"]["io.toolledger/status_ref"]
                        == gateway[twin]["meta"]["io.toolledger/status_ref"])
            else:
                assert reply.code == want["code"], (name, reply.code)
                assert gateway_code(answer) == want["code"], (name, answer)
                if want["code"] == "INPUT_INVALID":
                    detail = {"pointer": want["pointer"], "keyword": want["keyword"]}
                    assert reply.package["detail"] == detail, (name, reply.package)
                    assert answer["structuredContent"]["detail"] == detail, (name, answer)
            # The command line: the ordinary row is fresh; every other is not a case file.
            if name == "ordinary":
                assert run.returncode == 0, (name, run.stderr)
                assert json.loads(run.stdout)["delivery"] == "fresh"
            else:
                assert run.returncode == 2, (name, run.returncode, run.stdout)
                assert json.loads(run.stderr.strip().splitlines()[-1])["error"]["code"] == (
                    "FIXTURE_INVALID"
                ), (name, run.stderr)

        # One operation per door, one effect each: nothing refused was written or sent.
        listed = ledger.list()
        assert sorted(row["tool"] for row in listed) == [
            "pay", "payments-create_payment", "refund_order"
        ], listed
        assert len(payments.effects) == 1
        with sqlite3.connect(tmp_path / "payments.sqlite3") as upstream:
            assert upstream.execute("SELECT count(*) FROM payments").fetchone() == (1,)
        assert ledger.audit().passed
        audit = subprocess.run([toolledger_binary(), "audit", "--db", ledger_path],
                               capture_output=True, text=True, timeout=120)
        assert audit.returncode == 0, audit.stdout + audit.stderr
