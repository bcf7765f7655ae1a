"""Test upstream MCP server: a payments API with real, countable side effects.

Run as ``python payments.py``; it speaks MCP over stdio (both the handshake era
and the 2026-07-28 per-request era, as the official Python SDK serves them). With
``PAYMENTS_HTTP_PORT_FILE`` set it serves Streamable HTTP instead, at ``/mcp`` on a
loopback port of its own choosing (the SDK's Starlette app under uvicorn), and
writes that port to the file once it listens.

Every ``create_payment`` execution inserts one row into the SQLite file named
by ``PAYMENTS_STATE`` and commits it before anything is answered. The server
never deduplicates by ``idempotency_key``: any second execution is a second
effect, so a test can count rows to prove who prevented a double.

Fault injection is read afresh on every ``create_payment`` call from the JSON
file named by ``PAYMENTS_FAULTS`` (absent variable or file: no faults). Each
key lists the ``order_id`` values it applies to::

    {"drop_after_commit": [...], "drop_before_commit": [...], "hang": [...],
     "freeze": [...], "off_schema": [...], "refuse": [...]}

(``hang`` sleeps in the call, and the server goes on answering; ``freeze`` blocks the
whole process, which stays alive and answers nothing, not even a ping.)

``"meet": N`` makes every execution wait (at most 20 s) until N executions have
arrived, and records in ``PAYMENTS_STATE`` + ``.most`` the most it ever held at once:
calls that reach it one at a time each wait the bound out alone, and the most is one.

``"delay_ms": N`` makes every execution sleep N ms before its commit and N ms
after it: a window in which a crash campaign kills the caller. ``"start_delay_ms": N``,
read once at start, makes the server sleep N ms before it serves anything, as a
server started through ``npx`` or by a cold interpreter does.

It also serves resources, ``payments://summary`` (the payment count as text, which
a client may subscribe to) and ``payments://payment/ID`` for each payment (its JSON),
one prompt, ``refund_policy`` (taking an ``order_id``, completed from the
orders paid so far), and ``logging/setLevel``, so a gateway's forwarding of requests
it does not own can be seen. With ``PAYMENTS_REPORT=1``, ``create_payment`` reports
progress (1 and 2 of 2) and logs one ``info`` message before its commit and after it,
and after its commit says the resource list changed and, to a client subscribed to
``payments://summary``, that the summary was updated.

``PAYMENTS_ASKS=1`` makes the server ask its client during calls: ``create_payment``
asks the payer to confirm the charge (``elicitation/create``) before its commit, and
declines the payment unless the answer is ``accept`` with ``confirm: true``; and it
lists the read-only tools the official conformance suite calls to see a server ask
(``test_sampling``, ``test_elicitation``, ``test_elicitation_sep1034_defaults``,
``test_elicitation_sep1330_enums``, each as that suite specifies it) and
``test_roots`` (the client's roots, from ``roots/list``).

``PAYMENTS_LIE=1`` makes ``tools/list`` advertise an output schema for
``create_payment`` that requires a ``receipt_url`` the real result never has.

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (the variable the OpenTelemetry SDK reads),
each ``create_payment`` is a ``SERVER`` span of the official Python SDK, named
``tools/call create_payment``, a child of the W3C context in the request's ``_meta``,
exported over OTLP/HTTP as it ends (service ``payments``): the upstream's own span of a
call, in its caller's trace.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

# It logs on purpose, for the handshake era and for 2026-07-28 callers that opt in.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

DROP_EXIT_CODE = 3
SUMMARY_URI = "payments://summary"
PAYMENT_URI = "payments://payment/"
# The resource URIs the client subscribed to.
subscribed: set[str] = set()
HANG_SECONDS = 3600

PAYMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "payment_id": {"type": "string"},
        "order_id": {"type": "string"},
        "amount_minor": {"type": "integer", "minimum": 1},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "status": {"type": "string", "const": "captured"},
    },
    "required": ["payment_id", "order_id", "amount_minor", "currency", "status"],
    "additionalProperties": False,
}

LISTED_PAYMENT_SCHEMA: dict[str, Any] = {
    **PAYMENT_SCHEMA,
    "properties": {
        **PAYMENT_SCHEMA["properties"],
        "idempotency_key": {"type": ["string", "null"]},
    },
    "required": [*PAYMENT_SCHEMA["required"], "idempotency_key"],
}

INPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    "create_payment": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "amount_minor": {"type": "integer", "minimum": 1},
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "idempotency_key": {"type": "string"},
        },
        "required": ["order_id", "amount_minor", "currency"],
        "additionalProperties": False,
    },
    "get_payment_by_key": {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    },
    "list_payments": {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    },
}

OUTPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    "create_payment": PAYMENT_SCHEMA,
    "get_payment_by_key": {
        "type": "object",
        "properties": {"found": {"type": "boolean"}, "payment": PAYMENT_SCHEMA},
        "required": ["found"],
        "additionalProperties": False,
        "oneOf": [
            {"properties": {"found": {"const": True}}, "required": ["payment"]},
            {"properties": {"found": {"const": False}}, "not": {"required": ["payment"]}},
        ],
    },
    "list_payments": {
        "type": "object",
        "properties": {
            "payments": {"type": "array", "items": LISTED_PAYMENT_SCHEMA},
            "count": {"type": "integer", "minimum": 0},
        },
        "required": ["payments", "count"],
        "additionalProperties": False,
    },
}

DESCRIPTIONS: dict[str, str] = {
    "create_payment": "Capture a payment for an order. Every execution charges again.",
    "get_payment_by_key": "Look up the latest payment created with an idempotency key.",
    "list_payments": "List every payment, oldest first.",
}

READ_ONLY: dict[str, bool] = {
    "create_payment": False,
    "get_payment_by_key": True,
    "list_payments": True,
}

# The tools the conformance suite calls to see a server ask its client, as it specifies
# them, and ``test_roots``; listed only with PAYMENTS_ASKS=1 (no output schemas).
ASKING_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "test_sampling": (
        "Ask the client's model to answer a prompt.",
        {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
    ),
    "test_elicitation": (
        "Ask the user for a username and an email address.",
        {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
    ),
    "test_elicitation_sep1034_defaults": (
        "Ask the user with a form whose every field has a default.",
        {"type": "object", "properties": {}},
    ),
    "test_elicitation_sep1330_enums": (
        "Ask the user with a form of every kind of enum.",
        {"type": "object", "properties": {}},
    ),
    "test_roots": ("List the client's roots.", {"type": "object", "properties": {}}),
}

SEP1034_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
    },
}

SEP1330_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


def asks() -> bool:
    """Whether this server asks its client during calls (``PAYMENTS_ASKS=1``)."""
    return os.environ.get("PAYMENTS_ASKS") == "1"


async def asking_tool(
    name: str, args: dict[str, Any], ctx: ServerRequestContext[Any]
) -> types.CallToolResult:
    """One of ASKING_TOOLS: ask the client, and answer what it answered, as text."""
    if name == "test_sampling":
        sampled = await ctx.session.create_message(
            [types.SamplingMessage(role="user", content=types.TextContent(text=args["prompt"]))],
            max_tokens=100,
            related_request_id=ctx.request_id,
        )
        content = sampled.content
        said = content.text if isinstance(content, types.TextContent) else json.dumps(plain(content))
        return types.CallToolResult(content=[types.TextContent(text=f"LLM response: {said}")])
    if name == "test_roots":
        roots = await ctx.session.list_roots()
        listed = [str(root.uri) for root in roots.roots]
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(listed))])
    if name == "test_elicitation":
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        }
        message, prefix = args["message"], "User response"
    elif name == "test_elicitation_sep1034_defaults":
        schema, message = SEP1034_SCHEMA, "Please review and update the form fields with defaults"
        prefix = "Elicitation completed"
    else:
        schema, message = SEP1330_SCHEMA, "Please select options from the enum fields"
        prefix = "Elicitation completed"
    answer = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    text = f"{prefix}: action={answer.action}, content={json.dumps(answer.content)}"
    return types.CallToolResult(content=[types.TextContent(text=text)])


def plain(model: Any) -> Any:
    """A protocol model as the JSON it has on the wire."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


