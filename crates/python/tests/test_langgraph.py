"""The LangGraph adapter, driven offline by langchain-core's fake chat model through a
real graph with a checkpointer: an interrupt for approval, and a resume that replays
what already happened instead of executing it again."""

from __future__ import annotations

import json
from typing import Annotated, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

import toolledger as tl
import toolledger.langgraph
from conftest import PAYMENT_INPUT, PAYMENT_OUTPUT


class State(TypedDict):
    messages: Annotated[list, add_messages]


def build(ledger, model, performed):
    @ledger.tool(input_schema={"type": "object", "required": ["queue"],
                               "properties": {"queue": {"type": "string"}}},
                 output_schema={"type": "object", "required": ["ticket_id"],
                                "properties": {"ticket_id": {"type": "string"}}})
    def open_ticket(queue):
        "Open a support ticket."
        performed.append(("ticket", queue))
        return {"ticket_id": f"T-{len(performed)}"}

    @ledger.tool(input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT,
                 approval={"required": True, "max_validity_seconds": 3600})
    def pay(payer, amount_minor, currency, note=None):
        "Pay a payer."
        performed.append(("pay", payer))
        return {"payment_id": f"pay-{len(performed)}", "amount_minor": amount_minor,
                "currency": currency}

    node = ToolNode(toolledger.langgraph.tools([open_ticket, pay], approvers=["lead-2"]))

    def agent(state: State):
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def script():
    return GenericFakeChatModel(messages=iter([
        AIMessage("", tool_calls=[
            {"name": "open_ticket", "args": {"queue": "billing"}, "id": "call_ticket_1"},
            {"name": "pay", "args": {"payer": "bob", "amount_minor": 2500, "currency": "EUR"},
             "id": "call_pay_1"},
        ]),
        AIMessage("Done: the ticket is open and bob is paid."),
    ]))


def test_an_interrupt_for_approval_then_a_resume_that_replays(sqlite_location):
    performed: list = []
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        graph = build(ledger, script(), performed)
        thread = {"configurable": {"thread_id": "t-1"}}
        paused = graph.invoke({"messages": [HumanMessage("open a ticket and pay bob")]}, thread)
        asked = paused["__interrupt__"][0].value
        assert asked["status"] == "approval_required" and asked["tool"] == "pay"
        assert asked["key"] == "call_pay_1"
        # Nothing was paid before the human answered.
        assert ("pay", "bob") not in performed
        done = graph.invoke(Command(resume={"approved": True, "approver_id": "lead-2",
                                            "approval_id": "appr-1"}), thread)
        # The node ran again on resume: the ticket was replayed, not opened twice.
        assert performed.count(("ticket", "billing")) == 1
        assert performed.count(("pay", "bob")) == 1
        results = {m.tool_call_id: m for m in done["messages"] if m.type == "tool"}
        assert results["call_pay_1"].status == "success"
        assert results["call_pay_1"].artifact["code"] == "OK"
        assert done["messages"][-1].content.startswith("Done")
        # The ledger answers the same calls again without a second effect.
        assert ledger.dispatch(tl.Call("open_ticket", {"queue": "billing"},
                                       key="call_ticket_1")).outcome.__class__ is tl.Replayed
        assert ledger.audit().passed


def resumed(location, thread_id, answer):
    """Runs the script until the approval interrupt, resumes it with `answer`, and
    returns the tool messages by call id, what was performed, and the ledger's tools."""
    performed: list = []
    with tl.Ledger.open(location, tenant="acme", subject="user-1") as ledger:
        graph = build(ledger, script(), performed)
        thread = {"configurable": {"thread_id": thread_id}}
        graph.invoke({"messages": [HumanMessage("pay bob")]}, thread)
        done = graph.invoke(Command(resume=answer), thread)
        results = {m.tool_call_id: m for m in done["messages"] if m.type == "tool"}
        return results, performed, [row["tool"] for row in ledger.list()]


def test_a_refused_approval_sends_nothing(sqlite_location):
    results, performed, accepted = resumed(sqlite_location, "t-2", {"approved": False})
    assert results["call_pay_1"].status == "error"
    assert ("pay", "bob") not in performed
    assert accepted == ["open_ticket"]


def test_an_approval_for_other_arguments_is_refused(sqlite_location):
    other = {"payer": "bob", "amount_minor": 25, "currency": "EUR"}
    results, performed, accepted = resumed(
        sqlite_location, "t-3", {"approved": True, "approver_id": "lead-2", "arguments": other}
    )
    assert "APPROVAL_INVALID" in results["call_pay_1"].content
    assert ("pay", "bob") not in performed
    assert accepted == ["open_ticket"]


