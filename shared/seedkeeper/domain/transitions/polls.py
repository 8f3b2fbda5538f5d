"""What a poll of the slot's owner writes: a touch, a keepalive, a thaw, a resume."""

from __future__ import annotations

from dataclasses import dataclass

from seedkeeper.domain import opwindow
from seedkeeper.domain.checkpoints import counts_for
from seedkeeper.domain.models import Binding, OwnerClaim
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import LIVE_STATES, SlotRecord, State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions.machinery import (
    Change,
    Check,
    Decision,
    Equals,
    InState,
    Transition,
    next_record,
)


@dataclass(frozen=True)
class Poll:
    binding: Binding
    now: int
    idle_deadline: int


@dataclass(frozen=True)
class KeepAlive:
    """A touch by the slot's owner without a seed body (None: a cold slot's)."""

    owner: OwnerClaim | None
    now: int
    idle_deadline: int


def _extend(record: SlotRecord, poll: Poll) -> Decision:
    return Change(next_record(record, poll.now, idle_deadline=poll.idle_deadline))


# The identity first: a caller that is not the slot's own learns nothing of its state.
_OWN_BINDING: tuple[Check, ...] = (
    Equals("owner", lambda p: p.binding.owner, "claim-mismatch"),
    Equals("seed", lambda p: p.binding.seed, "seed-mismatch"),
    Equals("origin", lambda p: p.binding.origin, "origin-mismatch"),
)

TOUCH = Transition[Poll](
    "touch",
    checks=(*_OWN_BINDING, InState(LIVE_STATES, reason="slot-closed")),
    effect=_extend,
)

# Asked to checkpoint, then touched: the work is wanted again. Written after a touch
# returns one of these states; the slot task sees `seeded` and resumes the sandbox.
CHECKPOINT_STATES = frozenset({State.CHECKPOINTING, State.CHECKPOINTED})

THAW = Transition[Poll](
    "thaw",
    checks=(*_OWN_BINDING, InState(CHECKPOINT_STATES)),
    effect=lambda record, p: Change(next_record(record, p.now, state=State.SEEDED)),
    to=frozenset({State.SEEDED}),
)


KEEPALIVE = Transition[KeepAlive](
    "keepalive",
    # A poll without a seed body: the owner's claim is the identity it checks.
    checks=(
        Equals("owner", lambda p: p.owner, "claim-mismatch"),
        InState(LIVE_STATES, reason="slot-closed"),
    ),
    effect=lambda record, p: Change(next_record(record, p.now, idle_deadline=p.idle_deadline)),
)


def _resume(record: SlotRecord, poll: Poll) -> Decision:
    """A new attempt that restores the parked checkpoint: the record leaves the ended
    states (back on the sweep's index), its seed result and incarnation are the next
    attempt's to write, and the checkpoint stays named until that attempt is seeded."""
    if not counts_for(
        record.checkpoint, owner=record.owner, incarnation=record.incarnation, now=poll.now
    ):
        return Refused("checkpoint-not-counted")
    attempt = record.attempt + 1
    window = opwindow.advance_generation(record.window, attempt)
    reserved = opwindow.reserve(window, OpKind.RESTORE, Actor.SLOT_TASK, attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    changed = next_record(
        record,
        poll.now,
        state=State.SEEDING,
        attempt=attempt,
        incarnation=None,
        result=None,
        window=reserved.window,
        idle_deadline=poll.idle_deadline,
        expires_at=None,
        retained_reason=None,
        checkpoint_failures=None,
    )
    return Change(changed, reserved.entry)


RESUME = Transition[Poll](
    "resume",
    # The owner's seed on a parked slot: the same binding, a checkpoint that still counts.
    checks=(*_OWN_BINDING, InState(frozenset({State.PARKED}), reason="slot-closed")),
    effect=_resume,
    to=frozenset({State.SEEDING}),
)
