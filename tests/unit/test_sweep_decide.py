"""The sweep's decision for one expired index entry, over every state, window and task
status: only a positively-unseeded idle slot with nothing in flight and a running task is
ever stopped as it is; an idle seeded slot is only asked to checkpoint; only a checkpointed
slot whose checkpoint counts is parked."""

from __future__ import annotations

import itertools

import pytest

from builders import EXPIRED, IDLE, NOW, changed, checkpoint, owner, record_in
from seedkeeper.domain import transitions
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import (
    ENDED_STATES,
    Absent,
    Malformed,
    SlotRecord,
    State,
    Supported,
    Unsupported,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.sweep import (
    Disposition,
    Finish,
    Leave,
    Park,
    RequestCheckpoint,
    Retain,
    Stop,
    decide,
)


def asked_never(incarnation: str) -> TaskStatus:
    raise AssertionError(f"the runtime was asked about {incarnation}")


def expected(
    state: State, record: SlotRecord, expired: bool, unsettled: bool, status: TaskStatus
) -> Disposition:
    """The rule, spelled out state by state (not derived from the code under test)."""
    if state in ENDED_STATES:
        return Leave(state.value)
    if state is State.CLOSING:
        return Retain("closing", record) if unsettled else Finish(record, park=False)
    if not expired:
        return Leave("not-idle")
    if state in {State.SEEDING, State.SEED_FAILED, State.CHECKPOINTING}:
        return Retain(state.value.replace("_", "-"), record)
    if unsettled:
        return Retain("unsettled-operations", record)
    if status is TaskStatus.UNKNOWN:
        return Retain("task-unknown", record)
    if state is State.CHECKPOINTED:
        return Park(record)  # verified work: a task already stopped is parked too
    if status is TaskStatus.STOPPED:
        return Leave("task-stopped")
    return Stop(record) if state is State.UNSEEDED else RequestCheckpoint(record)


@pytest.mark.parametrize(
    ("state", "expired", "unsettled", "status"),
    list(itertools.product(State, [True, False], [True, False], list(TaskStatus))),
)
def test_every_state_window_and_task_status(
    state: State, expired: bool, unsettled: bool, status: TaskStatus
) -> None:
    record = record_in(state)
    if unsettled and state not in ENDED_STATES:
        record = changed(
            transitions.RESERVE.decide(
                record,
                transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW),
            )
        ).record
    now = EXPIRED + 1 if expired else NOW + IDLE
    asked: list[str] = []

    def task_status(incarnation: str) -> TaskStatus:
        asked.append(incarnation)
        return status

    decision = decide(Supported(record), now=now, task_status=task_status)
    assert decision == expected(state, record, expired, unsettled, status)
    acted_on = {State.UNSEEDED, State.SEEDED, State.CHECKPOINTED}
    if not (state in acted_on and expired and not unsettled):
        assert asked == [], "the runtime is asked only about a slot the sweep may act on"
    if state is not State.UNSEEDED:
        assert not isinstance(decision, Stop)


@pytest.mark.parametrize(
    "made",
    [
        checkpoint(owner=owner(run="run-2")),  # another owner's work
        checkpoint(incarnation="local:another-task:1"),  # another task's
        checkpoint(expires_at=EXPIRED),  # kept no longer
    ],
)
def test_a_checkpoint_that_does_not_count_is_never_parked(made: object) -> None:
    record = record_in(State.CHECKPOINTED)
    wrong = record.model_copy(update={"checkpoint": made})
    decision = decide(Supported(wrong), now=EXPIRED + 1, task_status=lambda _: TaskStatus.RUNNING)
    assert decision == Retain("checkpoint-not-counted", wrong)


def test_a_park_interrupted_after_its_fence_is_finished_as_a_park() -> None:
    fenced = changed(
        transitions.FENCE_PARK.decide(record_in(State.CHECKPOINTED), transitions.At(EXPIRED + 1))
    ).record
    assert fenced.state is State.CLOSING
    assert decide(Supported(fenced), now=EXPIRED + 1, task_status=asked_never) == Finish(
        fenced, park=True
    )


def test_records_this_code_may_not_write_are_retained_without_a_write() -> None:
    assert decide(Unsupported("s", 99), now=EXPIRED, task_status=asked_never) == Retain(
        "record-unsupported", None
    )
    assert decide(Malformed("s", "rev"), now=EXPIRED, task_status=asked_never) == Retain(
        "record-malformed", None
    )
    assert decide(Absent("s"), now=EXPIRED, task_status=asked_never) == Leave("no-record")


@pytest.mark.parametrize("state", sorted(ENDED_STATES))
def test_a_tombstone_or_a_parked_slot_is_left_alone(state: State) -> None:
    ended = record_in(state)
    decision = decide(Supported(ended), now=EXPIRED + 10**6, task_status=asked_never)
    assert decision == Leave(state.value)


def test_a_park_whose_checkpoint_expired_before_it_finished_is_retained_never_retired() -> None:
    """Retiring it would hide that its work is gone: it is kept, and said why."""
    fenced = changed(
        transitions.FENCE_PARK.decide(record_in(State.CHECKPOINTED), transitions.At(EXPIRED + 1))
    ).record
    assert fenced.checkpoint is not None
    later = fenced.checkpoint.expires_at + 1
    decision = decide(Supported(fenced), now=later, task_status=asked_never)
    assert decision == Retain("checkpoint-not-counted", fenced)
    stop = fenced.window.entries[-1].ref
    retired = transitions.RETIRE.decide(
        fenced, transitions.Stopped(stop=stop, now=later, expires_at=later + 1)
    )
    assert retired == Refused("checkpointed")
