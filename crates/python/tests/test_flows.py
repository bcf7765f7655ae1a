"""The seed's flows from Python, on SQLite and on PostgreSQL through the same API."""

from __future__ import annotations

import threading

import pytest

import toolledger as tl
from conftest import Payments, payment_tool

ARGS = {"payer": "bob", "amount_minor": 2500, "currency": "EUR"}


def open_ledger(location, payments, **options):
    options.setdefault("tenant", "acme")
    options.setdefault("subject", "user-1")
    return tl.Ledger.open(location, tools=[payment_tool()], downstream=payments, **options)


def test_fresh_then_replay_without_a_second_effect(location, payments):
    with open_ledger(location, payments) as ledger:
        call = tl.Call("pay", ARGS, key="pay-bob-1")
        first = ledger.dispatch(call)
        assert isinstance(first.outcome, tl.Fresh)
        assert first.code == "OK" and first.done
        assert first.output == {"payment_id": "pay-1", "amount_minor": 2500, "currency": "EUR"}
        again = ledger.dispatch(call)
        assert isinstance(again.outcome, tl.Replayed)
        assert again.output == first.output
        assert again.status_ref == first.status_ref
        assert again.outcome.result_sha256 == first.outcome.result_sha256
        assert payments.effects == [first.outcome.request_sha256 and payments.effects[0]]
        assert len(payments.effects) == 1
        assert first.package["gate"] == "PASS"
        assert first.canonical().startswith('{"code":"OK"')
        assert ledger.audit().passed


def test_a_key_reused_for_another_intent_is_a_conflict(location, payments):
    with open_ledger(location, payments) as ledger:
        ledger.dispatch(tl.Call("pay", ARGS, key="pay-bob-1"))
        other = ledger.dispatch(tl.Call("pay", {**ARGS, "amount_minor": 9999}, key="pay-bob-1"))
        assert isinstance(other.outcome, tl.Blocked)
        assert other.code == other.outcome.code == "IDEMPOTENCY_CONFLICT"
        assert other.output is None and not other.done
        assert len(payments.effects) == 1


def test_commit_then_drop_is_unknown_until_the_status_query_reconciles(location, payments):
    with open_ledger(location, payments) as ledger:
        call = tl.Call("pay", ARGS, key="pay-bob-1")
        payments.mode = "drop"
        lost = ledger.dispatch(call)
        assert isinstance(lost.outcome, tl.Unknown)
        assert lost.code == "OUTCOME_UNKNOWN"
        payments.mode = None
        # A retry under the same key never performs it again: still unknown.
        assert isinstance(ledger.dispatch(call).outcome, tl.Unknown)
        settled = ledger.status(lost.status_ref, call)
        assert isinstance(settled.outcome, tl.Reconciled)
        assert settled.output == {"payment_id": "pay-1", "amount_minor": 2500, "currency": "EUR"}
        assert isinstance(ledger.dispatch(call).outcome, tl.Replayed)
        assert len(payments.effects) == 1
        assert ledger.audit().passed


def test_a_host_that_kept_only_the_ref_asks_by_it(location, payments):
    with open_ledger(location, payments) as ledger:
        payments.mode = "drop"
        lost = ledger.dispatch(tl.Call("pay", ARGS, key="pay-bob-1"))
        payments.mode = None
    with open_ledger(location, payments) as restarted:
        settled = restarted.status(lost.status_ref)
        assert isinstance(settled.outcome, tl.Reconciled)
        # Another principal is told nothing about it.
        assert restarted.status(lost.status_ref, subject="user-2").code == "NOT_FOUND"
        assert len(payments.effects) == 1


