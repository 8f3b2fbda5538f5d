"""An attempt at seeding: its birth, its task's incarnation, its verdict, and a new attempt
when its task is gone without one. A birth is the one write with no record to read."""

from __future__ import annotations

from dataclasses import dataclass

from seedkeeper.domain import opwindow
from seedkeeper.domain.models import Binding, Incarnation
from seedkeeper.domain.opwindow import Actor, OpKind, OpRef, Window
from seedkeeper.domain.record import (
    LIVE_STATES,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions.machinery import (
    Acknowledged,
    At,
    Change,
    Decision,
    Equals,
    InState,
    Transition,
    next_record,
)

# Launching a cold slot is done once the task runs; a restore goes on inside the task.
LAUNCHED = "launched"

VERDICTS = frozenset({State.SEEDED, State.SEED_FAILED})
# Where a birth puts a record: seeding when it names a seed (the attempt is durable before
# any restore effect), unseeded otherwise.
BIRTH_STATES = frozenset({State.UNSEEDED, State.SEEDING})


@dataclass(frozen=True)
class Launched:
    incarnation: Incarnation
    launch: OpRef
    now: int


@dataclass(frozen=True)
class Verdict:
    attempt: int
    restore: OpRef
    result: SeedSucceeded | SeedFailed
    now: int


def born(slot: str, binding: Binding, *, now: int, idle_deadline: int) -> Change:
    """A new record, with its launch (or, for a seed, its restore) reserved before anything
    is launched. The store writes it only where no record is."""
    attempt = 1
    seeded = binding.seed is not None
    kind, actor = (OpKind.RESTORE, Actor.SLOT_TASK) if seeded else (OpKind.LAUNCH, Actor.SEED_FN)
    reserved = opwindow.reserve(Window(), kind, actor, generation=attempt)
    assert isinstance(reserved, opwindow.Reserved)  # an empty window always has room
    record = SlotRecord(
        slot=slot,
        rev=1,
        state=State.SEEDING if seeded else State.UNSEEDED,
        owner=binding.owner,
        seed=binding.seed,
        origin=binding.origin,
        attempt=attempt,
        idle_deadline=idle_deadline,
        window=reserved.window,
        created_at=now,
        updated_at=now,
    )
    return Change(record, reserved.entry)


def _hand_off(record: SlotRecord, launched: Launched) -> Decision:
    """A cold launch is settled by its task running; a restore continues detached."""
    entry = record.window.entry(launched.launch.ordinal)
    handed_off = (
        opwindow.settle(record.window, launched.launch, LAUNCHED)
        if entry is not None and entry.kind is OpKind.LAUNCH
        else opwindow.detach(record.window, launched.launch)
    )
    if isinstance(handed_off, opwindow.Mismatch):
        return Refused(handed_off.reason)
    window = handed_off.window if isinstance(handed_off, opwindow.Changed) else record.window
    changed = next_record(record, launched.now, incarnation=launched.incarnation, window=window)
    return Change(changed, handed_off.entry)


RECORD_INCARNATION = Transition[Launched](
    "record_incarnation",
    checks=(
        Equals("incarnation", lambda p: None, "incarnation-recorded"),  # the birth container
        InState(LIVE_STATES),
        Equals("attempt", lambda p: p.launch.generation, "attempt-superseded"),
    ),
    effect=_hand_off,
    already=lambda record, p: Acknowledged(record) if record.incarnation == p.incarnation else None,
)


def _verdict_stands(record: SlotRecord, verdict: Verdict) -> Acknowledged | None:
    """A duplicate verdict is acknowledged: the first one stands."""
    own = record.attempt == verdict.attempt == verdict.restore.generation
    settled = opwindow.settle(record.window, verdict.restore, verdict.result.outcome)
    if own and isinstance(settled, opwindow.AlreadySettled) and record.state in VERDICTS:
        return Acknowledged(record, settled.entry)
    return None


def _settle_seed(record: SlotRecord, verdict: Verdict) -> Decision:
    settled = opwindow.settle(record.window, verdict.restore, verdict.result.outcome)
    if isinstance(settled, opwindow.Mismatch):
        return Refused(settled.reason)
    if isinstance(settled, opwindow.AlreadySettled):
        return Refused("restore-settled")
    result = verdict.result
    seeded = isinstance(result, SeedSucceeded)
    if isinstance(result, SeedSucceeded) and record.resuming != result.resumed:
        return Refused("resume-mismatch")  # a snapshot's verdict on a resume, or the reverse
    state = State.SEEDED if seeded else State.SEED_FAILED
    # Resumed: the checkpoint it came from is superseded, no longer named, and owed. A
    # failed resume keeps naming it: the work is still there.
    superseded = record.checkpoint if seeded and record.resuming else None
    changes = {"checkpoint": None} if superseded is not None else {}
    changed = next_record(
        record, verdict.now, state=state, result=result, window=settled.window, **changes
    )
    owes = (superseded.key,) if superseded is not None else ()
    return Change(changed, settled.entry, owes=owes)


SETTLE_SEED = Transition[Verdict](
    "settle_seed",
    # The slot task's verdict on its own attempt, its restore settled in the same write.
    checks=(
        Equals("attempt", lambda p: p.attempt, "attempt-superseded"),
        Equals("attempt", lambda p: p.restore.generation, "attempt-superseded"),
        InState(frozenset({State.SEEDING})),
    ),
    effect=_settle_seed,
    to=VERDICTS,
    already=_verdict_stands,
)


def _new_attempt(record: SlotRecord, at: At) -> Decision:
    """The lost attempt's unsettled work becomes unknown and is kept."""
    attempt = record.attempt + 1
    window = opwindow.advance_generation(record.window, attempt)
    reserved = opwindow.reserve(window, OpKind.RESTORE, Actor.SLOT_TASK, attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    changed = next_record(record, at.now, attempt=attempt, incarnation=None, window=reserved.window)
    return Change(changed, reserved.entry)


BEGIN_ATTEMPT = Transition[At](
    "begin_attempt",
    # A seeding slot whose task is gone without a verdict: a new attempt, a new restore.
    checks=(InState(frozenset({State.SEEDING})),),
    effect=_new_attempt,
    to=frozenset({State.SEEDING}),
)
