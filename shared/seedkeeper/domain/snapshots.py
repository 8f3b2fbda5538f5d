"""Resident snapshots: two recorded generations per resource, and what a rotation owes.

Pure: no I/O. A rotation records a new current generation, keeps the replaced one as
retired (so a seed handle read from status still resolves after one more rotation), and
moves the objects of the generation retired before it to the pending-deletion ledger —
except any object a remaining generation still names. The store writes a plan in one
transaction; objects are deleted only once they are in the ledger and no record names them.

A backup id belongs to the resource that first recorded it: the store claims every id of a
new generation in the rotation's own transaction, and mirrors the claim in the resource's
own partition (`Resident.owned`) so that paying the ledger needs no read of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, model_validator

from seedkeeper.domain.models import BackupId, BranchRef, GitSha, Model, ResourceName, SeedIdentity
from seedkeeper.domain.record import EpochSeconds
from seedkeeper.domain.refused import Refused

LockfileHash = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# R2's largest object: 5 GiB less than 5 TiB (developers.cloudflare.com/r2/platform/limits).
R2_MAX_OBJECT_BYTES = 5 * 1024**4 - 5 * 1024**3


class Archive(Model):
    """One squashfs archive in R2, as its publisher measured it."""

    backup_id: BackupId
    size: Annotated[int, Field(ge=1, le=R2_MAX_OBJECT_BYTES)]
    sha256: Sha256


class NewSnapshot(Model):
    """What a resident publishes: a checkout archive (and its dependency archive) at
    `ref`/`sha`."""

    resource: ResourceName
    ref: BranchRef
    sha: GitSha
    created_at: EpochSeconds
    checkout: Archive
    deps: Archive | None = None
    lockfile_hash: LockfileHash | None = None

    @model_validator(mode="after")
    def _deps_are_keyed_by_their_lockfile(self) -> NewSnapshot:
        if (self.deps is None) != (self.lockfile_hash is None):
            raise ValueError("deps and lockfile_hash are given together or not at all")
        if self.deps is not None and self.deps.backup_id == self.checkout.backup_id:
            raise ValueError("the deps archive must be another object than the checkout")
        return self

    @property
    def archives(self) -> tuple[Archive, ...]:
        return (self.checkout,) if self.deps is None else (self.checkout, self.deps)

    @property
    def backup_ids(self) -> frozenset[str]:
        return frozenset(archive.backup_id for archive in self.archives)


class Snapshot(NewSnapshot):
    """A recorded generation."""

    generation: Annotated[int, Field(ge=1)]

    def same_content(self, new: NewSnapshot) -> bool:
        return NewSnapshot.model_validate(self.model_dump(exclude={"generation"})) == new


class DepsEntry(Model):
    """The dependency archive of the newest recorded generation with this lockfile."""

    lockfile_hash: LockfileHash
    archive: Archive
    generation: Annotated[int, Field(ge=1)]


class PendingDeletion(Model):
    """An object owed deletion: no record names it any more."""

    backup_id: BackupId
    since: EpochSeconds


@dataclass(frozen=True)
class Resident:
    """Everything recorded for one resource, read in one strongly consistent Query."""

    resource: str
    current: Snapshot | None = None
    retired: Snapshot | None = None
    deps: tuple[DepsEntry, ...] = ()
    pending: tuple[PendingDeletion, ...] = ()
    # The ids this resource's claim names, kept until their objects are deleted: only these
    # may ever be deleted on its behalf.
    owned: frozenset[str] = frozenset()

    @property
    def exists(self) -> bool:
        return bool(self.current or self.retired or self.deps or self.pending)

    @property
    def recorded_ids(self) -> frozenset[str]:
        """Every object a record names: these are never deleted."""
        ids = {entry.archive.backup_id for entry in self.deps}
        for generation in (self.current, self.retired):
            if generation is not None:
                ids |= generation.backup_ids
        return frozenset(ids)

    @property
    def pending_ids(self) -> frozenset[str]:
        return frozenset(entry.backup_id for entry in self.pending)

    def seed_handle(self) -> SeedHandle | None:
        current = self.current
        if current is None:
            return None
        return SeedHandle(
            ref=current.ref,
            sha=current.sha,
            checkout_backup_id=current.checkout.backup_id,
            deps_backup_id=current.deps.backup_id if current.deps else None,
        )

    def archives_for(self, seed: SeedIdentity) -> tuple[Archive, Archive | None] | None:
        """The recorded archives a seed names: the checkout of a generation at the seed's
        sha and under its ref (compared exactly: a look-alike names nothing), and deps of
        either generation. None when no record names them."""
        generations = [g for g in (self.current, self.retired) if g is not None]
        checkout = next(
            (
                g.checkout
                for g in generations
                if (g.checkout.backup_id, g.sha, g.ref)
                == (seed.checkout_backup_id, seed.sha, seed.ref)
            ),
            None,
        )
        if checkout is None or seed.deps_backup_id is None:
            return None if checkout is None else (checkout, None)
        deps = next(
            (g.deps for g in generations if g.deps and g.deps.backup_id == seed.deps_backup_id),
            None,
        )
        return None if deps is None else (checkout, deps)


class SeedHandle(Model):
    ref: BranchRef
    sha: GitSha
    checkout_backup_id: BackupId
    deps_backup_id: BackupId | None


@dataclass(frozen=True)
class Rotation:
    """The records after a rotation and the debts it adds to the ledger."""

    read: Resident
    current: Snapshot
    retired: Snapshot | None
    deps_put: DepsEntry | None
    deps_dropped: tuple[DepsEntry, ...]
    garbage: tuple[PendingDeletion, ...]


@dataclass(frozen=True)
class Unchanged:
    """The same snapshot recorded again (a retried publish): nothing rotates."""

    current: Snapshot


def plan_rotation(
    resident: Resident, new: NewSnapshot, *, now: int
) -> Rotation | Unchanged | Refused:
    current, retired = resident.current, resident.retired
    if current is not None and current.same_content(new):
        return Unchanged(current)
    reused = new.backup_ids & resident.pending_ids
    if reused:
        return Refused("backup-id-pending-deletion", ", ".join(sorted(reused)))
    for archive in new.archives:
        for generation in (current, retired):
            named = _archive_named(generation, archive.backup_id)
            if named is not None and named != archive:
                return Refused("backup-id-reused", archive.backup_id)
    promoted = Snapshot(**new.model_dump(), generation=current.generation + 1 if current else 1)
    kept = frozenset().union(*(g.backup_ids for g in (promoted, current) if g is not None))
    dropped_ids = sorted(retired.backup_ids - kept) if retired is not None else []
    kept_hashes = {g.lockfile_hash for g in (promoted, current) if g is not None}
    deps_put = (
        DepsEntry(lockfile_hash=new.lockfile_hash, archive=new.deps, generation=promoted.generation)
        if new.deps is not None and new.lockfile_hash is not None
        else None
    )
    return Rotation(
        read=resident,
        current=promoted,
        retired=current,
        deps_put=deps_put,
        deps_dropped=tuple(e for e in resident.deps if e.lockfile_hash not in kept_hashes),
        garbage=tuple(PendingDeletion(backup_id=i, since=now) for i in dropped_ids),
    )


@dataclass(frozen=True)
class Teardown:
    """Every record of a resource removed, every object it named moved to the ledger."""

    read: Resident
    garbage: tuple[PendingDeletion, ...]


def plan_teardown(resident: Resident, *, now: int) -> Teardown:
    owed = sorted(resident.recorded_ids - resident.pending_ids)
    return Teardown(
        read=resident, garbage=tuple(PendingDeletion(backup_id=i, since=now) for i in owed)
    )


def _archive_named(generation: Snapshot | None, backup_id: str) -> Archive | None:
    if generation is None:
        return None
    return next((a for a in generation.archives if a.backup_id == backup_id), None)
