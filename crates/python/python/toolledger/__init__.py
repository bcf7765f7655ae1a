"""toolledger: make an AI agent's side-effecting tool calls survive retries, crashes and
lost responses.

A host opens one :class:`Ledger`, describes each model call as a :class:`Call`, and
dispatches it. A retry of the same call replays the first result; another intent under
the same key is a conflict; an effect that may have happened is :class:`Unknown` until a
status query settles it. toolledger is **not exactly-once**: a downstream must be
idempotent on the request ref it is handed.

>>> import os, tempfile
>>> import toolledger
>>> path = os.path.join(tempfile.mkdtemp(), "ledger.sqlite3")
>>> # The built-in refund tool (no approval up to 50.00), on the simulation.
>>> refunds = toolledger.Tool.refund_order(approval_threshold_minor=5000)
>>> ledger = toolledger.Ledger.open(path, tools=[refunds], tenant="tenant-a", subject="user-1")
>>> orders = {"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
...     "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}
>>> call = toolledger.Call("refund_order", {"order_id": "ord-1", "amount_minor": 2599,
...     "currency": "USD", "reason": "damaged"}, key="refund-ord-1", context=orders)
>>> first = ledger.dispatch(call)
>>> type(first.outcome).__name__
'Fresh'
>>> again = ledger.dispatch(call)      # the model retries: no second refund
>>> type(again.outcome).__name__, again.output == first.output
('Replayed', True)
>>> ledger.close()
"""

from ._toolledger import (
    Accepted,
    Approval,
    Audit,
    Blocked,
    Call,
    Error,
    Fresh,
    InvalidError,
    ModelCall,
    Reconciled,
    Replayed,
    Reply,
    RolesError,
    StoreError,
    Tool,
    Unknown,
)
from . import downstream
from ._ledger import Ledger, LedgeredTool

__all__ = [
    "Accepted",
    "Approval",
    "Audit",
    "Blocked",
    "Call",
    "Error",
    "Fresh",
    "InvalidError",
    "Ledger",
    "LedgeredTool",
    "ModelCall",
    "Reconciled",
    "Replayed",
    "Reply",
    "RolesError",
    "StoreError",
    "Tool",
    "Unknown",
    "downstream",
]
