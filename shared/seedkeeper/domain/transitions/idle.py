"""The sweep's steps with an idle slot: an unseeded one is fenced and retired, a seeded one
is asked for a checkpoint, and a checkpointed one is fenced and parked."""

from __future__ import annotations

from dataclasses import dataclass

from seedkeeper.domain import opwindow
from seedkeeper.domain.checkpoints import counts_for
from seedkeeper.domain.opwindow import Actor, OpKind, OpRef
from seedkeeper.domain.record import SlotRecord, State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions.machinery import (
    Acknowledged,
    At,
    Below,
    Change,
    Check,
    Decision,
    Equals,
    InState,
    Transition,
    move_reserving,
    next_record,
)


@dataclass(frozen=True)
class Stopped:
    stop: OpRef
    now: int
    expires_at: int


@dataclass(frozen=True)
class Parked:
    stop: OpRef
    now: int
    expires_at: int


def _idle_in(state: State) -> tuple[Check, ...]:
    """The sweep's checks before any step it takes: expired (checked first: a fresh slot is
    left alone whatever its state), in `state`, nothing in flight."""
    return (
        Below("idle_deadline", lambda p: p.now, "not-idle"),
        InState(frozenset({state})),
        Equals("open_ops", lambda p: 0, "unsettled-operations"),
    )


def _reserve_stop(record: SlotRecord, at: At) -> Decision:
    return move_reserving(record, at.now, State.CLOSING, OpKind.STOP, Actor.SWEEP)


FENCE = Transition[At](
    "fence",
    # The idle sweep's only way to destruction: a touch or a seed in the same tick fails it.
    checks=_idle_in(State.UNSEEDED),
    effect=_reserve_stop,
    to=frozenset({State.CLOSING}),
)


def _retire(record: SlotRecord, stopped: Stopped) -> Decision:
    """A tombstone until `expires_at`, out of the sweep's index. Any other unsettled
    obligation (an unknown one included) blocks it, and so does a checkpoint of this
    incarnation: a slot fenced for a park is parked or kept, never retired."""
    checkpoint = record.checkpoint
    if checkpoint is not None and checkpoint.incarnation == record.incarnation:
        return Refused("checkpointed")
    settled = _stop_settled(record, stopped.stop)
    if isinstance(settled, Refused):
        return settled
    changed = next_record(
        record,
        stopped.now,
        state=State.RETIRED,
        window=settled.window,
        expires_at=stopped.expires_at,
    )
    return Change(changed, settled.entry)


def _stop_settled(record: SlotRecord, stop: OpRef) -> opwindow.Changed | Refused:
    """The sweep's stop settled, when it is the last obligation open."""
    settled = opwindow.settle(record.window, stop, "stopped")
    if not isinstance(settled, opwindow.Changed) or settled.entry.kind is not OpKind.STOP:
        return Refused("stop-not-open")
    if settled.window.unsettled:
        return Refused("unsettled-operations")
    return settled


RETIRE = Transition[Stopped](
    "retire",
    checks=(InState(frozenset({State.CLOSING})),),  # only through the fence
    effect=_retire,
    to=frozenset({State.RETIRED}),
    already=lambda record, p: Acknowledged(record) if record.state is State.RETIRED else None,
)


def _request_checkpoint(record: SlotRecord, at: At) -> Decision:
    """The slot task will freeze, capture and upload: its `checkpoint` op is reserved in
    the same write that asks for it."""
    if record.incarnation is None:
        return Refused("task-unknown")
    return move_reserving(record, at.now, State.CHECKPOINTING, OpKind.CHECKPOINT, Actor.SLOT_TASK)


REQUEST_CHECKPOINT = Transition[At](
    "request_checkpoint",
    # The sweep's first step with an idle seeded slot: nothing is stopped by it.
    checks=_idle_in(State.SEEDED),
    effect=_request_checkpoint,
    to=frozenset({State.CHECKPOINTING}),
)


def _reserve_park(record: SlotRecord, at: At) -> Decision:
    """The checkpoint must count for this owner and incarnation: only then is the task's
    disk allowed to go."""
    if not counts_for(
        record.checkpoint, owner=record.owner, incarnation=record.incarnation, now=at.now
    ):
        return Refused("checkpoint-not-counted")
    return _reserve_stop(record, at)


FENCE_PARK = Transition[At](
    "fence_park",
    # A touch (a new deadline, a new rev, `seeded`) in the same tick makes it fail.
    checks=_idle_in(State.CHECKPOINTED),
    effect=_reserve_park,
    to=frozenset({State.CLOSING}),
)


def _park(record: SlotRecord, parked: Parked) -> Decision:
    checkpoint = record.checkpoint
    if checkpoint is None or not counts_for(
        checkpoint, owner=record.owner, incarnation=record.incarnation, now=parked.now
    ):
        return Refused("checkpoint-not-counted")
    if parked.expires_at < checkpoint.expires_at:
        return Refused("expires-before-checkpoint")  # the record outlives what it names
    settled = _stop_settled(record, parked.stop)
    if isinstance(settled, Refused):
        return settled
    changed = next_record(
        record,
        parked.now,
        state=State.PARKED,
        window=settled.window,
        frozen_at=None,
        expires_at=parked.expires_at,
    )
    return Change(changed, settled.entry)


PARK = Transition[Parked](
    "park",
    checks=(InState(frozenset({State.CLOSING})),),  # only through the park fence
    effect=_park,
    to=frozenset({State.PARKED}),
    already=lambda record, p: Acknowledged(record) if record.state is State.PARKED else None,
)
