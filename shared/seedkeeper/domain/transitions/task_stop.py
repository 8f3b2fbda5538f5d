"""A slot task that stops (stopped by the platform, or found gone): its work checkpointed
and parked, or recorded lost."""

from __future__ import annotations

from dataclasses import dataclass

from seedkeeper.domain import opwindow
from seedkeeper.domain.checkpoints import counts_for
from seedkeeper.domain.models import Incarnation
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import Loss, SlotRecord, State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions.machinery import (
    Acknowledged,
    Change,
    Decision,
    Equals,
    InState,
    Transition,
    move_reserving,
    next_record,
)


@dataclass(frozen=True)
class Stopping:
    """The slot task of `attempt` in `incarnation` is being stopped by someone else (the
    platform): it checkpoints before it goes, or its work is recorded lost."""

    attempt: int
    incarnation: Incarnation
    now: int


@dataclass(frozen=True)
class Lost:
    """The task `incarnation` stopped (or is stopping) with no verified checkpoint."""

    incarnation: Incarnation
    loss: Loss
    expires_at: int


def _checkpoint_on_stop(record: SlotRecord, stopping: Stopping) -> Decision:
    return move_reserving(
        record, stopping.now, State.CHECKPOINTING, OpKind.CHECKPOINT, Actor.SLOT_TASK
    )


def _checkpoint_asked(record: SlotRecord, stopping: Stopping) -> Acknowledged | None:
    """Already asked (by the sweep, or by this task's earlier try): that op is the one."""
    own = record.attempt == stopping.attempt and record.incarnation == stopping.incarnation
    if record.state is not State.CHECKPOINTING or not own:
        return None
    entry = next(
        (
            e
            for e in record.window.entries
            if e.kind is OpKind.CHECKPOINT and e.generation == record.attempt and not e.settled
        ),
        None,
    )
    return Acknowledged(record, entry) if entry is not None else None


CHECKPOINT_ON_STOP = Transition[Stopping](
    "checkpoint_on_stop",
    # The slot task's own request when the platform stops it: idle or not, its work is
    # checkpointed before the task goes (DESIGN §10, step 7).
    checks=(
        Equals("attempt", lambda p: p.attempt, "attempt-superseded"),
        Equals("incarnation", lambda p: p.incarnation, "incarnation-mismatch"),
        InState(frozenset({State.SEEDED})),
    ),
    effect=_checkpoint_on_stop,
    to=frozenset({State.CHECKPOINTING}),
    already=_checkpoint_asked,
)


def _work_kept(record: SlotRecord, now: int) -> Refused | None:
    """The checkpoint holds all the work: it counts for this owner and incarnation, and it
    was captured while the sandbox was frozen, and the sandbox was not resumed since."""
    checkpoint = record.checkpoint
    if checkpoint is None or not counts_for(
        checkpoint, owner=record.owner, incarnation=record.incarnation, now=now
    ):
        return Refused("checkpoint-not-counted")
    if record.frozen_at is None or checkpoint.created_at < record.frozen_at:
        return Refused("not-frozen-since-capture")
    return None


def _park_on_stop(record: SlotRecord, stopping: Stopping) -> Decision:
    refused = _work_kept(record, stopping.now)
    if refused is not None:
        return refused
    assert record.checkpoint is not None
    changed = next_record(
        record,
        stopping.now,
        state=State.PARKED,
        frozen_at=None,
        expires_at=record.checkpoint.expires_at,
    )
    return Change(changed)


PARK_ON_STOP = Transition[Stopping](
    "park_on_stop",
    # The stopping task's last write, after its checkpoint is recorded: the sandbox stays
    # frozen until the platform ends it, so nothing changed after the capture. A poll that
    # came back meanwhile (`seeded`) does not change that: the task never resumes it now.
    checks=(
        Equals("attempt", lambda p: p.attempt, "attempt-superseded"),
        Equals("incarnation", lambda p: p.incarnation, "incarnation-mismatch"),
        InState(frozenset({State.CHECKPOINTED, State.SEEDED})),
        Equals("open_ops", lambda p: 0, "unsettled-operations"),
    ),
    effect=_park_on_stop,
    to=frozenset({State.PARKED}),
    already=lambda record, p: Acknowledged(record) if record.state is State.PARKED else None,
)


def _lose(record: SlotRecord, lost: Lost) -> Decision:
    """The work is gone with the task: recorded, with why, kept as long as a park would
    have been. The stopped task's open checkpoint can no longer settle: it is settled
    `lost` here. A checkpointed slot whose checkpoint counts is parked, never lost."""
    counted = counts_for(
        record.checkpoint, owner=record.owner, incarnation=record.incarnation, now=lost.loss.at
    )
    if record.state is State.CHECKPOINTED and counted:
        return Refused("checkpoint-counts")
    window = record.window
    for entry in window.entries:
        if entry.kind is OpKind.CHECKPOINT and entry.actor is Actor.SLOT_TASK and not entry.settled:
            settled = opwindow.settle(window, entry.ref, "lost")
            assert isinstance(settled, opwindow.Changed)
            window = settled.window
    if window.unsettled:
        return Refused("unsettled-operations")
    changed = next_record(
        record,
        lost.loss.at,
        state=State.LOST,
        window=window,
        loss=lost.loss,
        frozen_at=None,
        expires_at=lost.expires_at,
    )
    return Change(changed)


LOSE = Transition[Lost](
    "lose",
    # Written by the sweep for a stopped task it found, or by the stopping task itself
    # when its checkpoint could not be made in time.
    checks=(
        Equals("incarnation", lambda p: p.incarnation, "incarnation-mismatch"),
        InState(frozenset({State.SEEDED, State.CHECKPOINTING, State.CHECKPOINTED})),
    ),
    effect=_lose,
    to=frozenset({State.LOST}),
    already=lambda record, p: Acknowledged(record) if record.state is State.LOST else None,
)
