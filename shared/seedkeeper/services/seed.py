"""`POST /seed`: restore a resident snapshot into a slot, bound to a trusted owner claim.

The first call births the slot's record (before any effect), launches its task and records
the incarnation. The same call again is the poll and the re-attach: one conditional update
that extends the idle deadline and answers the current state, never a second task, never a
touch of the checkout. Anyone else gets a 409 reason token and learns nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import Field, SecretStr

from seedkeeper.adapters.r2 import R2, backup_key
from seedkeeper.adapters.runtime import SlotRuntime
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import IdleSettings
from seedkeeper.domain.models import Binding, Model, Origin, OwnerClaim, SeedIdentity, SlotId
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.outcomes import Cold, NotSeeded, Seeded, Seeding, SeedOutcome
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import (
    SUCCEEDED_STATES,
    Absent,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
    Supported,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.transitions import TOUCH, Acknowledged, Poll
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Unmet, Written
from seedkeeper.store.snapshots import SnapshotStore

# Re-deciding after a lost race: each round sees a newer record, so few are ever needed.
_ROUNDS = 4


class SeedSettings(IdleSettings):
    max_attempts: Annotated[int, Field(ge=1, le=8)] = 3
    deps_path: str = "node_modules"


class SeedRequest(Model):
    slot: SlotId
    seed: SeedIdentity | None
    claim: OwnerClaim | None = None
    origin: Origin | None = None

    @property
    def binding(self) -> Binding:
        return Binding(owner=self.claim, seed=self.seed, origin=self.origin)


# What a seed refuses with: a poll that is not the slot's own binding, or a closed slot
# (TOUCH's checks), or a record this code may not write.
REFUSALS = (*(check.reason for check in TOUCH.checks if check.reason), "record-unsupported")


class SeedService:
    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        snapshots: SnapshotStore,
        r2: R2 | None,
        runtime: Callable[[], SlotRuntime],
        settings: SeedSettings,
        presign_expiry: int,
        clock: Callable[[], int],
    ) -> None:
        self._lifecycle = lifecycle
        self._snapshots = snapshots
        self._r2 = r2
        self._runtime = runtime
        self._settings = settings
        self._presign_expiry = presign_expiry
        self._clock = clock

    def seed(self, request: SeedRequest) -> SeedOutcome:
        if request.seed is not None and self._r2 is None:
            return NotSeeded(reason="seed-unconfigured")
        for _ in range(_ROUNDS):
            now = self._clock()
            poll = Poll(request.binding, now=now, idle_deadline=now + self._settings.idle_window)
            touched = self._lifecycle.touch(request.slot, poll)
            if isinstance(touched, Written):
                return self._attach(request, self._thawed(touched.record, poll))
            current = touched.current
            if isinstance(current, Supported):
                refused = TOUCH.decide(current.record, poll)
                if isinstance(refused, Refused):
                    return refused
                continue  # ours after all (a race): touch it again
            if not isinstance(current, Absent):
                return Refused("record-unsupported")
            born = self._birth(request)
            if born is not None:
                return born
        return Refused("retry-later")

    def _thawed(self, record: SlotRecord, poll: Poll) -> SlotRecord:
        """A poll of a slot being checkpointed wants its work back: `seeded` again, so its
        task resumes the sandbox and the sweep's park fence fails (the touch alone already
        made it fail). One more write, only in this case. If it cannot be written the
        record is answered as it is: still frozen."""
        if record.state not in transitions.CHECKPOINT_STATES:
            return record
        # On the record the touch returned: one call unless someone moved in between.
        thawed = self._lifecycle.apply(record.slot, transitions.THAW, poll, as_read=record)
        return thawed.record if isinstance(thawed, Written | Acknowledged) else record

    def _birth(self, request: SeedRequest) -> SeedOutcome | None:
        """None when another caller's birth won the race: the caller re-decides. A seeded
        slot is born only in one transaction with the proof that a recorded generation
        names its seed, so nothing unrecorded is ever presigned."""
        seed = request.seed
        now = self._clock()
        born = self._lifecycle.birth(
            request.slot,
            request.binding,
            now=now,
            idle_deadline=now + self._settings.idle_window,
            requires=self._snapshots.recorded_check(seed) if seed is not None else None,
        )
        if isinstance(born, Unmet):
            return NotSeeded(reason="seed-missing")
        if isinstance(born, Conflict):
            return None
        assert born.entry is not None
        return self._launch(born.record, born.entry.ref)

    def _attach(self, request: SeedRequest, record: SlotRecord) -> SeedOutcome:
        """The same call again: answer the state, finishing a launch a dead handler left."""
        if record.state in {State.SEEDING, State.UNSEEDED}:
            open_launch = next(
                (e for e in record.window.entries if e.generation == record.attempt), None
            )
            if record.incarnation is None and open_launch is not None and not open_launch.settled:
                return self._relaunch(request, record, open_launch.ref)
            if record.state is State.SEEDING and record.incarnation is not None:
                status = self._runtime().status(record.incarnation)
                if status is TaskStatus.STOPPED:
                    return self._retry(request, record)
        return outcome_of(record)

    def _retry(self, request: SeedRequest, record: SlotRecord) -> SeedOutcome:
        """The task died without a verdict: a new attempt, whose debris sweep never touches
        a bound checkout. Bounded: past max_attempts the slot stays seeding (retained)."""
        if record.attempt >= self._settings.max_attempts:
            return NotSeeded(reason="seed-failed", step="task-lost", detail=None)
        outcome = self._lifecycle.write(
            transitions.BEGIN_ATTEMPT, record, transitions.At(now=self._clock())
        )
        if not isinstance(outcome, Written):
            return outcome_of(record)
        assert outcome.entry is not None
        return self._relaunch(request, outcome.record, outcome.entry.ref)

    def _relaunch(self, request: SeedRequest, record: SlotRecord, op: OpRef) -> SeedOutcome:
        seed = request.seed
        if seed is not None and self._snapshots.read(seed.resource).archives_for(seed) is None:
            # Rotated out since birth: nothing unrecorded is presigned. The record stays
            # seeding with its launch unsettled, so the slot is retained.
            return NotSeeded(reason="seed-missing")
        return self._launch(record, op)

    def _launch(self, record: SlotRecord, op: OpRef) -> SeedOutcome:
        seed = record.seed
        plan = SlotPlan(
            slot=record.slot,
            attempt=record.attempt,
            op=op,
            seed=seed,
            owner=record.owner,
            origin=record.origin,
            checkout=self._presign(seed.checkout_backup_id) if seed else None,
            deps=self._presign(seed.deps_backup_id) if seed and seed.deps_backup_id else None,
            deps_path=self._settings.deps_path,
        )
        incarnation = self._runtime().launch(plan)
        for _ in range(_ROUNDS):
            outcome = self._lifecycle.write(
                transitions.RECORD_INCARNATION,
                record,
                transitions.Launched(incarnation=incarnation, launch=op, now=self._clock()),
            )
            if isinstance(outcome, Written | Acknowledged):
                return outcome_of(outcome.record)
            if isinstance(outcome, Refused):
                break
            if not isinstance(outcome.current, Supported):
                break
            record = outcome.current.record  # the task settled or a poll touched: re-decide
        return outcome_of(record)

    def _presign(self, backup_id: str) -> SecretStr:
        """Called only for archives a record names (checked by the birth's transaction or
        the relaunch's read); the task verifies each against its recorded size and sha256."""
        assert self._r2 is not None
        return SecretStr(self._r2.presign_get(backup_key(backup_id), self._presign_expiry))


def outcome_of(record: SlotRecord) -> Seeded | NotSeeded | Cold | Seeding:
    """What a seed answers about the record as it now is."""
    result = record.result
    if isinstance(result, SeedSucceeded) and record.state in SUCCEEDED_STATES:
        return Seeded(
            cached=True,
            ref=result.ref,
            sha=result.head,
            from_=result.from_backup,
            steps=result.steps,
            ms=result.ms,
            incarnation=record.incarnation,
            claim=record.owner,
            frozen=record.frozen_at is not None or record.state is not State.SEEDED,
        )
    if record.state is State.SEED_FAILED and isinstance(result, SeedFailed):
        return NotSeeded(reason=result.reason, step=result.step, detail=result.detail)
    if record.state is State.UNSEEDED:
        return Cold(slot=record.slot, attempt=record.attempt, incarnation=record.incarnation)
    return Seeding(
        slot=record.slot,
        attempt=record.attempt,
        incarnation=record.incarnation,
        claim=record.owner,
    )
