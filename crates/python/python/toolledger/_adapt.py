"""What the framework adapters share: the text a model is handed for a reply, and the
approval a framework's human decision becomes."""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

from ._toolledger import Approval, Reply


def model_text(reply: Reply) -> str:
    """The tool's output as JSON when the effect is done; else the BLOCK package (its
    code first, then what to do), so the model reads why and never guesses."""
    view: Any = reply.output if reply.done else reply.package
    return json.dumps(view, ensure_ascii=False, sort_keys=True)


def approval_for(
    call_id: str,
    approver_id: str,
    *,
    approval_id: str | None = None,
    approved_at: int | None = None,
    valid_for: int = 600,
    approvers: Iterable[str] = (),
) -> Approval:
    """The approval of the tool call `call_id` by `approver_id`, from `approved_at` (now)
    for `valid_for` seconds; the ledger binds it to the call. `approvers` are who may
    approve (default: the approver named)."""
    at = int(time.time()) if approved_at is None else approved_at
    return Approval(
        approval_id or f"{call_id}-approval",
        approver_id,
        at,
        at + valid_for,
        eligible_approvers=list(approvers) or [approver_id],
    )
