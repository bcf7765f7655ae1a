"""The pure-Python peers on the same work as bench.py: a payment made once per key,
remembered durably in SQLite in the given directory, then the same keys again. Each
peer is used the way its own documentation shows. Prints one JSON object.

Usage: python peers.py --peer NAME --dir DIR --calls N --round R
Peers: agent-runtime-governance, replyonce (with a SQLite store written here, as it
ships none: one row per scope, read and written in one IMMEDIATE transaction at
synchronous=FULL), dbos (its SQLite system database).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import threading
import time

ARGS = {"payer": "bob", "amount_minor": 100, "currency": "USD"}


def effect_output(count: list) -> dict:
    count.append(1)
    return {"payment_id": f"pay-{len(count)}", "amount_minor": 100, "currency": "USD"}


def governance(path: str, keys: list[str]) -> tuple[float, float]:
    from agent_runtime_governance import ExecutionMode, InvocationOptions, Runtime
    from agent_runtime_governance.registry import SQLiteIdempotencyStore

    runtime = Runtime(idempotency_store=SQLiteIdempotencyStore(path))
    count: list = []

    @runtime.tool(execution_mode=ExecutionMode.IDEMPOTENT)
    def pay(payer: str, amount_minor: int, currency: str) -> dict:
        return effect_output(count)

    def run(key: str) -> None:
        pay(**ARGS, _governance=InvocationOptions(idempotency_key=key))

    return timed(keys, run, count)


class SQLiteStore:
    """A replyonce store over SQLite (its protocol: `transact` and `read`)."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS scopes (scope TEXT PRIMARY KEY, state TEXT NOT NULL)")
        self.lock = threading.Lock()

    async def transact(self, scope, fn):
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                row = self.db.execute("SELECT state FROM scopes WHERE scope = ?", (scope,)).fetchone()
                nxt, result = fn(None if row is None else json.loads(row[0]))
                if nxt is not None:
                    self.db.execute("INSERT INTO scopes (scope, state) VALUES (?, ?) "
                                    "ON CONFLICT (scope) DO UPDATE SET state = excluded.state",
                                    (scope, json.dumps(nxt)))
                self.db.execute("COMMIT")
                return result
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    async def read(self, scope):
        row = self.db.execute("SELECT state FROM scopes WHERE scope = ?", (scope,)).fetchone()
        return None if row is None else json.loads(row[0])


def replyonce(path: str, keys: list[str]) -> tuple[float, float]:
    from replyonce import Key, ReplyOnce

    ledger = ReplyOnce(SQLiteStore(path))
    count: list = []

    async def effect(ctx):
        return effect_output(count)

    loop = asyncio.new_event_loop()

    def run(key: str) -> None:
        result = loop.run_until_complete(ledger.once(Key(key, "pay", ARGS), effect))
        assert result.ok, result.status

    return timed(keys, run, count)


def dbos(path: str, keys: list[str]) -> tuple[float, float]:
    from dbos import DBOS, SetWorkflowID

    DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{path}",
                 "run_admin_server": False})
    count: list = []

    @DBOS.step()
    def charge() -> dict:
        return effect_output(count)

    @DBOS.workflow()
    def pay(payer: str, amount_minor: int, currency: str) -> dict:
        return charge()

    DBOS.launch()

    def run(key: str) -> None:
        with SetWorkflowID(key):
            pay(**ARGS)

    try:
        return timed(keys, run, count)
    finally:
        DBOS.destroy()


def timed(keys: list[str], run, count: list) -> tuple[float, float]:
    for warm in range(20):
        run(f"warm-{warm}")
    started = time.perf_counter()
    for key in keys:
        run(key)
    fresh = time.perf_counter() - started
    done = len(count)
    started = time.perf_counter()
    for key in keys:
        run(key)
    replay = time.perf_counter() - started
    # The same keys again performed nothing.
    assert len(count) == done, "a peer performed a replayed call again"
    return len(keys) / fresh, len(keys) / replay


PEERS = {"agent-runtime-governance": governance, "replyonce": replyonce, "dbos": dbos}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True, choices=sorted(PEERS))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--round", type=int, required=True)
    args = parser.parse_args()
    path = os.path.join(args.dir, f"{args.peer}-{args.round}.sqlite3")
    keys = [f"k-{args.round}-{n}" for n in range(args.calls)]
    fresh, replay = PEERS[args.peer](path, keys)
    print(json.dumps({"fresh_per_s": fresh, "replay_per_s": replay}))


if __name__ == "__main__":
    main()
