"""Parallel tool calls: one AI message's four tool calls run at once through LangGraph's
`ToolNode` (`ainvoke`) and through the Agents SDK's `Runner`, each ledgered under its
own id; and a LangGraph host killed mid-batch resumes from its checkpoint with the
finished calls replayed and the others settled, each performed once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import toolledger as tl
import toolledger.openai_agents
from conftest import PAYMENT_INPUT, PAYMENT_OUTPUT
from file_payments import FilePayments
from parallel_graph import DONE, PAYERS, build, model

HERE = Path(__file__).parent
# A bound on every wait for the others, never a measure.
TOGETHER_BOUND = 20.0


def meeting_tool(ledger: tl.Ledger, together: int, seen: dict):
    """An `async def` pay tool: each call waits (boundedly) for `together` calls to be
    inside at once, and records the most inside and the thread it ran on."""
    meeting = asyncio.Barrier(together)

    @ledger.tool("pay", input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT)
    async def pay(payer, amount_minor, currency, note=None):
        "Pay a payer."
        seen["inside"] += 1
        seen["most"] = max(seen["most"], seen["inside"])
        seen["threads"].add(threading.get_ident())
        try:
            await asyncio.wait_for(meeting.wait(), TOGETHER_BOUND)
        except TimeoutError:
            pass
        seen["inside"] -= 1
        seen["paid"].append(payer)
        return {"payment_id": f"pay-{len(seen['paid'])}", "amount_minor": amount_minor,
                "currency": currency}

    return pay


def fresh_seen() -> dict:
    return {"inside": 0, "most": 0, "threads": set(), "paid": []}


def test_langgraph_runs_one_messages_tool_calls_at_once(sqlite_location):
    seen = fresh_seen()

    async def main():
        with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
            pay = meeting_tool(ledger, len(PAYERS), seen)
            graph = build(pay, model(first_turn=True), InMemorySaver())
            done = await graph.ainvoke({"messages": [HumanMessage("pay everyone")]},
                                       {"configurable": {"thread_id": "t-1"}})
            # Each call is ledgered under its own tool call id.
            for payer in PAYERS:
                again = await ledger.adispatch(tl.Call("pay", {"payer": payer, "amount_minor":
                    100 + PAYERS.index(payer), "currency": "EUR"}, key=f"call_pay_{payer}"))
                assert isinstance(again.outcome, tl.Replayed), payer
            assert ledger.audit().passed
            return done, threading.get_ident()

    done, loop_thread = asyncio.run(main())
    tools = [m for m in done["messages"] if m.type == "tool"]
    assert sorted(m.tool_call_id for m in tools) == [f"call_pay_{p}" for p in PAYERS]
    assert all(m.artifact["code"] == "OK" for m in tools)
    assert done["messages"][-1].content == DONE
    assert seen["most"] == len(PAYERS), "the four calls were inside at once"
    assert seen["threads"] == {loop_thread}, "the async tool ran on the host's loop"
    assert sorted(seen["paid"]) == PAYERS


def test_the_agents_sdk_runs_a_turns_tool_calls_at_once(sqlite_location):
    seen = fresh_seen()
    calls = [function_call("pay", {"payer": p, "amount_minor": 100, "currency": "EUR"},
                           call_id=f"call_{p}") for p in PAYERS]

    async def main():
        with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
            pay = meeting_tool(ledger, len(PAYERS), seen)
            tools = toolledger.openai_agents.function_tools([pay])
            agent = Agent(name="payer", tools=tools,
                          model=ScriptedModel([calls, [assistant_message("all paid")]]))
            result = await Runner.run(agent, "pay everyone")
            return result, threading.get_ident()

    result, loop_thread = asyncio.run(main())
    assert result.final_output == "all paid"
    assert seen["most"] == len(PAYERS), "the turn's four calls were inside at once"
    assert seen["threads"] == {loop_thread}
    assert sorted(seen["paid"]) == PAYERS


def kill_mid_batch(location: str, effects: str, checkpoints: str) -> None:
    """Runs the parallel host until `a` and `b` are answered and `c` and `d` hold
    inside the tool, then kills it with SIGKILL."""
    args = [sys.executable, str(HERE / "parallel_child.py"), location, effects, checkpoints]
    with subprocess.Popen(args, cwd=HERE, stderr=subprocess.PIPE, text=True) as child:
        # Bounded: a child that never gets there is killed after 120 s.
        watchdog = threading.Timer(120, child.kill)
        watchdog.start()
        holding: set[str] = set()
        told: list[str] = []
        assert child.stderr is not None
        for line in child.stderr:
            told.append(line)
            if line.startswith("holding "):
                holding.add(line.split()[1])
            if holding == {"c", "d"}:
                break
        # `a` and `b` answered: their commit C is in the ledger. Each look is closed at
        # once: Python's own SQLite must hold no descriptor of the ledger's file once the
        # package's SQLite opens it in this process (closing one drops every POSIX lock
        # the process holds on the file, the other library's too).
        while watchdog.is_alive():
            with contextlib.closing(sqlite3.connect(location)) as db:
                done = db.execute(
                    "SELECT count(*) FROM operations WHERE status = 'succeeded'").fetchone()[0]
            if done == 2:
                break
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait()
        watchdog.cancel()
    assert holding == {"c", "d"}, "".join(told)


def test_a_langgraph_host_killed_mid_batch_resumes_with_the_finished_calls_replayed(tmp_path):
    location = str(tmp_path / "ledger.sqlite3")
    effects = str(tmp_path / "effects.log")
    checkpoints = str(tmp_path / "checkpoints.sqlite3")
    kill_mid_batch(location, effects, checkpoints)
    payments = FilePayments(effects)
    # Paid before the kill: a, b and c (c's answer was lost); d never left.
    assert sorted(effect["payment"]["amount_minor"] for effect in payments.effects()) == [100, 101, 102]
    time.sleep(1.5)  # the dead host's one-second leases run out
    performed: list[str] = []
    with tl.Ledger.open(location, tenant="acme", subject="user-1") as ledger:

        @ledger.tool("pay", input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT,
                     lookup=payments.lookup)
        def pay(payer, amount_minor, currency, note=None):
            "Pay a payer."
            performed.append(payer)
            return payments.execute(tl.downstream.current_request())

        saver = SqliteSaver(sqlite3.connect(checkpoints, check_same_thread=False))
        graph = build(pay, model(first_turn=False), saver)
        thread = {"configurable": {"thread_id": "batch-1"}}
        # The checkpoint holds the batch's AI message; the tool node runs again.
        done = graph.invoke(None, thread, durability="sync")
        tools = {m.tool_call_id: m.artifact for m in done["messages"] if m.type == "tool"}
        assert sorted(tools) == [f"call_pay_{p}" for p in PAYERS]
        assert done["messages"][-1].content == DONE
        # a and b finished before the kill: replayed. c and d were in flight: nothing
        # guesses, they are unknown (never sent again blindly). Nothing was performed.
        assert (tools["call_pay_a"]["code"], tools["call_pay_a"]["delivery"]) == ("OK", "local_replay")
        assert (tools["call_pay_b"]["code"], tools["call_pay_b"]["delivery"]) == ("OK", "local_replay")
        assert tools["call_pay_c"]["code"] == tools["call_pay_d"]["code"] == "OUTCOME_UNKNOWN"
        assert performed == []
        # Settled: c's status query finds the service's record of it; the relay sends d,
        # whose lookup found none, once.
        settled = ledger.status(tools["call_pay_c"]["status_ref"])
        assert isinstance(settled.outcome, tl.Reconciled), settled
        ledger.status(tools["call_pay_d"]["status_ref"])
        ledger.relay()
        assert performed == ["d"]
        for n, payer in enumerate(PAYERS):
            again = ledger.dispatch(tl.Call("pay", {"payer": payer, "amount_minor": 100 + n,
                                                    "currency": "EUR"}, key=f"call_pay_{payer}"))
            assert isinstance(again.outcome, tl.Replayed), (payer, again)
        assert ledger.audit().passed
    refs = [effect["ref"] for effect in payments.effects()]
    assert len(refs) == 4 and len(set(refs)) == 4, "one effect per tool call"
