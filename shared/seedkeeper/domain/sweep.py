"""What the idle sweep does with one expired slot, decided without I/O: only a slot the
fence would take (positively unseeded, idle, nothing in flight) whose task runs is
stopped; everything else is retained with its reason, or left as it is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from seedkeeper.domain.record import Absent, Classified, Malformed, SlotRecord, State, Unsupported
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.transitions import FENCE, At


@dataclass(frozen=True)
class Stop:
    """Positively unseeded, idle, nothing in flight, task running: fence, stop, retire."""

    record: SlotRecord


@dataclass(frozen=True)
class Retain:
    reason: str
    record: SlotRecord | None  # None: a record this code may not write (unsupported...)


@dataclass(frozen=True)
class Leave:
    """Nothing to do, nothing to record (an already stopped task stays untouched)."""

    reason: str


Disposition = Stop | Retain | Leave


def decide(
    classified: Classified, *, now: int, task_status: Callable[[str], TaskStatus]
) -> Disposition:
    """What the sweep does with one expired index entry. `task_status` is asked only for a
    slot that would otherwise be stopped."""
    if isinstance(classified, Absent):
        return Leave("no-record")
    if isinstance(classified, Unsupported):
        return Retain("record-unsupported", None)
    if isinstance(classified, Malformed):
        return Retain("record-malformed", None)
    record = classified.record
    if record.state is State.RETIRED:
        return Leave("retired")
    # The fence's own checks, as the write will make them: the one rule for a stop.
    fenced = FENCE.decide(record, At(now))
    if isinstance(fenced, Refused) and fenced.reason == "not-idle":
        return Leave("not-idle")
    if isinstance(fenced, Refused):
        return Retain(fenced.reason.removeprefix("state-").replace("_", "-"), record)
    if record.incarnation is None:
        return Retain("task-unknown", record)
    status = task_status(record.incarnation)
    if status is TaskStatus.STOPPED:
        return Leave("task-stopped")
    if status is TaskStatus.UNKNOWN:
        return Retain("task-unknown", record)
    return Stop(record)
