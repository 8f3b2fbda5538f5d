"""What each lifecycle transition does to a record, decided without I/O.

Every function takes the record as read and answers either the record to write
(`Change`), an acknowledgement that needs no write (`Acknowledged`), or a refusal with a
reason token (`Refused`). The lifecycle module writes a `Change` with one conditional
write; the conditions there restate these rules so a concurrent writer cannot slip
between the read and the write.
"""

from __future__ import annotations

from dataclasses import dataclass

from seedkeeper.domain import opwindow
from seedkeeper.domain.models import Incarnation, Origin, OwnerClaim, SeedIdentity
from seedkeeper.domain.opwindow import Actor, Operation, OpKind, OpRef, Window
from seedkeeper.domain.record import (
    LIVE_STATES,
    Checkpoint,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
)

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


@dataclass(frozen=True)
class Refused:
    reason: str


Decision = Change | Acknowledged | Refused


def born(
    slot: str,
    *,
    owner: OwnerClaim | None,
    seed: SeedIdentity | None,
    origin: Origin | None,
    now: int,
    idle_deadline: int,
) -> Change:
    """A new record, with the launch reserved before anything is launched. A seeded slot
    is `seeding` from birth: the attempt is durable before any restore effect."""
    attempt = 1
    kind, actor = (OpKind.RESTORE, Actor.SLOT_TASK) if seed else (OpKind.LAUNCH, Actor.SEED_FN)
    reserved = opwindow.reserve(Window(), kind, actor, generation=attempt)
    assert isinstance(reserved, opwindow.Reserved)  # an empty window always has room
    record = SlotRecord(
        slot=slot,
        rev=1,
        state=State.SEEDING if seed else State.UNSEEDED,
        owner=owner,
        seed=seed,
        origin=origin,
        attempt=attempt,
        idle_deadline=idle_deadline,
        window=reserved.window,
        created_at=now,
        updated_at=now,
    )
    return Change(record, reserved.entry)


def record_incarnation(
    record: SlotRecord, *, incarnation: Incarnation, launch: OpRef, now: int
) -> Decision:
    """The container the slot was born in. A cold launch is settled by it; a restore
    continues detached inside the task (which may already have settled it)."""
    if record.incarnation == incarnation:
        return Acknowledged(record)
    if record.incarnation is not None:
        return Refused("incarnation-recorded")
    if record.state not in LIVE_STATES:
        return Refused(f"state-{record.state}")
    if launch.generation != record.attempt:
        return Refused("attempt-superseded")
    entry = record.window.entry(launch.ordinal)
    handed_off = (
        opwindow.settle(record.window, launch, LAUNCHED)
        if entry is not None and entry.kind is OpKind.LAUNCH
        else opwindow.detach(record.window, launch)
    )
    if isinstance(handed_off, opwindow.Mismatch):
        return Refused(handed_off.reason)
    window = handed_off.window if isinstance(handed_off, opwindow.Changed) else record.window
    return Change(_next(record, now, incarnation=incarnation, window=window), handed_off.entry)


def settle_seed(
    record: SlotRecord,
    *,
    attempt: int,
    restore: OpRef,
    result: SeedSucceeded | SeedFailed,
    now: int,
) -> Decision:
    """The slot task's verdict on its own attempt, with its restore operation settled in
    the same write. A duplicate is acknowledged: the first verdict stands."""
    if record.attempt != attempt or restore.generation != attempt:
        return Refused("attempt-superseded")
    settled = opwindow.settle(record.window, restore, result.outcome)
    if isinstance(settled, opwindow.Mismatch):
        return Refused(settled.reason)
    if isinstance(settled, opwindow.AlreadySettled):
        if record.state in {State.SEEDED, State.SEED_FAILED}:
            return Acknowledged(record, settled.entry)
        return Refused("restore-settled")
    if record.state is not State.SEEDING:
        return Refused(f"state-{record.state}")
    state = State.SEEDED if isinstance(result, SeedSucceeded) else State.SEED_FAILED
    return Change(
        _next(record, now, state=state, result=result, window=settled.window), settled.entry
    )


