"""The slot task's checkpoint, once the sweep asked for it: the sandbox frozen, thawed by a
touch, the checkpoint recorded, or its failure."""

from __future__ import annotations

from dataclasses import dataclass

from seedkeeper.domain import opwindow
from seedkeeper.domain.checkpoints import retry_after
from seedkeeper.domain.opwindow import OpKind, OpRef
from seedkeeper.domain.record import Checkpoint, SlotRecord, State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions.machinery import (
    Acknowledged,
    Change,
    Decision,
    Equals,
    InState,
    Transition,
    next_record,
)


@dataclass(frozen=True)
class Freezing:
    """The slot task of `attempt` is about to stop its sandbox for the checkpoint `op`."""

    attempt: int
    op: OpRef
    now: int


@dataclass(frozen=True)
class Thawed:
    """The slot task resumed its sandbox after a touch; `op` (the checkpoint it was making,
    if any) is abandoned."""

    attempt: int
    op: OpRef | None
    now: int


@dataclass(frozen=True)
class Uploaded:
    checkpoint: Checkpoint
    upload: OpRef
    now: int


@dataclass(frozen=True)
class CheckpointFailed:
    """The slot task resumed its sandbox after its checkpoint `op` failed for `reason`."""

    op: OpRef
    reason: str
    now: int


def _open_checkpoint(record: SlotRecord, op: OpRef) -> bool:
    entry = record.window.entry(op.ordinal)
    return (
        entry is not None
        and entry.ref == op
        and entry.kind is OpKind.CHECKPOINT
        and not entry.settled
    )


def _freeze(record: SlotRecord, freezing: Freezing) -> Decision:
    if not _open_checkpoint(record, freezing.op):
        return Refused("checkpoint-not-open")
    return Change(next_record(record, freezing.now, frozen_at=freezing.now))


FREEZE = Transition[Freezing](
    "freeze",
    # Written before the sandbox is stopped, so a poll never says "not frozen" while it is.
    checks=(
        Equals("attempt", lambda p: p.attempt, "attempt-superseded"),
        InState(frozenset({State.CHECKPOINTING})),
    ),
    effect=_freeze,
    already=lambda record, p: Acknowledged(record) if record.frozen_at is not None else None,
)


def _thawed(record: SlotRecord, thawed: Thawed) -> Decision:
    window = record.window
    if thawed.op is not None and _open_checkpoint(record, thawed.op):
        settled = opwindow.settle(window, thawed.op, "abandoned")
        assert isinstance(settled, opwindow.Changed)
        window = settled.window
    return Change(next_record(record, thawed.now, frozen_at=None, window=window))


def _already_thawed(record: SlotRecord, thawed: Thawed) -> Acknowledged | None:
    open_op = thawed.op is not None and _open_checkpoint(record, thawed.op)
    return Acknowledged(record) if record.frozen_at is None and not open_op else None


THAWED = Transition[Thawed](
    "thawed",
    # Written after the sandbox is resumed (a touch moved the slot back to seeded).
    checks=(
        Equals("attempt", lambda p: p.attempt, "attempt-superseded"),
        InState(frozenset({State.SEEDED})),
    ),
    effect=_thawed,
    already=_already_thawed,
)


def _record_checkpoint(record: SlotRecord, uploaded: Uploaded) -> Decision:
    if not _open_checkpoint(record, uploaded.upload):
        return Refused("checkpoint-not-open")
    settled = opwindow.settle(record.window, uploaded.upload, "uploaded")
    assert isinstance(settled, opwindow.Changed)
    # Touched meanwhile (seeded): the checkpoint is recorded all the same, the state stays.
    state = State.CHECKPOINTED if record.state is State.CHECKPOINTING else record.state
    changed = next_record(
        record,
        uploaded.now,
        state=state,
        checkpoint=uploaded.checkpoint,
        window=settled.window,
        checkpoint_failures=None,
        retained_reason=None,
    )
    return Change(changed, settled.entry)


RECORD_CHECKPOINT = Transition[Uploaded](
    "record_checkpoint",
    # A verified checkpoint of this owner's work in this incarnation, settling its upload.
    checks=(
        Equals("incarnation", lambda p: p.checkpoint.incarnation, "incarnation-mismatch"),
        Equals("owner", lambda p: p.checkpoint.owner, "claim-mismatch"),
        Equals("attempt", lambda p: p.upload.generation, "attempt-superseded"),
        InState(frozenset({State.CHECKPOINTING, State.SEEDED})),
    ),
    effect=_record_checkpoint,
    to=frozenset({State.CHECKPOINTED}),
    stays=frozenset({State.SEEDED}),
    already=lambda record, p: Acknowledged(record) if record.checkpoint == p.checkpoint else None,
)


# Why a slot whose checkpoint failed is not parked yet (asked again after a backoff).
CHECKPOINT_FAILED_REASON = "checkpoint-failed"


def _checkpoint_failed(record: SlotRecord, failed: CheckpointFailed) -> Decision:
    """Nothing is parked: the slot is seeded again, asked again after a backoff (its idle
    deadline moves to then), and says why."""
    if not _open_checkpoint(record, failed.op):
        return Refused("checkpoint-not-open")
    settled = opwindow.settle(record.window, failed.op, failed.reason)
    assert isinstance(settled, opwindow.Changed)
    failures = min((record.checkpoint_failures or 0) + 1, 1000)
    changed = next_record(
        record,
        failed.now,
        state=State.SEEDED,
        window=settled.window,
        frozen_at=None,
        checkpoint_failures=failures,
        retained_reason=CHECKPOINT_FAILED_REASON,
        idle_deadline=max(record.idle_deadline, failed.now + retry_after(failures)),
    )
    return Change(changed, settled.entry)


CHECKPOINT_FAILED = Transition[CheckpointFailed](
    "checkpoint_failed",
    checks=(
        Equals("attempt", lambda p: p.op.generation, "attempt-superseded"),
        InState(frozenset({State.CHECKPOINTING, State.SEEDED})),
    ),
    effect=_checkpoint_failed,
    to=frozenset({State.SEEDED}),
    stays=frozenset({State.SEEDED}),
)
