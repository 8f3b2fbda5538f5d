"""Snapshots end to end against moto over HTTP (DynamoDB, and S3 standing in for R2):
rotation, the deletion ledger with injected R2 failures, races and teardown."""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Stack
from seedkeeper.adapters.r2 import R2, backup_key
from seedkeeper.domain.models import Binding, SeedIdentity
from seedkeeper.domain.snapshots import (
    Archive,
    NewSnapshot,
    Resident,
    Rotation,
    plan_rotation,
    plan_teardown,
)
from seedkeeper.errors import ResourceNotFound, SnapshotRefused
from seedkeeper.services.rotation import Snapshots
from seedkeeper.store.items import owed_since
from seedkeeper.store.lifecycle import Lifecycle, Unmet, Written
from seedkeeper.store.snapshots import Committed, Lost, SnapshotStore

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

NOW = 1_800_000_000
_ids = itertools.count()


class DeleteFaults:
    """Makes R2 refuse to delete chosen keys, inside the real client's request path."""

    def __init__(self, client: S3Client) -> None:
        self.failing: set[str] = set()
        client.meta.events.register("before-parameter-build.s3.DeleteObjects", self._batch)
        client.meta.events.register("before-parameter-build.s3.DeleteObject", self._single)

    def _batch(self, params: dict[str, Any], **_: Any) -> None:
        if {entry["Key"] for entry in params["Delete"]["Objects"]} & self.failing:
            raise ClientError({"Error": {"Code": "InternalError"}}, "DeleteObjects")

    def _single(self, params: dict[str, Any], **_: Any) -> None:
        if params["Key"] in self.failing:
            raise ClientError({"Error": {"Code": "InternalError"}}, "DeleteObject")


class World:
    """The service under test, its raw bucket view, and fault injection."""

    def __init__(self, stack: Stack) -> None:
        self.resource = f"acme-{next(_ids)}"  # hypothesis examples share one table
        self.s3 = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
        self.bucket = stack.r2_settings.bucket or ""
        self.faults = DeleteFaults(self.s3)
        self.store_table = stack.table
        self.store = SnapshotStore(self.store_table)
        self.snapshots = Snapshots(self.store, R2(self.s3, self.bucket), clock=lambda: NOW)

    def archive(self, kind: str) -> Archive:
        backup_id = f"{self.resource}-{kind}-{next(_ids)}"
        body = backup_id.encode() * 7
        self.s3.put_object(Bucket=self.bucket, Key=backup_key(backup_id), Body=body)
        return Archive(backup_id=backup_id, size=len(body), sha256=hashlib.sha256(body).hexdigest())

    def snapshot(self, lockfile: str | None = None, ref: str = "main") -> NewSnapshot:
        n = next(_ids)
        return NewSnapshot(
            resource=self.resource,
            ref=ref,
            sha=f"{n:040x}",
            created_at=NOW + n,
            checkout=self.archive("checkout"),
            deps=self.archive("deps") if lockfile else None,
            lockfile_hash=lockfile,
        )

    def objects(self) -> set[str]:
        listed = self.s3.list_objects_v2(Bucket=self.bucket).get("Contents", [])
        return {entry["Key"].removeprefix("backups/").removesuffix(".sqsh") for entry in listed}

    def resident(self) -> Resident:
        return self.store.read(self.resource)


@pytest.fixture
def world(stack: Stack) -> World:
    return World(stack)


def check_invariants(world: World, ever_recorded: set[str]) -> None:
    resident = world.resident()
    objects = world.objects()
    recorded = resident.recorded_ids
    assert recorded <= objects, "an object a record names was deleted"
    assert not recorded & resident.pending_ids, "a recorded object is owed deletion"
    # Every object named or owed is claimed by this resource; a claim's mirror goes with
    # its paid debt, so the partition does not grow with history.
    assert resident.owned == recorded | resident.pending_ids
    for backup_id in ever_recorded - recorded:
        assert backup_id not in objects or backup_id in resident.pending_ids, (
            f"{backup_id} left the records but is neither deleted nor owed"
        )
    generations = [g for g in (resident.current, resident.retired) if g is not None]
    assert len(generations) <= 2
    if len(generations) == 2:
        assert resident.current is not None
        assert resident.retired is not None
        assert resident.current.generation == resident.retired.generation + 1


