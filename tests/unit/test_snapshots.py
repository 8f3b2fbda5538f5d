"""Rotation planning, without I/O."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from seedkeeper.domain.models import SeedIdentity
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.snapshots import (
    Archive,
    DepsEntry,
    NewSnapshot,
    PendingDeletion,
    Resident,
    Rotation,
    Snapshot,
    Unchanged,
    plan_rotation,
    plan_teardown,
)

NOW = 1_800_000_000


def archive(backup_id: str, size: int = 100) -> Archive:
    return Archive(backup_id=backup_id, size=size, sha256=f"{size:064x}")


def new(n: int, *, lockfile: str | None = None, deps: str | None = None) -> NewSnapshot:
    return NewSnapshot(
        resource="acme",
        ref="main",
        sha=f"{n:040x}",
        created_at=NOW + n,
        checkout=archive(f"checkout-{n}"),
        deps=archive(deps) if deps else None,
        lockfile_hash=lockfile,
    )


def rotate(resident: Resident, snapshot: NewSnapshot) -> tuple[Resident, Rotation]:
    """Apply a plan the way the store's transaction does, ledger included."""
    plan = plan_rotation(resident, snapshot, now=NOW)
    assert isinstance(plan, Rotation), plan
    dropped = {e.lockfile_hash for e in plan.deps_dropped}
    deps = [e for e in resident.deps if e.lockfile_hash not in dropped]
    if plan.deps_put is not None:
        deps = [e for e in deps if e.lockfile_hash != plan.deps_put.lockfile_hash]
        deps.append(plan.deps_put)
    after = Resident(
        "acme", plan.current, plan.retired, tuple(deps), resident.pending + plan.garbage
    )
    return after, plan


def test_the_first_rotations_keep_everything() -> None:
    one, first = rotate(Resident("acme"), new(1))
    assert (first.current.generation, first.retired, first.garbage) == (1, None, ())
    two, second = rotate(one, new(2))
    assert second.current.generation == 2
    assert second.retired == one.current
    assert second.garbage == ()
    assert two.recorded_ids == {"checkout-1", "checkout-2"}


def test_the_third_rotation_owes_the_oldest_generations_objects() -> None:
    resident = Resident("acme")
    for n in (1, 2):
        resident, _ = rotate(resident, new(n, lockfile=f"lock-{n}", deps=f"deps-{n}"))
    resident, third = rotate(resident, new(3))
    assert [debt.backup_id for debt in third.garbage] == ["checkout-1", "deps-1"]
    assert [entry.lockfile_hash for entry in third.deps_dropped] == ["lock-1"]
    assert resident.recorded_ids == {"checkout-2", "deps-2", "checkout-3"}
    assert not resident.recorded_ids & resident.pending_ids


def test_an_object_a_remaining_generation_still_names_is_never_owed() -> None:
    resident = Resident("acme")
    for n in (1, 2, 3):
        resident, plan = rotate(resident, new(n, lockfile="same-lock", deps="deps-shared"))
    assert [debt.backup_id for debt in plan.garbage] == ["checkout-1"]
    assert plan.deps_dropped == ()
    assert resident.deps == (
        DepsEntry(lockfile_hash="same-lock", archive=archive("deps-shared"), generation=3),
    )


def test_recording_the_current_snapshot_again_rotates_nothing() -> None:
    resident, _ = rotate(Resident("acme"), new(1))
    assert plan_rotation(resident, new(1), now=NOW) == Unchanged(resident.current)  # type: ignore[arg-type]


def test_a_snapshot_may_not_name_an_object_owed_deletion() -> None:
    resident = Resident("acme", pending=(PendingDeletion(backup_id="checkout-1", since=NOW),))
    refused = plan_rotation(resident, new(1), now=NOW)
    assert refused == Refused("backup-id-pending-deletion", "checkout-1")


def test_a_backup_id_may_not_be_reused_for_other_bytes() -> None:
    resident, _ = rotate(Resident("acme"), new(1))
    impostor = new(2).model_copy(update={"checkout": archive("checkout-1", size=5)})
    assert plan_rotation(resident, impostor, now=NOW) == Refused("backup-id-reused", "checkout-1")


def test_the_seed_handle_is_the_current_generation() -> None:
    resident, _ = rotate(Resident("acme"), new(1, lockfile="lock", deps="deps-1"))
    handle = resident.seed_handle()
    assert handle is not None
    assert (handle.checkout_backup_id, handle.deps_backup_id) == ("checkout-1", "deps-1")
    assert Resident("acme").seed_handle() is None


def test_teardown_owes_every_recorded_object_once() -> None:
    resident = Resident("acme")
    for n in (1, 2, 3):
        resident, _ = rotate(resident, new(n, lockfile=f"lock-{n}", deps=f"deps-{n}"))
    teardown = plan_teardown(resident, now=NOW)
    owed = {debt.backup_id for debt in teardown.garbage}
    assert owed == {"checkout-2", "deps-2", "checkout-3", "deps-3"}
    assert not owed & resident.pending_ids


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"deps": archive("deps-1")}, "lockfile_hash"),
        ({"lockfile_hash": "lock"}, "lockfile_hash"),
        ({"deps": archive("checkout-1"), "lockfile_hash": "lock"}, "another object"),
        ({"resource": "a/b"}, "resource"),
        ({"ref": "a..b"}, "ref"),
        ({"checkout": {"backup_id": "x", "size": 0, "sha256": "0" * 64}}, "size"),
    ],
)
def test_a_new_snapshot_is_validated(changes: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        NewSnapshot.model_validate(new(1).model_dump() | changes)


def test_a_recorded_generation_keeps_its_number() -> None:
    snapshot = Snapshot(**new(1).model_dump(), generation=4)
    assert snapshot.same_content(new(1))
    assert not snapshot.same_content(new(2))


@pytest.mark.parametrize("ref", ["m\u0430in", "ma\u200bin", "develop"])
def test_a_seed_names_its_generations_ref_or_nothing(ref: str) -> None:
    """A look-alike of the recorded ref (a Cyrillic U+0430, a zero-width space) or another branch
    with the right checkout and sha names no recorded generation."""
    resident = Resident("acme")
    for n in (1, 2):
        resident, _ = rotate(resident, new(n).model_copy(update={"ref": f"release-{n}"}))
    current, retired = resident.current, resident.retired
    assert current is not None
    assert retired is not None
    for generation in (current, retired):
        seed = SeedIdentity(
            resource="acme",
            ref=generation.ref,
            sha=generation.sha,
            checkout_backup_id=generation.checkout.backup_id,
        )
        assert resident.archives_for(seed) == (generation.checkout, None)
        assert resident.archives_for(seed.model_copy(update={"ref": ref})) is None
        other = retired if generation is current else current
        assert resident.archives_for(seed.model_copy(update={"ref": other.ref})) is None
