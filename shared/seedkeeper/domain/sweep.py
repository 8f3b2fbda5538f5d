"""What the idle sweep does with one expired slot, decided without I/O.

Each step toward reclaiming a slot is a fence the sweep writes, and the decision asks that
fence's own checks (`seedkeeper.domain.transitions`), so the two cannot disagree:

- `unseeded`, idle, nothing in flight, task running: `Stop` (fence, stop, retire);
- `seeded`, idle, nothing in flight, task running: `RequestCheckpoint` (nothing stops);
- `checkpointed`, still idle, its checkpoint counting for this owner and incarnation, the
  task running or already stopped: `Park` (fence, stop, park);
- `seeded` or `checkpointing`, idle, or `checkpointed` with a checkpoint that no longer
  counts, the task stopped: `Lose` (its work went with it: recorded, with the runtime's
  cause, never hidden);
- `closing` with the sweep's stop still open (a sweep died between its fence and its last
  write): `Finish` (stop again, then park or retire).

Everything else is retained with its reason, or left as it is. The task's state is asked
for only where it decides the step (`asks`), so the sweep asks a page's in one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from seedkeeper.domain.checkpoints import counts_for
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import (
    ENDED_STATES,
    Absent,
    Classified,
    Loss,
    Malformed,
    SlotRecord,
    State,
    Unsupported,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskState, TaskStatus
from seedkeeper.domain.transitions import (
    FENCE,
    FENCE_PARK,
    LOSE,
    REQUEST_CHECKPOINT,
    At,
    Lost,
    Transition,
)


@dataclass(frozen=True)
class Stop:
    """Positively unseeded, idle, nothing in flight, task running: fence, stop, retire."""

    record: SlotRecord


@dataclass(frozen=True)
class RequestCheckpoint:
    """Seeded, idle, nothing in flight, task running: ask the task to checkpoint."""

    record: SlotRecord


@dataclass(frozen=True)
class Park:
    """Checkpointed and still idle, the checkpoint counting: fence, stop, park."""

    record: SlotRecord


@dataclass(frozen=True)
class Lose:
    """Idle, and its task stopped with no verified checkpoint: recorded lost, and why."""

    record: SlotRecord
    lost: Lost


@dataclass(frozen=True)
class Finish:
    """Closing, the sweep's own stop still open: stop again, then park or retire."""

    record: SlotRecord
    park: bool  # a checkpoint counts for this owner and incarnation


@dataclass(frozen=True)
class Retain:
    reason: str
    record: SlotRecord | None  # None: a record this code may not write (unsupported...)


@dataclass(frozen=True)
class Leave:
    """Nothing to do, nothing to record (a cold slot whose task already stopped is left)."""

    reason: str


Disposition = Stop | RequestCheckpoint | Park | Lose | Finish | Retain | Leave

# The fence the sweep writes in each state it acts on, and what it then does.
_STEPS: dict[State, tuple[Transition[At], type[Stop | RequestCheckpoint | Park]]] = {
    State.UNSEEDED: (FENCE, Stop),
    State.SEEDED: (REQUEST_CHECKPOINT, RequestCheckpoint),
    State.CHECKPOINTED: (FENCE_PARK, Park),
}


# Retained for these reasons while the task runs; its work is lost once it stopped.
_AT_STAKE = frozenset(
    {(State.CHECKPOINTING, "checkpointing"), (State.CHECKPOINTED, "checkpoint-not-counted")}
)
# A stop whose cause is not yet known: LOSE's checks do not depend on it.
_STOPPED = TaskState(TaskStatus.STOPPED)


@dataclass(frozen=True)
class _Asks:
    """A decision that waits on the task's state."""

    record: SlotRecord
    incarnation: str
    running: Stop | RequestCheckpoint | Park | Retain  # the step while the task runs
    loses: bool  # its work is recorded lost once the task stopped


