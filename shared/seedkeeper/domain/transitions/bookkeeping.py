"""Writes that never move the state: the sweep's note of why it keeps a slot, and work
reserved and settled on its own."""

from __future__ import annotations

from dataclasses import dataclass

from seedkeeper.domain import opwindow
from seedkeeper.domain.checkpoints import Backoff
from seedkeeper.domain.opwindow import Actor, OpKind, OpRef
from seedkeeper.domain.record import LIVE_STATES, SlotRecord, State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions.machinery import (
    ALL_STATES,
    Acknowledged,
    Change,
    Decision,
    InState,
    Transition,
    next_record,
)

# The sweep's next look at a slot it retains, unless configured (`SweepSettings`).
RETAIN_BACKOFF = Backoff()


@dataclass(frozen=True)
class Retained:
    reason: str
    now: int
    backoff: Backoff = RETAIN_BACKOFF


@dataclass(frozen=True)
class Reservation:
    kind: OpKind
    actor: Actor
    now: int


@dataclass(frozen=True)
class Settlement:
    ref: OpRef
    outcome: str
    now: int


def _retain(record: SlotRecord, retained: Retained) -> Decision:
    """Why the sweep keeps this slot, and when it looks again: later with each retain in a
    row. Any other write clears the backoff (`next_record`), so a change is looked at
    promptly."""
    retains = min((record.retains or 0) + 1, 1000)
    look = retained.now + retained.backoff.after(retains)
    changed = next_record(
        record, retained.now, retained_reason=retained.reason, retains=retains, next_look=look
    )
    return Change(changed)


NOTE_RETAINED = Transition[Retained](
    "note_retained",
    checks=(InState(ALL_STATES - {State.RETIRED}),),
    effect=_retain,
)


# Reserved and settled only by the transitions that also move the state: a restore by
# birth, `BEGIN_ATTEMPT` and `SETTLE_SEED`; a stop by the fences, `RETIRE` and `PARK`; a
# checkpoint by `REQUEST_CHECKPOINT`, `RECORD_CHECKPOINT`, `CHECKPOINT_FAILED` or `THAWED`.
_SETTLED_WITH_STATE = frozenset({OpKind.RESTORE, OpKind.STOP, OpKind.CHECKPOINT})


def _reserve(record: SlotRecord, reservation: Reservation) -> Decision:
    """Reserved before the effect starts; a full window refuses before any effect. Work
    that moves the state with it (a restore, a stop, a checkpoint) is reserved only by its
    own transition: never beside the protocol that would settle it."""
    if reservation.kind in _SETTLED_WITH_STATE:
        return Refused(f"{reservation.kind}-reserved-with-its-state")
    reserved = opwindow.reserve(record.window, reservation.kind, reservation.actor, record.attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    return Change(next_record(record, reservation.now, window=reserved.window), reserved.entry)


RESERVE = Transition[Reservation](
    "reserve",
    checks=(InState(LIVE_STATES | {State.CLOSING}),),
    effect=_reserve,
)


def _settle(record: SlotRecord, settlement: Settlement) -> Decision:
    """A launch settled on its own."""
    entry = record.window.entry(settlement.ref.ordinal)
    if entry is not None and entry.kind in _SETTLED_WITH_STATE:
        return Refused(f"{entry.kind}-settles-with-its-state")
    settled = opwindow.settle(record.window, settlement.ref, settlement.outcome)
    if isinstance(settled, opwindow.Mismatch):
        return Refused(settled.reason)
    if isinstance(settled, opwindow.AlreadySettled):
        return Acknowledged(record, settled.entry)
    return Change(next_record(record, settlement.now, window=settled.window), settled.entry)


SETTLE = Transition[Settlement]("settle", checks=(InState(ALL_STATES),), effect=_settle)
