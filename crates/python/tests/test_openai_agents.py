"""The OpenAI Agents SDK adapter, driven offline by the SDK's own scripted model
(``agents.testing.ScriptedModel``) through ``Runner``: the approval interruption, the
approved call performed once, and a retried run replaying it."""

from __future__ import annotations

import asyncio
import json

from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

import toolledger as tl
import toolledger.openai_agents
from conftest import pay_function

PAY = {"payer": "bob", "amount_minor": 2500, "currency": "EUR"}


def scripted():
    return ScriptedModel([
        [function_call("pay", PAY, call_id="call_pay_1")],
        [assistant_message("bob is paid")],
    ])


def test_a_tool_call_is_performed_once_and_a_retried_run_replays_it(sqlite_location):
    performed: list = []
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        tools = toolledger.openai_agents.function_tools([pay_function(ledger, performed)])
        agent = Agent(name="payer", model=scripted(), tools=tools)
        result = asyncio.run(Runner.run(agent, "pay bob"))
        assert result.final_output == "bob is paid"
        outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
        assert json.loads(outputs[0]) == {"payment_id": "pay-1", "amount_minor": 2500,
                                          "currency": "EUR"}
        # The same model call again (a retried run): replayed, not paid twice.
        again = asyncio.run(Runner.run(Agent(name="payer", model=scripted(), tools=tools), "pay bob"))
        assert again.final_output == "bob is paid"
        assert performed == ["bob"]
        assert ledger.dispatch(tl.Call("pay", PAY, key="call_pay_1")).outcome.__class__ is tl.Replayed


def test_needs_approval_interrupts_the_run_until_the_host_approves(sqlite_location):
    performed: list = []
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        pay = pay_function(ledger, performed, approval=True)
        tools = toolledger.openai_agents.function_tools([pay], approver_id="lead-2")
        assert tools[0].needs_approval is True
        agent = Agent(name="payer", model=scripted(), tools=tools)
        paused = asyncio.run(Runner.run(agent, "pay bob"))
        assert len(paused.interruptions) == 1 and performed == []
        assert ledger.list() == []
        state = paused.to_state()
        state.approve(paused.interruptions[0])
        done = asyncio.run(Runner.run(agent, state))
        assert done.final_output == "bob is paid"
        assert performed == ["bob"]
        shown = ledger.show(ledger.list()[0]["status_ref"])
        assert shown["approval_id"] == "call_pay_1-approval"


def test_a_rejected_call_is_never_performed(sqlite_location):
    performed: list = []
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        tools = toolledger.openai_agents.function_tools([pay_function(ledger, performed, approval=True)],
                                                        approver_id="lead-2")
        agent = Agent(name="payer", model=scripted(), tools=tools)
        paused = asyncio.run(Runner.run(agent, "pay bob"))
        state = paused.to_state()
        state.reject(paused.interruptions[0])
        asyncio.run(Runner.run(agent, state))
        assert performed == [] and ledger.list() == []


def test_a_direct_invoke_without_the_sdks_approval_performs_nothing(sqlite_location):
    # The tool invoked outside Runner's approval flow: no approval was recorded for this
    # call, so the adapter presents none and the ledger refuses the call.
    performed: list = []
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        tools = toolledger.openai_agents.function_tools([pay_function(ledger, performed, approval=True)],
                                                        approver_id="lead-2")
        arguments = json.dumps(PAY)
        context = ToolContext(context=None, tool_name="pay", tool_call_id="call_pay_9",
                              tool_arguments=arguments)
        answer = json.loads(asyncio.run(tools[0].on_invoke_tool(context, arguments)))
        assert answer["gate"] == "BLOCK" and answer["code"] == "APPROVAL_INVALID"
        assert performed == [] and ledger.list() == []
