"""A host killed at each commit point, and inside the downstream before and after its
effect: a restarted host, its status query and the relay settle it, with one effect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import toolledger as tl
from file_payments import PAY_ARGS, FilePayments, pay_tool

HERE = Path(__file__).parent
T = 1_767_225_600
# Commit 1 is commit A (the intent, accepted and claimed); commit 2 is commit C (the
# receipt), before the answer left; by commit 3 the call has been answered. At a commit
# point the child holds right after the commit (TOOLLEDGER_CRASH_HOLD) and this test
# kills it there with SIGKILL.
CASES = [
    ("commit", 1, -signal.SIGKILL),
    ("commit", 2, -signal.SIGKILL),
    ("commit", 3, 0),
    ("before-effect", 0, -signal.SIGKILL),
    ("after-effect", 0, -signal.SIGKILL),
]
HOLDING = "toolledger: holding after commit"


def run_child(location: str, effects: str, die: str, commit: int) -> tuple[int, str, str]:
    """Runs the host; killed with SIGKILL once it holds after commit `commit`."""
    env = dict(os.environ)
    if commit:
        env["TOOLLEDGER_CRASH_AFTER_COMMIT"] = str(commit)
        env["TOOLLEDGER_CRASH_HOLD"] = "1"
    args = [sys.executable, str(HERE / "crash_child.py"), location, effects, "k-1", die, str(T)]
    with subprocess.Popen(args, env=env, cwd=HERE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as child:
        # Bounded: a child that neither holds nor ends is killed after 120 s.
        watchdog = threading.Timer(120, child.kill)
        watchdog.start()
        told = []
        assert child.stderr is not None and child.stdout is not None
        for line in child.stderr:
            told.append(line)
            if line.startswith(HOLDING):
                child.send_signal(signal.SIGKILL)
                break
        returncode = child.wait()
        watchdog.cancel()
        return returncode, child.stdout.read(), "".join(told) + child.stderr.read()


@pytest.mark.parametrize("die, commit, returncode", CASES)
def test_a_host_killed_at_each_commit_point_ends_with_one_effect(
    location, tmp_path, die, commit, returncode
):
    effects = str(tmp_path / "effects.log")
    code, stdout, stderr = run_child(location, effects, die, commit)
    assert code == returncode, stderr
    assert (HOLDING in stderr) == (code == -signal.SIGKILL and die == "commit"), stderr
    acknowledged = stdout.split()
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


def test_a_host_killed_with_sixteen_calls_in_flight_on_one_ledger_recovers_each_once(
    location, tmp_path
):
    """Sixteen threads on one ledger, all inside the downstream at once (half after
    their effect, half before), killed with SIGKILL: each key ends with one effect."""
    effects = str(tmp_path / "effects.log")
    args = [sys.executable, str(HERE / "many_child.py"), location, effects, str(T)]
    with subprocess.Popen(args, cwd=HERE, stderr=subprocess.PIPE, text=True) as child:
        watchdog = threading.Timer(120, child.kill)
        watchdog.start()
        holding: set[str] = set()
        assert child.stderr is not None
        for line in child.stderr:
            if line.startswith("holding "):
                holding.add(line.split()[1])
            if len(holding) == 16:
                break
        child.send_signal(signal.SIGKILL)
        child.wait()
        watchdog.cancel()
    # All sixteen were in flight at once: eight had paid, eight had not.
    assert len(holding) == 16, holding
    payments = FilePayments(effects)
    assert len(payments.effects()) == 8
    later: int | None = T + 120
    if location.startswith("postgres"):
        later = None
        time.sleep(1.5)
    with tl.Ledger.open(location, tools=[pay_tool()], downstream=payments, tenant="acme",
                        subject="user-1") as ledger:
        calls = [tl.Call("pay", {**PAY_ARGS, "note": str(n)}, key=f"k-{n}", at=later)
                 for n in range(16)]
        for call in calls:
            first = ledger.dispatch(call)
            # In flight when the host died: never guessed, never sent again blindly.
            assert isinstance(first.outcome, tl.Unknown), first
            ledger.status(first.status_ref, call)
        ledger.relay(at=later)
        for call in calls:
            settled = ledger.dispatch(call)
            assert isinstance(settled.outcome, tl.Replayed), settled
        refs = [effect["ref"] for effect in payments.effects()]
        assert len(refs) == 16 and len(set(refs)) == 16, "one effect per key"
        assert ledger.audit().passed