def test_a_sequence_of_rotations_keeps_two_generations_and_pays_the_rest(world: World) -> None:
    ever: set[str] = set()
    handle = None
    for n in range(6):
        new = world.snapshot(lockfile=f"lock-{n % 2}")
        ever |= new.backup_ids
        recorded = world.snapshots.record(new)
        assert recorded.rotated
        assert recorded.current.generation == n + 1
        if handle is not None:  # a handle read from status before this rotation
            seed = SeedIdentity(resource=world.resource, **handle.model_dump())
            assert world.resident().archives_for(seed) is not None  # it still seeds
            assert {handle.checkout_backup_id, handle.deps_backup_id} <= world.objects()
        handle = world.snapshots.status(world.resource).seed_handle
        check_invariants(world, ever)
    assert world.resident().pending == ()
    assert len(world.objects()) == 4


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("rotate"), st.sampled_from([None, "lock-a", "lock-b"])),
            st.tuples(st.just("fail"), st.integers(0, 5)),
            st.tuples(st.just("heal"), st.none()),
            st.tuples(st.just("pay"), st.none()),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_rotations_with_failing_deletions_never_lose_a_generation_or_a_debt(
    stack: Stack, steps: list[tuple[str, Any]]
) -> None:
    world = World(stack)
    ever: set[str] = set()
    for action, argument in steps:
        if action == "rotate":
            new = world.snapshot(lockfile=argument)
            ever |= new.backup_ids
            world.snapshots.record(new)
        elif action == "fail":
            candidates = sorted(ever)
            if candidates:
                world.faults.failing.add(backup_key(candidates[argument % len(candidates)]))
        elif action == "heal":
            world.faults.failing.clear()
        else:
            world.snapshots.pay_debts(world.resource)
        check_invariants(world, ever)
    world.faults.failing.clear()
    world.snapshots.pay_debts(world.resource)
    assert world.resident().pending == ()
    assert world.objects() & ever == world.resident().recorded_ids
    if world.resident().exists:
        world.snapshots.delete(world.resource)
    assert not world.objects() & ever


def test_a_debt_that_failed_is_paid_by_the_next_rotation(world: World) -> None:
    first = world.snapshot()
    for new in (first, world.snapshot()):
        world.snapshots.record(new)
    world.faults.failing.add(backup_key(first.checkout.backup_id))
    third = world.snapshots.record(world.snapshot())
    assert third.payment.pending == (first.checkout.backup_id,)
    assert first.checkout.backup_id in world.objects()
    assert world.resident().pending_ids == {first.checkout.backup_id}
    world.faults.failing.clear()
    fourth = world.snapshots.record(world.snapshot())
    assert first.checkout.backup_id in fourth.payment.deleted
    assert first.checkout.backup_id not in world.objects()


def commit_together(store: SnapshotStore, plans: Sequence[object]) -> list[Committed | Lost]:
    """Commit each rotation plan from its own thread, all released at once."""
    barrier = threading.Barrier(len(plans))

    def commit(plan: object) -> Committed | Lost:
        assert isinstance(plan, Rotation)
        barrier.wait()
        return store.commit_rotation(plan)

    with ThreadPoolExecutor(len(plans)) as pool:
        return list(pool.map(commit, plans))


def test_two_concurrent_rotations_exactly_one_commits(world: World) -> None:
    world.snapshots.record(world.snapshot())
    read = world.resident()
    plans = [plan_rotation(read, world.snapshot(), now=NOW) for _ in range(2)]
    outcomes = commit_together(world.store, plans)
    assert sorted(type(outcome).__name__ for outcome in outcomes) == ["Committed", "Lost"]
    resident = world.resident()
    assert resident.current is not None
    assert resident.current.generation == 2
    winner = plans[outcomes.index(Committed())]
    assert isinstance(winner, Rotation)
    assert resident.current == winner.current
    assert resident.retired == read.current


def test_a_rotation_that_read_before_another_committed_gets_a_conflict(world: World) -> None:
    world.snapshots.record(world.snapshot())
    stale = world.resident()
    world.snapshots.record(world.snapshot())
    plan = plan_rotation(stale, world.snapshot(), now=NOW)
    assert isinstance(plan, Rotation)
    before = world.resident()
    assert world.store.commit_rotation(plan) == Lost("conflict")
    assert world.resident() == before


def test_recording_the_same_snapshot_again_rotates_nothing(world: World) -> None:
    new = world.snapshot()
    first = world.snapshots.record(new)
    again = world.snapshots.record(new)
    assert first.rotated
    assert not again.rotated
    assert again.current == first.current


def test_an_object_owed_deletion_cannot_be_recorded_again(world: World) -> None:
    first = world.snapshot()
    world.snapshots.record(first)
    world.snapshots.record(world.snapshot())
    world.faults.failing.add(backup_key(first.checkout.backup_id))
    world.snapshots.record(world.snapshot())
    revived = world.snapshot().model_copy(update={"checkout": first.checkout})
    with pytest.raises(SnapshotRefused, match="backup-id-pending-deletion"):
        world.snapshots.record(revived)


