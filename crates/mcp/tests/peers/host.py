"""MCP host driver built on the official Python SDK's client, for integration tests.

Usage::

    python host.py [--protocol {auto,legacy,2026-07-28}] -- CMD [ARG...]
    python host.py [--protocol ...] --url URL [--bearer-env NAME]

The second form speaks Streamable HTTP to ``URL`` instead, with
``Authorization: Bearer <the value of $NAME>`` when ``--bearer-env`` is given, and a
W3C ``traceparent`` header on every request when ``--traceparent VALUE`` is given.

``--observe`` asks every call for progress (a progress token) and for log messages
(``log_level`` ``debug``), and adds to each call's output the ``progress`` and
``logs`` notifications that arrived while it ran.

``--elicit approve|decline`` declares the elicitation capability and answers every
elicitation with ``true`` for each boolean field of its form (``{"approve": true}``
for the gateway's own approval) or a decline: mid-call on the handshake era,
and through the SDK's own input-required driver (the call retried with the
answers) on 2026-07-28. Without it the client declares no elicitation.
``--sample TEXT`` declares sampling and answers every ``sampling/createMessage`` with
``TEXT``; ``--roots URI,...`` declares roots and lists those. A call's output names
what it was asked meanwhile (``elicited``: the messages; ``sampled``: the prompts;
``rooted``: how many times the roots were listed).

Spawns ``CMD ARG...`` over stdio with the SDK's ``stdio_client`` (the child
inherits this process's full environment), opens a ``ClientSession`` and
negotiates the protocol: ``auto`` (the default, what ``mcp.Client`` does)
probes ``server/discover`` and falls back to the ``initialize`` handshake;
``legacy`` runs only the handshake; a modern version string adopts that
version without any probe.

It then reads one JSON array of steps from stdin and writes one JSON object
per step to stdout, one per line, flushed after each:

    {"op": "list_tools"}
        -> {"tools": [<Tool as JSON>, ...]}
    {"op": "call", "name": str, "arguments": {...}, "meta": {...}?, "timeout_s": float?}
        -> {"isError": bool, "content": [...], "structuredContent": ..., "meta": ...}
        or {"error": {"type": str, "code": int | null, "message": str}}
    {"op": "concurrent", "calls": [<call step>, ...]}
        -> {"results": [<call output>, ...]}   (in the given order)
    {"op": "reconnect"}
        -> {"reconnected": true}
    {"op": "sleep", "seconds": float}
        -> {"slept": seconds}
    {"op": "list_resources"} / {"op": "list_prompts"}
        -> {"resources": [...]} / {"prompts": [...]}
    {"op": "read_resource", "uri": str}
        -> {"contents": [...]}
    {"op": "get_prompt", "name": str, "arguments": {...}}
        -> {"messages": [...]}
    {"op": "complete", "prompt": str, "argument": str, "value": str}
        -> {"values": [...]}
    {"op": "set_level", "level": str}
        -> {"set": level}
    {"op": "subscribe", "uri": str} / {"op": "unsubscribe", "uri": str}
        -> {"subscribed": uri} / {"unsubscribed": uri}
    {"op": "listen", "uris": [str, ...]}
        -> {"listening": <the filter the server honored>}   (2026-07-28: opens a
           ``subscriptions/listen`` stream for changed resource and prompt lists and
           those resources' updates, kept open to the end; its events become notices)
    {"op": "notices"}
        -> {"notices": [{"method": str, "uri": str?}, ...]}   (the resource and prompt
           notifications, or listen events, received since the last such step, in order)

An error the SDK raises during a step (an ``MCPError`` for an error response,
a timeout or a closed connection; the ``RuntimeError`` of its own output
schema validation) becomes that step's error object and the driver goes on;
after a closed connection, ``reconnect`` spawns the command afresh. Exit
status is 0 after a clean close; any other failure prints
``{"fatal": "..."}`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import Subscription, listen
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
# The connect-time policy mcp.Client(mode="auto") runs; the SDK has no public alias for it.
from mcp.client._probe import negotiate_auto
# The loop mcp.Client runs for a 2026-07-28 InputRequiredResult; ClientSession leaves it
# to its caller.
from mcp.client._input_required import run_input_required_driver
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

PROTOCOLS = ("auto", "legacy", *MODERN_PROTOCOL_VERSIONS)


def emit(obj: dict[str, Any]) -> None:
    """Write one JSON line to stdout and flush it."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def error_object(exc: BaseException) -> dict[str, Any]:
    """The step output for an exception the SDK raised."""
    code = exc.code if isinstance(exc, MCPError) else None
    return {"error": {"type": type(exc).__name__, "code": code, "message": str(exc)}}