@pytest.mark.parametrize(
    "mode, code, effects",
    [
        ("raise", "OUTCOME_UNKNOWN", 0),
        ("garbage", "OUTCOME_UNKNOWN", 0),
        ("drop", "OUTCOME_UNKNOWN", 1),
        ("refuse", "DOWNSTREAM_REFUSED", 0),
        ("not_sent", "DOWNSTREAM_UNAVAILABLE", 0),
        ("off_schema", "RECEIPT_QUARANTINED", 1),
    ],
)
def test_a_python_downstream_failing_at_each_stage_is_answered_honestly(
    sqlite_location, payments, mode, code, effects
):
    with open_ledger(sqlite_location, payments) as ledger:
        payments.mode = mode
        reply = ledger.dispatch(tl.Call("pay", ARGS, key="k-1"))
        assert reply.code == code
        assert reply.status_ref is not None
        assert len(payments.effects) == effects
        payments.mode = None
        # Whatever happened, the same key never pays twice.
        ledger.dispatch(tl.Call("pay", ARGS, key="k-1"))
        ledger.status(reply.status_ref, tl.Call("pay", ARGS, key="k-1"))
        assert len(payments.effects) <= max(effects, 1)
        if mode in ("raise", "garbage"):
            # The code ran: it is never "nothing happened", whatever the lookup says.
            assert len(payments.effects) == 0
            shown = ledger.show(reply.status_ref)
            assert shown["status"] != "failed"


def test_a_lookup_that_raises_leaves_the_outcome_unknown(sqlite_location, payments):
    with open_ledger(sqlite_location, payments) as ledger:
        call = tl.Call("pay", ARGS, key="k-1")
        payments.mode = "drop"
        lost = ledger.dispatch(call)
        payments.mode, payments.lookup_raises = None, True
        assert isinstance(ledger.status(lost.status_ref, call).outcome, tl.Unknown)
        payments.lookup_raises = False
        assert isinstance(ledger.status(lost.status_ref, call).outcome, tl.Reconciled)
        assert len(payments.effects) == 1


def test_an_unknown_no_lookup_can_tell_is_settled_by_an_operator(sqlite_location, payments):
    now = 1_767_225_600
    with open_ledger(sqlite_location, payments) as ledger:
        call = tl.Call("pay", ARGS, key="k-1", at=now)
        payments.mode, payments.lookups = "drop", False
        lost = ledger.dispatch(call)
        payments.mode = None
        assert isinstance(ledger.status(lost.status_ref, call).outcome, tl.Unknown)
        # Once the worker's lease has run out, it is listed as unknown.
        later = now + 120
        listed = ledger.list(state="unknown", at=later)
        assert [row["status_ref"] for row in listed] == [lost.status_ref]
        # The provider's own records show the payment: settled with it.
        found = payments.by_ref[payments.effects[0]]
        with pytest.raises(tl.InvalidError) as refused:
            ledger.resolve(lost.status_ref, reason="seen in the provider's dashboard",
                           output={**found, "amount_minor": 1}, at=later)
        assert refused.value.code == "INPUT_INVALID"
        assert ledger.resolve(lost.status_ref, reason="seen in the provider's dashboard",
                              output=found, at=later) == "succeeded"
        assert ledger.dispatch(tl.Call("pay", ARGS, key="k-1", at=later)).output == found
        assert ledger.show(lost.status_ref)["operator_log"][0]["action"] == "resolve"
        assert len(payments.effects) == 1
        assert ledger.audit().passed


def test_enqueue_then_a_worker_or_the_relay_performs_it(location, payments):
    with open_ledger(location, payments) as ledger:
        accepted = ledger.enqueue(tl.Call("pay", ARGS, key="k-1"))
        assert isinstance(accepted.outcome, tl.Accepted)
        assert accepted.code == "ACCEPTED" and payments.effects == []
        worked = ledger.process(accepted.status_ref)
        assert isinstance(worked.outcome, tl.Fresh)
        for n in range(40):
            ledger.enqueue(tl.Call("pay", {**ARGS, "amount_minor": 100 + n}, key=f"batch-{n}"))
        drained = ledger.relay(workers=4, batch=8)
        assert drained["delivered"] == 40 and drained["claimed"] == 40
        assert len(payments.effects) == 41
        assert len(set(payments.effects)) == 41
        assert ledger.list(state="pending") == []
        assert ledger.audit().passed