def test_delete_leaves_no_object_and_no_record(world: World) -> None:
    ever: set[str] = set()
    for lockfile in ("lock-a", None, "lock-b"):
        new = world.snapshot(lockfile=lockfile)
        ever |= new.backup_ids
        world.snapshots.record(new)
    recorded = world.resident().recorded_ids
    payment = world.snapshots.delete(world.resource)
    assert payment.pending == ()
    assert set(payment.deleted) == recorded
    assert not world.objects() & ever
    assert not world.resident().exists
    with pytest.raises(ResourceNotFound):
        world.snapshots.status(world.resource)
    with pytest.raises(ResourceNotFound):
        world.snapshots.delete(world.resource)


def test_a_delete_r2_refuses_keeps_the_debt_until_a_retry_pays_it(world: World) -> None:
    new = world.snapshot()
    world.snapshots.record(new)
    world.faults.failing.add(backup_key(new.checkout.backup_id))
    partial = world.snapshots.delete(world.resource)
    assert partial.pending == (new.checkout.backup_id,)
    resident = world.resident()
    assert resident.current is None
    assert resident.pending_ids == {new.checkout.backup_id}
    world.faults.failing.clear()
    assert world.snapshots.delete(world.resource).deleted == (new.checkout.backup_id,)
    assert not world.resident().exists


def test_a_delete_racing_a_rotation_loses_cleanly(world: World) -> None:
    world.snapshots.record(world.snapshot())
    stale = world.resident()
    world.snapshots.record(world.snapshot())
    before = world.resident()
    assert world.store.commit_teardown(plan_teardown(stale, now=NOW)) == Lost("conflict")
    assert world.resident() == before


def test_one_rotation_costs_one_query_one_transaction_and_one_delete_batch(world: World) -> None:
    for _ in range(2):
        world.snapshots.record(world.snapshot(lockfile="lock"))
    third = world.snapshot(lockfile="other-lock")
    calls: Counter[str] = Counter()

    def count(event_name: str, **_: object) -> None:
        calls[event_name.removeprefix("before-call.")] += 1

    world.store_table.meta.client.meta.events.register("before-call.dynamodb", count)
    world.s3.meta.events.register("before-call.s3", count)
    recorded = world.snapshots.record(third)
    assert len(recorded.payment.deleted) == 2
    assert calls == Counter(
        {
            "dynamodb.Query": 1,  # the resource, strongly consistent
            "dynamodb.TransactWriteItems": 2,  # the rotation; then the paid debts cleared
            "s3.DeleteObjects": 1,  # the owed objects, in one batch
        }
    )


def test_the_births_check_agrees_with_the_records_for_every_seed(world: World) -> None:
    """What the seed function's birth transaction checks on the current item is exactly what
    `Resident.archives_for` finds in the records: before and after each rotation, and after
    the resource is deleted. Neither takes a seed under another ref than its generation's,
    nor under a look-alike of it."""
    lifecycle = Lifecycle(world.store_table)
    refs = ["main", "release/2", "m\u0430in"]  # the last one a look-alike of the first
    published = [world.snapshot(lockfile=f"lock-{n}", ref=refs[n % 2]) for n in range(3)]
    deps_ids = [s.deps.backup_id for s in published if s.deps is not None]
    checkouts = [s.checkout.backup_id for s in published] + deps_ids[:1]  # never a checkout
    shas = [s.sha for s in published]
    births = itertools.count()
    checked = Counter[bool]()
    for step in [*published, None]:
        if step is None:
            world.snapshots.delete(world.resource)
        else:
            world.snapshots.record(step)
        resident = world.resident()
        generations = [g for g in (resident.current, resident.retired) if g is not None]
        named = {(g.checkout.backup_id, g.sha, g.ref) for g in generations}
        for checkout, sha, deps, ref in itertools.product(checkouts, shas, [None, *deps_ids], refs):
            seed = SeedIdentity(
                resource=world.resource,
                ref=ref,
                sha=sha,
                checkout_backup_id=checkout,
                deps_backup_id=deps,
            )
            born = lifecycle.birth(
                f"check-{next(births)}",
                Binding(owner=None, seed=seed, origin=None),
                now=NOW,
                idle_deadline=NOW + 60,
                requires=world.store.recorded_check(seed),
            )
            recorded = resident.archives_for(seed) is not None
            assert isinstance(born, Written if recorded else Unmet), (seed, born)
            if recorded:  # a generation's own checkout at its sha, under its own ref
                assert (checkout, sha, ref) in named, seed
            checked[recorded] += 1
    assert checked[True] >= 10  # both generations, with and without deps, were seedable


