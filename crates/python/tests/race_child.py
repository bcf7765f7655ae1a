"""One of the processes racing one key: it waits for the start file, dispatches, and
prints its outcome."""

from __future__ import annotations

import os
import sys
import time

import toolledger as tl
from file_payments import PAY_ARGS, FilePayments, pay_tool


def main() -> None:
    location, effects, start = sys.argv[1], sys.argv[2], sys.argv[3]
    ledger = tl.Ledger.open(location, tools=[pay_tool()], downstream=FilePayments(effects),
                            tenant="acme", subject="user-1")
    deadline = time.monotonic() + 60
    while not os.path.exists(start) and time.monotonic() < deadline:
        time.sleep(0.001)
    reply = ledger.dispatch(tl.Call("pay", PAY_ARGS, key="raced"))
    print(type(reply.outcome).__name__, flush=True)


if __name__ == "__main__":
    main()
