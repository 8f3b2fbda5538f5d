"""Standby slots on the local stack, slot tasks as processes (DESIGN §12;
tests/container/test_slot_container.py runs a standby in the slot image): a seed served by a
blank standby and by a pre-seeded one, a standby killed after it took an assignment, two
seeds racing for one standby, and a pre-seeded standby a rotation superseded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from conftest import running_local_stack
from executor import ORIGIN, claim_for, client_for, publish
from repos import git, make_repository
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import State, Supported
from seedkeeper.domain.standby import BLANK_POOL, Standby, StandbyState
from seedkeeper.store.standbys import StandbyStore
from seedkeeper_client import Seeded, SeedIdentity, Seeding, SeedkeeperClient
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.stack import LocalStack

T = TypeVar("T")


def until(what: Callable[[], T | None], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("not in time")


def standbys(pool: str = BLANK_POOL) -> list[Standby]:
    return StandbyStore(StoreSettings().table_resource()).pool(pool)


def free(pool: str = BLANK_POOL, count: int = 1) -> list[Standby]:
    """Waits until `count` standbys of the pool are free: those."""
    return until(
        lambda: (
            [s for s in standbys(pool) if s.state is StandbyState.FREE][:count]
            if sum(s.state is StandbyState.FREE for s in standbys(pool)) >= count
            else None
        )
    )


def record_of(slot: str) -> Supported:
    classified = StoreSettings().lifecycle().read(slot)
    assert isinstance(classified, Supported), classified
    return classified


@pytest.fixture
def stack(
    tmp_path: Path, aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalStack]:
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(["sleep", "600"]))
    # The pools are tended by the tests (`stack.tend_standbys()`), not on a timer.
    with running_local_stack(tmp_path, standbys=1, standby_interval=3600) as local:
        yield local


def seed_via(client: SeedkeeperClient, slot: str, seed: SeedIdentity, run: str) -> Seeded:
    answer = client.seed(
        slot, seed, claim=claim_for(seed, run=run), origin=ORIGIN, wait=True, timeout=120
    )
    assert isinstance(answer, Seeded), answer
    return answer


def test_a_seed_takes_a_free_standby_and_the_pool_is_refilled(
    stack: LocalStack, tmp_path: Path
) -> None:
    client = client_for(stack)
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    (waiting,) = free()
    seeded = seed_via(client, "slot-1", seed, "run-1")
    assert seeded.incarnation == waiting.incarnation  # the standby's task runs the slot
    (taken,) = [s for s in standbys() if s.standby == waiting.standby]
    assert taken.state is StandbyState.ASSIGNED
    assert taken.plan is not None
    assert (taken.plan.slot, taken.plan.attempt) == ("slot-1", 1)
    # Its workspace holds the slot's checkout, as a launched task's would.
    runtime = stack.runtime
    assert isinstance(runtime, LocalRuntime)
    assert waiting.incarnation is not None
    checkout = runtime.workspace_of(waiting.incarnation) / "checkout"
    assert (checkout / "src" / "lib.py").read_text().startswith("VALUE = ")
    # The sweep's next look starts another.
    report = stack.tend_standbys()
    assert report.launched == 1
    (replacement,) = free()
    assert replacement.standby != waiting.standby


def test_with_no_standby_free_a_seed_launches_a_task(stack: LocalStack, tmp_path: Path) -> None:
    client = client_for(stack)
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    free()
    first = seed_via(client, "slot-1", seed, "run-1")
    second = seed_via(client, "slot-2", seed, "run-2")  # the pool is empty until tended
    assert first.incarnation != second.incarnation
    assert second.incarnation == "local:slot-2:1"  # RunTask's stand-in, as without a pool


def test_two_seeds_racing_for_one_standby_take_it_once(stack: LocalStack, tmp_path: Path) -> None:
    client = client_for(stack)
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    (waiting,) = free()
    answers: dict[str, Seeded] = {}

    def seed_slot(slot: str) -> None:
        answers[slot] = seed_via(client_for(stack), slot, seed, f"run-{slot}")

    racers = [threading.Thread(target=seed_slot, args=(slot,)) for slot in ("slot-a", "slot-b")]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    incarnations = sorted(str(answer.incarnation) for answer in answers.values())
    assert incarnations.count(str(waiting.incarnation)) == 1  # one slot per standby
    assert len(set(incarnations)) == 2  # and the other launched its own task


def test_a_standby_killed_after_taking_an_assignment_leaves_the_attempt_retryable(
    stack: LocalStack, tmp_path: Path
) -> None:
    client = client_for(stack)
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    (waiting,) = free()
    assert waiting.incarnation is not None
    runtime = stack.runtime
    assert isinstance(runtime, LocalRuntime)
    # Taken (the seed's first answer is `seeding`, bound to the standby's task), then
    # killed with no warning, its restore not done.
    first = client.seed("slot-1", seed, claim=claim_for(seed, run="run-1"), origin=ORIGIN)
    assert isinstance(first, Seeding), first
    assert first.incarnation == waiting.incarnation
    runtime.crash(waiting.incarnation)
    # The owner's next poll finds that task gone: a new attempt, its own task; the first
    # attempt never runs twice (its task is dead, and a new one would be refused).
    seeded = seed_via(client, "slot-1", seed, "run-1")
    assert seeded.incarnation == "local:slot-1:2"
    record = record_of("slot-1").record
    assert record.attempt == 2
    assert record.state is State.SEEDED


def test_a_preseeded_standby_serves_its_generation_and_a_rotation_retires_it(
    tmp_path: Path, aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(["sleep", "600"]))
    with running_local_stack(tmp_path, preseeded={"widgets": 1}, standby_interval=3600) as stack:
        client = client_for(stack)
        repo = make_repository(tmp_path)
        seed = publish(client, repo, tmp_path / "scratch")
        stack.tend_standbys()
        (ready,) = free("widgets")
        seeded = seed_via(client, "slot-1", seed, "run-1")
        assert seeded.incarnation == ready.incarnation
        assert "bind" in seeded.steps  # restored ahead: only the binding was left
        assert "download" not in seeded.steps

        # Another standby of this generation, then a rotation supersedes it.
        stack.tend_standbys()
        (old,) = free("widgets")
        newer = publish(client, _commit(repo), tmp_path / "scratch2")
        assert newer.sha != seed.sha
        # The rotation retired it; a seed of the old generation (still recorded, as the
        # retired one) is never served by it: it launches.
        (retired,) = [s for s in standbys("widgets") if s.standby == old.standby]
        assert retired.state is StandbyState.RETIRED
        again = seed_via(client, "slot-2", seed, "run-2")
        assert again.incarnation == "local:slot-2:1"
        # The sweep's next look stops it (positively unseeded) and starts one of the newer.
        report = stack.tend_standbys()
        assert (report.stopped, report.launched) == (1, 1)
        assert old.standby not in {s.standby for s in standbys("widgets")}  # forgotten
        (fresh,) = free("widgets")
        assert fresh.preseed is not None
        assert fresh.preseed.sha == newer.sha
        runtime = stack.runtime
        assert isinstance(runtime, LocalRuntime)
        assert old.incarnation is not None
        assert runtime.status(old.incarnation).value == "stopped"


def _commit(repo: Path) -> Path:
    (repo / "NEW.md").write_text("a newer generation\n")
    git(repo, "add", "NEW.md")
    git(repo, "commit", "--quiet", "-m", "newer")
    return repo
