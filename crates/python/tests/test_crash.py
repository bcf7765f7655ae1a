"""A host killed at each commit point, and inside the downstream before and after its
effect: a restarted host, its status query and the relay settle it, with one effect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import toolledger as tl
from file_payments import PAY_ARGS, FilePayments, pay_tool

HERE = Path(__file__).parent
T = 1_767_225_600
# Commit 1 is commit A (the intent, accepted and claimed); commit 2 is commit C (the
# receipt), before the answer left; by commit 3 the call has been answered.
CASES = [
    ("commit", 1, -signal.SIGABRT),
    ("commit", 2, -signal.SIGABRT),
    ("commit", 3, 0),
    ("before-effect", 0, -signal.SIGKILL),
    ("after-effect", 0, -signal.SIGKILL),
]


@pytest.mark.parametrize("die, commit, returncode", CASES)
def test_a_host_killed_at_each_commit_point_ends_with_one_effect(
    location, tmp_path, die, commit, returncode
):
    effects = str(tmp_path / "effects.log")
    env = dict(os.environ)
    if commit:
        env["TOOLLEDGER_CRASH_AFTER_COMMIT"] = str(commit)
    child = subprocess.run(
        [sys.executable, str(HERE / "crash_child.py"), location, effects, "k-1", die, str(T)],
        env=env, cwd=HERE, capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == returncode, child.stderr
    acknowledged = child.stdout.split()
    payments = FilePayments(effects)
    # Restarted after the dead worker's lease ran out (on SQLite by the calls' clock, on
    # PostgreSQL by the database's).
    later: int | None = T + 120
    if location.startswith("postgres"):
        later = None
        time.sleep(1.5)
    with tl.Ledger.open(location, tools=[pay_tool()], downstream=payments, tenant="acme",
                        subject="user-1") as ledger:
        call = tl.Call("pay", PAY_ARGS, key="k-1", at=later)
        first = ledger.dispatch(call)
        if acknowledged:
            # What was answered before the crash is still true.
            assert acknowledged == ["Fresh", first.status_ref]
            assert isinstance(first.outcome, tl.Replayed)
        if isinstance(first.outcome, tl.Unknown):
            ledger.status(first.status_ref, call)
            ledger.relay(at=later)
        settled = ledger.dispatch(call)
        assert isinstance(settled.outcome, tl.Replayed), settled
        assert len(payments.effects()) == 1
        assert settled.output == payments.effects()[0]["payment"]
        assert ledger.audit().passed
