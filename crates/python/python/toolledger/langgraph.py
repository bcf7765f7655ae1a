"""Ledgered tools for LangGraph's ``ToolNode``.

:func:`tools` turns ledgered tools (``@ledger.tool`` functions) into LangChain tools a
``ToolNode`` runs. Each model tool call is dispatched through the ledger under the
**tool call's id** as the idempotency key: the model's one tool call is one intent, so
when LangGraph runs a node again (a resume after ``interrupt``, a retried super-step,
a replayed thread), the calls that already happened are **replayed**, never executed
again.

A tool whose policy requires approval asks the human with LangGraph's ``interrupt``:
the payload names the tool, the arguments and the key; the resume value is
``{"approved": True, "approver_id": ..., "approval_id": ..., "expires_in": seconds}`` (or
``{"approved": False}``). The approval is bound by the ledger to this exact call: a
resume whose ``arguments`` differ from the call's is refused, and an approval that
expired is ``APPROVAL_EXPIRED``. Nothing is accepted before the human answers.

Needs ``langgraph`` and ``langchain-core`` (``pip install "toolledger[langgraph]"``).
"""

from __future__ import annotations

from typing import Any, Iterable

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool

from ._ledger import LedgeredTool
from ._adapt import approval_for, model_text
from ._toolledger import Call

__all__ = ["LedgerTool", "tools"]


class LedgerTool(BaseTool):
    """A ledgered tool as a LangChain tool: invoked by a ``ToolNode`` with the model's
    tool call, it answers a ``ToolMessage`` whose ``artifact`` is the ledger's package
    (a ``dict``, so a checkpointer can keep it): ``artifact["code"]`` is ``OK`` or why
    not, and ``artifact["status_ref"]`` names the operation."""

    ledgered: Any
    tenant: str | None = None
    subject: str | None = None
    approvers: list[str] = []
    context: dict | None = None

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:  # noqa: A002
        if not (isinstance(input, dict) and input.get("type") == "tool_call"):
            raise TypeError(
                "a ledgered tool is invoked with the model's tool call "
                "({'type': 'tool_call', 'id': ..., 'args': ...}): its id is the key"
            )
        call_id, arguments = input["id"], input.get("args", {})
        approval = None
        if self.ledgered.tool.requires_approval:
            from langgraph.types import interrupt

            answer = interrupt(
                {"status": "approval_required", "tool": self.name, "arguments": arguments,
                 "key": call_id}
            )
            if not isinstance(answer, dict) or answer.get("approved") is not True:
                return self._message(call_id, None, "the human did not approve it: nothing was sent")
            if "arguments" in answer and answer["arguments"] != arguments:
                return self._message(
                    call_id, None,
                    "APPROVAL_INVALID: the approval is for other arguments: nothing was sent",
                )
            approval = approval_for(
                call_id,
                str(answer["approver_id"]),
                approval_id=answer.get("approval_id"),
                approved_at=answer.get("approved_at"),
                valid_for=int(answer.get("expires_in", 600)),
                approvers=self.approvers,
            )
        reply = self.ledgered.ledger.dispatch(
            Call(self.ledgered.tool.name, arguments, key=call_id, tenant=self.tenant,
                 subject=self.subject, approval=approval, context=self.context)
        )
        return self._message(call_id, reply, model_text(reply))

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:  # noqa: A002
        import asyncio

        return await asyncio.to_thread(self.invoke, input, config, **kwargs)

    def _message(self, call_id: str, reply: Any, text: str) -> ToolMessage:
        done = reply is not None and reply.done
        artifact = reply.package if reply is not None else None
        return ToolMessage(content=text, tool_call_id=call_id, name=self.name,
                           artifact=artifact, status="success" if done else "error")

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a ledgered tool is invoked with the model's tool call, not run directly")


def tools(
    ledgered: Iterable[LedgeredTool],
    *,
    tenant: str | None = None,
    subject: str | None = None,
    approvers: Iterable[str] = (),
    context: dict | None = None,
) -> list[LedgerTool]:
    """LangChain tools for a ``ToolNode``, one per ledgered tool, with the tool's JSON
    Schema as its arguments' schema. ``tenant``/``subject`` default to the ledger's;
    ``approvers`` are who may approve (default: whoever the human answer names)."""
    made = []
    for one in ledgered:
        tool = one.tool
        made.append(
            LedgerTool(
                name=tool.name,
                description=tool.description or tool.name,
                args_schema=tool.input_schema,
                ledgered=one,
                tenant=tenant,
                subject=subject,
                approvers=list(approvers),
                context=context,
            )
        )
    return made
