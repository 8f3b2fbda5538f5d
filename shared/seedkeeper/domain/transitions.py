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
from seedkeeper.domain.checkpoints import Backoff, counts_for, retry_after
from seedkeeper.domain.models import Binding, Incarnation, OwnerClaim
from seedkeeper.domain.opwindow import Actor, Operation, OpKind, OpRef, Window
from seedkeeper.domain.record import (
    ENDED_STATES,
    LIVE_STATES,
    Checkpoint,
    Loss,
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
    # Checkpoint objects this change makes owed deletions (a resume's superseded one): the
    # store writes each as a ledger debt in the same transaction as the record.
    owes: tuple[str, ...] = ()


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
    stays: frozenset[State] = frozenset()  # states it leaves as they are (not drawn as moves)
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
class KeepAlive:
    """A touch by the slot's owner without a seed body (None: a cold slot's)."""

    owner: OwnerClaim | None
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
class CheckpointFailed:
    """The slot task resumed its sandbox after its checkpoint `op` failed for `reason`."""

    op: OpRef
    reason: str
    now: int


@dataclass(frozen=True)
class Parked:
    stop: OpRef
    now: int
    expires_at: int


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
    effect=lambda record, p: Change(_next(record, p.now, state=State.SEEDED)),
    to=frozenset({State.SEEDED}),
)


KEEPALIVE = Transition[KeepAlive](
    "keepalive",
    # A poll without a seed body: the owner's claim is the identity it checks.
    checks=(
        Equals("owner", lambda p: p.owner, "claim-mismatch"),
        InState(LIVE_STATES, reason="slot-closed"),
    ),
    effect=lambda record, p: Change(_next(record, p.now, idle_deadline=p.idle_deadline)),
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
    changed = _next(
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
    result = verdict.result
    seeded = isinstance(result, SeedSucceeded)
    if isinstance(result, SeedSucceeded) and record.resuming != result.resumed:
        return Refused("resume-mismatch")  # a snapshot's verdict on a resume, or the reverse
    state = State.SEEDED if seeded else State.SEED_FAILED
    # Resumed: the checkpoint it came from is superseded, no longer named, and owed. A
    # failed resume keeps naming it: the work is still there.
    superseded = record.checkpoint if seeded and record.resuming else None
    changes = {"checkpoint": None} if superseded is not None else {}
    changed = _next(
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
    changed = _next(record, at.now, attempt=attempt, incarnation=None, window=reserved.window)
    return Change(changed, reserved.entry)


BEGIN_ATTEMPT = Transition[At](
    "begin_attempt",
    # A seeding slot whose task is gone without a verdict: a new attempt, a new restore.
    checks=(InState(frozenset({State.SEEDING})),),
    effect=_new_attempt,
    to=frozenset({State.SEEDING}),
)


def _idle_in(state: State) -> tuple[Check, ...]:
    """The sweep's checks before any step it takes: expired (checked first: a fresh slot is
    left alone whatever its state), in `state`, nothing in flight."""
    return (
        Below("idle_deadline", lambda p: p.now, "not-idle"),
        InState(frozenset({state})),
        Equals("open_ops", lambda p: 0, "unsettled-operations"),
    )


def _move_reserving(
    record: SlotRecord, now: int, state: State, kind: OpKind, actor: Actor
) -> Decision:
    """Into `state`, with `actor`'s `kind` of work reserved in the same write."""
    reserved = opwindow.reserve(record.window, kind, actor, record.attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    changed = _next(record, now, state=state, window=reserved.window)
    return Change(changed, reserved.entry)


def _reserve_stop(record: SlotRecord, at: At) -> Decision:
    return _move_reserving(record, at.now, State.CLOSING, OpKind.STOP, Actor.SWEEP)


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
    changed = _next(
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
    return _move_reserving(record, at.now, State.CHECKPOINTING, OpKind.CHECKPOINT, Actor.SLOT_TASK)


REQUEST_CHECKPOINT = Transition[At](
    "request_checkpoint",
    # The sweep's first step with an idle seeded slot: nothing is stopped by it.
    checks=_idle_in(State.SEEDED),
    effect=_request_checkpoint,
    to=frozenset({State.CHECKPOINTING}),
)


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
    return Change(_next(record, freezing.now, frozen_at=freezing.now))


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
    return Change(_next(record, thawed.now, frozen_at=None, window=window))


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
    changed = _next(
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
    changed = _next(
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
    changed = _next(
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


def _checkpoint_on_stop(record: SlotRecord, stopping: Stopping) -> Decision:
    return _move_reserving(
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
    changed = _next(
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
    changed = _next(
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


def _retain(record: SlotRecord, retained: Retained) -> Decision:
    """Why the sweep keeps this slot, and when it looks again: later with each retain in a
    row. Any other write clears the backoff (`_next`), so a change is looked at promptly."""
    retains = min((record.retains or 0) + 1, 1000)
    look = retained.now + retained.backoff.after(retains)
    changed = _next(
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
    return Change(_next(record, reservation.now, window=reserved.window), reserved.entry)


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
    return Change(_next(record, settlement.now, window=settled.window), settled.entry)


SETTLE = Transition[Settlement]("settle", checks=(InState(ALL_STATES),), effect=_settle)


TRANSITIONS: tuple[Transition[Any], ...] = (
    TOUCH,
    KEEPALIVE,
    RESUME,
    RECORD_INCARNATION,
    SETTLE_SEED,
    BEGIN_ATTEMPT,
    FENCE,
    RETIRE,
    REQUEST_CHECKPOINT,
    FREEZE,
    THAW,
    THAWED,
    RECORD_CHECKPOINT,
    CHECKPOINT_FAILED,
    FENCE_PARK,
    PARK,
    CHECKPOINT_ON_STOP,
    PARK_ON_STOP,
    LOSE,
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
        for source in _ordered(transition.source - transition.stays):
            lines += [f"    {source} --> {to}: {transition.name}" for to in _ordered(transition.to)]
    lines += [f"    {state} --> [*]: expires" for state in _ordered(ENDED_STATES)]
    return "\n".join(lines)


def _ordered(states: frozenset[State]) -> list[State]:
    return [state for state in State if state in states]


def _next(record: SlotRecord, now: int, **changes: object) -> SlotRecord:
    """The record after one write: `rev` grows by one, `updated_at` never goes back, and a
    retain's backoff ends unless this write is a retain."""
    updated = {
        "rev": record.rev + 1,
        "updated_at": max(now, record.updated_at),
        "next_look": None,
        "retains": None,
        **changes,
    }
    return SlotRecord.model_validate({**record.model_dump(), **updated})
