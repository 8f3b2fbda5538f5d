"""Each transition's checks mean the same in both places they are made: decided on the
record as read (`holds`, what `Transition.decide` asks) and as the DynamoDB condition the
store derives from them (`store.lifecycle._checks`), evaluated by moto on the stored item.
Every transition, against a record in every state, with params that pass and that fail."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from boto3.dynamodb.conditions import ConditionBase
from botocore.exceptions import ClientError
from mypy_boto3_dynamodb.service_resource import Table

from builders import (
    EXPIRED,
    IDLE,
    INCARNATION,
    NOW,
    changed,
    checkpoint,
    loss,
    owner,
    record_in,
    seed,
    success,
)
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import Actor, OpKind, OpRef
from seedkeeper.domain.record import SlotRecord, State, encode, slot_key
from seedkeeper.store.lifecycle import _checks


def launch(record: SlotRecord, generation: int) -> OpRef:
    return OpRef(ordinal=1, actor=Actor.SEED_FN, generation=generation)


def upload(record: SlotRecord, generation: int) -> OpRef:
    return OpRef(ordinal=2, actor=Actor.SLOT_TASK, generation=generation)


# The slot's own stopping task, a superseded attempt's, another incarnation's.
STOPPING: list[Callable[[SlotRecord], Any]] = [
    lambda r: transitions.Stopping(r.attempt, r.incarnation or INCARNATION, now=EXPIRED),
    lambda r: transitions.Stopping(r.attempt + 1, r.incarnation or INCARNATION, now=EXPIRED),
    lambda r: transitions.Stopping(r.attempt, "local:another:1", now=EXPIRED),
]

# Per transition: params built from the record (the slot's own, or a stranger's/a late one).
PARAMS: dict[str, list[Callable[[SlotRecord], Any]]] = {
    "touch": [
        lambda r: transitions.Poll(r.binding, now=NOW, idle_deadline=NOW + IDLE),
        lambda r: transitions.Poll(Binding(), now=NOW, idle_deadline=NOW + IDLE),
        lambda r: transitions.Poll(
            r.binding.model_copy(update={"owner": owner(run="run-2")}),
            now=NOW,
            idle_deadline=NOW + IDLE,
        ),
    ],
    "keepalive": [
        lambda r: transitions.KeepAlive(r.owner, now=NOW, idle_deadline=NOW + IDLE),
        lambda r: transitions.KeepAlive(None, now=NOW, idle_deadline=NOW + IDLE),
        lambda r: transitions.KeepAlive(owner(run="run-2"), now=NOW, idle_deadline=NOW + IDLE),
    ],
    "resume": [
        lambda r: transitions.Poll(r.binding, now=EXPIRED, idle_deadline=EXPIRED + IDLE),
        lambda r: transitions.Poll(Binding(), now=EXPIRED, idle_deadline=EXPIRED + IDLE),
        lambda r: transitions.Poll(
            r.binding.model_copy(update={"seed": seed(sha="c" * 40)}),
            now=EXPIRED,
            idle_deadline=EXPIRED + IDLE,
        ),
        lambda r: transitions.Poll(
            r.binding.model_copy(update={"origin": "https://git.example.com/acme/other.git"}),
            now=EXPIRED,
            idle_deadline=EXPIRED + IDLE,
        ),
    ],
    "record_incarnation": [
        lambda r: transitions.Launched(INCARNATION, launch(r, r.attempt), now=NOW),
        lambda r: transitions.Launched(INCARNATION, launch(r, r.attempt + 1), now=NOW),
    ],
    "settle_seed": [
        lambda r: transitions.Verdict(
            r.attempt,
            OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=r.attempt),
            success(),
            now=NOW,
        ),
        lambda r: transitions.Verdict(
            r.attempt + 1,
            OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=r.attempt + 1),
            success(),
            now=NOW,
        ),
    ],
    "begin_attempt": [lambda r: transitions.At(NOW)],
    "fence": [
        lambda r: transitions.At(NOW),
        lambda r: transitions.At(r.idle_deadline),  # the boundary: not yet idle
        lambda r: transitions.At(r.idle_deadline + 1),
        lambda r: transitions.At(EXPIRED),
    ],
    "retire": [lambda r: transitions.Stopped(launch(r, 1), now=NOW, expires_at=EXPIRED)],
    "request_checkpoint": [
        lambda r: transitions.At(r.idle_deadline),
        lambda r: transitions.At(r.idle_deadline + 1),
    ],
    "freeze": [
        lambda r: transitions.Freezing(r.attempt, upload(r, r.attempt), now=NOW),
        lambda r: transitions.Freezing(r.attempt + 1, upload(r, r.attempt + 1), now=NOW),
    ],
    "thaw": [
        lambda r: transitions.Poll(r.binding, now=NOW, idle_deadline=NOW + IDLE),
        lambda r: transitions.Poll(Binding(), now=NOW, idle_deadline=NOW + IDLE),
    ],
    "thawed": [
        lambda r: transitions.Thawed(r.attempt, None, now=NOW),
        lambda r: transitions.Thawed(r.attempt + 1, upload(r, r.attempt + 1), now=NOW),
    ],
    "record_checkpoint": [
        lambda r: transitions.Uploaded(
            checkpoint(owner=r.owner, incarnation=r.incarnation or INCARNATION),
            upload(r, r.attempt),
            now=NOW,
        ),
        lambda r: transitions.Uploaded(
            checkpoint(owner=owner(run="run-2")), upload(r, r.attempt), NOW
        ),
        lambda r: transitions.Uploaded(
            checkpoint(owner=r.owner, incarnation="local:another:1"), upload(r, r.attempt), NOW
        ),
        lambda r: transitions.Uploaded(
            checkpoint(owner=r.owner, incarnation=r.incarnation or INCARNATION),
            upload(r, r.attempt + 1),
            now=NOW,
        ),
    ],
    "checkpoint_failed": [
        lambda r: transitions.CheckpointFailed(upload(r, r.attempt), "upload-failed", now=NOW),
        lambda r: transitions.CheckpointFailed(upload(r, r.attempt + 1), "upload-failed", NOW),
    ],
    "fence_park": [
        lambda r: transitions.At(r.idle_deadline),
        lambda r: transitions.At(EXPIRED + 1),
    ],
    "park": [lambda r: transitions.Parked(launch(r, 1), now=NOW, expires_at=EXPIRED)],
    "checkpoint_on_stop": STOPPING,
    "park_on_stop": STOPPING,
    "lose": [
        lambda r: transitions.Lost(r.incarnation or INCARNATION, loss(), expires_at=EXPIRED),
        lambda r: transitions.Lost("local:another:1", loss(), expires_at=EXPIRED),
    ],
    "note_retained": [lambda r: transitions.Retained("seeded", now=NOW)],
    "reserve": [lambda r: transitions.Reservation(OpKind.LAUNCH, Actor.SLOT_TASK, NOW)],
    "settle": [lambda r: transitions.Settlement(launch(r, 1), "launched", NOW)],
}


def test_every_transition_is_exercised() -> None:
    assert set(PARAMS) == {transition.name for transition in transitions.TRANSITIONS}


def busy(state: State) -> SlotRecord:
    """A record in `state` with other work in flight (a launch reserved)."""
    return changed(
        transitions.RESERVE.decide(
            record_in(state), transitions.Reservation(OpKind.LAUNCH, Actor.SEED_FN, NOW)
        )
    ).record


# A record in every state, and busy in the states whose window a check reads (`open_ops`).
BUSY = (State.UNSEEDED, State.SEEDED, State.CHECKPOINTED)
RECORDS: dict[str, Callable[[], SlotRecord]] = {
    **{state.value: partial(record_in, state) for state in State},
    **{f"{state}-busy": partial(busy, state) for state in BUSY},
}

CASES = [
    pytest.param(transition, reach, make, id=f"{transition.name}-{name}-{index}")
    for transition in transitions.TRANSITIONS
    for name, reach in RECORDS.items()
    for index, make in enumerate(PARAMS[transition.name])
]


@pytest.mark.parametrize(("transition", "reach", "make"), CASES)
def test_the_condition_holds_exactly_when_the_checks_do(
    table: Table,
    transition: transitions.Transition[Any],
    reach: Callable[[], SlotRecord],
    make: Callable[[SlotRecord], Any],
) -> None:
    record = reach()
    params = make(record)
    item = encode(record)
    table.put_item(Item=item)
    decided = all(transitions.holds(c, record, item, params) for c in transition.checks)
    assert condition_holds(table, record, _checks(transition, params)) is decided


def condition_holds(table: Table, record: SlotRecord, condition: ConditionBase) -> bool:
    try:
        table.update_item(
            Key=slot_key(record.slot),
            UpdateExpression="SET #rev = #rev",  # writes nothing new: only the condition
            ExpressionAttributeNames={"#rev": "rev"},
            ConditionExpression=condition,
        )
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        return False
    return True
