"""What the executor sends Seedkeeper and what it reads back, as the function URLs' OpenAPI
documents describe them (a test holds these to the server's own models, field for field).

What is sent is checked for shape only: Seedkeeper validates every field itself and refuses
a bad one by name. What is read back ignores fields this client does not know, so a newer
Seedkeeper's answers still parse.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# -- what the executor sends ------------------------------------------------------------


class OwnerClaim(Request):
    """Who a slot's work belongs to, from the executor's trusted run context; a slot is
    bound to its first claim for good."""

    run: str
    requester: str
    thread: str
    repository: str
    ref: str
    head: str


class SeedIdentity(Request):
    """Which snapshot a slot is seeded from (a snapshot's `seed_handle`, and its resource),
    optionally followed by a fetch of `fetch_ref` at `fetch_sha`."""

    resource: str
    ref: str
    sha: str
    checkout_backup_id: str
    deps_backup_id: str | None = None
    fetch_ref: str | None = None
    fetch_sha: str | None = None


class Archive(Answer):
    """One squashfs archive in R2, as its publisher measured it (sent in a NewSnapshot, and
    read back in every recorded generation: so unknown fields are ignored, not refused)."""

    backup_id: str
    size: int
    sha256: str


class NewSnapshot(Request):
    """A resident's snapshot whose archives are already in R2: a checkout archive (and a
    dependency archive, keyed by its lockfile's hash) at `ref`/`sha`."""

    resource: str
    ref: str
    sha: str
    created_at: int
    checkout: Archive
    deps: Archive | None = None
    lockfile_hash: str | None = None


# -- POST /seed, POST /keepalive -------------------------------------------------------


class Seeding(Answer):
    state: Literal["seeding"] = "seeding"
    slot: str
    attempt: int
    incarnation: str | None
    claim: OwnerClaim | None
    resumed: bool = False  # restoring the slot's parked checkpoint


class Seeded(Answer):
    model_config = ConfigDict(populate_by_name=True)

    seeded: Literal[True] = True
    cached: bool
    ref: str
    sha: str
    from_: str = Field(alias="from")  # "checkpoint" for a resumed slot
    steps: dict[str, int]
    ms: int
    incarnation: str | None
    claim: OwnerClaim | None
    frozen: bool = False  # stopped for a checkpoint; runs again within the watch interval
    resumed: bool = False


class NotSeeded(Answer):
    seeded: Literal[False] = False
    reason: str
    step: str | None = None
    detail: str | None = None


class Cold(Answer):
    state: Literal["unseeded"] = "unseeded"
    seeded: Literal[False] = False
    slot: str
    attempt: int
    incarnation: str | None
    claim: OwnerClaim | None = None


SeedAnswer = Seeded | NotSeeded | Cold | Seeding


class KeptAlive(Answer):
    slot: str
    claim: OwnerClaim | None
    state: str
    idle_deadline: int
    frozen: bool


# -- POST /receipt, POST /slot-evidence ------------------------------------------------

CheckpointState = Literal["present", "lost", "unknown"]


class Receipt(Answer):
    slot: str
    checkpoint: CheckpointState
    why: str | None = None
    size: int | None = None
    sha256: str | None = None
    created_at: int | None = None
    expires_at: int | None = None
    parked: bool = False
    retention_expires_at: int | None = None


class Evidence(Answer):
    """Exact-slot facts, never a permit to stop the slot."""

    slot: str
    incarnation: str | None
    state: str
    checkpoint: CheckpointState
    disposition: Literal["retained", "retired", "parked", "lost"]


# -- /snapshots ------------------------------------------------------------------------


class Snapshot(Answer):
    """A recorded generation of a resident's snapshot."""

    resource: str
    ref: str
    sha: str
    created_at: int
    checkout: Archive
    deps: Archive | None = None
    lockfile_hash: str | None = None
    generation: int


class SeedHandle(Answer):
    """What a seed names of the current generation (with the resource: a SeedIdentity)."""

    ref: str
    sha: str
    checkout_backup_id: str
    deps_backup_id: str | None


class DepsEntry(Answer):
    lockfile_hash: str
    archive: Archive
    generation: int


class Payment(Answer):
    deleted: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    spared: tuple[str, ...] = ()


class Recorded(Answer):
    resource: str
    rotated: bool
    current: Snapshot
    retired: Snapshot | None
    payment: Payment


class ObjectCounts(Answer):
    recorded: int
    present: int | None


class SnapshotStatus(Answer):
    resource: str
    current: Snapshot | None
    retired: Snapshot | None
    seed_handle: SeedHandle | None
    deps: tuple[DepsEntry, ...]
    pending_deletions: tuple[str, ...]
    objects: ObjectCounts
