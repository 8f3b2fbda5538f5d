"""`POST /keepalive` on the seed function: the owner's touch without a seed body. One
UpdateItem extends the idle deadline (a second, `thaw`, only for a slot being
checkpointed); anyone else, a closed or absent slot, a record this code may not write: a
409 and the item untouched. Through the seed function as Lambda invokes it, against moto;
a seeded slot seeded for real by the local runtime; and once through the local stack's
gateway with `SeedkeeperClient`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from builders import NOW, checkpoint, owner, stored_in, written
from conftest import Stack, running_local_stack
from executor import client_for
from functions import event, invoke
from seedkeeper.domain import transitions
from seedkeeper.domain.record import State, Supported, slot_key
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper_client import (
    ClaimNotEchoed,
    Cold,
    KeptAlive,
    OwnerClaim,
    SeedkeeperClient,
    SeedkeeperRefused,
)
from seedkeeper_task.supervisor import CHECKOUT
from sessions import injected_session, operations
from slots import Slots, seed_function

SLOT = "slot-1"


def keepalive(slot: str, claim: dict[str, Any] | None) -> tuple[int, Any]:
    request = event("seed-new", rawPath="/keepalive", body={"slot": slot, "claim": claim})
    request["requestContext"]["http"]["path"] = "/keepalive"
    return invoke(seed_function, request)


def refusal(reason: str) -> tuple[int, dict[str, Any]]:
    return 409, {"error": reason, "detail": None, "fields": []}


def test_a_keepalive_extends_a_seeded_slots_deadline_with_one_update(
    slots: Slots, repo: Path
) -> None:
    body = slots.body(slots.publish(repo))
    slots.seed(body)
    assert slots.settle(body)[1]["seeded"] is True
    before = slots.record()
    checkout = slots.workspace() / CHECKOUT
    head = sorted(p.name for p in checkout.iterdir())
    time.sleep(1.1)  # the next deadline is a second later at least

    with injected_session() as session:
        calls = operations(session, "dynamodb")
        status, answer = keepalive(SLOT, body["claim"])

    assert calls == ["UpdateItem"]
    record = slots.record()
    assert (status, answer) == (
        200,
        {
            "slot": SLOT,
            "claim": body["claim"],
            "state": "seeded",
            "idle_deadline": record.idle_deadline,
            "frozen": False,
        },
    )
    assert record.idle_deadline > before.idle_deadline
    assert record.rev == before.rev + 1
    assert record.model_dump(exclude={"rev", "idle_deadline", "updated_at"}) == before.model_dump(
        exclude={"rev", "idle_deadline", "updated_at"}
    )
    assert slots.attempts() == ["attempt-1.json"]  # no task launched, none touched
    assert sorted(p.name for p in checkout.iterdir()) == head


def test_a_cold_slot_is_kept_alive_with_a_null_claim(slots: Slots) -> None:
    status, _ = slots.seed(slots.body(None, slot="cold-1"))
    assert status == 200
    status, answer = keepalive("cold-1", None)
    assert (status, answer["state"], answer["frozen"], answer["claim"]) == (
        200,
        "unseeded",
        False,
        None,
    )
    assert answer["idle_deadline"] == slots.record("cold-1").idle_deadline


@pytest.mark.parametrize("state", [State.CHECKPOINTING, State.CHECKPOINTED])
def test_a_keepalive_asks_back_a_slot_being_checkpointed(stack: Stack, state: State) -> None:
    """Its work is wanted: `seeded` again (the task resumes the sandbox, the park fence
    fails), and `frozen` until the task says it has resumed it. The one case of two calls."""
    lifecycle = Lifecycle(stack.table)
    record = stored_in(lifecycle, SLOT, State.CHECKPOINTING)
    op = record.window.entries[-1].ref
    # The task froze the sandbox, and for `checkpointed` captured and recorded it.
    freezing = transitions.Freezing(attempt=record.attempt, op=op, now=NOW)
    record = written(lifecycle.write(transitions.FREEZE, record, freezing))
    if state is State.CHECKPOINTED:
        made = checkpoint(incarnation=record.incarnation)
        uploaded = transitions.Uploaded(checkpoint=made, upload=op, now=NOW)
        record = written(lifecycle.write(transitions.RECORD_CHECKPOINT, record, uploaded))
    assert (record.state, record.frozen_at) == (state, NOW)

    with injected_session() as session:
        calls = operations(session, "dynamodb")
        status, answer = keepalive(SLOT, owner().model_dump())

    assert calls == ["UpdateItem", "UpdateItem"]
    thawed = lifecycle.read(SLOT)
    assert isinstance(thawed, Supported)
    now = thawed.record
    # Resumed by the task, not by the keepalive: until then the sandbox is still frozen.
    assert (now.state, now.checkpoint, now.frozen_at) == (State.SEEDED, record.checkpoint, NOW)
    assert (status, answer) == (
        200,
        {
            "slot": SLOT,
            "claim": owner().model_dump(mode="json"),
            "state": "seeded",
            "idle_deadline": now.idle_deadline,
            "frozen": True,
        },
    )


@pytest.mark.parametrize(
    ("claim", "reason"),
    [
        pytest.param(
            owner(run="run-2", requester="mallory").model_dump(), "claim-mismatch", id="other"
        ),
        pytest.param(None, "claim-mismatch", id="none"),
    ],
)
def test_another_claim_is_refused_and_the_record_untouched(
    stack: Stack, claim: dict[str, Any] | None, reason: str
) -> None:
    stored_in(Lifecycle(stack.table), SLOT, State.SEEDED)
    before = stack.wire_item(SLOT)
    assert keepalive(SLOT, claim) == refusal(reason)
    assert stack.wire_item(SLOT) == before


@pytest.mark.parametrize("state", [State.PARKED, State.LOST, State.CLOSING])
def test_a_closed_slot_is_refused_and_untouched(stack: Stack, state: State) -> None:
    """A parked slot is resumed by the owner's seed, never by a keepalive."""
    record = stored_in(Lifecycle(stack.table), SLOT, state)
    before = stack.wire_item(SLOT)
    claim = record.owner.model_dump() if record.owner else None
    assert keepalive(SLOT, claim) == refusal("slot-closed")
    assert stack.wire_item(SLOT) == before