def a_seed_of(snapshot: NewSnapshot) -> SeedIdentity:
    return SeedIdentity(
        resource=snapshot.resource,
        ref=snapshot.ref,
        sha=snapshot.sha,
        checkout_backup_id=snapshot.checkout.backup_id,
        deps_backup_id=snapshot.deps.backup_id if snapshot.deps else None,
    )


def assert_still_seeds(world: World, snapshot: NewSnapshot) -> None:
    """The resource's seed of `snapshot` is recorded, its birth check holds, its objects
    are in R2."""
    seed = a_seed_of(snapshot)
    assert world.resident().archives_for(seed) is not None
    born = Lifecycle(world.store_table).birth(
        f"still-{next(_ids)}",
        Binding(owner=None, seed=seed, origin=None),
        now=NOW,
        idle_deadline=NOW + 60,
        requires=world.store.recorded_check(seed),
    )
    assert isinstance(born, Written), born
    assert snapshot.backup_ids <= world.objects()


@pytest.mark.parametrize("part", ["checkout", "deps"])
def test_another_resources_backup_id_is_refused_and_never_deleted_by_this_one(
    stack: Stack, part: str
) -> None:
    """B names A's object (same size and sha256): refused, nothing written for B; B's
    rotations and DELETE leave A's object, and A's seed still seeds."""
    a, b = World(stack), World(stack)
    owned = a.snapshot(lockfile="lock")
    a.snapshots.record(owned)
    b.snapshots.record(b.snapshot(lockfile="lock"))
    before = b.resident()
    stolen = b.snapshot(lockfile="lock").model_copy(update={part: getattr(owned, part)})
    with pytest.raises(SnapshotRefused, match="backup-id-owned") as refused:
        b.snapshots.record(stolen)
    # Only the id another resource owns: the caller's own (the other part) is not named.
    assert refused.value.detail == getattr(owned, part).backup_id
    assert b.resident() == before
    for _ in range(2):
        b.snapshots.record(b.snapshot(lockfile="lock"))
    b.snapshots.delete(b.resource)
    assert not b.resident().exists
    assert_still_seeds(a, owned)


def test_two_resources_racing_to_record_one_fresh_id_exactly_one_owns_it(stack: Stack) -> None:
    a, b = World(stack), World(stack)
    fresh = a.archive("checkout")
    plans = [
        plan_rotation(w.resident(), w.snapshot().model_copy(update={"checkout": fresh}), now=NOW)
        for w in (a, b)
    ]
    outcomes = commit_together(a.store, plans)
    assert sorted(outcomes, key=repr) == [Committed(), Lost("backup-id-owned", (fresh.backup_id,))]
    winner, loser = (a, b) if outcomes[0] == Committed() else (b, a)
    assert not loser.resident().exists
    with pytest.raises(SnapshotRefused, match="backup-id-owned"):
        loser.snapshots.record(loser.snapshot().model_copy(update={"checkout": fresh}))
    for _ in range(3):  # the loser's own rotations (the third one pays), then its teardown
        loser.snapshots.record(loser.snapshot())
    loser.snapshots.delete(loser.resource)
    assert fresh.backup_id in winner.objects()
    assert winner.resident().recorded_ids == {fresh.backup_id}


@pytest.mark.parametrize("owner", ["another resource", "no resource"])
def test_a_debt_naming_an_object_this_resource_does_not_own_never_deletes_it(
    stack: Stack, owner: str
) -> None:
    """Defence in depth: a ledger entry written before ownership existed (or planted) for an
    object this resource does not own is cleared without deleting the object."""
    a, b = World(stack), World(stack)
    if owner == "another resource":
        owned = a.snapshot()
        a.snapshots.record(owned)
        backup_id = owned.checkout.backup_id
    else:
        backup_id = a.archive("checkout").backup_id
    b.snapshots.record(b.snapshot())
    b.store_table.put_item(  # the ledger entry as written before ownership existed
        Item={
            "PK": f"RESIDENT#{b.resource}",
            "SK": f"GARBAGE#{backup_id}",
            "schema": 1,
            "backup_id": backup_id,
            "since": NOW,
            **owed_since(NOW),
        }
    )
    payment = b.snapshots.pay_debts(b.resource)
    assert backup_id in a.objects()
    assert (payment.deleted, payment.pending, payment.spared) == ((), (), (backup_id,))
    assert backup_id not in b.resident().pending_ids
    b.snapshots.delete(b.resource)
    assert backup_id in a.objects()
