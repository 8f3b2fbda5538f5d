"""The slot lifecycle as one table: every transition declared once.

A `Transition` names the states it leaves (`InState`), the checks it makes of the record
in order (each a refusal token), what is already true (acknowledged with no write) and its
effect on the record and its operation window. From that one declaration:

- `Transition.decide` is the pure decision on the record as read: `Change` (the record to
  write), `Acknowledged` (already true) or `Refused` (a reason token);
- the store (`seedkeeper.store.lifecycle`) derives the write: its ConditionExpression is
  the same checks over the same attributes (plus the `rev` and schema it was read at), its
  UpdateExpression the difference between the record as read and as changed.

`TRANSITIONS` is the table; `mermaid()` draws it (the README's state diagram is checked
against it). A birth is the one write with no record to read: `born`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from seedkeeper.domain import opwindow
from seedkeeper.domain.models import Binding, Incarnation
from seedkeeper.domain.opwindow import Actor, Operation, OpKind, OpRef, Window
from seedkeeper.domain.record import (
    LIVE_STATES,
    Checkpoint,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
    encode,
)
from seedkeeper.domain.refused import Refused

# Launching a cold slot is done once the task runs; a restore goes on inside the task.
LAUNCHED = "launched"


@dataclass(frozen=True)
class Change:
    record: SlotRecord
    entry: Operation | None = None  # the operation this change reserved or settled


@dataclass(frozen=True)
class Acknowledged:
    """Already true: nothing to write, nothing replayed."""

    record: SlotRecord
    entry: Operation | None = None


Decision = Change | Acknowledged | Refused

P = TypeVar("P")


# -- checks: each one both a pure test of the record and a condition on its item ----------


@dataclass(frozen=True)
class InState:
    """The states a transition leaves. Refused as `state-<state>` unless `reason` says."""

    states: frozenset[State]
    reason: str | None = None


@dataclass(frozen=True)
class Equals(Generic[P]):
    """The record's `attribute` is `value` (None: absent), compared as the item stores it."""

    attribute: str
    value: Callable[[P], object]
    reason: str


@dataclass(frozen=True)
class Below(Generic[P]):
    """The record's `attribute` is a number below `value`."""

    attribute: str
    value: Callable[[P], int]
    reason: str


Check = InState | Equals[Any] | Below[Any]


def stored(value: object) -> object:
    """A value as the record's item holds it (`record.encode`): models as their JSON maps,
    absent facts as None."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    return value


def holds(check: Check, record: SlotRecord, item: Mapping[str, Any], params: Any) -> bool:
    """The check on the record as read: the same test the store's condition makes."""
    if isinstance(check, InState):
        return record.state in check.states
    if isinstance(check, Equals):
        return item.get(check.attribute) == stored(check.value(params))
    found = item.get(check.attribute)
    return isinstance(found, int) and found < check.value(params)


@dataclass(frozen=True)
class Transition(Generic[P]):
    name: str
    checks: tuple[Check, ...]  # in order; exactly one `InState`
    effect: Callable[[SlotRecord, P], Decision]  # may still refuse (a full window, say)
    to: frozenset[State] = frozenset()  # the states it may move to; empty: the state stays
    already: Callable[[SlotRecord, P], Acknowledged | None] = field(
        default=lambda record, params: None
    )

    def __post_init__(self) -> None:
        if sum(isinstance(check, InState) for check in self.checks) != 1:
            raise ValueError(f"{self.name}: exactly one InState check")

    @property
    def source(self) -> frozenset[State]:
        return next(c.states for c in self.checks if isinstance(c, InState))

    def decide(self, record: SlotRecord, params: P) -> Decision:
        acknowledged = self.already(record, params)
        if acknowledged is not None:
            return acknowledged
        item = encode(record)
        for check in self.checks:
            if not holds(check, record, item, params):
                if isinstance(check, InState):
                    return Refused(check.reason or f"state-{record.state}")
                return Refused(check.reason)
        return self.effect(record, params)


# -- what each transition is told besides the record ---------------------------------------


@dataclass(frozen=True)
class At:
    now: int