def test_an_absent_slot_is_closed(stack: Stack) -> None:
    assert keepalive("never-born", owner().model_dump()) == refusal("slot-closed")
    assert keepalive("never-born", None) == refusal("slot-closed")


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"schema": 2}, id="newer-schema"),
        pytest.param({"rev": "2"}, id="rev-string"),
        pytest.param({"expires_at": 1_800_000_000}, id="expires-at-on-a-live-record"),
    ],
)
def test_a_record_this_code_may_not_write_is_never_touched(
    stack: Stack, changes: dict[str, Any]
) -> None:
    stored_in(Lifecycle(stack.table), SLOT, State.SEEDED)
    item = stack.table.get_item(Key=slot_key(SLOT), ConsistentRead=True)["Item"]
    stack.table.put_item(Item=item | changes)
    before = stack.wire_item(SLOT)
    assert keepalive(SLOT, owner().model_dump()) == refusal("record-unsupported")
    assert stack.wire_item(SLOT) == before


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"slot": SLOT}, id="claim-missing"),
        pytest.param({"slot": SLOT, "claim": None, "seed": None}, id="a-seed-body"),
        pytest.param({"slot": SLOT, "claim": None, "bearer": "token"}, id="unknown-field"),
        pytest.param({"slot": "../x", "claim": None}, id="bad-slot"),
    ],
)
def test_a_body_that_is_not_a_keepalive_is_invalid(stack: Stack, body: dict[str, Any]) -> None:
    request = event("seed-new", rawPath="/keepalive", body=json.dumps(body))
    request["requestContext"]["http"]["path"] = "/keepalive"
    status, answer = invoke(seed_function, request)
    assert (status, answer["error"]) == (400, "invalid-request")


def executors_claim() -> OwnerClaim:
    """The builders' owner, as the executor's client holds it."""
    return OwnerClaim.model_validate(owner().model_dump())


def test_the_client_keeps_a_slot_alive_through_the_local_gateway(
    tmp_path: Path, aws_credentials: None
) -> None:
    with running_local_stack(tmp_path) as stack:
        client = client_for(stack)
        assert isinstance(client.seed("cold-1", None), Cold)
        kept = client.keepalive("cold-1", None)
        assert isinstance(kept, KeptAlive)
        assert (kept.slot, kept.state, kept.frozen) == ("cold-1", "unseeded", False)
        with pytest.raises(SeedkeeperRefused) as refused:
            client.keepalive("cold-1", executors_claim())
        assert (refused.value.status, refused.value.reason) == (409, "claim-mismatch")


def test_a_keepalive_answer_about_another_slot_or_claim_raises() -> None:
    asked = executors_claim()
    claim = asked.model_dump(mode="json")
    fields = {"slot": "slot-2", "state": "seeded", "idle_deadline": 1, "frozen": False}
    text = json.dumps({**fields, "claim": claim}).encode()
    assert SeedkeeperClient._kept_alive(text, "slot-2", asked).slot == "slot-2"
    for slot, claimed in (("slot-1", asked), ("slot-2", None)):
        with pytest.raises(ClaimNotEchoed):
            SeedkeeperClient._kept_alive(text, slot, claimed)
    cold = json.dumps({**fields, "claim": None}).encode()
    with pytest.raises(ClaimNotEchoed):  # a claimed slot never answers as unclaimed
        SeedkeeperClient._kept_alive(cold, "slot-2", asked)
