"""`POST /seed`: restore a resident snapshot into a slot, bound to a trusted owner claim.

The first call births the slot's record (before any effect), launches its task and records
the incarnation. The same call again is the poll and the re-attach: one conditional update
that extends the idle deadline and answers the current state, never a second task, never a
touch of the checkout. Anyone else gets a 409 reason token and learns nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from types import UnionType
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from seedkeeper.adapters.r2 import R2, backup_key
from seedkeeper.adapters.runtime import SlotRuntime, TaskStatus
from seedkeeper.domain.checkpoints import IdleSettings
from seedkeeper.domain.models import Model, Origin, OwnerClaim, SeedIdentity, SlotId
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import (
    Absent,
    Classified,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
    Supported,
)
from seedkeeper.domain.transitions import Acknowledged, Refused
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


# -- answers ---------------------------------------------------------------------------


class Seeding(Model):
    state: Literal["seeding"] = "seeding"
    slot: str
    attempt: int
    incarnation: str | None
    claim: OwnerClaim | None


class Seeded(Model):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    seeded: Literal[True] = True
    cached: bool
    ref: str
    sha: str
    from_: str = Field(alias="from")
    steps: dict[str, int]
    ms: int
    incarnation: str | None
    claim: OwnerClaim | None


class NotSeeded(Model):
    seeded: Literal[False] = False
    reason: str
    step: str | None = None
    detail: str | None = None


class Cold(Model):
    state: Literal["unseeded"] = "unseeded"
    seeded: Literal[False] = False
    slot: str
    attempt: int
    incarnation: str | None


class Refusal(Model):
    error: str  # a reason token, and nothing about anyone else's slot


@dataclass(frozen=True)
class Answer:
    status: int
    body: BaseModel


# Every status `SeedService.seed` answers with, and its bodies: the route documents these.
ANSWERS: Mapping[int, type[BaseModel] | UnionType] = {
    HTTPStatus.OK: Seeded | NotSeeded | Cold,
    HTTPStatus.ACCEPTED: Seeding,
    HTTPStatus.CONFLICT: Refusal,
    HTTPStatus.SERVICE_UNAVAILABLE: Refusal,
}


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

    def seed(self, request: SeedRequest) -> Answer:
        if request.seed is not None and self._r2 is None:
            return Answer(HTTPStatus.OK, NotSeeded(reason="seed-unconfigured"))
        for _ in range(_ROUNDS):
            now = self._clock()
            touched = self._lifecycle.touch(
                request.slot,
                owner=request.claim,
                seed=request.seed,
                origin=request.origin,
                now=now,
                idle_deadline=now + self._settings.idle_window,
            )
            if isinstance(touched, Written):
                return self._attach(request, touched.record)
            current = touched.current
            if not isinstance(current, Absent):
                refusal = _refusal(request, current)
                if refusal is not None:
                    return Answer(HTTPStatus.CONFLICT, Refusal(error=refusal))
                continue  # ours after all (a race): touch it again
            born = self._birth(request)
            if born is not None:
                return born
        return Answer(HTTPStatus.SERVICE_UNAVAILABLE, Refusal(error="retry-later"))

    def _birth(self, request: SeedRequest) -> Answer | None:
        """None when another caller's birth won the race: the caller re-decides. A seeded
        slot is born only in one transaction with the proof that a recorded generation
        names its seed, so nothing unrecorded is ever presigned."""
        seed = request.seed
        now = self._clock()
        born = self._lifecycle.birth(
            request.slot,
            owner=request.claim,
            seed=seed,
            origin=request.origin,
            now=now,
            idle_deadline=now + self._settings.idle_window,
            requires=self._snapshots.recorded_check(seed) if seed is not None else None,
        )
        if isinstance(born, Unmet):
            return Answer(HTTPStatus.OK, NotSeeded(reason="seed-missing"))
        if isinstance(born, Conflict):
            return None
        assert born.entry is not None
        return self._launch(born.record, born.entry.ref)

    def _attach(self, request: SeedRequest, record: SlotRecord) -> Answer:
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
        return Answer(*_answer(record))

    def _retry(self, request: SeedRequest, record: SlotRecord) -> Answer:
        """The task died without a verdict: a new attempt, whose debris sweep never touches
        a bound checkout. Bounded: past max_attempts the slot stays seeding (retained)."""
        if record.attempt >= self._settings.max_attempts:
            return Answer(
                HTTPStatus.OK, NotSeeded(reason="seed-failed", step="task-lost", detail=None)
            )
        outcome = self._lifecycle.begin_attempt(record, now=self._clock())
        if not isinstance(outcome, Written):
            return Answer(*_answer(record))
        assert outcome.entry is not None
        return self._relaunch(request, outcome.record, outcome.entry.ref)

    def _relaunch(self, request: SeedRequest, record: SlotRecord, op: OpRef) -> Answer:
        seed = request.seed
        if seed is not None and self._snapshots.read(seed.resource).archives_for(seed) is None:
            # Rotated out since birth: nothing unrecorded is presigned. The record stays
            # seeding with its launch unsettled, so the slot is retained.
            return Answer(HTTPStatus.OK, NotSeeded(reason="seed-missing"))
        return self._launch(record, op)

    def _launch(self, record: SlotRecord, op: OpRef) -> Answer:
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
            outcome = self._lifecycle.record_incarnation(
                record, incarnation=incarnation, launch=op, now=self._clock()
            )
            if isinstance(outcome, Written | Acknowledged):
                return Answer(*_answer(outcome.record))
            if isinstance(outcome, Refused):
                break
            if not isinstance(outcome.current, Supported):
                break
            record = outcome.current.record  # the task settled or a poll touched: re-decide
        return Answer(*_answer(record))

    def _presign(self, backup_id: str) -> SecretStr:
        """Called only for archives a record names (checked by the birth's transaction or
        the relaunch's read); the task verifies each against its recorded size and sha256."""
        assert self._r2 is not None
        return SecretStr(self._r2.presign_get(backup_key(backup_id), self._presign_expiry))


def _refusal(request: SeedRequest, current: Classified) -> str | None:
    """Why this caller may not attach to the recorded slot; None when it is the same call."""
    if not isinstance(current, Supported):
        return "record-unsupported"
    record = current.record
    if record.owner != request.claim:
        return "claim-mismatch"
    if record.seed != request.seed:
        return "seed-mismatch"
    if record.origin != request.origin:
        return "origin-mismatch"
    if record.state in {State.CLOSING, State.RETIRED}:
        return "slot-closed"
    return None


def _answer(record: SlotRecord) -> tuple[int, BaseModel]:
    result = record.result
    if record.state is State.SEEDED and isinstance(result, SeedSucceeded):
        return HTTPStatus.OK, Seeded(
            cached=True,
            ref=result.ref,
            sha=result.head,
            from_=result.from_backup,
            steps=result.steps,
            ms=result.ms,
            incarnation=record.incarnation,
            claim=record.owner,
        )
    if record.state is State.SEED_FAILED and isinstance(result, SeedFailed):
        return HTTPStatus.OK, NotSeeded(
            reason=result.reason, step=result.step, detail=result.detail
        )
    if record.state is State.UNSEEDED:
        return HTTPStatus.OK, Cold(
            slot=record.slot, attempt=record.attempt, incarnation=record.incarnation
        )
    return HTTPStatus.ACCEPTED, Seeding(
        slot=record.slot,
        attempt=record.attempt,
        incarnation=record.incarnation,
        claim=record.owner,
    )
