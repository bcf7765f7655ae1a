"""Ledgered tools for LangGraph's ``ToolNode``.

:func:`tools` turns ledgered tools (``@ledger.tool`` functions) into LangChain tools a
``ToolNode`` runs. Each model tool call is dispatched through the ledger under the
**tool call's id** as the idempotency key: the model's one tool call is one intent, so
when LangGraph runs a node again (a resume after ``interrupt``, a retried super-step,
a replayed thread), the calls that already happened are **replayed**, never executed
again.

An AI message with several tool calls is run by the ``ToolNode`` at once (threads under
``graph.invoke``, tasks under ``graph.ainvoke``), all on one ledger, each under its own
id: if the process dies mid-batch, the resumed node replays the calls that finished and
settles the others, each performed at most once.

A tool whose policy requires approval asks the human with LangGraph's ``interrupt``:
the payload names the tool, the arguments and the key; the resume value is
``{"approved": True, "approver_id": ..., "approval_id": ..., "expires_in": seconds}`` (or
``{"approved": False}``). The approval is bound by the ledger to this exact call: a
resume whose ``arguments`` differ from the call's is refused, and an approval that
expired is ``APPROVAL_EXPIRED``. Nothing is accepted before the human answers.

Whatever is refused is answered, never raised: a ``ToolMessage`` with ``status="error"``
whose ``artifact`` is a BLOCK package. A human's refusal is ``APPROVAL_REQUIRED`` (as the
MCP gateway answers a declined approval); an answer that names no approver or holds a
malformed approval, or one for other arguments, is ``APPROVAL_INVALID``; a tool
call whose id is not an idempotency key is ``USAGE_ERROR``, and no human is asked.

Needs ``langgraph`` and ``langchain-core``, installed beside the package
(``pip install langgraph langchain-core``).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool

from ._ledger import LedgeredTool
from ._adapt import approval_for, is_key, model_text, refusal
from ._toolledger import Approval, Call

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
        prepared = self._prepare(input)
        if isinstance(prepared, ToolMessage):
            return prepared
        call_id, call = prepared
        return self._message(call_id, self.ledgered.ledger.dispatch(call))

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:  # noqa: A002
        """:meth:`invoke` for ``graph.ainvoke``: the ledger's work runs off the event
        loop (``Ledger.adispatch``), so a ``ToolNode`` runs an AI message's tool calls
        at once, each under its own id; an ``async def`` tool runs on the loop."""
        prepared = self._prepare(input)
        if isinstance(prepared, ToolMessage):
            return prepared
        call_id, call = prepared
        return self._message(call_id, await self.ledgered.ledger.adispatch(call))

    def _prepare(self, input: Any) -> tuple[str, Call] | ToolMessage:  # noqa: A002
        """The ledger call the model's tool call is, or the message answering it when it
        is refused before the ledger sees it (nothing accepted). A tool that needs
        approval asks the human here (``interrupt``)."""
        if not (isinstance(input, dict) and input.get("type") == "tool_call"):
            raise TypeError(
                "a ledgered tool is invoked with the model's tool call "
                "({'type': 'tool_call', 'id': ..., 'args': ...}): its id is the key"
            )
        call_id, arguments = input["id"], input.get("args", {})
        if not is_key(call_id):
            return self._refused(
                call_id, "USAGE_ERROR",
                "the tool call's id is not an idempotency key (1 to 128 bytes of "
                "[A-Za-z0-9_.:-], starting with a letter or digit): nothing was sent",
            )
        approval = None
        if self.ledgered.tool.requires_approval:
            from langgraph.types import interrupt

            answer = interrupt(
                {"status": "approval_required", "tool": self.name, "arguments": arguments,
                 "key": call_id}
            )
            approval = self._approval(call_id, arguments, answer)
            if isinstance(approval, ToolMessage):
                return approval
        return call_id, Call(self.ledgered.tool.name, arguments, key=call_id, tenant=self.tenant,
                             subject=self.subject, approval=approval, context=self.context)

    def _approval(self, call_id: str, arguments: Any, answer: Any) -> Approval | ToolMessage:
        """The approval the human's `answer` becomes, or the refusal to answer instead
        (nothing is accepted)."""
        if not isinstance(answer, dict) or answer.get("approved") is not True:
            return self._refused(call_id, "APPROVAL_REQUIRED",
                                 "the human did not approve it: nothing was sent")
        if "arguments" in answer and answer["arguments"] != arguments:
            return self._refused(call_id, "APPROVAL_INVALID",
                                 "the approval is for other arguments: nothing was sent")
        approver_id = answer.get("approver_id")
        if approver_id is None or approver_id == "":
            return self._refused(call_id, "APPROVAL_INVALID",
                                 "the answer names no approver: nothing was sent")
        approval_id = answer.get("approval_id")
        if not is_key(approver_id) or not (approval_id is None or is_key(approval_id)):
            return self._refused(call_id, "APPROVAL_INVALID",
                                 "the answer's approver_id or approval_id is not an identifier: "
                                 "nothing was sent")
        expires_in, approved_at = answer.get("expires_in", 600), answer.get("approved_at")
        if not _seconds(expires_in) or not (approved_at is None or _seconds(approved_at)):
            return self._refused(call_id, "APPROVAL_INVALID",
                                 "the answer's expires_in or approved_at is not whole seconds: "
                                 "nothing was sent")
        return approval_for(call_id, approver_id, approval_id=approval_id,
                            approved_at=approved_at, valid_for=expires_in,
                            approvers=self.approvers)

    def _message(self, call_id: str, reply: Any) -> ToolMessage:
        return ToolMessage(content=model_text(reply), tool_call_id=call_id, name=self.name,
                           artifact=reply.package,
                           status="success" if reply.done else "error")

    def _refused(self, call_id: Any, code: str, message: str) -> ToolMessage:
        """The answer to a tool call refused before the ledger saw it: its BLOCK package,
        as the artifact and, for the model, as the content."""
        package = refusal(code, message)
        return ToolMessage(content=json.dumps(package, ensure_ascii=False, sort_keys=True),
                           tool_call_id=str(call_id), name=self.name, artifact=package,
                           status="error")

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a ledgered tool is invoked with the model's tool call, not run directly")


def _seconds(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