def test_an_approver_the_policy_does_not_name_is_refused(sqlite_location):
    results, performed, _ = resumed(
        sqlite_location, "t-4", {"approved": True, "approver_id": "intern-9"}
    )
    assert results["call_pay_1"].artifact["code"] == "APPROVAL_INVALID"
    assert ("pay", "bob") not in performed


def test_a_refused_approval_answers_a_block_package(sqlite_location):
    results, performed, _ = resumed(sqlite_location, "t-5", {"approved": False})
    refused = results["call_pay_1"]
    assert refused.status == "error"
    assert refused.artifact["gate"] == "BLOCK"
    assert refused.artifact["code"] == "APPROVAL_REQUIRED"
    assert refused.artifact["message"]
    assert json.loads(refused.content) == refused.artifact
    assert ("pay", "bob") not in performed


def test_an_answer_that_names_no_approver_is_refused_not_raised(sqlite_location):
    for n, answer in enumerate([{"approved": True}, {"approved": True, "approver_id": None},
                                {"approved": True, "approver_id": ""}]):
        results, performed, accepted = resumed(sqlite_location, f"t-6-{n}", answer)
        refused = results["call_pay_1"]
        assert refused.status == "error"
        assert refused.artifact["code"] == "APPROVAL_INVALID"
        assert "approver" in refused.artifact["message"]
        assert ("pay", "bob") not in performed
        assert "pay" not in accepted


def test_an_answer_whose_approval_is_malformed_is_refused_not_raised(sqlite_location):
    for n, answer in enumerate([
        {"approved": True, "approver_id": "lead 2"},
        {"approved": True, "approver_id": "lead-2", "approval_id": "not an id"},
        {"approved": True, "approver_id": "lead-2", "expires_in": "soon"},
    ]):
        results, performed, accepted = resumed(sqlite_location, f"t-7-{n}", answer)
        refused = results["call_pay_1"]
        assert refused.status == "error"
        assert refused.artifact["code"] == "APPROVAL_INVALID"
        assert ("pay", "bob") not in performed
        assert "pay" not in accepted


def test_a_tool_call_id_that_is_not_a_key_is_answered_not_raised(sqlite_location):
    for n, call_id in enumerate(["call pay 1", "-call", "c" * 129, "appel-é"]):
        performed: list = []
        model = GenericFakeChatModel(messages=iter([
            AIMessage("", tool_calls=[
                {"name": "open_ticket", "args": {"queue": "billing"}, "id": call_id},
            ]),
            AIMessage("The ticket could not be opened."),
        ]))
        with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
            graph = build(ledger, model, performed)
            thread = {"configurable": {"thread_id": f"t-8-{n}"}}
            done = graph.invoke({"messages": [HumanMessage("open a ticket")]}, thread)
            answered = [m for m in done["messages"] if m.type == "tool"]
            assert [m.tool_call_id for m in answered] == [call_id]
            assert answered[0].status == "error"
            assert answered[0].artifact["code"] == "USAGE_ERROR"
            assert "not an idempotency key" in answered[0].artifact["message"]
            assert performed == [] and ledger.list() == []


def test_an_approval_tool_call_whose_id_is_not_a_key_asks_nobody(sqlite_location):
    performed: list = []
    model = GenericFakeChatModel(messages=iter([
        AIMessage("", tool_calls=[
            {"name": "pay", "args": {"payer": "bob", "amount_minor": 2500, "currency": "EUR"},
             "id": "call pay 1"},
        ]),
        AIMessage("bob could not be paid."),
    ]))
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        graph = build(ledger, model, performed)
        done = graph.invoke({"messages": [HumanMessage("pay bob")]},
                            {"configurable": {"thread_id": "t-9"}})
        assert "__interrupt__" not in done
        answered = [m for m in done["messages"] if m.type == "tool"]
        assert answered[0].artifact["code"] == "USAGE_ERROR"
        assert performed == [] and ledger.list() == []


def test_the_adapters_key_rule_is_the_ledgers(sqlite_location):
    # The adapter checks a tool call's id before it asks a human; the ledger checks it
    # again at dispatch. The two rules must agree.
    from toolledger._adapt import is_key

    ids = ["a", "0", "call_1", "call.1:x-y", "A" * 128, "", "-a", ".a", "_a", "a b",
           "a/b", "a" * 129, "é", "a\u00e9", "a\n", "call#1"]
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        for key in ids:
            try:
                ledger.dispatch(tl.Call("refund_order", {}, key=key))
                ledger_takes_it = True
            except tl.InvalidError:
                ledger_takes_it = False
            assert is_key(key) == ledger_takes_it, key
