"""Many calls at once on one `Ledger`: threads, and asyncio tasks.

Overlap is asserted by what the tool records (how many calls it holds at a time, each
waiting, boundedly, for the others to arrive), never by timing: calls serialized by a
lock would each wait out the bound alone, and the most inside at once would be one.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading

import pytest

import toolledger as tl
from conftest import PAYMENT_INPUT, PAYMENT_OUTPUT, Payments, payment_tool

# A bound on every wait for the others, never a measure.
TOGETHER_BOUND = 20.0
ARGS = {"payer": "bob", "amount_minor": 100, "currency": "EUR"}


class Inside:
    """Who is inside the tool now, the most ever inside at once, and the effects."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.effects: list[str] = []

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self, payer: str) -> dict:
        with self.lock:
            self.now -= 1
            self.effects.append(payer)
            return {"payment_id": f"pay-{len(self.effects)}", "amount_minor": 100,
                    "currency": "EUR"}


def blocking_pay(ledger: tl.Ledger, inside: Inside, together: int):
    meeting = threading.Barrier(together, timeout=TOGETHER_BOUND)

    @ledger.tool("pay", input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT)
    def pay(payer, amount_minor, currency, note=None):
        "Pay a payer."
        inside.enter()
        if together > 1:
            try:
                meeting.wait()
            except threading.BrokenBarrierError:
                pass
        return inside.leave(payer)

    return pay


