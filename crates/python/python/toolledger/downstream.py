"""Downstreams written in Python: what performs a tool's effect.

A downstream is any object with an ``identity`` (``"name@revision"``: recorded with every
intent it is to perform), ``execute(request)`` and ``lookup(request)``. Each answers one
of :class:`Receipt` (done: here is the output), :class:`NotSent` (certainly did not
leave; from ``lookup``: no record of it), :class:`Refused` (refused for good) or
:class:`Unknown` (may have happened). An exception raised by ``execute``, or any other
answer, is :class:`Unknown`: the code ran, so the request may have left. It is never read
as "nothing happened".

The downstream must be idempotent on ``request.request_ref``: send it as the service's
idempotency key, and answer the first result again when it comes twice.

A ledger shared by threads or asyncio tasks calls ``execute`` from several threads at
once: a downstream guards whatever state it keeps. One whose ``lookup`` cannot find what
it performed sets ``can_look_up = False``: each of its successes is then written to disk
before it is answered, since no status query could recover one a power loss took back.

>>> from toolledger.downstream import Receipt, NotSent
>>> class Tickets:
...     identity = "tickets@1"
...     def __init__(self):
...         self.opened = {}
...     def execute(self, request):
...         ticket = self.opened.setdefault(request.request_ref, {"ticket_id": f"T-{len(self.opened) + 1}"})
...         return Receipt({**ticket, "queue": request.arguments["queue"]})
...     def lookup(self, request):
...         ticket = self.opened.get(request.request_ref)
...         return NotSent("no such ticket") if ticket is None else Receipt({**ticket, "queue": request.arguments["queue"]})
>>> Tickets.identity
'tickets@1'
"""

from __future__ import annotations

import contextvars
from typing import Protocol, Union

from ._toolledger import (
    _NotSent as NotSent,
    _Receipt as Receipt,
    _Refused as Refused,
    _Request as Request,
    _Unknown as Unknown,
)

Answer = Union[Receipt, NotSent, Refused, Unknown]
"""What ``execute`` and ``lookup`` return."""

__all__ = [
    "Answer",
    "Downstream",
    "NotSent",
    "Receipt",
    "Refused",
    "Request",
    "Unknown",
    "current_request",
]


class Downstream(Protocol):
    """The shape of a downstream (a structural type: no base class is needed)."""

    identity: str
    can_look_up: bool  # optional; True when absent

    def execute(self, request: Request) -> Answer: ...

    def lookup(self, request: Request) -> Answer: ...


_current: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "toolledger_request", default=None
)


def current_request() -> Request | None:
    """The request a ``@ledger.tool`` function is performing, inside that function: its
    ``request_ref`` is the idempotency key to hand the service it calls.

    >>> current_request() is None
    True
    """
    return _current.get()
