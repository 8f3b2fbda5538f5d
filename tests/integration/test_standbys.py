"""Standby slots against the table on the moto server (DESIGN §12): the seed function's take
(one slot per standby, at most one task per attempt, under a race), a pre-seeded standby
never handed out once its generation is superseded, and the standby's own calls to the
checkpoint function, answered only to the task its item names."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from builders import NOW, ORIGIN, owner
from conftest import Stack
from functions import as_task, event, invoke, load_function
from seedkeeper import config
from seedkeeper.domain.models import SeedIdentity
from seedkeeper.domain.outcomes import Seeding
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import Supported
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, Launch, TaskState, TaskStatus
from seedkeeper.domain.snapshots import Archive, NewSnapshot
from seedkeeper.domain.standby import (
    BLANK_POOL,
    Generation,
    PoolSettings,
    Standby,
    StandbyPlan,
    StandbyState,
)
from seedkeeper.services.seed import SeedRequest, SeedService, SeedSettings
from seedkeeper.services.standbys import StandbyPool
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper.store.standbys import StandbyStore

checkpoint_function = load_function("checkpoint")

RESOURCE = "acme-widgets"
NOT_THIS_TASK: tuple[int, Any] = (403, {"error": "not-this-task", "detail": None, "fields": []})


def task(number: int) -> str:
    return f"arn:aws:ecs:us-east-1:000000000000:task/seedkeeper/{number:032x}"


class Tasks:
    """A runtime that starts nothing: each launch a new task ARN, every task running."""

    def __init__(self) -> None:
        self.launched: list[str] = []
        self.stopped: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, settings: Any = None) -> Tasks:
        return self

    def _next(self) -> str:
        with self.lock:
            self.launched.append(task(1000 + len(self.launched)))
            return self.launched[-1]

    def launch(self, plan: SlotPlan) -> str:
        return self._next()

    def launch_standby(self, standby: StandbyPlan) -> str:
        return self._next()

    def status(self, incarnation: str) -> TaskStatus:
        return TaskStatus.RUNNING

    def statuses(self, incarnations: Any) -> dict[str, TaskState]:
        return {i: UNKNOWN if i in self.stopped else RUNNING for i in incarnations}

    def launched_for(self, incarnation: str) -> Launch | None:
        return None

    def stop(self, incarnation: str) -> None:
        self.stopped.append(incarnation)


def publish(stack: Stack, sha: str) -> SeedIdentity:
    stack.snapshots.record(
        NewSnapshot(
            resource=RESOURCE,
            ref="main",
            sha=sha,
            created_at=NOW,
            checkout=Archive(backup_id=f"checkout-{sha[:4]}", size=10, sha256="0" * 64),
        )
    )
    return SeedIdentity(
        resource=RESOURCE, ref="main", sha=sha, checkout_backup_id=f"checkout-{sha[:4]}"
    )


def standbys(stack: Stack) -> StandbyStore:
    return StandbyStore(stack.table)


def free_standby(stack: Stack, number: int, preseed: Generation | None = None) -> Standby:
    """A standby whose task reported in: free."""
    store = standbys(stack)
    standby = Standby(
        standby=f"{number:032x}",
        preseed=preseed,
        state=StandbyState.STARTING,
        launched_at=NOW,
        retire_at=NOW + 3600,
    )
    assert store.register(standby)
    assert store.launched(standby, task(number))
    recorded = standby.model_copy(update={"incarnation": task(number)})
    assert store.move(recorded, StandbyState.FREE, from_states={StandbyState.STARTING}, now=NOW)
    return recorded.model_copy(update={"state": StandbyState.FREE})


def seed_service(stack: Stack, tasks: Tasks, pools: PoolSettings) -> SeedService:
    table = stack.table
    return SeedService(
        lifecycle=stack.store.lifecycle(),
        snapshots=SnapshotStore(table),
        r2=stack.r2,
        runtime=tasks,
        settings=SeedSettings(),
        clock=lambda: NOW + 10,
        standbys=StandbyStore(table),
        pools=pools,
    )


def seed(service: SeedService, slot: str, seed: SeedIdentity) -> Any:
    return service.seed(
        SeedRequest(slot=slot, seed=seed, claim=owner(head=seed.sha), origin=ORIGIN)
    )


def incarnation_of(stack: Stack, slot: str) -> str | None:
    classified = stack.store.lifecycle().read(slot)
    assert isinstance(classified, Supported), classified
    return classified.record.incarnation


def test_racing_seeds_take_each_standby_once_and_each_attempt_has_one_task(
    stack: Stack,
) -> None:
    seeded = publish(stack, "a" * 40)
    for number in (1, 2, 3):
        free_standby(stack, number)
    tasks = Tasks()
    service = seed_service(stack, tasks, PoolSettings(pool=3))
    slots = [f"slot-{n}" for n in range(8)]
    answers: dict[str, Any] = {}
    barrier = threading.Barrier(len(slots))

    def race(slot: str) -> None:
        barrier.wait()
        answers[slot] = seed(service, slot, seeded)

    racers = [threading.Thread(target=race, args=(slot,)) for slot in slots]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()

    assert all(isinstance(answer, Seeding) for answer in answers.values()), answers
    named = Counter(incarnation_of(stack, slot) for slot in slots)
    assert all(count == 1 for count in named.values()), named  # one slot per task
    standby_tasks = {task(n) for n in (1, 2, 3)}
    assert standby_tasks <= set(named)  # every standby served one
    assert len(tasks.launched) == len(slots) - 3  # the rest launched their own
    assigned = standbys(stack).pool(BLANK_POOL)
    assert {s.state for s in assigned} == {StandbyState.ASSIGNED}
    for standby in assigned:
        assert standby.plan is not None
        assert incarnation_of(stack, standby.plan.slot) == standby.incarnation


def test_a_seed_with_no_pool_kept_launches_without_looking(stack: Stack) -> None:
    seeded = publish(stack, "a" * 40)
    free_standby(stack, 1)
    tasks = Tasks()
    seed(seed_service(stack, tasks, PoolSettings()), "slot-1", seeded)
    assert incarnation_of(stack, "slot-1") == tasks.launched[0]
    assert standbys(stack).pool(BLANK_POOL)[0].state is StandbyState.FREE


def test_a_preseeded_standby_serves_only_its_generation_while_it_is_current(
    stack: Stack,
) -> None:
    old = publish(stack, "a" * 40)
    resident = SnapshotStore(stack.table).read(RESOURCE).current
    assert resident is not None
    generation = Generation.of(resident)
    holding = free_standby(stack, 1, preseed=generation)
    tasks = Tasks()
    pools = PoolSettings(preseeded={RESOURCE: 1})
    # A seed of another generation (a fetch on top: not what it restored) launches.
    fetching = old.model_copy(update={"fetch_ref": "feature"})
    seed(seed_service(stack, tasks, pools), "slot-0", fetching)
    assert incarnation_of(stack, "slot-0") == tasks.launched[0]
    # Superseded by a rotation (the store's retire bypassed: the take checks it itself).
    new = publish(stack, "b" * 40)
    assert new.sha != old.sha
    assert standbys(stack).move(  # as if the rotation's retirement had not happened
        holding.model_copy(update={"state": StandbyState.RETIRED}),
        StandbyState.FREE,
        from_states={StandbyState.RETIRED},
        now=NOW,
    )
    seed(seed_service(stack, tasks, pools), "slot-1", old)  # the old generation: still recorded
    assert incarnation_of(stack, "slot-1") == tasks.launched[1]  # never the superseded standby
    (still,) = standbys(stack).pool(RESOURCE)
    assert still.state is StandbyState.FREE


def test_a_rotation_retires_the_standbys_of_the_generation_it_superseded(stack: Stack) -> None:
    publish(stack, "a" * 40)
    resident = SnapshotStore(stack.table).read(RESOURCE).current
    assert resident is not None
    free_standby(stack, 1, preseed=Generation.of(resident))
    publish(stack, "b" * 40)
    (retired,) = standbys(stack).pool(RESOURCE)
    assert retired.state is StandbyState.RETIRED


def test_the_pool_is_kept_at_its_target_and_what_it_retires_is_stopped(stack: Stack) -> None:
    tasks = Tasks()
    pool = StandbyPool(
        standbys=standbys(stack),
        snapshots=SnapshotStore(stack.table),
        runtime=tasks,
        settings=PoolSettings(pool=2, max_age=3600),
        clock=lambda: NOW,
    )
    report = pool.tend()
    assert report.launched == 2
    items = standbys(stack).pool(BLANK_POOL)
    assert {s.state for s in items} == {StandbyState.STARTING}
    assert {s.incarnation for s in items} == set(tasks.launched)
    for standby in items:  # their tasks report in
        assert standbys(stack).move(
            standby, StandbyState.FREE, from_states={StandbyState.STARTING}, now=NOW
        )
    # Over age, an hour later: both retired and stopped, two more launched.
    aged = StandbyPool(
        standbys=standbys(stack),
        snapshots=SnapshotStore(stack.table),
        runtime=tasks,
        settings=PoolSettings(pool=2, max_age=3600),
        clock=lambda: NOW + 3600,
    )
    report = aged.tend()
    assert (report.retired, report.stopped, report.launched) == (2, 2, 2)
    assert sorted(tasks.stopped) == sorted(tasks.launched[:2])
    assert len(standbys(stack).pool(BLANK_POOL)) == 2


def test_a_standby_that_never_reports_in_is_a_start_failure(stack: Stack) -> None:
    """Its task runs but never asks for its assignment (an image that cannot reach the
    checkpoint function): given up after the start timeout, and counted for the alarm as
    one whose task stopped before it was free is."""
    tasks = Tasks()

    def pool_at(now: int) -> StandbyPool:
        return StandbyPool(
            standbys=standbys(stack),
            snapshots=SnapshotStore(stack.table),
            runtime=tasks,
            settings=PoolSettings(pool=1, max_age=3600, start_timeout=600),
            clock=lambda: now,
        )

    assert pool_at(NOW).tend().launched == 1
    assert pool_at(NOW + 599).tend().start_failures == 0  # still starting
    later = pool_at(NOW + 600).tend()
    assert (later.retired, later.start_failures, later.launched) == (1, 1, 1)
    assert tasks.stopped == tasks.launched[:1]


class ReadThenRaced(StandbyStore):
    """A store whose pool is read, then raced (`race`) before the sweep writes."""

    def __init__(self, stack: Stack, race: Callable[[], None]) -> None:
        super().__init__(stack.table)
        self._race = race

    def pool(self, pool: str, *, consistent: bool = True) -> list[Standby]:
        read = super().pool(pool, consistent=consistent)
        self._race()
        return read


def test_a_standby_assigned_as_it_times_out_is_no_start_failure(stack: Stack) -> None:
    """Read still starting at its start timeout, it reports in and a seed takes it before
    the sweep retires it: the retirement's condition fails, and a standby that started is
    neither retired nor counted as one that did not."""
    tasks = Tasks()
    settings = PoolSettings(pool=1, max_age=3600, start_timeout=600)
    first = StandbyPool(
        standbys=standbys(stack),
        snapshots=SnapshotStore(stack.table),
        runtime=tasks,
        settings=settings,
        clock=lambda: NOW,
    )
    assert first.tend().launched == 1
    (starting,) = standbys(stack).pool(BLANK_POOL)

    def reported_in_and_taken() -> None:
        assert standbys(stack).move(
            starting, StandbyState.FREE, from_states={StandbyState.STARTING}, now=NOW + 600
        )
        seed(seed_service(stack, tasks, settings), "slot-1", publish(stack, "a" * 40))

    timed_out = StandbyPool(
        standbys=ReadThenRaced(stack, reported_in_and_taken),
        snapshots=SnapshotStore(stack.table),
        runtime=tasks,
        settings=settings,
        clock=lambda: NOW + 600,
    ).tend()
    assert (timed_out.retired, timed_out.start_failures) == (0, 0)
    assert incarnation_of(stack, "slot-1") == starting.incarnation
    (assigned,) = [s for s in standbys(stack).pool(BLANK_POOL) if s.standby == starting.standby]
    assert assigned.state is StandbyState.ASSIGNED


# -- the standby's own calls ------------------------------------------------------------


def ask(standby: Standby, signer: str | None = None, **changes: Any) -> tuple[int, Any]:
    body = {
        "standby": standby.standby,
        "resource": standby.preseed.resource if standby.preseed else None,
        "incarnation": standby.incarnation,
    } | changes
    request = event("checkpoint-upload", body=body, rawPath="/tasks/standby")
    return invoke(checkpoint_function, as_task(request, signer or str(standby.incarnation)))


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "epoch_seconds", lambda: NOW + 10)


def test_a_standby_reports_in_waits_and_is_answered_its_assignment(stack: Stack) -> None:
    store = standbys(stack)
    starting = Standby(
        standby="1" * 32, state=StandbyState.STARTING, launched_at=NOW, retire_at=NOW + 3600
    )
    assert store.register(starting)
    assert store.launched(starting, task(1))
    standby = starting.model_copy(update={"incarnation": task(1)})
    assert ask(standby) == (200, {"state": "free", "plan": None, "grant": None})
    seeded = publish(stack, "a" * 40)
    seed(seed_service(stack, Tasks(), PoolSettings(pool=1)), "slot-1", seeded)
    status, answer = ask(standby)
    assert status == 200
    assert answer["state"] == "assigned"
    assert (answer["plan"]["slot"], answer["plan"]["attempt"]) == ("slot-1", 1)


def test_only_the_standbys_own_task_is_answered(stack: Stack) -> None:
    """Another task (any slot's, holding the same role) naming the standby, with its own
    incarnation or the standby's, is refused alike: nothing moved, no plan disclosed."""
    standby = free_standby(stack, 1)
    seeded = publish(stack, "a" * 40)
    seed(seed_service(stack, Tasks(), PoolSettings(pool=1)), "slot-1", seeded)
    before = standbys(stack).pool(BLANK_POOL)
    intruder = task(7)
    assert ask(standby, signer=intruder) == NOT_THIS_TASK  # the standby's incarnation
    assert ask(standby, signer=intruder, incarnation=intruder) == NOT_THIS_TASK  # its own
    assert ask(standby, signer=intruder, leaving=True) == NOT_THIS_TASK
    absent = standby.model_copy(update={"standby": "f" * 32})
    assert ask(absent) == NOT_THIS_TASK  # no such standby: the same answer
    assert standbys(stack).pool(BLANK_POOL) == before


def test_a_free_standby_that_leaves_is_never_taken_after(stack: Stack) -> None:
    standby = free_standby(stack, 1)
    assert ask(standby, leaving=True)[1]["state"] == "retired"
    tasks = Tasks()
    seeded = publish(stack, "a" * 40)
    seed(seed_service(stack, tasks, PoolSettings(pool=1)), "slot-1", seeded)
    assert incarnation_of(stack, "slot-1") == tasks.launched[0]


def test_a_preseeded_standby_is_granted_its_generation_then_free_once_prepared(
    stack: Stack,
) -> None:
    publish(stack, "a" * 40)
    resident = SnapshotStore(stack.table).read(RESOURCE).current
    assert resident is not None
    store = standbys(stack)
    starting = Standby(
        standby="2" * 32,
        preseed=Generation.of(resident),
        state=StandbyState.STARTING,
        launched_at=NOW,
        retire_at=NOW + 3600,
    )
    assert store.register(starting)
    assert store.launched(starting, task(2))
    standby = starting.model_copy(update={"incarnation": task(2)})
    status, answer = ask(standby)
    assert (status, answer["state"]) == (200, "preparing")
    assert answer["grant"]["checkout"]["size"] == 10
    assert ask(standby, prepared=True)[1]["state"] == "free"
    # Superseded while it waits: told to leave.
    publish(stack, "b" * 40)
    assert ask(standby)[1]["state"] == "retired"


def test_a_standby_past_its_age_is_told_to_leave_even_if_no_sweep_tends_its_pool(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its pool no longer kept (the resource dropped from StandbyPreseeded), nothing looks at
    it: its own ask retires it once its time is up, and no seed takes it after."""
    standby = free_standby(stack, 1)
    assert ask(standby)[1]["state"] == "free"
    monkeypatch.setattr(config, "epoch_seconds", lambda: NOW + 3600)
    config.standby_desk.cache_clear()  # built with the clock it was given
    assert ask(standby)[1]["state"] == "retired"
    (retired,) = standbys(stack).pool(BLANK_POOL)
    assert retired.state is StandbyState.RETIRED


def test_pool_empty_is_counted_only_when_a_pool_kept_could_have_served_the_seed(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[str] = []
    monkeypatch.setattr("seedkeeper.services.seed.count", counted.append)
    seeded = publish(stack, "a" * 40)
    tasks = Tasks()
    # Pre-seeded standbys of another resource only: this seed was never theirs to serve.
    seed(seed_service(stack, tasks, PoolSettings(preseeded={"other-thing": 2})), "slot-1", seeded)
    assert counted == []
    # A blank pool kept, none free: the seed waited for a task it should not have.
    seed(seed_service(stack, tasks, PoolSettings(pool=2)), "slot-2", seeded)
    assert counted == ["StandbyPoolEmpty"]
    assert len(tasks.launched) == 2
