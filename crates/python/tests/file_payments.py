"""A payments provider whose every effect is a line appended (and fsynced) to a file,
shared by the processes of one test: it never deduplicates, so the file counts every
effect any process performed; its lookup reads the file."""

from __future__ import annotations

import fcntl
import json
import os

from toolledger import Tool
from toolledger.downstream import NotSent, Receipt

PAY_ARGS = {"payer": "bob", "amount_minor": 2500, "currency": "EUR"}


def pay_tool() -> Tool:
    from conftest import payment_tool

    return payment_tool()


class FilePayments:
    identity = "payments@1"

    def __init__(self, path: str) -> None:
        self.path = path

    def effects(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as lines:
            return [json.loads(line) for line in lines if line.strip()]

    def execute(self, request):
        with open(self.path, "a+") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.seek(0)
            count = sum(1 for line in log if line.strip())
            arguments = request.arguments
            payment = {
                "payment_id": f"pay-{count + 1}",
                "amount_minor": arguments["amount_minor"],
                "currency": arguments["currency"],
            }
            log.write(json.dumps({"ref": request.request_ref, "payment": payment}) + "\n")
            log.flush()
            os.fsync(log.fileno())
        return Receipt(payment)

    def lookup(self, request):
        for effect in self.effects():
            if effect["ref"] == request.request_ref:
                return Receipt(effect["payment"])
        return NotSent("no such payment")
