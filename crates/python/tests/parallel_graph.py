"""The graph of the parallel tool-call tests: an agent whose one AI message holds four
`pay` tool calls, a `ToolNode` of the ledger's tools, and a checkpointer. Shared by
`test_parallel.py` and the host process it kills (`parallel_child.py`)."""

from __future__ import annotations

from typing import Annotated, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

import toolledger.langgraph

PAYERS = ["a", "b", "c", "d"]
DONE = "Done: everyone is paid."


class State(TypedDict):
    messages: Annotated[list, add_messages]


def batch() -> AIMessage:
    """One AI message, four tool calls, each its own id (its idempotency key)."""
    return AIMessage("", tool_calls=[
        {"name": "pay", "args": {"payer": payer, "amount_minor": 100 + n, "currency": "EUR"},
         "id": f"call_pay_{payer}"}
        for n, payer in enumerate(PAYERS)
    ])


def model(*, first_turn: bool) -> GenericFakeChatModel:
    """The scripted model: the batch then the end, or (resumed after the batch) the end."""
    turns = [batch(), AIMessage(DONE)] if first_turn else [AIMessage(DONE)]
    return GenericFakeChatModel(messages=iter(turns))


def build(pay, chat: GenericFakeChatModel, checkpointer):
    node = ToolNode(toolledger.langgraph.tools([pay]))

    def agent(state: State):
        return {"messages": [chat.invoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)
