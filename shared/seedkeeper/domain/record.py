"""The slot lifecycle record (schema 1) and its codec.

Reading classifies an item: `Absent`, `Supported(record)`, `Unsupported` (a schema newer
than this code: written by a newer deployment) or `Malformed`. Only a `Supported` record
can be handed to a lifecycle transition, so the other two are never rewritten.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from seedkeeper.domain.models import (
    BackupId,
    Binding,
    BranchRef,
    GitSha,
    Incarnation,
    Model,
    Origin,
    OwnerClaim,
    SeedIdentity,
    SlotId,
    validate_item,
)
from seedkeeper.domain.opwindow import Window

SCHEMA = 1
LIFECYCLE_SK = "LIFECYCLE"
SLOT_PREFIX = "SLOT#"
# The sparse index's partition values while a slot may have a live container: `live#00`
# to `live#99`, a slot's shard a stable hash of its id, so no one partition takes every
# touch. The shard count may grow (the sweep queries every shard ever used); a record moves
# to its shard under the current count when it is born, resumed or touched.
LIVE_PREFIX = "live#"
SWEEP_SHARDS = 16  # unless configured (`StoreSettings.sweep_shards`)
MAX_SWEEP_SHARDS = 100  # two digits
_LIVE_PARTITION = re.compile(r"live#[0-9]{2}")

# Up to the last second of the year 9999: no later time is one a clock, a table or
# Python's datetime can show (a 20-digit "time" was recorded, and listing it crashed).
EpochSeconds = Annotated[int, Field(ge=0, le=253_402_300_799)]
# A duration a task measured (a seed's steps).
Milliseconds = Annotated[int, Field(ge=0)]
Detail = Annotated[str, Field(max_length=512)]


class State(StrEnum):
    UNSEEDED = "unseeded"  # durable pre-start classification: cold, no seed ever attempted
    SEEDING = "seeding"  # a seed attempt was durably marked before any restore effect
    SEEDED = "seeded"  # restore, fix-up and marker verified; owner bound
    SEED_FAILED = "seed_failed"  # half tree swept; the slot runs cold and may hold work
    CHECKPOINTING = "checkpointing"  # idle: the slot task is asked to freeze and capture
    CHECKPOINTED = "checkpointed"  # its frozen work is verified in R2; the task still runs
    CLOSING = "closing"  # the task is being stopped (retirement or park)
    RETIRED = "retired"  # container stopped after proof; tombstone until TTL
    PARKED = "parked"  # task stopped after a verified checkpoint; kept until it expires
    LOST = "lost"  # task stopped without a verified checkpoint: the work is gone, and said so


# A poll may touch these: a slot whose task is (or may be) running.
LIVE_STATES = frozenset(
    {
        State.UNSEEDED,
        State.SEEDING,
        State.SEEDED,
        State.SEED_FAILED,
        State.CHECKPOINTING,
        State.CHECKPOINTED,
    }
)
# A seed succeeded and its result stays while the work is checkpointed, parked or lost.
SUCCEEDED_STATES = frozenset(
    {State.SEEDED, State.CHECKPOINTING, State.CHECKPOINTED, State.PARKED, State.LOST}
)
# No task any more: out of the sweep's index, and expiring (the table's TTL).
ENDED_STATES = frozenset({State.RETIRED, State.PARKED, State.LOST})


class SeedSucceeded(Model):
    outcome: Literal["seeded"] = "seeded"
    ref: BranchRef
    head: GitSha
    from_backup: BackupId
    steps: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")], Milliseconds]
    ms: Milliseconds
    resumed: bool = False  # restored from the slot's own checkpoint, not from the snapshot


# Why a seed failed: its archives are not recorded (or gone), the restore failed, or the
# archive tried to cross the trust boundary (DESIGN §9) and was refused.
FailureReason = Literal["seed-missing", "seed-failed", "unsafe-archive"]


class SeedFailed(Model):
    outcome: Literal["failed"] = "failed"
    reason: FailureReason
    step: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
    detail: Detail


SeedResult = Annotated[SeedSucceeded | SeedFailed, Field(discriminator="outcome")]


class Checkpoint(Model):
    """A verified upload of the slot's checkout, tied to one owner and one incarnation."""

    key: Annotated[str, Field(pattern=r"^checkpoints/[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$")]
    size: EpochSeconds
    etag: Annotated[str, Field(min_length=1, max_length=128)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    created_at: EpochSeconds
    expires_at: EpochSeconds
    owner: OwnerClaim | None = None  # absent for an unclaimed slot (encode drops None)
    incarnation: Incarnation


Token = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,63}$")]


