"""The sweep's decision for one expired index entry, over every state, window and task
status: only a positively-unseeded idle slot with nothing in flight and a running task is
ever stopped as it is; an idle seeded slot is only asked to checkpoint; only a checkpointed
slot whose checkpoint counts is parked; an idle seeded or checkpointing slot whose task
stopped is recorded lost, with the runtime's cause."""

from __future__ import annotations

import itertools

import pytest

from builders import (
    EXPIRED,
    IDLE,
    INCARNATION,
    LOST_RETENTION,
    NOW,
    changed,
    checkpoint,
    owner,
    record_in,
)
from seedkeeper.domain import transitions
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import (
    ENDED_STATES,
    Absent,
    Classified,
    Loss,
    Malformed,
    SlotRecord,
    State,
    Supported,
    Unsupported,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, TaskState, TaskStatus
from seedkeeper.domain.sweep import (
    Disposition,
    Finish,
    Leave,
    Lose,
    Park,
    RequestCheckpoint,
    Retain,
    Stop,
    asks,
    decide,
)

RETENTION = LOST_RETENTION
SPOT = TaskState.stopped("SpotInterruption", "Your Spot Task was interrupted.")


def asked_never(incarnation: str) -> TaskState:
    raise AssertionError(f"the runtime was asked about {incarnation}")


def lost(record: SlotRecord, task: TaskState, now: int) -> Lose:
    loss = Loss(reason=task.reason, detail=task.detail, at=now)
    return Lose(record, transitions.Lost(INCARNATION, loss, expires_at=now + RETENTION))


def expected(
    state: State, record: SlotRecord, expired: bool, unsettled: bool, task: TaskState, *, now: int
) -> Disposition:
    """The rule, spelled out state by state (not derived from the code under test)."""
    if state in ENDED_STATES:
        return Leave(state.value)
    if state is State.CLOSING:
        return Retain("closing", record) if unsettled else Finish(record, park=False)
    if not expired:
        return Leave("not-idle")
    if state in {State.SEEDING, State.SEED_FAILED}:
        return Retain(state.value.replace("_", "-"), record)
    if unsettled:  # a checkpointing slot's too: its loss could not be written
        return Retain("unsettled-operations", record)
    if task.status is TaskStatus.UNKNOWN:
        return Retain("task-unknown", record)
    if state is State.CHECKPOINTED:
        return Park(record)  # verified work: a task already stopped is parked too
    if task.status is TaskStatus.STOPPED:
        # A cold slot had nothing to lose; a seeded or checkpointing one's work is gone.
        return Leave("task-stopped") if state is State.UNSEEDED else lost(record, task, now)
    if state is State.CHECKPOINTING:
        return Retain("checkpointing", record)  # its task is at work on it
    return Stop(record) if state is State.UNSEEDED else RequestCheckpoint(record)


@pytest.mark.parametrize(
    ("state", "expired", "unsettled", "task"),
    list(itertools.product(State, [True, False], [True, False], [RUNNING, UNKNOWN, SPOT])),
)
def test_every_state_window_and_task_status(
    state: State, expired: bool, unsettled: bool, task: TaskState
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

    def task_status(incarnation: str) -> TaskState:
        asked.append(incarnation)
        return task

    entry = Supported(record)
    decision = decide(entry, now=now, retention=RETENTION, task_status=task_status)
    assert decision == expected(state, record, expired, unsettled, task, now=now)
    acted_on = {State.UNSEEDED, State.SEEDED, State.CHECKPOINTING, State.CHECKPOINTED}
    if not (state in acted_on and expired and not unsettled):
        assert asked == [], "the runtime is asked only about a slot the sweep may act on"
    assert asks(entry, now=now, retention=RETENTION) == (asked[0] if asked else None)
    if state is not State.UNSEEDED:
        assert not isinstance(decision, Stop)
    if isinstance(decision, Lose):  # and the loss is one the transition writes
        written = changed(transitions.LOSE.decide(record, decision.lost)).record
        assert (written.state, written.loss) == (State.LOST, decision.lost.loss)
        assert written.expires_at == now + RETENTION


@pytest.mark.parametrize("task", [RUNNING, UNKNOWN, SPOT])
def test_a_checkpointed_slot_whose_checkpoint_stopped_counting_is_lost_once_its_task_stopped(
    task: TaskState,
) -> None:
    """Its work is verified nowhere: kept while the task runs, recorded lost once it
    stopped, never parked and never retired."""
    record = record_in(State.CHECKPOINTED)
    assert record.checkpoint is not None
    expired = record.model_copy(
        update={"checkpoint": record.checkpoint.model_copy(update={"expires_at": EXPIRED})}
    )
    decision = decide(
        Supported(expired), now=EXPIRED + 1, retention=RETENTION, task_status=lambda _: task
    )
    assert (
        decision
        == {
            TaskStatus.RUNNING: Retain("checkpoint-not-counted", expired),
            TaskStatus.UNKNOWN: Retain("task-unknown", expired),
            TaskStatus.STOPPED: lost(expired, task, EXPIRED + 1),
        }[task.status]
    )


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
    decision = decide(
        Supported(wrong), now=EXPIRED + 1, retention=RETENTION, task_status=lambda _: RUNNING
    )
    assert decision == Retain("checkpoint-not-counted", wrong)


def test_a_park_interrupted_after_its_fence_is_finished_as_a_park() -> None:
    fenced = changed(
        transitions.FENCE_PARK.decide(record_in(State.CHECKPOINTED), transitions.At(EXPIRED + 1))
    ).record
    assert fenced.state is State.CLOSING
    decision = decide(
        Supported(fenced), now=EXPIRED + 1, retention=RETENTION, task_status=asked_never
    )
    assert decision == Finish(fenced, park=True)


def test_records_this_code_may_not_write_are_retained_without_a_write() -> None:
    cases: list[tuple[Classified, Disposition]] = [
        (Unsupported("s", 99), Retain("record-unsupported", None)),
        (Malformed("s", "rev"), Retain("record-malformed", None)),
        (Absent("s"), Leave("no-record")),
    ]
    for entry, disposition in cases:
        assert decide(entry, now=EXPIRED, retention=RETENTION, task_status=asked_never) == (
            disposition
        )


@pytest.mark.parametrize("state", sorted(ENDED_STATES))
def test_a_tombstone_a_parked_or_a_lost_slot_is_left_alone(state: State) -> None:
    ended = record_in(state)
    decision = decide(
        Supported(ended), now=EXPIRED + 10**6, retention=RETENTION, task_status=asked_never
    )
    assert decision == Leave(state.value)


def test_a_park_whose_checkpoint_expired_before_it_finished_is_retained_never_retired() -> None:
    """Retiring it would hide that its work is gone: it is kept, and said why."""
    fenced = changed(
        transitions.FENCE_PARK.decide(record_in(State.CHECKPOINTED), transitions.At(EXPIRED + 1))
    ).record
    assert fenced.checkpoint is not None
    later = fenced.checkpoint.expires_at + 1
    decision = decide(Supported(fenced), now=later, retention=RETENTION, task_status=asked_never)
    assert decision == Retain("checkpoint-not-counted", fenced)
    stop = fenced.window.entries[-1].ref
    retired = transitions.RETIRE.decide(
        fenced, transitions.Stopped(stop=stop, now=later, expires_at=later + 1)
    )
    assert retired == Refused("checkpointed")
