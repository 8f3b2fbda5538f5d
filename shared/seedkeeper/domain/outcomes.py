"""What the services answer: the outcome models each service returns, or a `Refused`
(`seedkeeper.domain.refused`). Pure data; the API's answer table (`seedkeeper.api.answers`)
gives each outcome and each refusal its HTTP status."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from seedkeeper.domain.models import Model, OwnerClaim
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.snapshots import DepsEntry, SeedHandle, Sha256, Snapshot

# -- POST /seed ---------------------------------------------------------------------------


class Seeding(Model):
    state: Literal["seeding"] = "seeding"
    slot: str
    attempt: int
    incarnation: str | None
    claim: OwnerClaim | None
    resumed: bool = False  # restoring the slot's parked checkpoint


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
    # The slot was idle and its sandbox stopped for a checkpoint: this poll asked for it
    # back, and until the slot task has resumed it (within its watch interval) it is frozen.
    frozen: bool = False
    # Restored from the slot's own checkpoint (then `from` is "checkpoint").
    resumed: bool = False


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
    claim: OwnerClaim | None = None  # echoed, as a seeding or seeded answer echoes it


SeedOutcome = Seeded | NotSeeded | Cold | Seeding | Refused


# -- POST /keepalive ------------------------------------------------------------------------


class KeptAlive(Model):
    slot: str
    claim: OwnerClaim | None  # echoed, as a seed's answer echoes it
    state: str
    idle_deadline: int
    # As for a seed's poll: the sandbox was stopped for a checkpoint and this touch asked for
    # it back; it runs again within the slot task's frozen watch interval.
    frozen: bool


# -- POST /receipt, POST /slot-evidence ----------------------------------------------------

CheckpointState = Literal["present", "lost", "unknown"]


class Receipt(Model):
    slot: str
    checkpoint: CheckpointState
    why: str | None = None  # for "unknown": what made it uncertain
    size: int | None = None
    sha256: str | None = None
    created_at: int | None = None
    expires_at: int | None = None
    # A parked slot: its task is stopped and the checkpoint is kept until then.
    parked: bool = False
    retention_expires_at: int | None = None


class Evidence(Model):
    slot: str
    incarnation: str | None  # the birth container
    state: str
    checkpoint: CheckpointState
    # Never a stop permit: the checkout's current bytes, exclusive ownership and detached
    # writers' quiescence are not proven by any of these facts.
    disposition: Literal["retained", "retired", "parked", "lost"]


# -- /checkpoints (the slot task's) ---------------------------------------------------------


class GrantedArchive(Model):
    """A presigned GET of one archive, with the size and sha256 its record names: the task
    downloads and verifies it against these at once, and before extracting it requires
    the records it reads itself to name the same."""

    url: str
    size: Annotated[int, Field(ge=1)]
    sha256: Sha256


class RestoreGrant(Model):
    """What a started slot task restores from: its seed's archives, or its parked
    checkpoint on a resume (none for a cold slot)."""

    checkout: GrantedArchive | None = None
    deps: GrantedArchive | None = None
    resume: GrantedArchive | None = None
    expires_in: int


class UploadGrant(Model):
    """Where to PUT one checkpoint: the URL and the headers its signature covers."""

    key: str
    url: str
    headers: dict[str, str]
    expires_in: int


class CheckpointRecorded(Model):
    slot: str
    state: str  # checkpointed, or seeded when a poll came back meanwhile
    key: str
    size: int
    sha256: str
    created_at: int
    expires_at: int


class CheckpointNotTaken(Model):
    slot: str
    state: str
    retry_at: int  # when the sweep will ask again


# -- /snapshots ---------------------------------------------------------------------------


class Payment(Model):
    """What one attempt to pay the ledger did."""

    deleted: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    # Owed by an entry written before ownership was recorded, but not this resource's object:
    # the entry is cleared and the object left alone (R2's lifecycle rule is its backstop).
    spared: tuple[str, ...] = ()


class Recorded(Model):
    resource: str
    rotated: bool
    current: Snapshot
    retired: Snapshot | None
    payment: Payment


class ObjectCounts(Model):
    recorded: int
    present: int | None  # None when R2 is not configured or did not answer


class SnapshotStatus(Model):
    resource: str
    current: Snapshot | None
    retired: Snapshot | None
    seed_handle: SeedHandle | None
    deps: tuple[DepsEntry, ...]
    pending_deletions: tuple[str, ...]
    objects: ObjectCounts
