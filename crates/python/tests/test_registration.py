"""What the ledger refuses of its operator and its host, with nothing changed: a second
tool under a name it already serves, and settling by hand an operation a worker holds
under a live lease."""

from __future__ import annotations

import pytest

import toolledger as tl
from conftest import PAYMENT_INPUT, PAYMENT_OUTPUT, pay_function, payment_tool

PAY = {"payer": "bob", "amount_minor": 2500, "currency": "EUR"}
NOW = 1_767_225_600


def test_a_second_tool_under_a_registered_name_is_refused_and_the_first_kept(sqlite_location):
    performed: list = []
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        first = pay_function(ledger, performed, "first")
        with pytest.raises(tl.InvalidError) as refused:
            pay_function(ledger, performed, "second")
        assert refused.value.code == "USAGE_ERROR"
        assert "pay" in refused.value.message and "already" in refused.value.message
        assert ledger.tools == ["pay"]
        assert first(PAY, key="k-1").done
        assert performed == ["first"]


def test_a_tool_under_the_name_of_a_given_tool_is_refused(sqlite_location, payments):
    performed: list = []
    with tl.Ledger.open(sqlite_location, tools=[payment_tool()], downstream=payments,
                        tenant="acme", subject="user-1") as ledger:
        with pytest.raises(tl.InvalidError) as refused:
            pay_function(ledger, performed, "python")
        assert refused.value.code == "USAGE_ERROR"
        assert ledger.dispatch(tl.Call("pay", PAY, key="k-1")).done
        assert performed == [] and len(payments.effects) == 1


def test_the_simulations_refund_order_is_not_a_registration(sqlite_location):
    # A ledger opened with nothing runs the built-in refund_order on the simulation, for
    # trying the contract; the first tool registered ends the simulation, so a tool of
    # that name is not a second one.
    performed: list = []
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1") as ledger:
        assert ledger.tools == ["refund_order"]
        mine = pay_function(ledger, performed, "mine", name="refund_order")
        assert ledger.tools == ["refund_order"]
        assert mine(PAY, key="k-1").done and performed == ["mine"]


def test_resolve_answers_lease_held_while_a_worker_holds_the_lease(sqlite_location):
    # An operator's ledger settles by hand while another process's worker is inside the
    # downstream: the request may be in flight, so the operation is left alone.
    seen: dict = {}
    with tl.Ledger.open(sqlite_location, tenant="acme", subject="user-1",
                        lease_seconds=30) as ledger:
        @ledger.tool(input_schema=PAYMENT_INPUT, output_schema=PAYMENT_OUTPUT)
        def pay(payer, amount_minor, currency, note=None):
            "Pay a payer."
            with tl.Ledger.open(sqlite_location) as operator:
                [row] = operator.list(at=NOW + 1)
                seen["state"] = row["state"]
                seen["status_ref"] = row["status_ref"]
                with pytest.raises(tl.InvalidError) as held:
                    operator.resolve(row["status_ref"], reason="not in the bank's records",
                                     not_happened=True, at=NOW + 29)
                seen["code"], seen["message"] = held.value.code, held.value.message
            return {"payment_id": "pay-1", "amount_minor": amount_minor, "currency": currency}

        done = pay(PAY, key="k-1", at=NOW)
        assert done.done
        assert seen["code"] == "LEASE_HELD" and "lease" in seen["message"]
        # Nothing was written: the worker's receipt settled it, and it has ended.
        assert ledger.show(seen["status_ref"])["operator_log"] == []
        with pytest.raises(tl.InvalidError) as ended:
            ledger.resolve(seen["status_ref"], reason="too late", not_happened=True,
                           at=NOW + 60)
        assert ended.value.code == "NOT_RESOLVABLE"
