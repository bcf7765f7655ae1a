"""A host process the crash tests kill: it dispatches one payment and may die at a
commit point (`TOOLLEDGER_CRASH_AFTER_COMMIT`) or by SIGKILL inside the downstream."""

from __future__ import annotations

import os
import signal
import sys

import toolledger as tl
from file_payments import FilePayments, PAY_ARGS, pay_tool


class Dying(FilePayments):
    """Dies by SIGKILL inside `execute`, before or after its effect, as `die` says."""

    def __init__(self, path: str, die: str) -> None:
        super().__init__(path)
        self.die = die

    def execute(self, request):
        if self.die == "before-effect":
            os.kill(os.getpid(), signal.SIGKILL)
        answer = super().execute(request)
        if self.die == "after-effect":
            os.kill(os.getpid(), signal.SIGKILL)
        return answer


def main() -> None:
    location, effects, key, die, at = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    # A short lease: PostgreSQL's leases run on the database's clock, so the restarted
    # host waits this long in real time before the dead worker's lease is over.
    ledger = tl.Ledger.open(location, tools=[pay_tool()], downstream=Dying(effects, die),
                            tenant="acme", subject="user-1", lease_seconds=1)
    reply = ledger.dispatch(tl.Call("pay", PAY_ARGS, key=key, at=at))
    # What was acknowledged to the host: the parent checks it stays true.
    print(type(reply.outcome).__name__, reply.status_ref, flush=True)


if __name__ == "__main__":
    main()
