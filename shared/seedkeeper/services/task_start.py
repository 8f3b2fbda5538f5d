"""`POST /tasks/start` on the checkpoint function, the slot task's own function: a task, once
started, names its slot, attempt, operation and its own incarnation, and is answered the
presigned GETs it restores from. URLs never travel in RunTask's overrides, where
DescribeTasks readers and CloudTrail would see live bearer URLs.

Only the attempt's own task is answered. The incarnation it names must be the one that signed
the call (`Caller`: its task role session is named after its task id). When the record names
it, that is the attempt's task. When the record names no task yet (the seed function records
the one RunTask answered, after RunTask answers), the runtime must say it launched this task
for this slot's attempt (the plan in RunTask's override, read back with DescribeTasks): then
it is recorded here (RECORD_INCARNATION, conditional on the attempt). So a second task of one
attempt (a RunTask client token that aged out, a relaunch racing its first launch) is
refused, restores nothing and exits, and another slot's task, holding the same role, can
never take this attempt. Anyone else hears one refusal, `not-this-task`, and learns nothing
more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from seedkeeper.adapters.r2 import R2, backup_key
from seedkeeper.domain import transitions
from seedkeeper.domain.caller import NOT_THIS_TASK, Caller
from seedkeeper.domain.models import Incarnation, Model, SlotId
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.outcomes import GrantedArchive, RestoreGrant
from seedkeeper.domain.record import Checkpoint, SlotRecord, State, Supported
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import Launch
from seedkeeper.domain.snapshots import Archive
from seedkeeper.domain.transitions import Acknowledged
from seedkeeper.observability import logger
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.snapshots import SnapshotStore

# What `/tasks/start` refuses with besides the request's own refusals.
REFUSALS = (NOT_THIS_TASK, "seed-missing", "r2-unconfigured")


class StartedOp(Model):
    """The plan's operation by its ordinal and generation: the attempt's restore, or a cold
    slot's launch (which of the two the record says)."""

    ordinal: Annotated[int, Field(ge=1)]
    generation: Annotated[int, Field(ge=1)]


class TaskStart(Model):
    slot: SlotId
    attempt: Annotated[int, Field(ge=1)]
    incarnation: Incarnation
    op: StartedOp


def not_this_attempt(record: SlotRecord, call: TaskStart) -> Refused | None:
    """None when `call` is the live attempt's task: the record is seeding (or a cold slot
    launching) in this attempt, `op` is that attempt's restore still open (or its launch),
    and the record names no incarnation or this one."""
    entry = record.window.entry(call.op.ordinal)
    expected = OpKind.LAUNCH if record.state is State.UNSEEDED else OpKind.RESTORE
    live = (
        record.state in {State.SEEDING, State.UNSEEDED}
        and record.attempt == call.attempt == call.op.generation
        and entry is not None
        and entry.generation == call.op.generation
        and entry.kind is expected
        and (expected is OpKind.LAUNCH or not entry.settled)
        and record.incarnation in {None, call.incarnation}
    )
    return None if live else Refused(NOT_THIS_TASK)


class TaskStarts:
    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        snapshots: SnapshotStore,
        r2: R2 | None,
        launched_for: Callable[[str], Launch | None],
        presign_expiry: int,
        clock: Callable[[], int],
    ) -> None:
        """`launched_for`: what the slot runtime launched a task for (`SlotRuntime`)."""
        self._lifecycle = lifecycle
        self._snapshots = snapshots
        self._launched_for = launched_for
        self._r2 = r2
        self._presign_expiry = presign_expiry
        self._clock = clock

    def start(self, call: TaskStart, caller: Caller) -> RestoreGrant | Refused:
        if not caller.is_task(call.incarnation):
            return Refused(NOT_THIS_TASK)
        classified = self._lifecycle.read(call.slot)
        if not isinstance(classified, Supported):
            return Refused(NOT_THIS_TASK)
        record = classified.record
        refused = not_this_attempt(record, call)
        if refused is not None:
            return refused
        if record.incarnation is None:
            if self._launched_for(call.incarnation) != Launch(call.slot, call.attempt):
                logger.warning("task start: not launched for this attempt", slot=call.slot)
                return Refused(NOT_THIS_TASK)
            entry = record.window.entry(call.op.ordinal)
            assert entry is not None  # not_this_attempt found it
            launched = transitions.Launched(
                incarnation=call.incarnation, launch=entry.ref, now=self._clock()
            )
            outcome = self._lifecycle.apply(
                call.slot, transitions.RECORD_INCARNATION, launched, as_read=record
            )
            if not isinstance(outcome, Written | Acknowledged):
                return Refused(NOT_THIS_TASK)  # another task of the attempt came first, or it moved
            record = outcome.record
            refused = not_this_attempt(record, call)
            if refused is not None:
                return refused
        return self._grant(record)

    def _grant(self, record: SlotRecord) -> RestoreGrant | Refused:
        """Presigned only for what the record names: its parked checkpoint on a resume (the
        seed function HEADed it before launching), else the archives a recorded generation
        names for its seed, read now (a rotation may have deleted them since)."""
        seed = record.seed
        if seed is None:
            return RestoreGrant(expires_in=self._presign_expiry)  # a cold slot restores nothing
        if self._r2 is None:
            return Refused("r2-unconfigured")
        if record.resuming:
            checkpoint = record.checkpoint
            assert checkpoint is not None
            return RestoreGrant(
                resume=self._presign(checkpoint.key, checkpoint), expires_in=self._presign_expiry
            )
        archives = self._snapshots.read(seed.resource).archives_for(seed)
        if archives is None:
            logger.warning("task start: seed rotated out", slot=record.slot)
            return Refused("seed-missing", "no recorded generation names the seed")
        return archives_grant(self._r2, *archives, expires_in=self._presign_expiry)

    def _presign(self, key: str, recorded: Archive | Checkpoint) -> GrantedArchive:
        assert self._r2 is not None
        return presigned(self._r2, key, recorded, self._presign_expiry)


def presigned(r2: R2, key: str, recorded: Archive | Checkpoint, expires_in: int) -> GrantedArchive:
    """A GET of `key`, with the size and sha256 the records name for it."""
    url = r2.presign_get(key, expires_in)
    return GrantedArchive(url=url, size=recorded.size, sha256=recorded.sha256)


def archives_grant(
    r2: R2, checkout: Archive, deps: Archive | None, *, expires_in: int
) -> RestoreGrant:
    """The GETs of a seed's recorded archives."""
    return RestoreGrant(
        checkout=presigned(r2, backup_key(checkout.backup_id), checkout, expires_in),
        deps=presigned(r2, backup_key(deps.backup_id), deps, expires_in) if deps else None,
        expires_in=expires_in,
    )