async def confirmed(args: dict[str, Any], ctx: ServerRequestContext[Any]) -> bool:
    """Whether the payer confirms the charge of ``args``, asked with elicitation."""
    answer = await ctx.session.elicit_form(
        f"Charge {args['amount_minor']} {args['currency']} for order {args['order_id']}?",
        {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
        related_request_id=ctx.request_id,
    )
    return answer.action == "accept" and (answer.content or {}).get("confirm") is True


FAULT_KINDS = ("drop_after_commit", "drop_before_commit", "hang", "freeze", "off_schema", "refuse")


def open_state() -> sqlite3.Connection:
    """Open the state database in autocommit mode, creating the table if absent."""
    conn = sqlite3.connect(os.environ["PAYMENTS_STATE"], timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(
        "CREATE TABLE IF NOT EXISTS payments ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " payment_id TEXT UNIQUE,"
        " order_id TEXT NOT NULL,"
        " amount_minor INTEGER NOT NULL,"
        " currency TEXT NOT NULL,"
        " idempotency_key TEXT,"
        " created_at TEXT NOT NULL)"
    )
    return conn


def read_fault_file() -> dict[str, Any]:
    """Return the fault file's contents, read now (empty when there is none)."""
    path = os.environ.get("PAYMENTS_FAULTS")
    if not path or not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_faults(order_id: str) -> set[str]:
    """Return the fault kinds that name ``order_id`` in the fault file, read now."""
    faults = read_fault_file()
    return {kind for kind in FAULT_KINDS if order_id in faults.get(kind, [])}


def read_delay() -> float:
    """Return the seconds to sleep on each side of a commit (``delay_ms``)."""
    return float(read_fault_file().get("delay_ms", 0)) / 1000.0


MEETING = {"arrived": 0, "inside": 0, "most": 0}
MEETING_BOUND = 20.0


async def meet() -> None:
    """Wait for the others (``meet``), recording how many are inside at once."""
    together = int(read_fault_file().get("meet", 0))
    if together <= 0:
        return
    MEETING["arrived"] += 1
    MEETING["inside"] += 1
    MEETING["most"] = max(MEETING["most"], MEETING["inside"])
    Path(os.environ["PAYMENTS_STATE"] + ".most").write_text(str(MEETING["most"]))
    with anyio.move_on_after(MEETING_BOUND):
        while MEETING["arrived"] < together:
            await anyio.sleep(0.01)
    MEETING["inside"] -= 1


def server_tracer() -> Any:
    """The SDK's tracer exporting to ``OTEL_EXPORTER_OTLP_ENDPOINT`` as each span ends,
    or ``None`` when the variable is unset."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "payments"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    return provider.get_tracer("payments")


TRACER = server_tracer()


def server_span(tool: str, meta: Any) -> Any:
    """The upstream's span of one call, a child of the context in ``_meta``; a no-op
    context when nothing is exported."""
    if TRACER is None:
        import contextlib

        return contextlib.nullcontext()
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(
        {key: meta[key] for key in ("traceparent", "tracestate") if isinstance(meta.get(key), str)}
    )
    return TRACER.start_as_current_span(
        f"tools/call {tool}", context=parent, kind=SpanKind.SERVER
    )


def record_trace(tool: str, args: dict[str, Any], meta: Any) -> None:
    """Append the W3C trace context the request's ``_meta`` carried (``traceparent``,
    ``tracestate``; null when absent) to ``$PAYMENTS_STATE.traces``, one JSON line per
    call, for the tests to read what trace the gateway sent on."""
    line = {
        "tool": tool,
        "order_id": args.get("order_id"),
        "key": args.get("key"),
        "traceparent": meta.get("traceparent"),
        "tracestate": meta.get("tracestate"),
    }
    with open(os.environ["PAYMENTS_STATE"] + ".traces", "a", encoding="utf-8") as traces:
        traces.write(json.dumps(line) + "\n")


def payment_view(row: sqlite3.Row) -> dict[str, Any]:
    """The payment object every tool returns."""
    return {
        "payment_id": row["payment_id"],
        "order_id": row["order_id"],
        "amount_minor": row["amount_minor"],
        "currency": row["currency"],
        "status": "captured",
    }


def insert_payment(conn: sqlite3.Connection, args: dict[str, Any]) -> sqlite3.Row:
    """Insert one payment and commit it; returns the committed row."""
    created_at = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    conn.execute("BEGIN IMMEDIATE")
    try:
        seq = conn.execute(
            "INSERT INTO payments (order_id, amount_minor, currency, idempotency_key, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                args["order_id"],
                args["amount_minor"],
                args["currency"],
                args.get("idempotency_key"),
                created_at,
            ),
        ).lastrowid
        conn.execute("UPDATE payments SET payment_id = ? WHERE seq = ?", (f"pay_{seq}", seq))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return conn.execute("SELECT * FROM payments WHERE seq = ?", (seq,)).fetchone()


def tool_result(structured: dict[str, Any]) -> types.CallToolResult:
    """A successful result: structured content plus its JSON text rendering."""
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(structured))],
        structured_content=structured,
    )


def tool_error(text: str) -> types.CallToolResult:
    """A tool-level failure (``isError: true``) with a single text block."""
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
# The least level a handshake-era caller asked for with ``logging/setLevel``.
log_level = {"least": "debug"}


async def report(ctx: ServerRequestContext[Any], order_id: str, step: int, what: str) -> None:
    """Progress ``step`` of 2 (when the caller asked for progress) and a log message
    at ``info`` (unless ``logging/setLevel`` asked for a higher level); only with
    ``PAYMENTS_REPORT=1``."""
    if os.environ.get("PAYMENTS_REPORT") != "1":
        return
    await ctx.session.report_progress(step, 2, what)
    if LOG_LEVELS.index("info") < LOG_LEVELS.index(log_level["least"]):
        return
    await ctx.session.send_log_message(
        "info", {"order_id": order_id, "step": what}, "payments", related_request_id=ctx.request_id
    )


async def create_payment(
    conn: sqlite3.Connection, args: dict[str, Any], ctx: ServerRequestContext[Any]
) -> types.CallToolResult:
    """Execute one payment, applying any fault injected for its order.

    It reports progress (when the caller gave a progress token) and logs one message
    before its commit and after it.
    """
    faults = read_faults(args["order_id"])
    await report(ctx, args["order_id"], 1, "authorizing")
    if "drop_before_commit" in faults:
        os._exit(DROP_EXIT_CODE)
    if "refuse" in faults:
        return tool_error("card declined")
    if asks() and not await confirmed(args, ctx):
        return tool_error("the payer did not confirm the charge")
    if "hang" in faults:
        await anyio.sleep(HANG_SECONDS)
    if "freeze" in faults:
        time.sleep(HANG_SECONDS)
    await meet()
    delay = read_delay()
    await anyio.sleep(delay)
    row = insert_payment(conn, args)
    await anyio.sleep(delay)
    if "drop_after_commit" in faults:
        os._exit(DROP_EXIT_CODE)
    await report(ctx, args["order_id"], 2, "captured")
    if os.environ.get("PAYMENTS_REPORT") == "1":
        await ctx.session.send_resource_list_changed()
        if SUMMARY_URI in subscribed:
            await ctx.session.send_resource_updated(SUMMARY_URI)
    payment = payment_view(row)
    if "off_schema" in faults:
        payment.update(status="pending", amount_minor=str(row["amount_minor"]))
    return tool_result(payment)


def get_payment_by_key(conn: sqlite3.Connection, args: dict[str, Any]) -> types.CallToolResult:
    """Report the latest payment whose idempotency key equals ``key``."""
    row = conn.execute(
        "SELECT * FROM payments WHERE idempotency_key = ? ORDER BY seq DESC LIMIT 1",
        (args["key"],),
    ).fetchone()
    if row is None:
        return tool_result({"found": False})
    return tool_result({"found": True, "payment": payment_view(row)})


def list_payments(conn: sqlite3.Connection) -> types.CallToolResult:
    """Report every payment, oldest first, with its idempotency key."""
    rows = conn.execute("SELECT * FROM payments ORDER BY seq").fetchall()
    payments = [{**payment_view(row), "idempotency_key": row["idempotency_key"]} for row in rows]
    return tool_result({"payments": payments, "count": len(payments)})


def advertised_output_schema(name: str) -> dict[str, Any]:
    """The output schema ``tools/list`` shows, lying for create_payment under PAYMENTS_LIE=1."""
    schema = OUTPUT_SCHEMAS[name]
    if name == "create_payment" and os.environ.get("PAYMENTS_LIE") == "1":
        return {
            **schema,
            "properties": {**schema["properties"], "receipt_url": {"type": "string"}},
            "required": [*schema["required"], "receipt_url"],
        }
    return schema


def build_server(conn: sqlite3.Connection) -> Server[Any]:
    """Wire the three tools into a low-level server with exact schemas."""

    async def on_list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [
            types.Tool(
                name=name,
                description=DESCRIPTIONS[name],
                input_schema=INPUT_SCHEMAS[name],
                output_schema=advertised_output_schema(name),
                annotations=types.ToolAnnotations(read_only_hint=READ_ONLY[name]),
            )
            for name in INPUT_SCHEMAS
        ]
        if asks():
            tools.extend(
                types.Tool(
                    name=name,
                    description=description,
                    input_schema=schema,
                    annotations=types.ToolAnnotations(read_only_hint=True),
                )
                for name, (description, schema) in ASKING_TOOLS.items()
            )
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if asks() and params.name in ASKING_TOOLS:
            return await asking_tool(params.name, params.arguments or {}, ctx)
        if params.name not in INPUT_SCHEMAS:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        args = params.arguments or {}
        try:
            jsonschema.validate(args, INPUT_SCHEMAS[params.name])
        except jsonschema.ValidationError as exc:
            return tool_error(f"invalid arguments: {exc.message}")
        if params.name in ("create_payment", "get_payment_by_key"):
            record_trace(params.name, args, params.meta or {})
        if params.name == "create_payment":
            with server_span(params.name, params.meta or {}):
                return await create_payment(conn, args, ctx)
        if params.name == "get_payment_by_key":
            return get_payment_by_key(conn, args)
        return list_payments(conn)

    async def on_list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        summary = types.Resource(
            uri=SUMMARY_URI, name="summary", mime_type="text/plain",
            description="How many payments were made.",
        )
        rows = conn.execute("SELECT payment_id FROM payments ORDER BY seq").fetchall()
        each = [
            types.Resource(
                uri=PAYMENT_URI + row["payment_id"], name=row["payment_id"],
                mime_type="application/json",
            )
            for row in rows
        ]
        return types.ListResourcesResult(resources=[summary, *each])

    async def on_read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri.startswith(PAYMENT_URI):
            row = conn.execute(
                "SELECT * FROM payments WHERE payment_id = ?", (uri[len(PAYMENT_URI) :],)
            ).fetchone()
            if row is not None:
                text = json.dumps(payment_view(row))
                return types.ReadResourceResult(
                    contents=[
                        types.TextResourceContents(uri=uri, mime_type="application/json", text=text)
                    ]
                )
        if uri != SUMMARY_URI:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown resource: {params.uri}")
        (count,) = conn.execute("SELECT count(*) FROM payments").fetchone()
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=SUMMARY_URI, mime_type="text/plain", text=f"{count} payments"
                )
            ]
        )

    async def on_subscribe_resource(
        ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        subscribed.add(str(params.uri))
        return types.EmptyResult()

    async def on_unsubscribe_resource(
        ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        subscribed.discard(str(params.uri))
        return types.EmptyResult()

    async def on_list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[
                types.Prompt(
                    name="refund_policy",
                    description="The refund policy for one order.",
                    arguments=[types.PromptArgument(name="order_id", required=True)],
                )
            ]
        )

    async def on_get_prompt(
        ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if params.name != "refund_policy":
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown prompt: {params.name}")
        order = (params.arguments or {}).get("order_id", "?")
        text = f"Refund order {order} only once, and only to the card that paid."
        return types.GetPromptResult(
            messages=[
                types.PromptMessage(role="user", content=types.TextContent(text=text))
            ]
        )

    async def on_completion(
        ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        """Completes ``refund_policy``'s ``order_id`` from the orders paid so far."""
        if not isinstance(params.ref, types.PromptReference) or params.ref.name != "refund_policy":
            raise MCPError(code=types.INVALID_PARAMS, message="nothing to complete there")
        rows = conn.execute(
            "SELECT DISTINCT order_id FROM payments WHERE order_id LIKE ? ORDER BY order_id",
            (params.argument.value + "%",),
        ).fetchall()
        return types.CompleteResult(completion=types.Completion(values=[row[0] for row in rows]))

    async def on_set_logging_level(
        ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        log_level["least"] = params.level
        return types.EmptyResult()

    return Server(
        "payments",
        version="1.0.0",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
        on_list_resources=on_list_resources,
        on_read_resource=on_read_resource,
        on_subscribe_resource=on_subscribe_resource,
        on_unsubscribe_resource=on_unsubscribe_resource,
        on_list_prompts=on_list_prompts,
        on_get_prompt=on_get_prompt,
        on_completion=on_completion,
        on_set_logging_level=on_set_logging_level,
    )


async def serve_http(server: Server, port_file: str) -> None:
    """Serve Streamable HTTP on a loopback port; its number goes to ``port_file``."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    written = Path(port_file + ".tmp")
    written.write_text(str(sock.getsockname()[1]), encoding="utf-8")
    written.replace(port_file)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


async def main() -> None:
    await anyio.sleep(float(read_fault_file().get("start_delay_ms", 0)) / 1000.0)
    conn = open_state()
    server = build_server(conn)
    port_file = os.environ.get("PAYMENTS_HTTP_PORT_FILE")
    if port_file:
        await serve_http(server, port_file)
        return
    async with stdio_server() as (read_stream, write_stream):
        changes = NotificationOptions(resources_changed=True)
        options = server.create_initialization_options(changes)
        await server.run(read_stream, write_stream, options)


if __name__ == "__main__":
    anyio.run(main)
