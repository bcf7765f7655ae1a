"""The Python side of `cargo xtask bench python`'s many-callers rows, on the installed
`toolledger` package. Prints one JSON object:

- `threads_wall_s`: eight threads, each one call of a tool that takes `--slow` seconds
  (`time.sleep`, as a blocking client waits), all on one `Ledger`: the wall time;
- `asyncio_fresh_per_s`: `--tasks` asyncio tasks on one `Ledger`, each `--calls` fresh
  `adispatch`es in turn, to a downstream that answers at once: calls per second;
- `loop_lag_p99_ms`: while they run, a probe coroutine sleeps 1 ms at a time and
  records how late it wakes: the 99th percentile, in milliseconds.

Usage: python many.py --dir DIR --round R --tasks N --calls N --slow SECONDS
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from pathlib import Path

import toolledger as tl
from bench import Instant

HERE = Path(__file__).parent
ARGS = {"payer": "bob", "amount_minor": 100, "currency": "USD"}


class Slow(Instant):
    """Takes `slow` seconds, as a blocking client waits on its service."""

    def __init__(self, slow: float) -> None:
        super().__init__()
        self.slow = slow

    def execute(self, request):
        time.sleep(self.slow)
        return super().execute(request)


def threads_wall(path: str, slow: float) -> float:
    ledger = tl.Ledger.open(path, tools=[tl.Tool.load(HERE / "pay.json")], downstream=Slow(slow),
                            tenant="bench", subject="agent")
    calls = [tl.Call("pay", ARGS, key=f"slow-{n}") for n in range(8)]
    threads = [threading.Thread(target=ledger.dispatch, args=(call,)) for call in calls]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    assert all(ledger.dispatch(call).done for call in calls)
    ledger.close()
    return wall


async def asyncio_rate(path: str, tasks: int, calls: int, round_: int) -> tuple[float, float]:
    ledger = tl.Ledger.open(path, tools=[tl.Tool.load(HERE / "pay.json")], downstream=Instant(),
                            tenant="bench", subject="agent")
    for warm in range(20):
        await ledger.adispatch(tl.Call("pay", ARGS, key=f"warm-{warm}"))
    lags: list[float] = []
    running = True

    async def probe() -> None:
        while running:
            asked = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - asked - 0.001)

    async def caller(task: int) -> None:
        for n in range(calls):
            reply = await ledger.adispatch(tl.Call("pay", ARGS, key=f"a-{round_}-{task}-{n}"))
            assert reply.done, reply

    watcher = asyncio.ensure_future(probe())
    started = time.perf_counter()
    await asyncio.gather(*(caller(task) for task in range(tasks)))
    elapsed = time.perf_counter() - started
    running = False
    await watcher
    ledger.close()
    lags.sort()
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else 0.0
    return tasks * calls / elapsed, p99 * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--round", type=int, required=True)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--slow", type=float, required=True)
    args = parser.parse_args()
    wall = threads_wall(os.path.join(args.dir, f"py-threads-{args.round}.sqlite3"), args.slow)
    rate, lag = asyncio.run(asyncio_rate(os.path.join(args.dir, f"py-async-{args.round}.sqlite3"),
                                         args.tasks, args.calls, args.round))
    print(json.dumps({"threads_wall_s": wall, "asyncio_fresh_per_s": rate,
                      "loop_lag_p99_ms": lag}))


if __name__ == "__main__":
    main()
