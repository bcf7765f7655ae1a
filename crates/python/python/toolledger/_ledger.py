"""The :class:`Ledger` and the ``@ledger.tool`` decorator."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import contextvars
import functools
import inspect
import itertools
import weakref
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from . import _toolledger
from ._toolledger import Approval, Call, ModelCall, Reply, Tool
from .downstream import NotSent, Receipt, Refused, Request, Unknown, _current

try:
    from opentelemetry import trace as _otel
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # OpenTelemetry is the host's choice: without it, no spans.
    _otel = None  # type: ignore[assignment]

_ANSWERS = (Receipt, NotSent, Refused, Unknown)

# The ledger's own spans and metrics (when the OTEL_* variables export them) leave
# before the interpreter does.
atexit.register(_toolledger._flush)

_T = TypeVar("_T")

#: How many ledger calls the awaitable methods work at once, process-wide, as asyncio's
#: own default executor sizes itself: each holds a thread of the package's own pool
#: (never the event loop's) while it works, except while an ``async def`` tool awaits on
#: its loop. More calls wait their turn. Read at each awaited call.
MAX_CONCURRENT_CALLS = min(32, (os.cpu_count() or 1) + 4)

# The event loop of the coroutine that awaits a ledger call: where an ``async def``
# tool runs, from the pool thread that works the call.
_loop: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "toolledger_loop", default=None
)


class _Awaited:
    """One event loop's ledger calls in flight: their futures by id, and where the
    package's threads leave them when they finish. The loop watches its socket; its own
    thread turns each finished call into its reply, so the pool's threads never take
    the GIL to hand one back."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.completions = _toolledger._Completions()
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count()
        loop.add_reader(self.completions.fileno(), self._arrived)

    def _arrived(self) -> None:
        for id_, value, ok in self.completions.drain():
            future = self.futures.pop(id_)
            # A cancelled awaiter's call still ran to its end; a retry reads it.
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


_awaited: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Awaited] = (
    weakref.WeakKeyDictionary()
)


async def _soon(method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Starts a ledger call on the package's pool, with this coroutine's context and its
    loop, and awaits it: the loop goes on meanwhile. Cancelling the awaiting task does
    not stop a call already handed to the ledger; it runs to its end, and a retry reads
    it."""
    loop = asyncio.get_running_loop()
    awaited = _awaited.get(loop)
    if awaited is None:
        awaited = _awaited[loop] = _Awaited(loop)
    context = contextvars.copy_context()
    context.run(_loop.set, loop)
    id_ = next(awaited.ids)
    future = loop.create_future()
    awaited.futures[id_] = future
    try:
        method(*args, _soon=(awaited.completions, id_, context, MAX_CONCURRENT_CALLS), **kwargs)
    except BaseException:
        del awaited.futures[id_]
        raise
    return await future


def _run_coroutine(make: Callable[[], Awaitable[_T]]) -> _T:
    """Runs an ``async def`` tool's coroutine from the thread working the call: on the
    loop of the coroutine awaiting the call when there is one, else on a loop of its
    own."""
    loop = _loop.get()
    try:
        asyncio.get_running_loop()
        on_a_loop = True
    except RuntimeError:
        on_a_loop = False
    if loop is not None and loop.is_running() and not on_a_loop:
        running = asyncio.run_coroutine_threadsafe(make(), loop)  # type: ignore[arg-type]
        # The pool's thread only waits now: another awaited call may start on its share.
        _toolledger._park(True)
        try:
            return running.result()
        finally:
            _toolledger._park(False)
    if not on_a_loop:
        return asyncio.run(make())  # type: ignore[arg-type]
    # A synchronous call made on a running loop's own thread: that loop is blocked
    # until the call returns, so the coroutine gets a loop of its own, on a thread.
    with concurrent.futures.ThreadPoolExecutor(1) as alone:
        return alone.submit(lambda: asyncio.run(make())).result()  # type: ignore[arg-type]


def _span_of(
    ledger: _toolledger.Ledger, purpose: str, call: Call | None
) -> tuple[str, dict[str, Any]]:
    """The name and first attributes of a call's span (``docs/python.md``, "Traces"):
    OpenTelemetry's GenAI tool span, never the key, the arguments or the result."""
    tool = call.tool if call is not None else ""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.type": "function",
        "toolledger.purpose": purpose,
        "toolledger.store": ledger._store,
    }
    if tool:
        attributes["gen_ai.tool.name"] = tool
    # A call without the model's ids is named by a digest of its key: never recorded.
    if call is not None and call.model_call is not None:
        attributes["gen_ai.tool.call.id"] = call.model_call.call_id
    return (f"execute_tool {tool}" if tool else "execute_tool"), attributes