def describe(exc: BaseException) -> str:
    """A one-line description of a fatal exception, unwrapping single-member groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def plain(model: BaseModel) -> Any:
    """A protocol model as the JSON it has on the wire."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def call_output(result: types.CallToolResult) -> dict[str, Any]:
    """The step output for a tool result."""
    return {
        "isError": result.is_error,
        "content": [plain(block) for block in result.content],
        "structuredContent": result.structured_content,
        "meta": result.meta,
    }


class Host:
    """One stdio connection to the command under test, re-openable."""

    def __init__(
        self,
        server: StdioServerParameters | None,
        protocol: str,
        url: str | None = None,
        token: str | None = None,
        traceparent: str | None = None,
        elicit: str | None = None,
        observe: bool = False,
        sample: str | None = None,
        roots: list[str] | None = None,
    ) -> None:
        self._sample = sample
        self._roots = roots
        self.sampled: list[str] = []
        self.rooted = 0
        self.notices: list[dict[str, Any]] = []
        self._listening = False
        self._observe = observe
        self.progress: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self._server = server
        self._protocol = protocol
        self._url = url
        self._token = token
        self._traceparent = traceparent
        self._elicit = elicit
        self.elicited: list[str] = []
        self._stack: AsyncExitStack | None = None
        self._session: ClientSession | None = None

    async def connect(self) -> None:
        """Spawn the command, open a session and negotiate the protocol."""
        async with AsyncExitStack() as stack:
            if self._url is not None:
                headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
                if self._traceparent:
                    headers["traceparent"] = self._traceparent
                client = await stack.enter_async_context(httpx2.AsyncClient(headers=headers))
                streams = await stack.enter_async_context(
                    streamable_http_client(self._url, http_client=client)
                )
                read_stream, write_stream = streams[0], streams[1]
            else:
                assert self._server is not None
                read_stream, write_stream = await stack.enter_async_context(
                    stdio_client(self._server)
                )
            callback = self._answer_elicitation if self._elicit else None
            observed: dict[str, Any] = (
                {"logging_callback": self._logged, "log_level": "debug"} if self._observe else {}
            )
            observed["message_handler"] = self._noticed
            if self._sample is not None:
                observed["sampling_callback"] = self._answer_sampling
            if self._roots is not None:
                observed["list_roots_callback"] = self._answer_roots
            session = await stack.enter_async_context(
                ClientSession(read_stream, write_stream, elicitation_callback=callback, **observed)
            )
            if self._protocol == "legacy":
                await session.initialize()
            elif self._protocol == "auto":
                await negotiate_auto(session)
            else:
                pinned = types.DiscoverResult(
                    supported_versions=[self._protocol], capabilities=types.ServerCapabilities()
                )
                session.adopt(pinned)
            self._stack = stack.pop_all()
            self._session = session

    async def close(self) -> None:
        """Close the session and stop the spawned process."""
        stack, self._stack, self._session = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    @property
    def session(self) -> ClientSession:
        """The live session; raises if a reconnect failed half-way."""
        if self._session is None:
            raise RuntimeError("not connected")
        return self._session

    async def list_tools(self) -> dict[str, Any]:
        """Every tool, following pagination to the end."""
        tools: list[types.Tool] = []
        cursor: str | None = None
        try:
            while True:
                page = await self.session.list_tools(
                    params=None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
                )
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
        except Exception as exc:
            return error_object(exc)
        return {"tools": [plain(tool) for tool in tools]}

    async def _answer_elicitation(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        """Answer an elicitation as ``--elicit`` says, remembering its message."""
        self.elicited.append(params.message)
        if self._elicit == "approve":
            schema = plain(params).get("requestedSchema", {})
            fields = [
                name
                for name, field in schema.get("properties", {}).items()
                if field.get("type") == "boolean"
            ]
            return types.ElicitResult(
                action="accept", content={name: True for name in fields or ["approve"]}
            )
        return types.ElicitResult(action="decline")

    async def _answer_sampling(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        """Answer a sampling request with ``--sample``'s text, remembering its prompt."""
        for message in params.messages:
            content = message.content
            if isinstance(content, types.TextContent):
                self.sampled.append(content.text)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(text=self._sample or ""),
            model="test-model",
            stop_reason="endTurn",
        )

    async def _answer_roots(self, context: Any) -> types.ListRootsResult:
        """List ``--roots``'s roots."""
        self.rooted += 1
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in self._roots or []])

    async def _noticed(self, message: Any) -> None:
        """Keep a resource or prompt notification the server sent (once a listen stream
        is open its frames reach this handler too, and are kept from the stream instead)."""
        if self._listening:
            return
        if isinstance(message, types.ResourceUpdatedNotification):
            self.notices.append({"method": message.method, "uri": str(message.params.uri)})
        elif isinstance(
            message, (types.ResourceListChangedNotification, types.PromptListChangedNotification)
        ):
            self.notices.append({"method": message.method})

    async def open_listen(self, step: dict[str, Any]) -> dict[str, Any]:
        """Open a ``subscriptions/listen`` stream, read into ``notices`` until the end."""
        assert self._stack is not None
        subscription = await self._stack.enter_async_context(
            listen(
                self.session,
                prompts_list_changed=True,
                resources_list_changed=True,
                resource_subscriptions=step.get("uris", []),
            )
        )
        group = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.callback(group.cancel_scope.cancel)
        group.start_soon(self._pump, subscription)
        self._listening = True
        return {"listening": plain(subscription.honored)}

    async def _pump(self, subscription: Subscription) -> None:
        """Keep each event of a listen stream as the notification it stands for."""
        async for event in subscription:
            if isinstance(event, ResourceUpdated):
                self.notices.append({"method": "notifications/resources/updated", "uri": event.uri})
            elif isinstance(event, ResourcesListChanged):
                self.notices.append({"method": "notifications/resources/list_changed"})
            elif isinstance(event, PromptsListChanged):
                self.notices.append({"method": "notifications/prompts/list_changed"})
            elif isinstance(event, ToolsListChanged):
                self.notices.append({"method": "notifications/tools/list_changed"})

    async def _logged(self, params: types.LoggingMessageNotificationParams) -> None:
        """Keep a log message the server sent."""
        self.logs.append(plain(params))

    async def _progressed(self, progress: float, total: float | None, message: str | None) -> None:
        """Keep a progress notification of the call in flight."""
        self.progress.append({"progress": progress, "total": total, "message": message})

    async def _input(self, key: str, request: types.InputRequest) -> Any:
        """One embedded request of an InputRequiredResult, through the callbacks."""
        if isinstance(request, types.ElicitRequest) and self._elicit:
            return await self._answer_elicitation(None, request.params)
        if isinstance(request, types.CreateMessageRequest) and self._sample is not None:
            return await self._answer_sampling(None, request.params)
        if isinstance(request, types.ListRootsRequest) and self._roots is not None:
            return await self._answer_roots(None)
        return types.ErrorData(code=types.INVALID_REQUEST, message=f"cannot answer {key}")

    async def call(self, step: dict[str, Any]) -> dict[str, Any]:
        """One tools/call; SDK failures become an error object."""
        if step.get("op", "call") != "call":
            raise ValueError(f"not a call step: {step!r}")
        name: str = step["name"]
        arguments: dict[str, Any] = step.get("arguments", {})
        meta: dict[str, Any] | None = step.get("meta")
        timeout_s: float | None = step.get("timeout_s")
        async def retry(responses: Any, state: str | None) -> Any:
            return await self.session.call_tool(
                name,
                arguments,
                read_timeout_seconds=timeout_s,
                meta=meta,
                input_responses=responses,
                request_state=state,
                allow_input_required=True,
                progress_callback=self._progressed if self._observe else None,
            )

        try:
            result = await retry(None, None)
            if isinstance(result, types.InputRequiredResult):
                result = await run_input_required_driver(result, dispatch=self._input, retry=retry)
        except Exception as exc:
            return error_object(exc)
        output = call_output(result)
        output["elicited"] = list(self.elicited)
        self.elicited.clear()
        output["sampled"], self.sampled = self.sampled, []
        output["rooted"], self.rooted = self.rooted, 0
        if self._observe:
            output["progress"], self.progress = self.progress, []
            output["logs"], self.logs = self.logs, []
        return output

    async def concurrent(self, calls: list[dict[str, Any]]) -> dict[str, Any]:
        """Run the calls at once; results keep the given order."""
        results: list[dict[str, Any]] = [{} for _ in calls]

        async def run(index: int, step: dict[str, Any]) -> None:
            results[index] = await self.call(step)

        async with anyio.create_task_group() as tg:
            for index, step in enumerate(calls):
                tg.start_soon(run, index, step)
        return {"results": results}

    async def run_step(self, step: dict[str, Any]) -> dict[str, Any]:
        """Execute one step and return its output object."""
        op = step["op"]
        if op == "list_tools":
            return await self.list_tools()
        if op == "call":
            return await self.call(step)
        if op == "concurrent":
            return await self.concurrent(step["calls"])
        if op == "reconnect":
            await self.close()
            await self.connect()
            return {"reconnected": True}
        if op == "sleep":
            await anyio.sleep(float(step["seconds"]))
            return {"slept": step["seconds"]}
        if op == "listen":
            try:
                return await self.open_listen(step)
            except Exception as exc:
                return error_object(exc)
        if op == "notices":
            notices, self.notices = self.notices, []
            return {"notices": notices}
        if op in (
            "list_resources",
            "read_resource",
            "list_prompts",
            "get_prompt",
            "complete",
            "set_level",
            "subscribe",
            "unsubscribe",
        ):
            try:
                return await self.other(op, step)
            except Exception as exc:
                return error_object(exc)
        raise ValueError(f"unknown op: {op!r}")

    async def other(self, op: str, step: dict[str, Any]) -> dict[str, Any]:
        """A request other than tools/*: resources, prompts, completion, the log level."""
        if op == "list_resources":
            listed = await self.session.list_resources()
            return {"resources": [plain(resource) for resource in listed.resources]}
        if op == "read_resource":
            read = await self.session.read_resource(step["uri"])
            return {"contents": [plain(content) for content in read.contents]}
        if op == "list_prompts":
            prompts = await self.session.list_prompts()
            return {"prompts": [plain(prompt) for prompt in prompts.prompts]}
        if op == "complete":
            completed = await self.session.complete(
                types.PromptReference(name=step["prompt"]),
                {"name": step["argument"], "value": step["value"]},
            )
            return {"values": completed.completion.values}
        if op == "set_level":
            await self.session.set_logging_level(step["level"])
            return {"set": step["level"]}
        if op == "subscribe":
            await self.session.subscribe_resource(step["uri"])
            return {"subscribed": step["uri"]}
        if op == "unsubscribe":
            await self.session.unsubscribe_resource(step["uri"])
            return {"unsubscribed": step["uri"]}
        prompt = await self.session.get_prompt(step["name"], step.get("arguments"))
        return {"messages": [plain(message) for message in prompt.messages]}