def test_threads_on_one_ledger_run_their_tools_at_once(location):
    inside = Inside()
    with tl.Ledger.open(location, tenant="acme", subject="user-1") as ledger:
        pay = blocking_pay(ledger, inside, together=8)
        replies: list[tl.Reply] = []
        threads = [
            threading.Thread(target=lambda n=n: replies.append(pay(ARGS, key=f"pay-{n}")))
            for n in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [type(reply.outcome).__name__ for reply in replies] == ["Fresh"] * 8
        assert inside.most == 8
        assert len(inside.effects) == 8
        assert all(isinstance(pay(ARGS, key=f"pay-{n}").outcome, tl.Replayed) for n in range(8))
        assert len(inside.effects) == 8
        assert ledger.audit().passed


def test_threads_racing_one_key_on_one_ledger_make_one_effect(sqlite_location):
    inside = Inside()
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        pay = blocking_pay(ledger, inside, together=1)
        replies: list[tl.Reply] = []
        threads = [
            threading.Thread(target=lambda: replies.append(pay(ARGS, key="raced")))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        names = [type(reply.outcome).__name__ for reply in replies]
        assert names.count("Fresh") == 1, names
        # The others wait for it in this process and replay it: none answers unknown.
        assert set(names) == {"Fresh", "Replayed"}, names
        assert inside.effects == ["bob"]
        assert isinstance(pay(ARGS, key="raced").outcome, tl.Replayed)
        assert inside.effects == ["bob"]


def test_asyncio_tasks_run_an_async_tool_on_the_hosts_loop(location):
    inside = Inside()
    ran_on: set[int] = set()

    async def main() -> list[tl.Reply]:
        meeting = asyncio.Barrier(8)
        loop_thread = threading.get_ident()
        with tl.Ledger.open(location, tenant="acme", subject="user-1") as ledger:

            @ledger.tool("pay", input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT)
            async def pay(payer, amount_minor, currency, note=None):
                "Pay a payer."
                ran_on.add(threading.get_ident())
                assert tl.downstream.current_request() is not None
                inside.enter()
                try:
                    await asyncio.wait_for(meeting.wait(), TOGETHER_BOUND)
                except TimeoutError:
                    pass
                return inside.leave(payer)

            replies = await asyncio.gather(*(pay(ARGS, key=f"pay-{n}") for n in range(8)))
            again = await asyncio.gather(*(pay(ARGS, key=f"pay-{n}") for n in range(8)))
            assert all(isinstance(reply.outcome, tl.Replayed) for reply in again)
            # The status path, awaited.
            status = await ledger.astatus(replies[0].status_ref)
            assert isinstance(status.outcome, tl.Replayed)
            assert ran_on == {loop_thread}
            return replies

    replies = asyncio.run(main())
    assert [type(reply.outcome).__name__ for reply in replies] == ["Fresh"] * 8
    assert inside.most == 8
    assert len(inside.effects) == 8


def test_a_ledger_call_never_blocks_the_event_loop(sqlite_location):
    """A blocking tool waits for the loop to let it go: were the call made on the
    loop's thread, the loop could never do so, and the bounded wait would run out."""
    entered = threading.Event()
    released = threading.Event()

    async def main() -> tuple[tl.Reply, bool]:
        with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:

            @ledger.tool("pay", input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT)
            def pay(payer, amount_minor, currency, note=None):
                "Pay a payer."
                entered.set()
                let_go = released.wait(TOGETHER_BOUND)
                return {"payment_id": "pay-1" if let_go else "pay-2", "amount_minor": 100,
                        "currency": "EUR"}

            call = asyncio.ensure_future(ledger.adispatch(tl.Call("pay", ARGS, key="loop")))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            released.set()
            reply = await call
            return reply, call.done()

    reply, done = asyncio.run(main())
    assert done and isinstance(reply.outcome, tl.Fresh)
    assert reply.output["payment_id"] == "pay-1"


def test_asyncio_tasks_racing_one_key_make_one_effect(sqlite_location):
    inside = Inside()

    async def main() -> list[tl.Reply]:
        with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
            pay = blocking_pay(ledger, inside, together=1)
            calls = [ledger.adispatch(tl.Call("pay", ARGS, key="raced")) for _ in range(8)]
            replies = await asyncio.gather(*calls)
            assert isinstance((await pay.acall(ARGS, key="raced")).outcome, tl.Replayed)
            return replies

    names = [type(reply.outcome).__name__ for reply in asyncio.run(main())]
    assert names.count("Fresh") == 1 and set(names) == {"Fresh", "Replayed"}, names
    assert inside.effects == ["bob"]


# A host's own context variable: an awaited call's downstream and role resolver read it
# as the awaiting coroutine set it, though they run on a thread of the package's pool.
# The payer is the owner; an agent acts for others (the resolver is asked at every step).
OWNED = {"owner": "/payer", "act_for_others": ["agent"]}

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def test_an_awaited_calls_host_code_runs_in_the_awaiting_coroutines_context(sqlite_location):
    seen: list[tuple[str, str]] = []

    class Traced(Payments):
        def execute(self, request):
            seen.append(("execute", REQUEST_ID.get()))
            return super().execute(request)

    def roles(tenant, subject):
        seen.append(("roles", REQUEST_ID.get()))
        return ["agent"]

    async def main() -> tl.Reply:
        with tl.Ledger.open(sqlite_location, tools=[payment_tool(authorization=OWNED)],
                            downstream=Traced(),
                            tenant="acme", subject="user-1", roles=roles) as ledger:

            async def one(n: int) -> tl.Reply:
                REQUEST_ID.set(f"req-{n}")
                return await ledger.adispatch(tl.Call("pay", ARGS, key=f"ctx-{n}"))

            replies = await asyncio.gather(*(one(n) for n in range(4)))
            assert all(isinstance(reply.outcome, tl.Fresh) for reply in replies)
            return replies[0]

    asyncio.run(main())
    assert sorted(value for name, value in seen if name == "execute") == [
        f"req-{n}" for n in range(4)
    ]
    assert {value for name, value in seen if name == "roles"} == {f"req-{n}" for n in range(4)}


def test_an_awaited_call_raises_as_the_call_would_with_its_cause(sqlite_location):
    def broken(tenant, subject):
        raise OSError("the directory is down")

    async def main() -> None:
        with tl.Ledger.open(sqlite_location, tools=[payment_tool(authorization=OWNED)],
                            downstream=Payments(), tenant="acme", subject="user-1",
                            roles=broken) as ledger:
            with pytest.raises(tl.RolesError) as failed:
                await ledger.adispatch(tl.Call("pay", ARGS, key="k-1"))
            assert failed.value.code == "ROLES_UNAVAILABLE"
            assert isinstance(failed.value.__cause__, OSError)
            # Refused before anything starts: raised on the awaiting coroutine at once.
            with pytest.raises(tl.InvalidError) as refused:
                await ledger.adispatch(tl.Call("pay", ARGS, key="a key with spaces"))
            assert refused.value.code == "USAGE_ERROR"
            with pytest.raises(tl.InvalidError):
                await ledger.astatus("not-a-ref")

    asyncio.run(main())


def test_an_awaited_resolve_answers_the_status_it_settled(sqlite_location):
    async def main() -> None:
        payments = Payments()
        with tl.Ledger.open(sqlite_location, tools=[payment_tool()], downstream=payments,
                            tenant="acme", subject="user-1") as ledger:
            accepted = await ledger.aenqueue(tl.Call("pay", ARGS, key="k-1"))
            settled = await ledger.aresolve(accepted.status_ref, reason="never sent",
                                            not_happened=True)
            assert settled == "failed"
            with pytest.raises(tl.InvalidError) as refused:
                await ledger.aresolve(accepted.status_ref, reason="again", not_happened=True)
            assert refused.value.code == "NOT_RESOLVABLE"
            assert payments.effects == []

    asyncio.run(main())


def test_a_cancelled_awaiter_leaves_its_call_to_run_to_its_end(sqlite_location):
    entered = threading.Event()
    released = threading.Event()
    payments = Payments()

    class Held(Payments):
        def execute(self, request):
            entered.set()
            released.wait(TOGETHER_BOUND)
            return payments.execute(request)

    async def main() -> tl.Reply:
        with tl.Ledger.open(sqlite_location, tools=[payment_tool()], downstream=Held(),
                            tenant="acme", subject="user-1") as ledger:
            call = tl.Call("pay", ARGS, key="k-1")
            waiting = asyncio.ensure_future(ledger.adispatch(call))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            released.set()
            # The same key again waits for the first call's turn, then reads it.
            return await ledger.adispatch(call)

    reply = asyncio.run(main())
    assert isinstance(reply.outcome, tl.Replayed)
    assert len(payments.effects) == 1


def test_awaited_calls_work_at_most_max_concurrent_calls_at_once(sqlite_location, monkeypatch):
    """Two at a time: synchronous tools meet in pairs. A larger pool would let more in at
    once; a smaller one would leave each alone at its meeting until the bound ran out."""
    from toolledger import _ledger

    monkeypatch.setattr(_ledger, "MAX_CONCURRENT_CALLS", 2)
    inside = Inside()

    async def main() -> list[tl.Reply]:
        with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
            blocking_pay(ledger, inside, together=2)
            calls = [ledger.adispatch(tl.Call("pay", ARGS, key=f"k-{n}")) for n in range(6)]
            return await asyncio.gather(*calls)

    replies = asyncio.run(main())
    assert all(isinstance(reply.outcome, tl.Fresh) for reply in replies)
    assert inside.most == 2 and len(inside.effects) == 6


def test_a_forked_child_works_awaited_calls_on_threads_of_its_own(sqlite_location):
    """The parent's pool has an idle thread when it forks; the child has none of it,
    and would wait for it forever were the pool not the child's own."""

    async def one(ledger: tl.Ledger, key: str) -> tl.Reply:
        return await asyncio.wait_for(ledger.adispatch(tl.Call("pay", ARGS, key=key)),
                                      TOGETHER_BOUND)

    def opened() -> tl.Ledger:
        return tl.Ledger.open(sqlite_location, tools=[payment_tool()], downstream=Payments(),
                              tenant="acme", subject="user-1")

    with opened() as ledger:
        assert isinstance(asyncio.run(one(ledger, "parent")).outcome, tl.Fresh)
    child = os.fork()
    if child == 0:
        code = 1
        try:
            with opened() as ledger:
                code = 0 if isinstance(asyncio.run(one(ledger, "child")).outcome, tl.Fresh) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
