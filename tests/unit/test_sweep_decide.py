"""The sweep's decision for one expired index entry, over every state, window and task
status: only a positively-unseeded idle slot with nothing in flight and a running task is
ever stopped."""

from __future__ import annotations

import itertools

import pytest

from builders import EXPIRED, IDLE, NOW, changed, record_in
from seedkeeper.domain import transitions
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import Absent, Malformed, State, Supported, Unsupported
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.sweep import Leave, Retain, Stop, decide

LIVE = [State.UNSEEDED, State.SEEDING, State.SEEDED, State.SEED_FAILED, State.CLOSING]


def asked_never(incarnation: str) -> TaskStatus:
    raise AssertionError(f"the runtime was asked about {incarnation}")


@pytest.mark.parametrize(
    ("state", "expired", "unsettled", "status"),
    list(itertools.product(LIVE, [True, False], [True, False], list(TaskStatus))),
)
def test_only_the_positively_unseeded_idle_slot_is_stopped(
    state: State, expired: bool, unsettled: bool, status: TaskStatus
) -> None:
    record = record_in(state)
    if unsettled:
        record = changed(
            transitions.RESERVE.decide(
                record,
                transitions.Reservation(kind=OpKind.CHECKPOINT, actor=Actor.SLOT_TASK, now=NOW),
            )
        ).record
    now = EXPIRED if expired else NOW + IDLE
    asked: list[str] = []

    def task_status(incarnation: str) -> TaskStatus:
        asked.append(incarnation)
        return status

    decision = decide(Supported(record), now=now, task_status=task_status)
    permitted = state is State.UNSEEDED and expired and not unsettled
    if permitted and status is TaskStatus.RUNNING:
        assert decision == Stop(record)
    else:
        assert not isinstance(decision, Stop)
    if permitted and status is TaskStatus.STOPPED:
        assert decision == Leave("task-stopped")  # already stopped: untouched
    if permitted and status is TaskStatus.UNKNOWN:
        assert decision == Retain("task-unknown", record)
    if not permitted:
        assert asked == [], "the runtime is asked only about a slot it might stop"
    if not expired:
        assert decision == Leave("not-idle")


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (State.SEEDING, "seeding"),
        (State.SEEDED, "seeded"),
        (State.SEED_FAILED, "seed-failed"),
    ],
)
def test_a_seeded_slot_is_retained_with_its_reason(state: State, reason: str) -> None:
    record = record_in(state)
    assert decide(Supported(record), now=EXPIRED, task_status=asked_never) == Retain(reason, record)


def test_records_this_code_may_not_write_are_retained_without_a_write() -> None:
    assert decide(Unsupported("s", 99), now=EXPIRED, task_status=asked_never) == Retain(
        "record-unsupported", None
    )
    assert decide(Malformed("s", "rev"), now=EXPIRED, task_status=asked_never) == Retain(
        "record-malformed", None
    )
    assert decide(Absent("s"), now=EXPIRED, task_status=asked_never) == Leave("no-record")


def test_a_retired_tombstone_is_left_alone() -> None:
    retired = record_in(State.RETIRED)
    decision = decide(Supported(retired), now=EXPIRED + 10**6, task_status=asked_never)
    assert decision == Leave("retired")


def test_a_closing_slot_is_retained() -> None:
    closing = record_in(State.CLOSING)
    decision = decide(Supported(closing), now=EXPIRED, task_status=asked_never)
    assert decision == Retain("closing", closing)
