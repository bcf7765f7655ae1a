"""The one door from Python: a call's arguments are held to what the ledger can store by
the facade itself, so what Python hands it is answered exactly as every other door
answers it. Out-of-domain values are ``INPUT_INVALID`` with a pointer and nothing
written; an integral float is its integer."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolledger as tl
from toolledger import Tool
from toolledger.downstream import NotSent, Receipt

NOTE_OUTPUT = {
    "type": "object",
    "required": ["effect"],
    "additionalProperties": False,
    "properties": {"effect": {"type": "integer"}},
}


class Effects:
    """A downstream that takes any arguments and counts every effect."""

    identity = "effects@1"

    def __init__(self) -> None:
        self.done: list[str] = []

    def execute(self, request):
        self.done.append(request.request_ref)
        return Receipt({"effect": len(self.done)})

    def lookup(self, request):
        return NotSent("no such effect")


def open_ledger(location, effects):
    tool = Tool(
        "note",
        description="Write anything down, once per key.",
        input_schema={"type": "object"},
        output_schema=NOTE_OUTPUT,
        revisions={"effect": "note.effect.v1", "handler": "note.handler.v1"},
    )
    return tl.Ledger.open(location, tools=[tool], downstream=effects, tenant="acme",
                          subject="user-1")


def deep(levels: int) -> dict:
    """An object of ``levels`` levels: the arguments object itself is level 1."""
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


HOSTILE = [
    ({"n": 2**53}, "/n", "integer_range"),
    ({"n": 2**53 + 1}, "/n", "integer_range"),
    ({"n": -(2**53) - 1}, "/n", "integer_range"),
    ({"n": 2**63 - 1}, "/n", "integer_range"),
    ({"n": 2**64 + 5}, "/n", "integer_range"),
    ({"n": -(10**400)}, "/n", "integer_range"),
    ({"n": [0, 19.99]}, "/n/1", "fraction"),
    ({"n": 1.5}, "/n", "fraction"),
    ({"n": 1e300}, "/n", "integer_range"),
    ({"a/b~": 0.5}, "/a~1b~0", "fraction"),
    (deep(33), "/a" * 32, "depth"),
    (deep(65), "/a" * 32, "depth"),
    ({"s": "x" * 10_000_000}, "", "size"),
]


def test_out_of_domain_arguments_are_input_invalid_and_nothing_is_written(sqlite_location):
    effects = Effects()
    with open_ledger(sqlite_location, effects) as ledger:
        for index, (arguments, pointer, keyword) in enumerate(HOSTILE):
            reply = ledger.dispatch(tl.Call("note", arguments, key=f"k-{index}"))
            assert reply.code == "INPUT_INVALID", (pointer, reply.code)
            assert reply.package["detail"] == {"pointer": pointer, "keyword": keyword}
            assert ledger.enqueue(tl.Call("note", arguments, key=f"k-{index}")).code == (
                "INPUT_INVALID"
            )
        assert effects.done == []
        assert ledger.list() == []
        assert ledger.audit().passed
        # A list that contains itself is refused where it passes the depth bound.
        nested: list = []
        nested.append(nested)
        reply = ledger.dispatch(tl.Call("note", {"n": nested}, key="k-self"))
        assert reply.package["detail"] == {"pointer": "/n" + "/0" * 31, "keyword": "depth"}


def test_what_json_cannot_say_is_refused_before_the_call_exists():
    for value, said in [
        ((1, 2), "tuple"),
        ({1, 2}, "set"),
        (b"x", "bytes"),
        ("\ud800", "lone surrogate"),
        (float("nan"), "number JSON cannot write"),
    ]:
        try:
            tl.Call("note", {"v": value}, key="k")
        except tl.InvalidError as refused:
            assert refused.code == "USAGE_ERROR"
            assert said in refused.message, refused.message
        else:
            raise AssertionError(f"{value!r} was accepted")


def test_an_integral_float_is_its_integer(sqlite_location):
    effects = Effects()
    with open_ledger(sqlite_location, effects) as ledger:
        fresh = ledger.dispatch(tl.Call("note", {"f": 2.0, "g": [-0.0]}, key="k-f"))
        assert isinstance(fresh.outcome, tl.Fresh)
        for same in ({"f": 2, "g": [0]}, {"f": 2.0, "g": [0.0]}):
            again = ledger.dispatch(tl.Call("note", same, key="k-f"))
            assert isinstance(again.outcome, tl.Replayed), again.code
            assert again.outcome.request_sha256 == fresh.outcome.request_sha256
        assert ledger.show(fresh.status_ref, arguments=True)["arguments"] == {"f": 2, "g": [0]}
        assert len(effects.done) == 1
        assert ledger.audit().passed


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(min_value=-1000, max_value=1000).map(float)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.function_scoped_fixture])
@given(arguments=st.dictionaries(st.text(max_size=6), json_values, max_size=4))
def test_whatever_the_door_holds_round_trips_and_replays(tmp_path_factory, arguments):
    location = str(tmp_path_factory.mktemp("door") / "ledger.sqlite3")
    effects = Effects()
    with open_ledger(location, effects) as ledger:
        first = ledger.dispatch(tl.Call("note", arguments, key="k-0"))
        if first.code == "INPUT_INVALID":
            assert effects.done == [] and ledger.list() == []
        else:
            assert isinstance(first.outcome, tl.Fresh), first.code
            again = ledger.dispatch(tl.Call("note", arguments, key="k-0"))
            assert isinstance(again.outcome, tl.Replayed), again.code
            assert again.outcome.request_sha256 == first.outcome.request_sha256
            stored = ledger.show(first.status_ref, arguments=True)["arguments"]
            # What was stored is the value itself, integral floats as integers.
            assert stored == arguments
            assert ledger.dispatch(tl.Call("note", stored, key="k-0")).outcome.request_sha256 == (
                first.outcome.request_sha256
            )
            assert len(effects.done) == 1
        assert ledger.audit().passed
