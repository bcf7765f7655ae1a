"""The Python side of `cargo xtask bench python`: fresh and replayed calls through the
installed `toolledger` package, on the tool in pay.json with a downstream that answers at
once, on a new SQLite file in the given directory. Prints one JSON object.

Usage: python bench.py --dir DIR --calls N --round R
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import toolledger as tl
from toolledger.downstream import Receipt

HERE = Path(__file__).parent


class Instant:
    """Answers at once: what is measured is the ledger and the binding."""

    identity = "bench-instant@1"

    def __init__(self) -> None:
        self.count = 0

    def execute(self, request):
        self.count += 1
        arguments = request.arguments
        return Receipt({"payment_id": f"pay-{self.count}", "amount_minor": arguments["amount_minor"],
                        "currency": arguments["currency"]})

    def lookup(self, request):
        return tl.downstream.NotSent("no record")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--round", type=int, required=True)
    args = parser.parse_args()
    ledger = tl.Ledger.open(os.path.join(args.dir, f"python-{args.round}.sqlite3"),
                            tools=[tl.Tool.load(HERE / "pay.json")], downstream=Instant(),
                            tenant="bench", subject="agent")
    for warm in range(20):
        ledger.dispatch(tl.Call("pay", {"payer": "bob", "amount_minor": 100, "currency": "USD"},
                                key=f"warm-{warm}"))
    keys = [f"k-{args.round}-{n}" for n in range(args.calls)]
    started = time.perf_counter()
    for key in keys:
        reply = ledger.dispatch(tl.Call("pay", {"payer": "bob", "amount_minor": 100,
                                                "currency": "USD"}, key=key))
        assert reply.done
    fresh = time.perf_counter() - started
    started = time.perf_counter()
    for key in keys:
        reply = ledger.dispatch(tl.Call("pay", {"payer": "bob", "amount_minor": 100,
                                                "currency": "USD"}, key=key))
        assert isinstance(reply.outcome, tl.Replayed)
    replay = time.perf_counter() - started
    print(json.dumps({"fresh_per_s": args.calls / fresh, "replay_per_s": args.calls / replay}))


if __name__ == "__main__":
    main()
