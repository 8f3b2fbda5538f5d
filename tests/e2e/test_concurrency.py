"""Concurrency over HTTP against the local stack: many executors at once, one slot."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from botocore.credentials import Credentials

from repos import make_repository
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import Supported
from seedkeeper_client import (
    Archive,
    NewSnapshot,
    OwnerClaim,
    SeedAnswer,
    Seeded,
    SeedIdentity,
    Seeding,
    SeedkeeperClient,
    SeedkeeperRefused,
)
from seedkeeper_tools.local.stack import LocalStack
from seedkeeper_tools.publish import backup_id_for, head_of, upload_archive

CALLERS = 50
ORIGIN = "https://git.example.com/acme/widgets.git"
T = TypeVar("T")


@pytest.fixture
def client(stack: LocalStack) -> SeedkeeperClient:
    signing = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    return SeedkeeperClient(stack.url, credentials=signing, timeout=120)


@pytest.fixture
def seed(client: SeedkeeperClient, tmp_path: Path) -> SeedIdentity:
    repo = make_repository(tmp_path)
    sha, ref = head_of(repo)
    archive = upload_archive(
        repo, tmp_path, backup_id_for("widgets", "checkout", sha), R2.from_settings(R2Settings())
    )
    client.publish(
        NewSnapshot(
            resource="widgets",
            ref=ref,
            sha=sha,
            created_at=1_800_000_000,
            checkout=Archive.model_validate(archive.model_dump()),
        )
    )
    return SeedIdentity(resource="widgets", ref=ref, sha=sha, checkout_backup_id=archive.backup_id)


def claim(seed: SeedIdentity, run: str) -> OwnerClaim:
    return OwnerClaim(
        run=run,
        requester=f"user-{run}",
        thread=f"thread-{run}",
        repository="acme/widgets",
        ref=seed.ref,
        head=seed.sha,
    )


def all_at_once(count: int, work: Callable[[int], T]) -> list[T | SeedkeeperRefused]:
    barrier = threading.Barrier(count)

    def released(index: int) -> T | SeedkeeperRefused:
        barrier.wait()
        try:
            return work(index)
        except SeedkeeperRefused as refused:
            return refused

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(released, range(count)))


def test_fifty_owners_race_for_one_slot_and_exactly_one_is_bound(
    stack: LocalStack, client: SeedkeeperClient, seed: SeedIdentity
) -> None:
    claims = [claim(seed, f"run-{index}") for index in range(CALLERS)]
    answers = all_at_once(
        CALLERS, lambda index: client.seed("contested", seed, claim=claims[index], origin=ORIGIN)
    )
    winners = [index for index, answer in enumerate(answers) if isinstance(answer, Seeding)]
    assert len(winners) == 1, answers
    refusals = [answer for answer in answers if isinstance(answer, SeedkeeperRefused)]
    assert len(refusals) == CALLERS - 1
    assert {(r.status, r.reason) for r in refusals} == {(409, "claim-mismatch")}
    refused: dict[str, Any] = {"error": "claim-mismatch", "detail": None, "fields": []}
    assert all(r.body == refused for r in refusals)  # nothing disclosed
    record = StoreSettings().lifecycle().read("contested")
    assert isinstance(record, Supported)
    assert record.record.owner is not None
    assert record.record.owner.model_dump() == claims[winners[0]].model_dump()
    attempts = sorted((stack.data_dir / "slots" / "contested").glob("attempt-*.json"))
    assert [path.name for path in attempts] == ["attempt-1.json"]  # one task launched


def test_fifty_concurrent_polls_by_the_winner_launch_nothing_more(
    stack: LocalStack, client: SeedkeeperClient, seed: SeedIdentity
) -> None:
    owner = claim(seed, "winner")
    first = client.seed("polled", seed, claim=owner, origin=ORIGIN)
    assert isinstance(first, Seeding)
    client.seed("polled", seed, claim=owner, origin=ORIGIN, wait=True, timeout=60)

    def poll(_: int) -> SeedAnswer:
        return client.seed("polled", seed, claim=owner, origin=ORIGIN)

    answers = all_at_once(CALLERS, poll)
    seeded = [answer for answer in answers if isinstance(answer, Seeded)]
    assert len(seeded) == CALLERS, answers
    assert len({answer.model_dump_json() for answer in seeded}) == 1  # the same final answer
    attempts = sorted((stack.data_dir / "slots" / "polled").glob("attempt-*.json"))
    assert [path.name for path in attempts] == ["attempt-1.json"]
    assert Counter(type(answer).__name__ for answer in answers) == {"Seeded": CALLERS}
