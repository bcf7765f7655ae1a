"""A LangGraph host the parallel test kills mid-batch: its graph (checkpointed to a
SQLite file) runs one AI message's four `pay` calls at once on one ledger. Payers `a`
and `b` are paid and answered; `c` is paid and then holds; `d` holds before paying.
Each holding call says so on stderr, and the parent kills the process there."""

from __future__ import annotations

import os
import sqlite3
import sys
import time

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver

import toolledger as tl
from conftest import PAYMENT_INPUT, PAYMENT_OUTPUT
from file_payments import FilePayments
from parallel_graph import build, model
from toolledger.downstream import current_request


def hold(payer: str) -> None:
    # One write, one line: a pipe keeps a write this small whole between threads.
    os.write(2, f"holding {payer}\n".encode())
    time.sleep(600)


def main() -> None:
    location, effects, checkpoints = sys.argv[1], sys.argv[2], sys.argv[3]
    payments = FilePayments(effects)
    # A short lease: the resumed host takes the dead one's calls over a second later.
    ledger = tl.Ledger.open(location, tenant="acme", subject="user-1", lease_seconds=1)

    @ledger.tool("pay", input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT,
                 lookup=payments.lookup)
    def pay(payer, amount_minor, currency, note=None):
        "Pay a payer."
        if payer == "d":
            hold(payer)
        receipt = payments.execute(current_request())
        if payer == "c":
            hold(payer)
        return receipt

    saver = SqliteSaver(sqlite3.connect(checkpoints, check_same_thread=False))
    graph = build(pay, model(first_turn=True), saver)
    graph.invoke({"messages": [HumanMessage("pay a, b, c and d")]},
                 {"configurable": {"thread_id": "batch-1"}}, durability="sync")


if __name__ == "__main__":
    main()