def test_the_relay_runs_until_its_stop_event_is_set(sqlite_location, payments):
    with open_ledger(sqlite_location, payments) as ledger:
        stop = threading.Event()
        done = {}
        worker = threading.Thread(
            target=lambda: done.update(ledger.relay(workers=2, stop=stop, poll=0.01))
        )
        worker.start()
        for n in range(10):
            ledger.enqueue(tl.Call("pay", {**ARGS, "amount_minor": 100 + n}, key=f"late-{n}"))
        deadline = threading.Event()
        for _ in range(500):
            if len(payments.effects) == 10:
                break
            deadline.wait(0.01)
        stop.set()
        worker.join(timeout=30)
        assert not worker.is_alive()
        assert done["delivered"] == 10 and len(payments.effects) == 10


APPROVED = {"required": True, "max_validity_seconds": 3600}


def test_an_approval_is_bound_to_the_call_and_expires(location, payments):
    now = 1_767_225_600
    tool = payment_tool(approval=APPROVED)
    with tl.Ledger.open(location, tools=[tool], downstream=payments, tenant="acme",
                        subject="user-1") as ledger:
        assert tool.requires_approval
        bare = ledger.dispatch(tl.Call("pay", ARGS, key="k-1", at=now))
        assert bare.code == "APPROVAL_INVALID"
        grant = tl.Approval("appr-1", "lead-2", now - 10, now + 600,
                            eligible_approvers=["lead-2"])
        # Not an approver of this call.
        stranger = tl.Approval("appr-2", "intern-9", now - 10, now + 600,
                               eligible_approvers=["lead-2"])
        assert ledger.dispatch(tl.Call("pay", ARGS, key="k-2", at=now,
                                       approval=stranger)).code == "APPROVAL_INVALID"
        # Expired before the call.
        late = ledger.dispatch(tl.Call("pay", ARGS, key="k-3", at=now + 601, approval=grant))
        assert late.code == "APPROVAL_EXPIRED"
        # Valid longer than the policy allows.
        long = tl.Approval("appr-3", "lead-2", now - 10, now + 7200, eligible_approvers=["lead-2"])
        assert ledger.dispatch(tl.Call("pay", ARGS, key="k-4", at=now,
                                       approval=long)).code == "APPROVAL_INVALID"
        approved = ledger.dispatch(tl.Call("pay", ARGS, key="k-5", at=now, approval=grant))
        assert isinstance(approved.outcome, tl.Fresh)
        assert len(payments.effects) == 1


OWNED = {"owner": "/payer", "act_for_others": ["agent"]}


def test_a_revoked_role_is_refused_at_the_next_step(location, payments):
    roles = {"agent-7": ["agent"]}
    with tl.Ledger.open(location, tools=[payment_tool(authorization=OWNED)], downstream=payments,
                        tenant="acme", roles=lambda tenant, subject: roles.get(subject, [])) as ledger:
        call = tl.Call("pay", ARGS, key="k-1", subject="agent-7")
        assert isinstance(ledger.dispatch(call).outcome, tl.Fresh)
        assert isinstance(ledger.dispatch(call).outcome, tl.Replayed)
        roles["agent-7"] = []
        # Roles are asked again at every step and never stored: the replay is refused.
        assert ledger.dispatch(call).code == "NOT_FOUND"
        # Bob acts on his own behalf.
        own = tl.Call("pay", ARGS, key="k-2", subject="bob")
        assert isinstance(ledger.dispatch(own).outcome, tl.Fresh)
        assert len(payments.effects) == 2


def test_a_role_resolver_that_fails_accepts_nothing(sqlite_location, payments):
    def broken(tenant, subject):
        raise OSError("the directory is down")

    with tl.Ledger.open(sqlite_location, tools=[payment_tool(authorization=OWNED)],
                        downstream=payments, tenant="acme", roles=broken) as ledger:
        with pytest.raises(tl.RolesError) as failed:
            ledger.dispatch(tl.Call("pay", ARGS, key="k-1", subject="agent-7"))
        assert failed.value.code == "ROLES_UNAVAILABLE"
        assert isinstance(failed.value, tl.Error)
        # The resolver's own exception is kept as the cause, for the host's traceback.
        assert isinstance(failed.value.__cause__, OSError)
        assert str(failed.value.__cause__) == "the directory is down"
        assert ledger.list() == [] and payments.effects == []


