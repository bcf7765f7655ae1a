"""Type stubs of the compiled module (crates/python/src)."""

import os
import threading
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, final

from typing_extensions import Self

Json = Any

class Error(Exception):
    code: str
    message: str

class InvalidError(Error): ...
class StoreError(Error): ...
class RolesError(Error): ...

@final
class Tool:
    def __init__(
        self,
        name: str,
        *,
        description: str,
        input_schema: Mapping[str, Json],
        output_schema: Mapping[str, Json],
        output_bindings: Mapping[str, str] | None = None,
        revisions: Mapping[str, str] | None = None,
        approval: Mapping[str, Json] | None = None,
        authorization: Mapping[str, Json] | None = None,
        max_attempts: int | None = None,
    ) -> None: ...
    @staticmethod
    def load(path: str | os.PathLike[str]) -> Tool: ...
    @staticmethod
    def refund_order(approval_threshold_minor: int | None = None) -> Tool: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str | None: ...
    @property
    def input_schema(self) -> dict[str, Json] | None: ...
    @property
    def output_schema(self) -> dict[str, Json] | None: ...
    @property
    def requires_approval(self) -> bool: ...

@final
class ModelCall:
    def __init__(
        self,
        provider: str,
        api_family: str,
        adapter_revision: str,
        response_id: str,
        call_id: str,
    ) -> None: ...
    @property
    def call_id(self) -> str: ...
    @property
    def response_id(self) -> str: ...

@final
class Approval:
    def __init__(
        self,
        approval_id: str,
        approver_id: str,
        approved_at: int,
        expires_at: int,
        *,
        eligible_approvers: Sequence[str] = ...,
    ) -> None: ...

@final
class Call:
    def __init__(
        self,
        tool: str,
        arguments: Mapping[str, Json],
        *,
        key: str,
        tenant: str | None = None,
        subject: str | None = None,
        model_call: ModelCall | None = None,
        context: Mapping[str, Json] | None = None,
        approval: Approval | None = None,
        at: int | None = None,
        operation_id: str | None = None,
    ) -> None: ...
    @property
    def tool(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def model_call(self) -> ModelCall | None: ...
    @property
    def arguments(self) -> dict[str, Json]: ...

class _Done:
    @property
    def status_ref(self) -> str: ...
    @property
    def output(self) -> dict[str, Json]: ...
    @property
    def result_sha256(self) -> str: ...
    @property
    def request_sha256(self) -> str: ...
    @property
    def receipt_ref(self) -> str: ...
    @property
    def code(self) -> Literal["OK"]: ...
    @property
    def done(self) -> Literal[True]: ...

@final
class Fresh(_Done): ...

@final
class Replayed(_Done): ...

@final
class Reconciled(_Done): ...

@final
class Unknown:
    @property
    def status_ref(self) -> str: ...
    @property
    def code(self) -> Literal["OUTCOME_UNKNOWN"]: ...
    @property
    def done(self) -> Literal[False]: ...
    @property
    def output(self) -> None: ...

@final
class Accepted:
    @property
    def status_ref(self) -> str: ...
    @property
    def code(self) -> Literal["ACCEPTED"]: ...
    @property
    def done(self) -> Literal[False]: ...
    @property
    def output(self) -> None: ...

@final
class Blocked:
    @property
    def code(self) -> str: ...
    @property
    def status_ref(self) -> str | None: ...
    @property
    def done(self) -> Literal[False]: ...
    @property
    def output(self) -> None: ...

Outcome = Fresh | Replayed | Reconciled | Unknown | Accepted | Blocked

@final
class Reply:
    @property
    def outcome(self) -> Outcome: ...
    @property
    def code(self) -> str: ...
    @property
    def status_ref(self) -> str | None: ...
    @property
    def output(self) -> dict[str, Json] | None: ...
    @property
    def done(self) -> bool: ...
    @property
    def decision(
        self,
    ) -> Literal[
        "fresh",
        "replay",
        "reconciled",
        "accepted",
        "outcome_unknown",
        "conflict",
        "approval_required",
        "blocked",
    ]: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def package(self) -> dict[str, Json]: ...
    def canonical(self) -> str: ...

@final
class Audit:
    @property
    def passed(self) -> bool: ...
    @property
    def package(self) -> dict[str, Json]: ...
    def __bool__(self) -> bool: ...

def _park(parked: bool) -> None: ...
def _flush() -> None: ...

class _Completions:
    def fileno(self) -> int: ...
    def drain(self) -> list[tuple[int, Any, bool]]: ...

class Ledger:
    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        config: str | os.PathLike[str] | None = None,
        tools: Iterable[Tool] | None = None,
        downstream: Any = None,
        downstreams: Mapping[str, Any] | None = None,
        roles: Callable[[str, str], Sequence[str]] | None = None,
        tenant: str | None = None,
        subject: str | None = None,
        profiles: Iterable[tuple[str, str, str]] | None = None,
        worker: str | None = None,
        lease_seconds: int | None = None,
    ) -> None: ...
    def dispatch(self, call: Call) -> Reply: ...
    def enqueue(self, call: Call) -> Reply: ...
    def process(
        self, status_ref: str, *, context: Mapping[str, Json] | None = None, at: int | None = None
    ) -> Reply: ...
    def status(
        self,
        status_ref: str,
        call: Call | None = None,
        *,
        tenant: str | None = None,
        subject: str | None = None,
        model_call: ModelCall | None = None,
        context: Mapping[str, Json] | None = None,
        at: int | None = None,
    ) -> Reply: ...
    def resolve(
        self,
        status_ref: str,
        *,
        reason: str,
        output: Mapping[str, Json] | None = None,
        not_happened: bool = False,
        at: int | None = None,
    ) -> Literal["succeeded", "failed"]: ...
    def relay(
        self,
        *,
        workers: int = 1,
        batch: int | None = None,
        stop: threading.Event | None = None,
        poll: float = 0.05,
        context: Mapping[str, Json] | None = None,
        at: int | None = None,
        lease_seconds: int | None = None,
    ) -> dict[str, int]: ...
    def audit(self) -> Audit: ...
    def list(
        self,
        *,
        state: str | None = None,
        tool: str | None = None,
        older_than: int = 0,
        limit: int = 100,
        after: str | None = None,
        arguments: bool = False,
        at: int | None = None,
    ) -> list[dict[str, Json]]: ...
    def show(self, status_ref: str, *, arguments: bool = False) -> dict[str, Json] | None: ...
    def requeue(self, status_ref: str, *, reason: str, at: int | None = None) -> str: ...
    @property
    def tools(self) -> list[str]: ...
    @property
    def _store(self) -> Literal["sqlite", "postgres"]: ...
    def _register(self, tool: Tool, downstream: Any) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> Literal[False]: ...

@final
class _Request:
    @property
    def request_ref(self) -> str: ...
    @property
    def request_sha256(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def output_revision(self) -> str: ...
    @property
    def arguments(self) -> dict[str, Json]: ...

@final
class _Receipt:
    def __init__(self, output: Mapping[str, Json]) -> None: ...
    @property
    def output(self) -> Mapping[str, Json]: ...

@final
class _NotSent:
    def __init__(self, reason: str = "") -> None: ...
    @property
    def reason(self) -> str: ...

@final
class _Refused:
    def __init__(self, reason: str = "") -> None: ...
    @property
    def reason(self) -> str: ...

@final
class _Unknown:
    def __init__(self, reason: str = "") -> None: ...
    @property
    def reason(self) -> str: ...

def is_key(text: str) -> bool: ...
