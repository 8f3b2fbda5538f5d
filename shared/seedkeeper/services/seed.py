"""`POST /seed`: restore a resident snapshot into a slot, bound to a trusted owner claim.

The first call births the slot's record (before any effect), launches its task and records
the incarnation. The same call again is the poll and the re-attach: one conditional update
that extends the idle deadline and answers the current state, never a second task, never a
touch of the checkout. On a parked slot it is the resume: a new attempt that restores the
slot's own checkpoint. Anyone else gets a 409 reason token and learns nothing more.

`POST /keepalive` is the poll without a seed body: the owner's claim alone, one update.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from seedkeeper.adapters.r2 import R2
from seedkeeper.adapters.runtime import SlotRuntime
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import IdleSettings
from seedkeeper.domain.models import Binding, Model, Origin, OwnerClaim, SeedIdentity, SlotId
from seedkeeper.domain.opwindow import OpKind, OpRef, OpStatus
from seedkeeper.domain.outcomes import Cold, KeptAlive, NotSeeded, Seeded, Seeding, SeedOutcome
from seedkeeper.domain.plan import DEPS_PATH, SlotPlan
from seedkeeper.domain.record import (
    SUCCEEDED_STATES,
    Absent,
    Checkpoint,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
    Supported,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.standby import BLANK_POOL, PoolSettings, Standby, StandbyState
from seedkeeper.domain.transitions import KEEPALIVE, RESUME, TOUCH, Acknowledged, KeepAlive, Poll
from seedkeeper.errors import R2Unavailable
from seedkeeper.observability import count, logger
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Unmet, Written
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper.store.standbys import StandbyStore

# Re-deciding after a lost race: each round sees a newer record, so few are ever needed.
_ROUNDS = 4
# Free standbys a launch tries before it starts a task: each one passed over was taken by
# another seed in the moment between the look and the take.
_STANDBY_TRIES = 3


class SeedSettings(IdleSettings):
    max_attempts: Annotated[int, Field(ge=1, le=8)] = 3
    deps_path: str = DEPS_PATH


class SeedRequest(Model):
    slot: SlotId
    seed: SeedIdentity | None
    claim: OwnerClaim | None = None
    origin: Origin | None = None

    @property
    def binding(self) -> Binding:
        return Binding(owner=self.claim, seed=self.seed, origin=self.origin)


class KeepaliveRequest(Model):
    slot: SlotId
    claim: OwnerClaim | None  # None: a cold slot's (or an unclaimed seed's)


# What a seed refuses with: a poll that is not the slot's own binding, or a closed slot
# (TOUCH's checks), or a record this code may not write. A resume refuses with the same
# checks first (RESUME's), and a checkpoint it cannot restore is a `NotSeeded`, not a
# refusal (`_not_restorable`).
REFUSALS = (*(check.reason for check in TOUCH.checks if check.reason), "record-unsupported")
# A keepalive's: another owner's claim, a closed (or absent) slot, a record this code may
# not write.
KEEPALIVE_REFUSALS = (
    *(check.reason for check in KEEPALIVE.checks if check.reason),
    "record-unsupported",
)


def _not_restorable(detail: str) -> NotSeeded:
    """The slot's checkpoint cannot be restored: said so to its owner, and nothing is
    written (a parked slot stays parked until its record expires; a resume whose task died
    stays seeding, retained, its checkpoint still named)."""
    return NotSeeded(reason="seed-missing", step="resume", detail=detail)


class SeedService:
    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        snapshots: SnapshotStore,
        r2: R2 | None,
        runtime: Callable[[], SlotRuntime],
        settings: SeedSettings,
        clock: Callable[[], int],
        standbys: StandbyStore | None = None,
        pools: PoolSettings | None = None,
    ) -> None:
        """`standbys`, `pools`: where free standbys are found, and how many are kept (none:
        every launch starts a task)."""
        self._standbys = standbys
        self._pools = pools or PoolSettings()
        self._lifecycle = lifecycle
        self._snapshots = snapshots
        self._r2 = r2
        self._runtime = runtime
        self._settings = settings
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
                record = current.record
                refused = TOUCH.decide(record, poll)
                if not isinstance(refused, Refused):
                    continue  # ours after all (a race): touch it again
                if record.state is State.PARKED:
                    resumed = self._resume(record, poll)
                    if resumed is None:
                        continue  # moved meanwhile (another resume?): re-decide
                    return resumed
                if record.state is State.LOST and refused.reason == "slot-closed":
                    return outcome_of(record)  # its own owner (the binding held): the loss
                return refused
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

    def keepalive(self, request: KeepaliveRequest) -> KeptAlive | Refused:
        """The owner's touch without a seed body: one UpdateItem extending the idle
        deadline (a second, `thaw`, only for a slot being checkpointed, as for a poll)."""
        seeded = request.claim is not None  # a claimed slot is a seeded one, almost always
        for _ in range(_ROUNDS):
            now = self._clock()
            keep = KeepAlive(request.claim, now=now, idle_deadline=now + self._settings.idle_window)
            touched = self._lifecycle.keepalive(request.slot, keep, seeded=seeded)
            if isinstance(touched, Written):
                record = touched.record
                # THAW checks the whole binding: the touched record's own (the claim held).
                poll = Poll(record.binding, now=now, idle_deadline=keep.idle_deadline)
                return kept_alive(self._thawed(record, poll))
            current = touched.current
            if isinstance(current, Absent):
                return Refused("slot-closed")  # gone (a retired record expires) or never born
            if not isinstance(current, Supported):
                return Refused("record-unsupported")
            refused = KEEPALIVE.decide(current.record, keep)
            if isinstance(refused, Refused):
                return refused
            # Ours after all: a race, or a claimed cold slot. Touch it again, as it is.
            seeded = current.record.seed is not None
        return Refused("retry-later")

    def _resume(self, record: SlotRecord, poll: Poll) -> SeedOutcome | None:
        """A parked slot's owner is back: a new attempt restoring its checkpoint. RESUME's
        binding checks come first, so anyone else hears what any mismatch hears. Nothing is
        written unless R2 holds the checkpoint as recorded. None: the record moved between
        the read and the write; the caller re-decides."""
        decision = RESUME.decide(record, poll)
        if isinstance(decision, Refused):
            return self._not_resumed(decision)
        assert record.checkpoint is not None  # a parked record names one
        gone = self._checkpoint_gone(record.checkpoint)
        if gone is not None:
            return gone
        written = self._lifecycle.write(RESUME, record, poll)
        if isinstance(written, Refused):
            return self._not_resumed(written)
        if not isinstance(written, Written):
            return None
        assert written.entry is not None  # the resume's restore, reserved in that write
        return self._launch(written.record, written.entry.ref)

    @staticmethod
    def _not_resumed(refused: Refused) -> SeedOutcome:
        """Past its retention a checkpoint no longer counts (R2's lifecycle rule deletes it
        soon after): as gone for its owner as a deleted one. Every other refusal is answered
        as it is: a binding check's as a poll's (a full window cannot be: a parked record has
        no unsettled operation)."""
        if refused.reason == "checkpoint-not-counted":
            return _not_restorable("checkpoint expired")
        return refused

    def _checkpoint_gone(self, checkpoint: Checkpoint) -> NotSeeded | None:
        """None when R2 holds the checkpoint as recorded (its size and ETag; the task
        verifies its sha256). R2 not answering, or a bucket that is not there, raises
        `R2Unavailable`: a 503 `retry-later`, nothing written."""
        assert self._r2 is not None  # a parked record names a seed, and a seed needs R2
        facts = self._r2.head(checkpoint.key)
        if facts is None:
            # A bare 404 is also what a missing bucket answers: only a bucket that is there
            # makes the checkpoint lost.
            if not self._r2.bucket_exists():
                raise R2Unavailable("NoSuchBucket")
            return _not_restorable("checkpoint lost")
        if (facts.size, facts.etag) != (checkpoint.size, checkpoint.etag):
            return _not_restorable("checkpoint changed")
        return None

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
        a bound checkout. Bounded: past max_attempts the slot stays seeding (retained).

        Counted by the attempts this seed (or this resume) lost, not by `attempt`, which
        every resume also advances: each lost attempt's restore stays `unknown` in the
        window (never evicted), and a parked record has none left."""
        lost = sum(
            entry.kind is OpKind.RESTORE and entry.status is OpStatus.UNKNOWN
            for entry in record.window.entries
        )
        if lost + 1 >= self._settings.max_attempts:
            return NotSeeded(reason="seed-failed", step="task-lost", detail=None)
        outcome = self._lifecycle.write(
            transitions.BEGIN_ATTEMPT, record, transitions.At(now=self._clock())
        )
        if not isinstance(outcome, Written):
            return outcome_of(record)
        assert outcome.entry is not None
        return self._relaunch(request, outcome.record, outcome.entry.ref)

    def _relaunch(self, request: SeedRequest, record: SlotRecord, op: OpRef) -> SeedOutcome:
        if record.checkpoint is not None and record.resuming:
            # A resume's task died: it restores the checkpoint, so only while R2 holds it.
            gone = self._checkpoint_gone(record.checkpoint)
            return gone if gone is not None else self._launch(record, op)
        seed = request.seed
        if seed is not None and self._snapshots.read(seed.resource).archives_for(seed) is None:
            # Rotated out since birth: no task is started for it (its start would be refused
            # too). The record stays seeding with its launch unsettled: the slot is retained.
            return NotSeeded(reason="seed-missing")
        return self._launch(record, op)

    def _launch(self, record: SlotRecord, op: OpRef) -> SeedOutcome:
        """Give the attempt a free standby when there is one (`_take_standby`); else start
        its task, then record it. The plan names the attempt and the binding, never a URL:
        the task asks the checkpoint function for those when it starts. So a relaunch of one
        attempt sends RunTask exactly what the first launch sent, and its client token
        answers the same task."""
        plan = SlotPlan.of(record, op, deps_path=self._settings.deps_path)
        taken = self._take_standby(record, op, plan)
        if taken is not None:
            return taken
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

    def _take_standby(self, record: SlotRecord, op: OpRef, plan: SlotPlan) -> SeedOutcome | None:
        """Bind a free standby's task to this attempt: the standby's move to `assigned` and
        the record's incarnation in one transaction (one slot per standby, at most one task
        per attempt), with, for a pre-seeded one, the proof that its generation is still
        the resource's current one. One holding the seed's generation first, else a blank
        one, tried in random order so racing seeds spread; one taken meanwhile is passed
        over. None: no standby could be taken, and the caller launches a task."""
        standbys = self._standbys
        if standbys is None or not self._pools.any:
            return None
        seed = plan.binding.seed
        pools: list[tuple[str, SeedIdentity | None]] = []  # which pools could serve it
        if seed is not None and not record.resuming and self._pools.preseeded.get(seed.resource):
            pools.append((seed.resource, seed))
        if self._pools.pool:
            pools.append((BLANK_POOL, None))
        if not pools:
            return None  # no pool kept serves this seed: nothing to find, nothing missing
        candidates = [
            standby
            for pool, holding in pools
            for standby in free_standbys(standbys.pool(pool, consistent=False), holding=holding)
        ]
        for standby in candidates[:_STANDBY_TRIES]:
            assert standby.incarnation is not None  # a free standby's task reported in
            now = self._clock()
            alongside = [standbys.take(standby, plan, now)]
            if standby.preseed is not None:
                generation = standby.preseed
                alongside.append(
                    self._snapshots.current_check(generation.resource, generation.generation)
                )
            launched = transitions.Launched(incarnation=standby.incarnation, launch=op, now=now)
            outcome = self._lifecycle.write_with(
                transitions.RECORD_INCARNATION, record, launched, alongside
            )
            if isinstance(outcome, Unmet):
                continue  # taken by another seed, retired, or its generation superseded
            if isinstance(outcome, Written | Acknowledged):
                logger.info("standby taken", slot=record.slot, preseeded=bool(standby.preseed))
                return outcome_of(outcome.record)
            if isinstance(outcome, Conflict) and isinstance(outcome.current, Supported):
                return outcome_of(outcome.current.record)  # moved: a task or verdict is there
            return outcome_of(record)
        count("StandbyPoolEmpty")
        return None