async def drive(host: Host) -> None:
    """Connect, run every step from stdin, then close."""
    await host.connect()
    try:
        steps = json.loads(await anyio.to_thread.run_sync(sys.stdin.read))
        if not isinstance(steps, list):
            raise ValueError("stdin must hold a JSON array of steps")
        for step in steps:
            emit(await host.run_step(step))
    finally:
        await host.close()


def parse_args(argv: list[str]) -> Host:
    """Read ``[--protocol P] (--url URL [--bearer-env NAME] [--traceparent V] | -- CMD ARG...)``."""
    parser = argparse.ArgumentParser(
        prog="host.py", description="Drive an MCP server with the SDK's client."
    )
    parser.add_argument("--protocol", choices=PROTOCOLS, default="auto")
    parser.add_argument("--url")
    parser.add_argument("--bearer-env")
    parser.add_argument("--traceparent")
    parser.add_argument("--elicit", choices=("approve", "decline"))
    parser.add_argument("--observe", action="store_true")
    parser.add_argument("--sample")
    parser.add_argument("--roots", type=lambda text: [uri for uri in text.split(",") if uri])
    split = argv.index("--") if "--" in argv else len(argv)
    options, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if options.url is not None:
        token = os.environ.get(options.bearer_env) if options.bearer_env else None
        return Host(
            None,
            options.protocol,
            url=options.url,
            token=token,
            traceparent=options.traceparent,
            elicit=options.elicit,
            observe=options.observe,
            sample=options.sample,
            roots=options.roots,
        )
    if not command:
        parser.error("give --url URL, or '--' and the server command")
    server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    return Host(
        server,
        options.protocol,
        elicit=options.elicit,
        observe=options.observe,
        sample=options.sample,
        roots=options.roots,
    )


def main() -> int:
    host = parse_args(sys.argv[1:])
    try:
        anyio.run(drive, host)
    except Exception as exc:
        emit({"fatal": describe(exc)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
