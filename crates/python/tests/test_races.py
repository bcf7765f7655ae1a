"""Eight threads, then eight processes, racing one key: one effect."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import toolledger as tl
from file_payments import PAY_ARGS, FilePayments, pay_tool

HERE = Path(__file__).parent
# The one that performs it is fresh; the others replay it, or (while it is in flight)
# answer unknown: none performs it again.
ALLOWED = {"Fresh", "Replayed", "Unknown"}


def settle(location, payments):
    with tl.Ledger.open(location, tools=[pay_tool()], downstream=payments, tenant="acme",
                        subject="user-1") as ledger:
        final = ledger.dispatch(tl.Call("pay", PAY_ARGS, key="raced"))
        assert isinstance(final.outcome, tl.Replayed)
        assert ledger.audit().passed
        return final


def test_eight_threads_racing_one_key_make_one_effect(location, tmp_path):
    payments = FilePayments(str(tmp_path / "effects.log"))
    ledgers = [
        tl.Ledger.open(location, tools=[pay_tool()], downstream=payments, tenant="acme",
                       subject="user-1")
        for _ in range(8)
    ]
    shared = ledgers[0]
    barrier = threading.Barrier(10)
    outcomes: list[str] = []
    lock = threading.Lock()

    def race(ledger):
        barrier.wait()
        reply = ledger.dispatch(tl.Call("pay", PAY_ARGS, key="raced"))
        with lock:
            outcomes.append(type(reply.outcome).__name__)

    # Seven ledgers of their own and one shared by two threads.
    threads = [threading.Thread(target=race, args=(ledger,)) for ledger in ledgers[1:]]
    threads += [threading.Thread(target=race, args=(shared,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    barrier.wait()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 9 and set(outcomes) <= ALLOWED
    assert outcomes.count("Fresh") == 1
    assert len(payments.effects()) == 1
    for ledger in ledgers:
        ledger.close()
    settle(location, payments)


def test_eight_processes_racing_one_key_make_one_effect(location, tmp_path):
    effects = str(tmp_path / "effects.log")
    start = tmp_path / "start"
    # The store exists before the race starts: creating it is not what is raced.
    with tl.Ledger.open(location, tools=[pay_tool()], downstream=FilePayments(effects),
                        tenant="acme", subject="user-1"):
        pass
    children = [
        subprocess.Popen(
            [sys.executable, str(HERE / "race_child.py"), location, effects, str(start)],
            cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(8)
    ]
    start.touch()
    outcomes = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        outcomes.append(out.strip())
    assert set(outcomes) <= ALLOWED, outcomes
    assert outcomes.count("Fresh") == 1
    assert len(FilePayments(effects).effects()) == 1
    settle(location, FilePayments(effects))