def free_standbys(standbys: list[Standby], *, holding: SeedIdentity | None = None) -> list[Standby]:
    """The free ones (holding the seed's generation, when given), in random order."""
    free = [
        s
        for s in standbys
        if s.state is StandbyState.FREE
        and s.incarnation is not None
        and (holding is None or (s.preseed is not None and s.preseed.holds(holding)))
    ]
    random.shuffle(free)
    return free


def outcome_of(record: SlotRecord) -> Seeded | NotSeeded | Cold | Seeding:
    """What a seed answers about the record as it now is."""
    if record.loss is not None:  # the work went with its task: said so, never hidden
        return NotSeeded(reason="lost", step=record.loss.reason, detail=record.loss.detail)
    result = record.result
    if isinstance(result, SeedSucceeded) and record.state in SUCCEEDED_STATES:
        return Seeded(
            cached=True,
            ref=result.ref,
            sha=result.head,
            from_="checkpoint" if result.resumed else result.from_backup,
            steps=result.steps,
            ms=result.ms,
            incarnation=record.incarnation,
            claim=record.owner,
            frozen=record.frozen_at is not None or record.state is not State.SEEDED,
            resumed=result.resumed,
        )
    if record.state is State.SEED_FAILED and isinstance(result, SeedFailed):
        return NotSeeded(reason=result.reason, step=result.step, detail=result.detail)
    if record.state is State.UNSEEDED:
        return Cold(
            slot=record.slot,
            attempt=record.attempt,
            incarnation=record.incarnation,
            claim=record.owner,
        )
    return Seeding(
        slot=record.slot,
        attempt=record.attempt,
        incarnation=record.incarnation,
        claim=record.owner,
        resumed=record.resuming,
    )


def kept_alive(record: SlotRecord) -> KeptAlive:
    """What a keepalive answers: `frozen` as a poll's, erring towards "still frozen" while
    the slot is being checkpointed or its task has not resumed the sandbox yet."""
    return KeptAlive(
        slot=record.slot,
        claim=record.owner,
        state=record.state.value,
        idle_deadline=record.idle_deadline,
        frozen=record.frozen_at is not None or record.state in transitions.CHECKPOINT_STATES,
    )
