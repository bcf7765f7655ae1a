"""What the framework adapters share: the text a model is handed for a reply, the
approval a framework's human decision becomes, and the BLOCK package an adapter answers
itself for a tool call the ledger never saw."""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

from ._toolledger import Approval, Reply
from ._toolledger import is_key as _is_key

def is_key(text: Any) -> bool:
    """Whether `text` is an idempotency key, by the ledger's own rule (asked of the
    binding, never written here twice): the adapters check a tool call's id first, so a
    call that can never be keyed is answered before a human is asked to approve it."""
    return isinstance(text, str) and _is_key(text)


def refusal(code: str, message: str) -> dict[str, Any]:
    """The BLOCK package of a tool call refused before the ledger saw it, so with no
    status and no status ref: nothing was accepted and nothing was sent. `code` is one
    of the ledger's codes."""
    return {"gate": "BLOCK", "code": code, "status": None, "status_ref": None,
            "message": message}


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