def _handed() -> tuple[str, str]:
    """The current span's W3C context, for the ledger's steps to be its children."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", ""), carrier.get("tracestate", "")


def _ended(span: Any, reply: Any = None, error: BaseException | None = None) -> None:
    """What the call answered, on its span."""
    if isinstance(error, _toolledger.Error):
        decision, error_type = "error", error.code
    elif error is not None:
        decision, error_type = "error", type(error).__qualname__
    else:
        decision, error_type = reply.decision, reply.error_type
    span.set_attribute("toolledger.decision", decision)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(_otel.Status(_otel.StatusCode.ERROR, error_type))


class _CallSpan:
    """The call's span, a child of the host's current one, current while the call
    runs (so a Python tool's own spans nest under it), ended with what the call
    answered; nothing when OpenTelemetry is not installed. ``trace`` is its W3C
    context, handed to the ledger as the call's own span (``None`` without one)."""

    def __init__(self, ledger: _toolledger.Ledger, purpose: str, call: Call | None) -> None:
        self._started = None
        self.span: Any = None
        self.trace: tuple[str, str] | None = None
        if _otel is not None:
            name, attributes = _span_of(ledger, purpose, call)
            self._started = _otel.get_tracer("toolledger").start_as_current_span(
                name,
                kind=_otel.SpanKind.INTERNAL,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )

    def __enter__(self) -> "_CallSpan":
        if self._started is not None:
            self.span = self._started.__enter__()
            self.trace = _handed()
        return self

    def answered(self, reply: Any) -> Any:
        """``reply``, recorded on the span."""
        if self.span is not None:
            _ended(self.span, reply)
        return reply

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        if self._started is None:
            return
        if error is not None:
            _ended(self.span, error=error)
        self._started.__exit__(kind, error, tb)


def _traced(
    ledger: _toolledger.Ledger,
    purpose: str,
    call: Call | None,
    work: Callable[[tuple[str, str] | None], Any],
) -> Any:
    """``work`` under the call's span (:class:`_CallSpan`)."""
    with _CallSpan(ledger, purpose, call) as span:
        return span.answered(work(span.trace))


async def _atraced(
    ledger: _toolledger.Ledger,
    purpose: str,
    call: Call | None,
    work: Callable[[tuple[str, str] | None], Awaitable[Any]],
) -> Any:
    """:func:`_traced`, for an awaited call: the span is current in this coroutine's
    context, which the call's threads run in."""
    with _CallSpan(ledger, purpose, call) as span:
        return span.answered(await work(span.trace))


_Base = _toolledger.Ledger


class Ledger(_toolledger.Ledger):
    """A ledger over a SQLite file or a PostgreSQL database (``postgres://…``).

    Open it with :meth:`Ledger.open`; use it as a context manager to close it.

    >>> import os, tempfile
    >>> from toolledger import Ledger
    >>> with Ledger.open(os.path.join(tempfile.mkdtemp(), "ledger.sqlite3")) as ledger:
    ...     ledger.tools
    ['refund_order']
    """

    @classmethod
    def open(cls, location: Any, **options: Any) -> "Ledger":
        """Opens (creating when missing) the ledger at ``location``: a path or a
        ``postgres://`` URL.

        Options: ``config`` (a ``toolledger.toml``: its tools and HTTP services),
        ``tools`` (:class:`Tool` objects), ``downstream`` (performs every tool no service
        and no ``downstreams`` entry performs), ``downstreams`` (tool name → downstream),
        ``roles`` (``(tenant, subject) -> list[str]``, asked at every step), ``tenant`` and
        ``subject`` (the principal of calls that name none), ``profiles`` (extra provider
        profiles, ``(provider, api_family, adapter_revision)``), ``worker`` and
        ``lease_seconds``. With no config, tools or downstream: the built-in
        ``refund_order`` on the simulation, for trying the contract.
        """
        return cls(location, **options)

    def dispatch(self, call: Call, **private: Any) -> Reply:
        """Dispatches a call: a new intent is accepted (commit A) and performed now; a
        retry replays the first result; another intent under the same key is
        ``IDEMPOTENCY_CONFLICT``. Raises :class:`toolledger.Error` only when nothing was
        accepted. With OpenTelemetry installed, the call is a span under the host's
        current one (``docs/python.md``, "Traces")."""
        return _traced(  # type: ignore[no-any-return]
            self, "dispatch", call, lambda trace: _Base.dispatch(self, call, _trace=trace, **private)
        )

    def enqueue(self, call: Call, **private: Any) -> Reply:
        """Accepts a call (commit A) and stops: ``Accepted``, certainly not sent; a
        worker (:meth:`process`) or the relay performs it."""
        return _traced(  # type: ignore[no-any-return]
            self, "enqueue", call, lambda trace: _Base.enqueue(self, call, _trace=trace, **private)
        )

    def process(self, status_ref: str, **options: Any) -> Reply:
        """Works the accepted operation ``status_ref`` as a worker: the tenant, subject
        and arguments come from the ledger; ``context`` is the business context its
        rules read, ``at`` the instant."""
        return _traced(  # type: ignore[no-any-return]
            self,
            "process",
            None,
            lambda trace: _Base.process(self, status_ref, _trace=trace, **options),
        )

    def status(self, status_ref: str, call: Call | None = None, **options: Any) -> Reply:
        """The explicit status query for ``status_ref``: settles an unknown outcome on
        the downstream's evidence, or answers what the ledger knows. Asked as ``call``
        (the same intent), or by a host that holds only the ref: then ``tenant``,
        ``subject``, ``model_call`` and ``context``."""
        return _traced(  # type: ignore[no-any-return]
            self,
            "query_status",
            call,
            lambda trace: _Base.status(self, status_ref, call, _trace=trace, **options),
        )

    async def adispatch(self, call: Call) -> Reply:
        """:meth:`dispatch`, awaitable: the call runs on the ledger's threads, never
        blocking the event loop, and many run at once. An ``async def`` tool runs on
        this coroutine's loop."""
        base = functools.partial(_Base.dispatch, self)
        return await _atraced(  # type: ignore[no-any-return]
            self, "dispatch", call, lambda trace: _soon(base, call, _trace=trace)
        )

    async def aenqueue(self, call: Call) -> Reply:
        """:meth:`enqueue`, awaitable."""
        base = functools.partial(_Base.enqueue, self)
        return await _atraced(  # type: ignore[no-any-return]
            self, "enqueue", call, lambda trace: _soon(base, call, _trace=trace)
        )

    async def aprocess(self, status_ref: str, **options: Any) -> Reply:
        """:meth:`process`, awaitable (the same keyword options)."""
        base = functools.partial(_Base.process, self)
        return await _atraced(  # type: ignore[no-any-return]
            self, "process", None, lambda trace: _soon(base, status_ref, _trace=trace, **options)
        )

    async def astatus(self, status_ref: str, call: Call | None = None, **options: Any) -> Reply:
        """:meth:`status`, awaitable (the same keyword options)."""
        base = functools.partial(_Base.status, self)
        return await _atraced(  # type: ignore[no-any-return]
            self,
            "query_status",
            call,
            lambda trace: _soon(base, status_ref, call, _trace=trace, **options),
        )

    async def aresolve(self, status_ref: str, **options: Any) -> str:
        """:meth:`resolve`, awaitable (the same keyword options)."""
        return await _soon(self.resolve, status_ref, **options)  # type: ignore[no-any-return]

    def tool(
        self,
        name: str | None = None,
        *,
        input_schema: Mapping[str, Any],
        output_schema: Mapping[str, Any],
        description: str | None = None,
        identity: str | None = None,
        lookup: Callable[[Request], Any] | None = None,
        output_bindings: Mapping[str, str] | None = None,
        approval: Mapping[str, Any] | None = None,
        authorization: Mapping[str, Any] | None = None,
        revisions: Mapping[str, str] | None = None,
        max_attempts: int | None = None,
    ) -> Callable[[Callable[..., Any]], "LedgeredTool"]:
        """Turns a function with side effects into a ledgered tool: the function is the
        downstream, called with the arguments as keywords, and its return value (a
        ``dict`` the output schema accepts) is the receipt.

        ``lookup(request)`` tells what became of a request whose outcome is unknown: the
        output when it happened, ``None`` when there is no record of it. Without one, an
        unknown outcome stays unknown until an operator settles it (:meth:`resolve`),
        and each success is written to disk before it is answered (a lookup-less
        success a power loss took back could never be recovered).

        An ``async def`` function (and lookup) runs on the event loop of the coroutine
        that awaits the call (:meth:`adispatch`, or ``await tool.acall(...)``; calling
        the tool returns that coroutine), or on a loop of its own when the call is
        synchronous.
        Inside the function, :func:`toolledger.downstream.current_request` is the request
        (its ``request_ref`` is the key to hand a service).

        A name is one tool: under a name the ledger already serves (from its config, its
        ``tools`` or an earlier ``@ledger.tool``) it raises :class:`InvalidError`
        (``USAGE_ERROR``) and the first tool stays. The simulation's ``refund_order`` is
        not one: the first tool registered ends the simulation.

        >>> import os, tempfile
        >>> from toolledger import Ledger
        >>> ledger = Ledger.open(os.path.join(tempfile.mkdtemp(), "l.sqlite3"), tenant="acme", subject="u-1")
        >>> sent = []
        >>> @ledger.tool(input_schema={"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
        ...              output_schema={"type": "object", "properties": {"message_id": {"type": "string"}}, "required": ["message_id"]})
        ... def send_email(to):
        ...     "Send the welcome email."
        ...     sent.append(to)
        ...     return {"message_id": f"m-{len(sent)}"}
        >>> send_email({"to": "a@example.com"}, key="welcome-a").output
        {'message_id': 'm-1'}
        >>> type(send_email({"to": "a@example.com"}, key="welcome-a").outcome).__name__, len(sent)
        ('Replayed', 1)
        """

        def wrap(function: Callable[..., Any]) -> LedgeredTool:
            tool_name = name or function.__name__
            text = description or inspect.getdoc(function) or tool_name
            tool = Tool(
                tool_name,
                description=text,
                input_schema=input_schema,
                output_schema=output_schema,
                output_bindings=output_bindings,
                revisions=revisions,
                approval=approval,
                authorization=authorization,
                max_attempts=max_attempts,
            )
            performer = _FunctionDownstream(function, identity or f"python-{tool_name}@1", lookup)
            self._register(tool, performer)
            return LedgeredTool(self, tool, function)

        return wrap


class LedgeredTool:
    """A function made a ledgered tool by ``@ledger.tool``: calling it dispatches a call
    (``tool(arguments, key=...)``) and returns the :class:`Reply`."""

    def __init__(self, ledger: Ledger, tool: Tool, function: Callable[..., Any]) -> None:
        self.ledger = ledger
        self.tool = tool
        self.function = function
        functools.update_wrapper(self, function)

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.tool.name

    def call(
        self,
        arguments: Mapping[str, Any],
        /,
        *,
        key: str,
        tenant: str | None = None,
        subject: str | None = None,
        model_call: ModelCall | None = None,
        context: Mapping[str, Any] | None = None,
        approval: Approval | None = None,
        at: int | None = None,
    ) -> Reply:
        """Dispatches one call of the tool under idempotency ``key``."""
        return self.ledger.dispatch(
            Call(self.tool.name, arguments, key=key, tenant=tenant, subject=subject,
                 model_call=model_call, context=context, approval=approval, at=at)
        )

    async def acall(self, arguments: Mapping[str, Any], /, **options: Any) -> Reply:
        """:meth:`call`, awaitable (:meth:`Ledger.adispatch`), with the same options."""
        return await self.ledger.adispatch(Call(self.tool.name, arguments, **options))

    def __call__(self, arguments: Mapping[str, Any], /, **options: Any) -> Any:
        """:meth:`call`; for an ``async def`` function, :meth:`acall` (a coroutine)."""
        if inspect.iscoroutinefunction(self.function):
            return self.acall(arguments, **options)
        return self.call(arguments, **options)

    def __repr__(self) -> str:
        return f"LedgeredTool({self.tool.name!r})"


class _FunctionDownstream:
    """A function as a downstream: the arguments as keywords, the return value the
    receipt's output (or an answer of :mod:`toolledger.downstream`)."""

    def __init__(
        self,
        function: Callable[..., Any],
        identity: str,
        lookup: Callable[[Request], Any] | None,
    ) -> None:
        self.function = function
        self.identity = identity
        self._lookup = lookup
        # Without a lookup, nothing could recover a success a power loss took back.
        self.can_look_up = lookup is not None

    def execute(self, request: Request) -> Any:
        if inspect.iscoroutinefunction(self.function):

            async def performed() -> Any:
                token = _current.set(request)
                try:
                    return await self.function(**request.arguments)
                finally:
                    _current.reset(token)

            result = _run_coroutine(performed)
        else:
            token = _current.set(request)
            try:
                result = self.function(**request.arguments)
            finally:
                _current.reset(token)
        return result if isinstance(result, _ANSWERS) else Receipt(result)

    def lookup(self, request: Request) -> Any:
        if self._lookup is None:
            return Unknown("the tool has no lookup: an operator settles it")
        lookup = self._lookup
        if inspect.iscoroutinefunction(lookup):
            result = _run_coroutine(lambda: lookup(request))
        else:
            result = lookup(request)
        if result is None:
            return NotSent("no record of the request")
        return result if isinstance(result, _ANSWERS) else Receipt(result)