@dataclass(frozen=True)
class Poll:
    binding: Binding
    now: int
    idle_deadline: int


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


@dataclass(frozen=True)
class Stopped:
    stop: OpRef
    now: int
    expires_at: int


@dataclass(frozen=True)
class Uploaded:
    checkpoint: Checkpoint
    upload: OpRef
    now: int


@dataclass(frozen=True)
class Retained:
    reason: str
    now: int


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


# -- the table ---------------------------------------------------------------------------

ALL_STATES = frozenset(State)
VERDICTS = frozenset({State.SEEDED, State.SEED_FAILED})
# Where a birth puts a record: seeding when it names a seed (the attempt is durable before
# any restore effect), unseeded otherwise.
BIRTH_STATES = frozenset({State.UNSEEDED, State.SEEDING})


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


def _extend(record: SlotRecord, poll: Poll) -> Decision:
    return Change(_next(record, poll.now, idle_deadline=poll.idle_deadline))


TOUCH = Transition[Poll](
    "touch",
    # The identity first: a caller that is not the slot's own learns nothing of its state.
    checks=(
        Equals("owner", lambda p: p.binding.owner, "claim-mismatch"),
        Equals("seed", lambda p: p.binding.seed, "seed-mismatch"),
        Equals("origin", lambda p: p.binding.origin, "origin-mismatch"),
        InState(LIVE_STATES, reason="slot-closed"),
    ),
    effect=_extend,
)


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
    changed = _next(record, launched.now, incarnation=launched.incarnation, window=window)
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
    seeded = isinstance(verdict.result, SeedSucceeded)
    state = State.SEEDED if seeded else State.SEED_FAILED
    changed = _next(record, verdict.now, state=state, result=verdict.result, window=settled.window)
    return Change(changed, settled.entry)


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
    changed = _next(record, at.now, attempt=attempt, incarnation=None, window=reserved.window)
    return Change(changed, reserved.entry)


BEGIN_ATTEMPT = Transition[At](
    "begin_attempt",
    # A seeding slot whose task is gone without a verdict: a new attempt, a new restore.
    checks=(InState(frozenset({State.SEEDING})),),
    effect=_new_attempt,
    to=frozenset({State.SEEDING}),
)