def asks(classified: Classified, *, now: int, retention: int) -> str | None:
    """The incarnation whose task state `decide` needs for this entry; None when it
    decides without (the sweep would not act on the slot whatever its task does)."""
    before = _before_task(classified, now, retention)
    return before.incarnation if isinstance(before, _Asks) else None


def decide(
    classified: Classified,
    *,
    now: int,
    retention: int,
    task_status: Callable[[str], TaskState],
) -> Disposition:
    """What the sweep does with one expired index entry. `task_status` is asked only for a
    slot `asks` names; a lost record is kept `retention` seconds."""
    before = _before_task(classified, now, retention)
    if not isinstance(before, _Asks):
        return before
    task = task_status(before.incarnation)
    if task.status is TaskStatus.UNKNOWN:
        return Retain("task-unknown", before.record)
    if task.status is TaskStatus.RUNNING or isinstance(before.running, Park):
        return before.running  # verified work is parked, its task running or not
    if not before.loses:
        return Leave("task-stopped")  # a cold slot: nothing went with it
    return Lose(before.record, _lost(before.incarnation, task, now, retention))


def _before_task(classified: Classified, now: int, retention: int) -> Disposition | _Asks:
    if isinstance(classified, Absent):
        return Leave("no-record")
    if isinstance(classified, Unsupported):
        return Retain("record-unsupported", None)
    if isinstance(classified, Malformed):
        return Retain("record-malformed", None)
    record = classified.record
    if record.state in ENDED_STATES:
        return Leave(record.state.value)
    if record.state is State.CLOSING:
        return _closing(record, now)
    # Any fence's checks answer for the states no step leaves: not idle, or retained.
    fence, step = _STEPS.get(record.state, (FENCE, Stop))
    fenced = fence.decide(record, At(now))
    reason = _token(fenced.reason) if isinstance(fenced, Refused) else None
    if reason == "not-idle":
        return Leave("not-idle")
    at_stake = (record.state, reason) in _AT_STAKE or (
        record.state is State.SEEDED and reason is None
    )
    if reason is not None and not at_stake:
        return Retain(reason, record)
    if record.incarnation is None:
        return Retain("task-unknown", record)
    if at_stake:
        losing = LOSE.decide(record, _lost(record.incarnation, _STOPPED, now, retention))
        if isinstance(losing, Refused):  # something else in flight: nothing is written
            return Retain(_token(losing.reason), record)
    running = step(record) if reason is None else Retain(reason, record)
    return _Asks(record, record.incarnation, running, loses=at_stake)


def _lost(incarnation: str, task: TaskState, now: int, retention: int) -> Lost:
    loss = Loss(reason=task.reason, detail=task.detail, at=now)
    return Lost(incarnation=incarnation, loss=loss, expires_at=now + retention)


def _token(reason: str) -> str:
    return reason.removeprefix("state-").replace("_", "-")


def _closing(record: SlotRecord, now: int) -> Finish | Retain:
    """Only the sweep's own open stop, nothing else in flight, is finished: parked when
    the fence was a park's and its checkpoint still counts, retired when it was a cold
    slot's. A park whose checkpoint stopped counting is retained: retiring it would hide
    the loss of its work."""
    stops = [
        entry
        for entry in record.window.entries
        if entry.kind is OpKind.STOP and entry.actor is Actor.SWEEP and not entry.settled
    ]
    if len(stops) != 1 or record.window.unsettled != 1:
        return Retain("closing", record)
    if not _parking(record):
        return Finish(record, park=False)
    if counts_for(record.checkpoint, owner=record.owner, incarnation=record.incarnation, now=now):
        return Finish(record, park=True)
    return Retain("checkpoint-not-counted", record)


def _parking(record: SlotRecord) -> bool:
    """Fenced for a park: its checkpoint is this incarnation's (a cold slot has none)."""
    checkpoint = record.checkpoint
    return checkpoint is not None and checkpoint.incarnation == record.incarnation