class Loss(Model):
    """Why a slot's work is gone: its task stopped with no verified checkpoint of it."""

    reason: Token  # the stop's cause as a token (`spot-interruption`, `task-crashed`, ...)
    detail: Detail  # what the runtime said, or why the checkpoint on the stop failed
    at: EpochSeconds


class SlotRecord(Model):
    slot: SlotId
    rev: Annotated[int, Field(ge=1)]
    state: State
    owner: OwnerClaim | None = None
    seed: SeedIdentity | None = None
    origin: Origin | None = None
    attempt: Annotated[int, Field(ge=1)]
    incarnation: Incarnation | None = None
    idle_deadline: EpochSeconds
    window: Window
    checkpoint: Checkpoint | None = None
    result: SeedResult | None = None
    retained_reason: Token | None = None
    # Set by the sweep's retain, cleared by every other write: when it looks at the slot
    # again (the backoff after `retains` retains in a row), so a slot nothing changes is
    # not re-read every run.
    next_look: EpochSeconds | None = None
    retains: Annotated[int, Field(ge=1, le=1000)] | None = None
    # Set by the slot task before it stops the sandbox, cleared after it resumes it: while
    # set, the sandbox may be frozen (a poll says so).
    frozen_at: EpochSeconds | None = None
    checkpoint_failures: Annotated[int, Field(ge=1, le=1000)] | None = None  # in a row
    loss: Loss | None = None
    created_at: EpochSeconds
    updated_at: EpochSeconds
    expires_at: EpochSeconds | None = None

    @property
    def binding(self) -> Binding:
        return Binding(owner=self.owner, seed=self.seed, origin=self.origin)

    @property
    def sweep_at(self) -> int:
        """When the sweep looks at the slot: its idle deadline, or later while a retain's
        backoff runs (the index's sort key; `idle_deadline` keeps its meaning)."""
        return max(self.idle_deadline, self.next_look or 0)

    @property
    def resuming(self) -> bool:
        """A seed attempt that restores the slot's own checkpoint (a parked slot's owner
        came back), not the snapshot: only a resume leaves a checkpoint on a seeding record."""
        return self.state is State.SEEDING and self.checkpoint is not None

    @model_validator(mode="after")
    def _states_carry_their_facts(self) -> SlotRecord:
        seeded_states = {State.SEEDING, State.SEED_FAILED, *SUCCEEDED_STATES}
        # Closing and retired may follow a cold slot or a checkpointed one.
        either = {State.CLOSING, State.RETIRED}
        if self.state is State.UNSEEDED and self.seed is not None:
            raise ValueError("an unseeded record names a seed")
        if self.state in seeded_states and self.seed is None:
            raise ValueError(f"a {self.state} record names no seed")
        succeeded = isinstance(self.result, SeedSucceeded)
        if self.state not in either and (self.state in SUCCEEDED_STATES) != succeeded:
            raise ValueError(f"a {self.state} record and its result disagree")
        if (self.state is State.SEED_FAILED) != isinstance(self.result, SeedFailed):
            raise ValueError("only a seed_failed record carries a failed result")
        if (self.state in ENDED_STATES) != (self.expires_at is not None):
            raise ValueError("exactly the retired, parked and lost records carry expires_at")
        if self.state is State.PARKED and self.checkpoint is None:
            raise ValueError("a parked record names no checkpoint")
        if self.frozen_at is not None and self.state in ENDED_STATES:
            raise ValueError(f"a {self.state} record has no task to be frozen")
        if (self.state is State.LOST) != (self.loss is not None):
            raise ValueError("exactly the lost records say what was lost")
        if (self.next_look is None) != (self.retains is None):
            raise ValueError("a retain's next look and its count go together")
        return self


@dataclass(frozen=True)
class Absent:
    slot: str


