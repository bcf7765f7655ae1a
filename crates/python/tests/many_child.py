"""A host the many-calls crash test kills: sixteen threads dispatch sixteen keys on one
`Ledger` at once. Keys 0 to 7 pay and then hold inside the tool; keys 8 to 15 hold
before paying. Each holding call says so on stderr; the parent kills the process once
all sixteen are in flight."""

from __future__ import annotations

import os
import sys
import threading
import time

import toolledger as tl
from file_payments import PAY_ARGS, FilePayments, pay_tool

IN_FLIGHT = 16


class Holding(FilePayments):
    def execute(self, request):
        n = int(request.arguments["note"])
        if n >= IN_FLIGHT // 2:
            self.hold(n)
        answer = super().execute(request)
        self.hold(n)
        return answer

    @staticmethod
    def hold(n: int) -> None:
        # One write, one line: a pipe keeps a write this small whole between threads.
        os.write(2, f"holding {n}\n".encode())
        time.sleep(600)


def main() -> None:
    location, effects, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ledger = tl.Ledger.open(location, tools=[pay_tool()], downstream=Holding(effects),
                            tenant="acme", subject="user-1", lease_seconds=1)
    threads = [
        threading.Thread(target=ledger.dispatch, args=(
            tl.Call("pay", {**PAY_ARGS, "note": str(n)}, key=f"k-{n}", at=at),))
        for n in range(IN_FLIGHT)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