def begin_attempt(record: SlotRecord, *, now: int) -> Decision:
    """A seeding slot whose task is gone without a verdict: a new attempt with a new
    restore. The lost attempt's unsettled work becomes unknown and is kept."""
    if record.state is not State.SEEDING:
        return Refused(f"state-{record.state}")
    attempt = record.attempt + 1
    window = opwindow.advance_generation(record.window, attempt)
    reserved = opwindow.reserve(window, OpKind.RESTORE, Actor.SLOT_TASK, attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    changed = _next(record, now, attempt=attempt, incarnation=None, window=reserved.window)
    return Change(changed, reserved.entry)


def fence(record: SlotRecord, *, now: int) -> Decision:
    """The idle sweep's only way to destruction: a positively-unseeded, expired slot with
    no unsettled operation goes to `closing`, with its stop reserved."""
    if record.state is not State.UNSEEDED:
        return Refused(f"state-{record.state}")
    if record.idle_deadline >= now:
        return Refused("not-idle")
    if record.window.unsettled:
        return Refused("unsettled-operations")
    reserved = opwindow.reserve(record.window, OpKind.STOP, Actor.SWEEP, record.attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    return Change(_next(record, now, state=State.CLOSING, window=reserved.window), reserved.entry)


def retire(record: SlotRecord, *, stop: OpRef, now: int, expires_at: int) -> Decision:
    """After the stop: a tombstone until `expires_at`, out of the sweep's index. Any other
    unsettled obligation (an unknown one included) blocks it."""
    if record.state is State.RETIRED:
        return Acknowledged(record)
    if record.state is not State.CLOSING:
        return Refused(f"state-{record.state}")
    settled = opwindow.settle(record.window, stop, "stopped")
    if not isinstance(settled, opwindow.Changed) or settled.entry.kind is not OpKind.STOP:
        return Refused("stop-not-open")
    if settled.window.unsettled:
        return Refused("unsettled-operations")
    return Change(
        _next(record, now, state=State.RETIRED, window=settled.window, expires_at=expires_at),
        settled.entry,
    )


def record_checkpoint(
    record: SlotRecord, *, checkpoint: Checkpoint, upload: OpRef, now: int
) -> Decision:
    """A verified checkpoint of this owner's work in this incarnation, settling its upload."""
    if record.state not in {State.SEEDED, State.SEED_FAILED, State.CLOSING}:
        return Refused(f"state-{record.state}")
    if checkpoint.owner != record.owner or checkpoint.incarnation != record.incarnation:
        return Refused("checkpoint-owner-mismatch")
    settled = opwindow.settle(record.window, upload, "uploaded")
    if not isinstance(settled, opwindow.Changed) or settled.entry.kind is not OpKind.CHECKPOINT:
        return Refused("upload-not-open")
    return Change(_next(record, now, checkpoint=checkpoint, window=settled.window), settled.entry)


def note_retained(record: SlotRecord, *, reason: str, now: int) -> Decision:
    """Why the sweep keeps this slot: written once, not again while the reason holds."""
    if record.retained_reason == reason:
        return Acknowledged(record)
    if record.state is State.RETIRED:
        return Refused("state-retired")
    return Change(_next(record, now, retained_reason=reason))


def reserve(record: SlotRecord, *, kind: OpKind, actor: Actor, now: int) -> Decision:
    """Reserve an effect before starting it; a full window refuses before any effect."""
    if record.state not in LIVE_STATES | {State.CLOSING}:
        return Refused(f"state-{record.state}")
    reserved = opwindow.reserve(record.window, kind, actor, record.attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    return Change(_next(record, now, window=reserved.window), reserved.entry)


# Settled only by the transition that also moves the state: `settle_seed` and `retire`.
_SETTLED_WITH_STATE = frozenset({OpKind.RESTORE, OpKind.STOP})


def settle(record: SlotRecord, *, ref: OpRef, outcome: str, now: int) -> Decision:
    """Settle a launch or a checkpoint upload on its own (a failed upload, say)."""
    entry = record.window.entry(ref.ordinal)
    if entry is not None and entry.kind in _SETTLED_WITH_STATE:
        return Refused(f"{entry.kind}-settles-with-its-state")
    settled = opwindow.settle(record.window, ref, outcome)
    if isinstance(settled, opwindow.Mismatch):
        return Refused(settled.reason)
    if isinstance(settled, opwindow.AlreadySettled):
        return Acknowledged(record, settled.entry)
    return Change(_next(record, now, window=settled.window), settled.entry)


def _next(record: SlotRecord, now: int, **changes: object) -> SlotRecord:
    """The record after one write: `rev` grows by one, `updated_at` never goes back."""
    updated = {"rev": record.rev + 1, "updated_at": max(now, record.updated_at), **changes}
    return SlotRecord.model_validate({**record.model_dump(), **updated})
