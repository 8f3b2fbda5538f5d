"""What the idle sweep does with one expired slot, decided without I/O.

Each step toward reclaiming a slot is a fence the sweep writes, and the decision asks that
fence's own checks (`seedkeeper.domain.transitions`), so the two cannot disagree:

- `unseeded`, idle, nothing in flight, task running: `Stop` (fence, stop, retire);
- `seeded`, idle, nothing in flight, task running: `RequestCheckpoint` (nothing stops);
- `checkpointed`, still idle, its checkpoint counting for this owner and incarnation, the
  task running or already stopped: `Park` (fence, stop, park);
- `closing` with the sweep's stop still open (a sweep died between its fence and its last
  write): `Finish` (stop again, then park or retire).

Everything else is retained with its reason, or left as it is.
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
    Malformed,
    SlotRecord,
    State,
    Unsupported,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.transitions import FENCE, FENCE_PARK, REQUEST_CHECKPOINT, At, Transition


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
    """Nothing to do, nothing to record (an already stopped task stays untouched)."""

    reason: str


Disposition = Stop | RequestCheckpoint | Park | Finish | Retain | Leave

# The fence the sweep writes in each state it acts on, and what it then does.
_STEPS: dict[State, tuple[Transition[At], type[Stop | RequestCheckpoint | Park]]] = {
    State.UNSEEDED: (FENCE, Stop),
    State.SEEDED: (REQUEST_CHECKPOINT, RequestCheckpoint),
    State.CHECKPOINTED: (FENCE_PARK, Park),
}


def decide(
    classified: Classified, *, now: int, task_status: Callable[[str], TaskStatus]
) -> Disposition:
    """What the sweep does with one expired index entry. `task_status` is asked only for a
    slot the sweep would otherwise act on."""
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
    if isinstance(fenced, Refused) and fenced.reason == "not-idle":
        return Leave("not-idle")
    if isinstance(fenced, Refused):
        return Retain(fenced.reason.removeprefix("state-").replace("_", "-"), record)
    if record.incarnation is None:
        return Retain("task-unknown", record)
    status = task_status(record.incarnation)
    if status is TaskStatus.UNKNOWN:
        return Retain("task-unknown", record)
    if status is TaskStatus.STOPPED and step is not Park:
        return Leave("task-stopped")  # its work is verified only once checkpointed
    return step(record)


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