@dataclass(frozen=True)
class Supported:
    record: SlotRecord

    @property
    def state(self) -> State:
        return self.record.state


@dataclass(frozen=True)
class Unsupported:
    """Written by a newer deployment: never rewritten, never destroyed."""

    slot: str
    schema: int


@dataclass(frozen=True)
class Malformed:
    """Fails validation: never rewritten, never destroyed."""

    slot: str
    error: str


Classified = Absent | Supported | Unsupported | Malformed


def slot_key(slot: str) -> dict[str, str]:
    return {"PK": f"{SLOT_PREFIX}{slot}", "SK": LIFECYCLE_SK}


def sweep_shard(slot: str, shards: int) -> str:
    """The index partition of a live slot among `shards`: sha256 of its id, the same in
    every process (Python's `hash` of a string is salted per process)."""
    digest = hashlib.sha256(slot.encode()).digest()
    return shard_partition(int.from_bytes(digest[:8], "big") % shards)


def shard_partition(shard: int) -> str:
    return f"{LIVE_PREFIX}{shard:02d}"


def encode(record: SlotRecord, *, shards: int = SWEEP_SHARDS) -> dict[str, Any]:
    """The DynamoDB item of a record (plain Python values; absent facts are absent
    attributes). `open_ops` and the index keys (`sweep`: the slot's shard among `shards`;
    `sweep_at`) are derived here so conditions can test them."""
    body = record.model_dump(mode="json", exclude_none=True, exclude={"slot", "window"})
    window = record.window
    item: dict[str, Any] = {
        **slot_key(record.slot),
        **body,
        "schema": SCHEMA,
        "ops": [entry.model_dump(mode="json", exclude_none=True) for entry in window.entries],
        "next_ordinal": window.next_ordinal,
        "open_ops": window.unsettled,
    }
    if record.state not in ENDED_STATES:
        item["sweep"] = sweep_shard(record.slot, shards)
        item["sweep_at"] = record.sweep_at
    return item


def classify(slot: str, item: dict[str, Any] | None) -> Classified:
    """Classify an item as read from the table (numbers arrive as Decimal)."""
    if item is None:
        return Absent(slot)
    schema = item.get("schema")
    if isinstance(schema, int | Decimal) and schema > SCHEMA:
        return Unsupported(slot, int(schema))
    try:
        record = decode(item)
    except (ValidationError, ValueError) as invalid:
        return Malformed(slot, _summarise(invalid))
    if record.slot != slot:
        return Malformed(slot, "the item's key names another slot")
    return Supported(record)


def decode(item: dict[str, Any]) -> SlotRecord:
    fields = dict(item)
    key, sk = fields.pop("PK", None), fields.pop("SK", None)
    if not isinstance(key, str) or not key.startswith(SLOT_PREFIX) or sk != LIFECYCLE_SK:
        raise ValueError("not a slot lifecycle key")
    if fields.pop("schema", None) != SCHEMA:
        raise ValueError(f"schema is not {SCHEMA}")
    open_ops = fields.pop("open_ops", None)
    sweep, sweep_at = fields.pop("sweep", None), fields.pop("sweep_at", None)
    fields["window"] = {
        "entries": fields.pop("ops", []),
        "next_ordinal": fields.pop("next_ordinal", None),
    }
    fields["slot"] = key.removeprefix(SLOT_PREFIX)
    record = validate_item(SlotRecord, fields)
    if open_ops != record.window.unsettled:
        raise ValueError("open_ops does not count the unsettled operations")
    if record.state in ENDED_STATES:
        if sweep is not None or sweep_at is not None:
            raise ValueError("sweep: an ended record is out of the sweep's index")
    elif not (isinstance(sweep, str) and _LIVE_PARTITION.fullmatch(sweep)):
        raise ValueError("sweep does not name a live shard")  # any: the count may have grown
    elif sweep_at != record.sweep_at:
        raise ValueError("sweep_at is not the record's next look")
    return record


def _summarise(invalid: Exception) -> str:
    if isinstance(invalid, ValidationError):
        first = invalid.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "record"
        return f"{where}: {first['msg']}"[:200]
    return str(invalid)[:200]
