"""Fixtures of the Python suite: ledgers on SQLite and on a throwaway PostgreSQL server
the suite starts itself (never one that happens to be running), and a payments
downstream that counts every effect it performs."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

# The Agents SDK's tracing would export to the network: no test calls out.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from toolledger import Tool
from toolledger.downstream import NotSent, Receipt, Refused, Unknown

ROOT = Path(__file__).resolve().parents[3]

# The Rust suites' supervisor (one script for both): it starts the server, then blocks
# on a pipe only this process holds; when the pipe closes (the session ends, or pytest
# is killed) it stops the server and removes its directory.
SUPERVISOR = (ROOT / "crates/testkit/src/supervisor.sh").read_text()


def _bindir() -> str:
    given = os.environ.get("TOOLLEDGER_PG_BINDIR")
    if given:
        return given
    try:
        return subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "/usr/lib/postgresql/15/bin"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """A PostgreSQL server on a free loopback port, for this session only."""

    def __init__(self) -> None:
        bindir = _bindir()
        if not os.path.exists(os.path.join(bindir, "initdb")):
            # A check that cannot run fails: it is never skipped.
            raise RuntimeError(f"no PostgreSQL server binaries in {bindir}")
        self.bindir = bindir
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="toolledger-py-pg-")
        user = None
        if os.geteuid() == 0:
            # initdb and postgres refuse to run as root.
            user = "postgres"
            entry = pwd.getpwnam(user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.supervisor = subprocess.Popen(
            ["sh", "-c", SUPERVISOR, "sh", self.dir, bindir, str(self.port), ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            user=user,
        )
        first = self.supervisor.stdout.readline() if self.supervisor.stdout else ""
        if not first.startswith("started"):
            raise RuntimeError("the PostgreSQL cluster did not start: " + first)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._psql("SELECT 1").returncode == 0:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the PostgreSQL cluster did not accept connections")
        self.databases = 0
        self.lock = threading.Lock()

    def _psql(self, sql: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [os.path.join(self.bindir, "psql"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qAtc", sql],
            capture_output=True,
            text=True,
        )

    def database(self) -> str:
        """A fresh, empty database's URL."""
        with self.lock:
            self.databases += 1
            name = f"t{self.databases}"
        done = self._psql(f"CREATE DATABASE {name}")
        if done.returncode != 0:
            raise RuntimeError("CREATE DATABASE failed: " + done.stderr)
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.supervisor.stdin:
            self.supervisor.stdin.close()
        self.supervisor.wait(timeout=60)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    started = Cluster()
    yield started
    started.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty ledger on each store."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite3")
    return request.getfixturevalue("cluster").database()


@pytest.fixture
def sqlite_location(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.sqlite3")


PAYMENT_INPUT = {
    "type": "object",
    "required": ["payer", "amount_minor", "currency"],
    "additionalProperties": False,
    "properties": {
        "payer": {"type": "string", "pattern": "^[a-z0-9-]{1,32}$"},
        "amount_minor": {"type": "integer", "minimum": 1, "maximum": 100000000},
        "currency": {"enum": ["EUR", "USD"]},
        "note": {"type": "string", "maxLength": 200},
    },
}
PAYMENT_OUTPUT = {
    "type": "object",
    "required": ["payment_id", "amount_minor", "currency"],
    "additionalProperties": False,
    "properties": {
        "payment_id": {"type": "string", "pattern": "^pay-[0-9]+$"},
        "amount_minor": {"type": "integer"},
        "currency": {"type": "string"},
    },
}


def payment_tool(**policy) -> Tool:
    return Tool(
        "pay",
        description="Pay a payer, once per idempotency key.",
        input_schema=PAYMENT_INPUT,
        output_schema=PAYMENT_OUTPUT,
        output_bindings={"/amount_minor": "/amount_minor", "/currency": "/currency"},
        revisions={"effect": "pay.effect.v1", "handler": "pay.handler.v1"},
        **policy,
    )


def pay_function(ledger, performed: list, mark=None, *, name=None, approval=False):
    """A Python function registered as the ledgered tool `name` (default `pay`) on
    `ledger`: it records `mark` (default: the payer) in `performed` at each effect."""

    @ledger.tool(name, input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT,
                 approval={"required": True} if approval else None)
    def pay(payer, amount_minor, currency, note=None):
        "Pay a payer."
        performed.append(payer if mark is None else mark)
        return {"payment_id": f"pay-{len(performed)}", "amount_minor": amount_minor,
                "currency": currency}

    return pay


class Payments:
    """A payments provider that never deduplicates: every `execute` that gets past its
    fault is one more effect, counted. `mode` makes the next executes fail:

    - `"drop"`: pays, then the connection drops (raises) — commit-then-drop;
    - `"raise"`: raises before paying;
    - `"garbage"`: answers something that is not an answer;
    - `"refuse"`, `"not_sent"`: refuses, or says nothing left;
    - `"off_schema"`: pays and answers an output its schema rejects.

    `lookup` finds a payment by the request ref (when `lookups` is on).
    """

    identity = "payments@1"

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.by_ref: dict[str, dict] = {}
        self.mode: str | None = None
        self.lookups = True
        self.lookup_raises = False
        self.lock = threading.Lock()

    def _pay(self, request) -> dict:
        with self.lock:
            self.effects.append(request.request_ref)
            arguments = request.arguments
            payment = {
                "payment_id": f"pay-{len(self.effects)}",
                "amount_minor": arguments["amount_minor"],
                "currency": arguments["currency"],
            }
            self.by_ref[request.request_ref] = payment
            return payment

    def execute(self, request):
        mode = self.mode
        if mode == "raise":
            raise ConnectionRefusedError("the provider is down")
        if mode == "garbage":
            return {"not": "an answer"}
        if mode == "refuse":
            return Refused("card declined")
        if mode == "not_sent":
            return NotSent("the provider said busy")
        payment = self._pay(request)
        if mode == "drop":
            raise ConnectionResetError("the stream dropped after the commit")
        if mode == "off_schema":
            return Receipt({**payment, "payment_id": 42})
        return Receipt(payment)

    def lookup(self, request):
        if self.lookup_raises:
            raise TimeoutError("the lookup timed out")
        if not self.lookups:
            return Unknown("no lookup")
        payment = self.by_ref.get(request.request_ref)
        return NotSent("no such payment") if payment is None else Receipt(payment)


@pytest.fixture
def payments() -> Payments:
    return Payments()


def _binary(name: str, variable: str) -> str:
    """The workspace's binary `name`: `$variable`, else a build of it under `target/`,
    else one on the PATH. A binary that cannot be found fails the test, never skips it."""
    given = os.environ.get(variable)
    if given:
        return given
    for profile in ("ci/test-debug/debug", "debug", "release"):
        candidate = ROOT / "target" / profile / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise RuntimeError(f"no {name} binary: set {variable}")


def refundd_binary() -> str:
    return _binary("toolledger-refundd", "TOOLLEDGER_REFUNDD")


def toolledger_binary() -> str:
    return _binary("toolledger", "TOOLLEDGER_CLI")
