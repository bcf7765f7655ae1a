"""Ledgered tools for the OpenAI Agents SDK.

:func:`function_tools` turns ledgered tools (``@ledger.tool`` functions) into the SDK's
``FunctionTool`` objects. Each invocation is dispatched through the ledger under the
**tool call's id** (``ToolContext.tool_call_id``) as the idempotency key, so a run that
is resumed or retried replays what already happened instead of executing it again.

``needs_approval`` is the tool's own policy: a tool whose definition requires approval
interrupts the run (``result.interruptions``) until the host approves it with
``RunState.approve``; the SDK invokes it only then, and the adapter turns the approval
the SDK recorded for this call id (``ToolContext.is_tool_approved``) into an approval by
``approver_id`` bound by the ledger to this exact call, valid for ``approval_seconds``.
A rejected call is never invoked, so nothing is accepted. A tool invoked without a
recorded approval (``on_invoke_tool`` called directly, outside the SDK's approval flow)
presents none, and the ledger refuses it: ``APPROVAL_INVALID``, nothing accepted and
nothing sent.

Needs ``openai-agents``, installed beside the package (``pip install openai-agents``).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from agents import FunctionTool
from agents.tool_context import ToolContext

from ._ledger import LedgeredTool
from ._adapt import approval_for, model_text
from ._toolledger import Call

__all__ = ["function_tool", "function_tools"]


def function_tool(
    ledgered: LedgeredTool,
    *,
    tenant: str | None = None,
    subject: str | None = None,
    approver_id: str | None = None,
    approval_seconds: int = 600,
    context: dict | None = None,
) -> FunctionTool:
    """One ``FunctionTool`` for a ledgered tool, its parameters the tool's JSON Schema."""
    tool = ledgered.tool
    needs_approval = tool.requires_approval
    if needs_approval and approver_id is None:
        raise ValueError(f"{tool.name} requires approval: give approver_id=")

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        key = ctx.tool_call_id
        approval = None
        if needs_approval and _approved(ctx, tool.name, key):
            approval = approval_for(key, str(approver_id), valid_for=approval_seconds)
        call = Call(tool.name, json.loads(arguments or "{}"), key=key, tenant=tenant,
                    subject=subject, approval=approval, context=context)
        # Off the event loop (the SDK runs a turn's tool calls at once); an `async def`
        # tool runs back on this loop.
        reply = await ledgered.ledger.adispatch(call)
        return model_text(reply)

    return FunctionTool(
        name=tool.name,
        description=tool.description or tool.name,
        params_json_schema=tool.input_schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
        needs_approval=needs_approval,
    )


def _approved(ctx: ToolContext[Any], name: str, call_id: str) -> bool:
    """Whether the SDK recorded an approval of this tool call (``RunState.approve``).
    Being invoked is not one: ``on_invoke_tool`` can be called outside the SDK's
    approval flow, and an approval is never made up from ``approver_id`` alone."""
    approved = getattr(ctx, "is_tool_approved", None)
    return callable(approved) and approved(name, call_id) is True


def function_tools(ledgered: Iterable[LedgeredTool], **options: Any) -> list[FunctionTool]:
    """A ``FunctionTool`` per ledgered tool (options as :func:`function_tool`)."""
    return [function_tool(one, **options) for one in ledgered]
