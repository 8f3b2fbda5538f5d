"""Recording, inspecting and deleting a resource's snapshots: the records in DynamoDB,
the archives in R2, and the ledger that keeps every owed deletion true until it is paid.

A backup id belongs to the resource that first recorded it: another resource naming it is
refused (`backup-id-owned`), and no rotation or DELETE deletes an object its resource does
not own."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from seedkeeper.adapters.clock import epoch_seconds
from seedkeeper.adapters.r2 import R2, backup_key
from seedkeeper.domain.outcomes import ObjectCounts, Payment, Recorded, SnapshotStatus
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.snapshots import (
    Archive,
    NewSnapshot,
    Resident,
    Unchanged,
    plan_rotation,
    plan_teardown,
)
from seedkeeper.domain.standby import Generation
from seedkeeper.errors import ResourceNotFound, RotationConflict, SnapshotRefused
from seedkeeper.store.snapshots import Lost, SnapshotStore
from seedkeeper.store.standbys import StandbyStore

# What recording a snapshot refuses with (`SnapshotRefused`): an id another resource owns,
# an id reused for other bytes, an id still owed for deletion.
RECORD_REFUSALS = ("backup-id-owned", "backup-id-reused", "backup-id-pending-deletion")


class Snapshots:
    def __init__(
        self,
        store: SnapshotStore,
        r2: R2 | None,
        clock: Callable[[], int] = epoch_seconds,
        standbys: StandbyStore | None = None,
    ) -> None:
        """`standbys`: where the standbys pre-seeded with a resource's generations wait (a
        rotation retires those it superseded)."""
        self._store = store
        self._r2 = r2
        self._clock = clock
        self._standbys = standbys

    def record(self, new: NewSnapshot) -> Recorded:
        """Record `new` as the current generation and rotate; then pay what is owed."""
        resident = self._store.read(new.resource)
        plan = plan_rotation(resident, new, now=self._clock())
        if isinstance(plan, Refused):
            raise SnapshotRefused(plan.reason, plan.detail)
        if isinstance(plan, Unchanged):
            return Recorded(
                resource=new.resource,
                rotated=False,
                current=plan.current,
                retired=resident.retired,
                payment=self._pay(resident, resident.pending_ids),
            )
        committed = self._store.commit_rotation(plan)
        if isinstance(committed, Lost):
            if committed.why == "conflict":
                raise RotationConflict(new.resource)
            raise SnapshotRefused(committed.why, ", ".join(committed.backup_ids))
        self._retire_standbys(new.resource, Generation.of(plan.current))
        owed = resident.pending_ids | {debt.backup_id for debt in plan.garbage}
        return Recorded(
            resource=new.resource,
            rotated=True,
            current=plan.current,
            retired=plan.retired,
            payment=self._pay(resident, owed),
        )

    def status(self, resource: str) -> SnapshotStatus:
        resident = self._resident(resource)
        recorded = resident.recorded_ids
        return SnapshotStatus(
            resource=resource,
            current=resident.current,
            retired=resident.retired,
            seed_handle=resident.seed_handle(),
            deps=resident.deps,
            pending_deletions=tuple(sorted(resident.pending_ids)),
            objects=ObjectCounts(recorded=len(recorded), present=self._count_present(recorded)),
        )

    def delete(self, resource: str) -> Payment:
        """Remove every record of `resource`; each object they named becomes a ledger debt
        in the same transaction, and is then deleted. What R2 would not delete stays owed."""
        resident = self._resident(resource)
        teardown = plan_teardown(resident, now=self._clock())
        if isinstance(self._store.commit_teardown(teardown), Lost):
            raise RotationConflict(resource)
        self._retire_standbys(resource, None)
        return self._pay(resident, resident.pending_ids | resident.recorded_ids)

    def _retire_standbys(self, resource: str, current: Generation | None) -> None:
        """Standbys holding a superseded generation are never taken (a seed's take checks
        the generation in its own transaction); retired here too, so the sweep stops them."""
        if self._standbys is not None:
            self._standbys.retire_superseded(resource, current, self._clock())

    def deps_archive(self, resource: str, lockfile_hash: str) -> Archive | None:
        """The dependency archive already recorded for this lockfile, to reuse."""
        entries = self._store.read(resource).deps
        return next((e.archive for e in entries if e.lockfile_hash == lockfile_hash), None)

    def pay_debts(self, resource: str) -> Payment:
        """Retry the deletions a resource still owes (the idle sweep calls this)."""
        resident = self._store.read(resource)
        return self._pay(resident, resident.pending_ids)

    def _resident(self, resource: str) -> Resident:
        resident = self._store.read(resource)
        if not resident.exists:
            raise ResourceNotFound(resource)
        return resident

    def _pay(self, resident: Resident, backup_ids: Iterable[str]) -> Payment:
        """Delete the owed objects `resident` owns (its own read of its claims, so no extra
        call); clear the entries of those deleted and of those it does not own."""
        owed = sorted(backup_ids)
        if not owed or self._r2 is None:
            return Payment(pending=tuple(owed))
        spared = [backup_id for backup_id in owed if backup_id not in resident.owned]
        keys = {backup_key(i): i for i in owed if i in resident.owned}
        report = self._r2.delete(list(keys))  # nothing to delete sends nothing
        deleted = sorted(keys[key] for key in report.deleted)
        self._store.clear_debts(resident.resource, deleted + spared)
        return Payment(
            deleted=tuple(deleted),
            pending=tuple(sorted(keys[k] for k in report.failed)),
            spared=tuple(spared),
        )

    def _count_present(self, backup_ids: Iterable[str]) -> int | None:
        if self._r2 is None:
            return None
        return sum(self._r2.head(backup_key(backup_id)) is not None for backup_id in backup_ids)