def _reserve_stop(record: SlotRecord, at: At) -> Decision:
    reserved = opwindow.reserve(record.window, OpKind.STOP, Actor.SWEEP, record.attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    changed = _next(record, at.now, state=State.CLOSING, window=reserved.window)
    return Change(changed, reserved.entry)


FENCE = Transition[At](
    "fence",
    # The idle sweep's only way to destruction: a touch or a seed in the same tick fails it.
    checks=(
        Below("idle_deadline", lambda p: p.now, "not-idle"),
        InState(frozenset({State.UNSEEDED})),
        Equals("open_ops", lambda p: 0, "unsettled-operations"),
    ),
    effect=_reserve_stop,
    to=frozenset({State.CLOSING}),
)


def _retire(record: SlotRecord, stopped: Stopped) -> Decision:
    """A tombstone until `expires_at`, out of the sweep's index. Any other unsettled
    obligation (an unknown one included) blocks it."""
    settled = opwindow.settle(record.window, stopped.stop, "stopped")
    if not isinstance(settled, opwindow.Changed) or settled.entry.kind is not OpKind.STOP:
        return Refused("stop-not-open")
    if settled.window.unsettled:
        return Refused("unsettled-operations")
    changed = _next(
        record,
        stopped.now,
        state=State.RETIRED,
        window=settled.window,
        expires_at=stopped.expires_at,
    )
    return Change(changed, settled.entry)


RETIRE = Transition[Stopped](
    "retire",
    checks=(InState(frozenset({State.CLOSING})),),  # only through the fence
    effect=_retire,
    to=frozenset({State.RETIRED}),
    already=lambda record, p: Acknowledged(record) if record.state is State.RETIRED else None,
)


def _record_checkpoint(record: SlotRecord, uploaded: Uploaded) -> Decision:
    settled = opwindow.settle(record.window, uploaded.upload, "uploaded")
    if not isinstance(settled, opwindow.Changed) or settled.entry.kind is not OpKind.CHECKPOINT:
        return Refused("upload-not-open")
    changed = _next(record, uploaded.now, checkpoint=uploaded.checkpoint, window=settled.window)
    return Change(changed, settled.entry)


RECORD_CHECKPOINT = Transition[Uploaded](
    "record_checkpoint",
    # A verified checkpoint of this owner's work in this incarnation, settling its upload.
    checks=(
        InState(frozenset({State.SEEDED, State.SEED_FAILED, State.CLOSING})),
        Equals("owner", lambda p: p.checkpoint.owner, "checkpoint-owner-mismatch"),
        Equals("incarnation", lambda p: p.checkpoint.incarnation, "checkpoint-owner-mismatch"),
    ),
    effect=_record_checkpoint,
)


NOTE_RETAINED = Transition[Retained](
    "note_retained",
    # Why the sweep keeps this slot: written once, not again while the reason holds.
    checks=(InState(ALL_STATES - {State.RETIRED}),),
    effect=lambda record, p: Change(_next(record, p.now, retained_reason=p.reason)),
    already=lambda record, p: Acknowledged(record) if record.retained_reason == p.reason else None,
)


def _reserve(record: SlotRecord, reservation: Reservation) -> Decision:
    """Reserved before the effect starts; a full window refuses before any effect."""
    reserved = opwindow.reserve(record.window, reservation.kind, reservation.actor, record.attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    return Change(_next(record, reservation.now, window=reserved.window), reserved.entry)


RESERVE = Transition[Reservation](
    "reserve",
    checks=(InState(LIVE_STATES | {State.CLOSING}),),
    effect=_reserve,
)


# Settled only by the transition that also moves the state: `SETTLE_SEED` and `RETIRE`.
_SETTLED_WITH_STATE = frozenset({OpKind.RESTORE, OpKind.STOP})


def _settle(record: SlotRecord, settlement: Settlement) -> Decision:
    """A launch or a checkpoint upload settled on its own (a failed upload, say)."""
    entry = record.window.entry(settlement.ref.ordinal)
    if entry is not None and entry.kind in _SETTLED_WITH_STATE:
        return Refused(f"{entry.kind}-settles-with-its-state")
    settled = opwindow.settle(record.window, settlement.ref, settlement.outcome)
    if isinstance(settled, opwindow.Mismatch):
        return Refused(settled.reason)
    if isinstance(settled, opwindow.AlreadySettled):
        return Acknowledged(record, settled.entry)
    return Change(_next(record, settlement.now, window=settled.window), settled.entry)


SETTLE = Transition[Settlement]("settle", checks=(InState(ALL_STATES),), effect=_settle)


TRANSITIONS: tuple[Transition[Any], ...] = (
    TOUCH,
    RECORD_INCARNATION,
    SETTLE_SEED,
    BEGIN_ATTEMPT,
    FENCE,
    RETIRE,
    RECORD_CHECKPOINT,
    NOTE_RETAINED,
    RESERVE,
    SETTLE,
)


def mermaid() -> str:
    """The state diagram of the table: every transition that moves a record, from each
    state it leaves to each state it may reach; a birth from `[*]`, a tombstone's expiry
    (the table's TTL) to `[*]`."""
    lines = ["stateDiagram-v2"]
    lines += [f"    [*] --> {state}: born" for state in _ordered(BIRTH_STATES)]
    for transition in TRANSITIONS:
        for source in _ordered(transition.source):
            lines += [f"    {source} --> {to}: {transition.name}" for to in _ordered(transition.to)]
    lines.append(f"    {State.RETIRED} --> [*]: expires")
    return "\n".join(lines)


def _ordered(states: frozenset[State]) -> list[State]:
    return [state for state in State if state in states]


def _next(record: SlotRecord, now: int, **changes: object) -> SlotRecord:
    """The record after one write: `rev` grows by one, `updated_at` never goes back."""
    updated = {"rev": record.rev + 1, "updated_at": max(now, record.updated_at), **changes}
    return SlotRecord.model_validate({**record.model_dump(), **updated})