def test_bad_input_is_a_stable_error_and_writes_nothing(sqlite_location, payments):
    with open_ledger(sqlite_location, payments) as ledger:
        for bad in ("", "a key with spaces", "k" * 300):
            with pytest.raises(tl.InvalidError) as refused:
                ledger.dispatch(tl.Call("pay", ARGS, key=bad))
            assert refused.value.code == "USAGE_ERROR"
        with pytest.raises(tl.InvalidError):
            tl.Call("pay", {"payer": object()}, key="k")
        nested: list = []
        nested.append(nested)
        deep = ledger.dispatch(tl.Call("pay", {"payer": nested}, key="k"))
        assert deep.package["detail"] == {"pointer": "/payer" + "/0" * 31, "keyword": "depth"}
        schema = ledger.dispatch(tl.Call("pay", {**ARGS, "currency": "GBP"}, key="k-1"))
        assert schema.code == "INPUT_INVALID"
        assert schema.package["detail"] == {"keyword": "enum", "pointer": "/currency"}
        assert ledger.dispatch(tl.Call("nope", ARGS, key="k-1")).code == "INPUT_INVALID"
        with pytest.raises(tl.InvalidError):
            ledger.dispatch(tl.Call("pay", ARGS, key="k-1", tenant="acme", subject=None,
                                    model_call=tl.ModelCall("nobody", "x", "y", "r", "c")))
        with pytest.raises(tl.InvalidError):
            ledger.status("not-a-ref")
        assert ledger.list() == [] and payments.effects == []
    with pytest.raises(tl.InvalidError) as closed:
        ledger.dispatch(tl.Call("pay", ARGS, key="k-1"))
    assert closed.value.code == "USAGE_ERROR"


def test_a_call_needs_a_principal(sqlite_location, payments):
    with tl.Ledger.open(sqlite_location, tools=[payment_tool()], downstream=payments) as ledger:
        with pytest.raises(tl.InvalidError, match="principal"):
            ledger.dispatch(tl.Call("pay", ARGS, key="k-1"))
        reply = ledger.dispatch(tl.Call("pay", ARGS, key="k-1", tenant="acme", subject="u-1"))
        assert reply.done


def test_a_bad_tool_is_refused_with_its_pointer():
    with pytest.raises(tl.InvalidError) as refused:
        tl.Tool("bad", description="x", input_schema={"type": "object", "requried": ["a"]},
                output_schema={"type": "object"})
    assert refused.value.code == "USAGE_ERROR"
    assert "/input_schema" in refused.value.message


def test_a_store_of_another_kind_is_a_store_error(tmp_path, payments):
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(tl.StoreError) as refused:
        open_ledger(str(junk), payments)
    assert refused.value.code in ("STORE_ERROR", "SCHEMA_UNSUPPORTED")
    assert str(tmp_path) not in str(refused.value)


def test_operators_list_show_and_requeue(location, payments):
    with open_ledger(location, payments) as ledger:
        payments.mode = "refuse"
        refused = ledger.dispatch(tl.Call("pay", ARGS, key="k-1"))
        payments.mode = None
        assert ledger.show(refused.status_ref)["status"] == "failed"
        assert ledger.show("sr_" + "0" * 32) is None
        assert ledger.requeue(refused.status_ref, reason="the card was replaced") == "requeued"
        assert ledger.process(refused.status_ref).done
        assert ledger.requeue(refused.status_ref, reason="again") == "succeeded"
        assert ledger.requeue("sr_" + "0" * 32, reason="again") == "missing"
        rows = ledger.list(arguments=True)
        assert [row["state"] for row in rows] == ["succeeded"]
        assert len(payments.effects) == 1
