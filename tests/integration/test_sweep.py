"""The idle sweep against moto's DynamoDB: the full decision matrix with real conditional
writes, touches racing the fence, records it may not write, its cost, its cursor, its
metrics, the tasks it asks about in batches, and the ledger debts it pays."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from builders import EXPIRED, IDLE, INCARNATION, NOW, stored_in, written
from conftest import Stack
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import (
    ENDED_STATES,
    SWEEP_SHARDS,
    SlotRecord,
    State,
    Supported,
    encode,
    slot_key,
    sweep_shard,
)
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, TaskState, TaskStatus
from seedkeeper.domain.snapshots import Archive, NewSnapshot, Rotation, plan_rotation
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper.services.sweep import RETAINED_ALERT_AFTER, Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper.store.sweep_index import PROGRESS_KEY, SweepIndex

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

LIVE = [state for state in State if state not in ENDED_STATES]
FAR = EXPIRED + 100_000


@dataclass
class FakeRuntime:
    """Answers each incarnation's state as the row says; a row marked `touched` gets a
    poll exactly while the sweep asks (a request racing the fence in the same tick)."""

    states: dict[str, TaskState] = field(default_factory=dict)
    on_status: dict[str, Callable[[], None]] = field(default_factory=dict)
    asked: list[list[str]] = field(default_factory=list)  # each batch asked, in order
    stopped: list[str] = field(default_factory=list)

    def launch(self, plan: Any) -> str:
        raise AssertionError("the sweep never launches")

    def launch_standby(self, standby: Any) -> str:
        raise AssertionError("no standby pool is kept here")

    def status(self, incarnation: str) -> TaskStatus:
        raise AssertionError("the sweep asks a page's tasks in one batch")

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        self.asked.append(list(incarnations))
        for incarnation in incarnations:
            if incarnation in self.on_status:
                self.on_status[incarnation]()
        return {incarnation: self.states.get(incarnation, UNKNOWN) for incarnation in incarnations}

    def launched_for(self, incarnation: str) -> Any:
        raise AssertionError("the sweep never asks what a task was launched for")

    def stop(self, incarnation: str) -> None:
        self.stopped.append(incarnation)


SPOT = TaskState.stopped("SpotInterruption", "Your Spot Task was interrupted.")
RETENTION = RetentionSettings()
# The states whose idle, quiet slots the sweep acts on as their task says.
WAITS_ON_THE_TASK = {State.UNSEEDED, State.SEEDED, State.CHECKPOINTING, State.CHECKPOINTED}


def touch(lifecycle: Lifecycle, record: SlotRecord, until: int) -> None:
    written(
        lifecycle.touch(
            record.slot,
            transitions.Poll(
                Binding(owner=record.owner, seed=record.seed, origin=record.origin),
                now=EXPIRED,
                idle_deadline=until,
            ),
        )
    )


def sweeper(
    table: Table,
    runtime: FakeRuntime,
    page_size: int = 100,
    max_items: int = 1000,
    at: int = EXPIRED + 1,
) -> Sweeper:
    return Sweeper(
        index=SweepIndex(table),
        lifecycle=Lifecycle(table),
        runtime=lambda: runtime,
        snapshots=None,
        r2=None,
        settings=SweepSettings(page_size=page_size, max_items=max_items),
        retention=RETENTION,
        clock=lambda: at,
    )


def final_state(
    state: State, expired: bool, unsettled: bool, touched: bool, status: TaskStatus
) -> State:
    """Where the sweep must leave a row, spelled out (not derived from the code)."""
    if state is State.CLOSING:
        return State.RETIRED  # a fence without its retirement: finished
    acts = expired and not unsettled and not touched
    if state is State.UNSEEDED and acts and status is TaskStatus.RUNNING:
        return State.RETIRED
    if state is State.SEEDED and acts and status is TaskStatus.RUNNING:
        return State.CHECKPOINTING  # asked to checkpoint; nothing stopped
    if state in {State.SEEDED, State.CHECKPOINTING} and acts and status is TaskStatus.STOPPED:
        return State.LOST  # its work went with the task: recorded, never hidden
    if state is State.CHECKPOINTED and acts and status is not TaskStatus.UNKNOWN:
        return State.PARKED
    return state


def test_the_whole_matrix_stops_only_what_the_design_permits(
    table: Table, lifecycle: Lifecycle, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = FakeRuntime()
    rows = {}
    waiting: set[str] = set()
    for index, (state, expired, unsettled, touched, task) in enumerate(
        itertools.product(
            LIVE, [True, False], [True, False], [True, False], [RUNNING, UNKNOWN, SPOT]
        )
    ):
        slot = f"row-{index}"
        incarnation = f"local:{slot}:1"
        record = stored_in(lifecycle, slot, state, incarnation)
        if unsettled and state is not State.CLOSING:
            record = written(
                lifecycle.write(
                    transitions.RESERVE,
                    record,
                    transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW),
                )
            )
        if not expired and state is not State.CLOSING:
            touch(lifecycle, record, FAR)
        runtime.states[incarnation] = task
        if touched and state is not State.CLOSING:
            current = lifecycle.read(slot)
            assert isinstance(current, Supported)
            runtime.on_status[incarnation] = partial(touch, lifecycle, current.record, FAR)
        rows[slot] = (state, final_state(state, expired, unsettled, touched, task.status))
        if state in WAITS_ON_THE_TASK and expired and not unsettled:
            waiting.add(slot)

    report = sweeper(table, runtime).sweep()

    stopped = {slot for slot, (_, final) in rows.items() if final in {State.RETIRED, State.PARKED}}
    assert set(report.stopped) == {s for s, (_, f) in rows.items() if f is State.RETIRED}
    assert set(report.parked) == {s for s, (_, f) in rows.items() if f is State.PARKED}
    assert set(report.lost) == {s for s, (_, f) in rows.items() if f is State.LOST}
    assert set(report.checkpoints_requested) == {
        s for s, (_, f) in rows.items() if f is State.CHECKPOINTING and rows[s][0] is State.SEEDED
    }
    assert sorted(runtime.stopped) == sorted(f"local:{slot}:1" for slot in stopped)
    # One batch for the page, and only the tasks a decision waits on.
    (asked,) = runtime.asked
    assert sorted(asked) == sorted(f"local:{slot}:1" for slot in waiting)
    for slot, (_, final) in rows.items():
        current = lifecycle.read(slot)
        assert isinstance(current, Supported)
        record = current.record
        assert record.state is final, slot
        if final in {State.RETIRED, State.PARKED, State.LOST}:
            assert "sweep" not in (table.get_item(Key=slot_key(slot))["Item"])
        if final is State.PARKED:
            assert record.checkpoint is not None
            assert record.expires_at is not None
            assert record.expires_at >= record.checkpoint.expires_at
        if final is State.LOST:
            assert record.loss is not None
            assert (record.loss.reason, record.loss.detail) == (SPOT.reason, SPOT.detail)
            assert record.loss.at == EXPIRED + 1
            assert record.expires_at == EXPIRED + 1 + RETENTION.park_retention
            assert record.window.unsettled == 0  # an open checkpoint is settled `lost`
    assert report.left["task-stopped"] > 0
    emitted = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line
    ]
    reasons = {m["reason"]: m["SlotsRetained"][0] for m in emitted if "SlotsRetained" in m}
    assert reasons == dict(report.retained)
    assert [m["SlotsLost"][0] for m in emitted if "SlotsLost" in m] == [len(report.lost)]


def test_a_retained_slot_is_looked_at_again_after_its_backoff(
    table: Table, lifecycle: Lifecycle
) -> None:
    """Its reason and next look are written; the next run does not read it (nor write
    it); the run after its next look does, and backs off twice as long."""
    record = stored_in(lifecycle, "kept", State.SEED_FAILED, INCARNATION)
    runtime = FakeRuntime()
    first = sweeper(table, runtime).sweep()
    assert first.retained == {"seed-failed": 1}
    noted = lifecycle.read("kept")
    assert isinstance(noted, Supported)
    assert noted.record.retained_reason == "seed-failed"
    assert noted.record.rev == record.rev + 1
    assert (noted.record.retains, noted.record.next_look) == (1, EXPIRED + 1 + 300)
    assert noted.record.idle_deadline == record.idle_deadline  # it keeps its meaning
    calls: list[str] = []
    table.meta.client.meta.events.register(
        "before-call.dynamodb", lambda event_name, **_: calls.append(event_name)
    )
    second = sweeper(table, runtime, at=EXPIRED + 1 + 300).sweep()
    assert (second.read, second.retained) == (1, {})  # the progress item only
    assert "before-call.dynamodb.UpdateItem" not in calls
    assert lifecycle.read("kept") == noted
    third = sweeper(table, runtime, at=EXPIRED + 1 + 301).sweep()
    assert third.retained == {"seed-failed": 1}
    again = lifecycle.read("kept")
    assert isinstance(again, Supported)
    assert again.record.retained_reason == "seed-failed"
    assert (again.record.retains, again.record.next_look) == (2, EXPIRED + 1 + 301 + 600)
    assert runtime.asked == []


def test_a_runtime_that_cannot_be_built_leaves_every_task_unknown(
    table: Table, lifecycle: Lifecycle
) -> None:
    """A runtime the sweep cannot build (misconfigured, or not installed where it runs)
    says nothing of any task: the cold slot is retained, never stopped on a guess."""
    record = stored_in(lifecycle, "cold", State.UNSEEDED, INCARNATION)

    def unavailable() -> FakeRuntime:
        raise RuntimeUnavailable("the local runtime is not installed")

    report = Sweeper(
        index=SweepIndex(table),
        lifecycle=lifecycle,
        runtime=unavailable,
        snapshots=None,
        r2=None,
        settings=SweepSettings(),
        retention=RETENTION,
        clock=lambda: EXPIRED + 1,
    ).sweep()
    assert report.retained == {"task-unknown": 1}
    assert report.stopped == []
    kept = lifecycle.read("cold")
    assert isinstance(kept, Supported)
    assert (kept.record.state, kept.record.retained_reason) == (State.UNSEEDED, "task-unknown")
    assert kept.record.rev == record.rev + 1


def test_records_it_may_not_write_are_retained_untouched(
    table: Table, lifecycle: Lifecycle
) -> None:
    stored_in(lifecycle, "future", State.UNSEEDED, "local:future:1")
    stored_in(lifecycle, "broken", State.UNSEEDED, "local:broken:1")
    future: dict[str, Any] = {
        **slot_key("future"),
        "schema": 99,
        "sweep": sweep_shard("future", SWEEP_SHARDS),
        "sweep_at": NOW,
        "x": 1,
    }
    table.put_item(Item=future)
    broken = table.get_item(Key=slot_key("broken"))["Item"] | {"rev": "seven"}
    table.put_item(Item=broken)
    runtime = FakeRuntime(states={"local:future:1": RUNNING})
    report = sweeper(table, runtime).sweep()
    assert report.retained == {"record-unsupported": 1, "record-malformed": 1}
    assert report.stopped == []
    assert runtime.asked == []
    assert table.get_item(Key=slot_key("future"))["Item"] == future
    assert table.get_item(Key=slot_key("broken"))["Item"] == broken


def bulk(table: Table, count: int, *, expired: int) -> None:
    """`count` cold slots, `expired` of them past their deadline (test setup, written raw)."""
    with table.batch_writer() as batch:
        for index in range(count):
            birth = transitions.born(
                f"bulk-{index}",
                Binding(owner=None, seed=None, origin=None),
                now=NOW,
                idle_deadline=NOW + IDLE if index < expired else FAR,
            )
            assert birth.entry is not None
            launched = transitions.RECORD_INCARNATION.decide(
                birth.record,
                transitions.Launched(
                    incarnation=f"local:bulk-{index}:1", launch=birth.entry.ref, now=NOW
                ),
            )
            assert isinstance(launched, transitions.Change)
            batch.put_item(Item=encode(launched.record))


def test_the_sweep_reads_the_expired_slots_not_the_table(table: Table) -> None:
    bulk(table, 10_000, expired=100)
    runtime = FakeRuntime(states={f"local:bulk-{i}:1": RUNNING for i in range(100)})
    report = sweeper(table, runtime, page_size=100).sweep()
    assert len(report.stopped) == 100
    assert report.read <= 100 + 100 + 1  # the expired items, at most one more page, the cursor
    assert report.finished


def test_a_long_backlog_is_resumed_from_the_cursor(table: Table) -> None:
    bulk(table, 120, expired=100)
    runtime = FakeRuntime()  # every task unknown: all retained, nothing stopped
    seen: list[int] = []
    for _ in range(10):
        report = sweeper(table, runtime, page_size=25, max_items=40).sweep()
        seen.append(sum(report.retained.values()))
        if report.finished:
            break
    assert sum(seen) == 100
    assert seen[0] < 100  # it really stopped part-way and resumed
    assert "cursor" not in table.get_item(Key=PROGRESS_KEY)["Item"]  # the pass ended


def test_the_sweep_pays_the_ledger(stack: Stack) -> None:
    s3 = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
    store = SnapshotStore(stack.table)
    service = stack.snapshots
    ids = []
    for n in range(3):
        backup_id = f"swept-{n}"
        s3.put_object(Bucket=stack.r2_settings.bucket or "", Key=backup_key(backup_id), Body=b"x")
        ids.append(backup_id)
        new = NewSnapshot(
            resource="swept",
            ref="main",
            sha=f"{n:040x}",
            created_at=NOW + n,
            checkout=Archive(backup_id=backup_id, size=1, sha256="0" * 64),
        )
        # Rotate without paying, as if every deletion had failed.
        plan = rotation_of(store, new)
        store.commit_rotation(plan)
    assert store.read("swept").pending_ids == {"swept-0"}
    report = Sweeper(
        index=SweepIndex(stack.table),
        lifecycle=Lifecycle(stack.table),
        runtime=FakeRuntime,
        snapshots=service,
        r2=stack.r2,
        settings=SweepSettings(),
        retention=RETENTION,
        clock=lambda: NOW + 10,
    ).sweep()
    assert report.debts_paid == 1
    assert store.read("swept").pending_ids == set()
    listed = s3.list_objects_v2(Bucket=stack.r2_settings.bucket or "").get("Contents", [])
    assert sorted(o["Key"] for o in listed) == [backup_key("swept-1"), backup_key("swept-2")]


def rotation_of(store: SnapshotStore, new: NewSnapshot) -> Rotation:
    plan = plan_rotation(store.read(new.resource), new, now=NOW)
    assert isinstance(plan, Rotation)
    return plan


@dataclass
class RefusingStops(FakeRuntime):
    """ECS refuses every StopTask (throttled, or down)."""

    def stop(self, incarnation: str) -> None:
        raise RuntimeUnavailable("ThrottlingException", retryable=True)


def test_a_stop_the_platform_refuses_is_counted_as_such_and_stopped_again(
    table: Table, lifecycle: Lifecycle
) -> None:
    """The cold slot is fenced (closing) but its task not stopped: retained as
    `stop-failed`, not as if a poll had touched it, and counted long (its alarm) once
    refused past the alert age. The next sweep that may stop it stops it."""
    stored_in(lifecycle, "cold", State.UNSEEDED, INCARNATION)
    runtime = RefusingStops(states={INCARNATION: RUNNING})
    first = sweeper(table, runtime).sweep()
    assert (first.retained, first.retained_long) == ({"stop-failed": 1}, {})
    assert first.stopped == []
    closing = lifecycle.read("cold")
    assert isinstance(closing, Supported)
    assert closing.record.state is State.CLOSING
    late = sweeper(table, runtime, at=closing.record.idle_deadline + RETAINED_ALERT_AFTER + 1)
    still = late.sweep()
    assert (still.retained, still.retained_long) == ({"stop-failed": 1}, {"stop-failed": 1})
    working = FakeRuntime(states={INCARNATION: RUNNING})
    second = sweeper(table, working).sweep()
    assert (second.stopped, working.stopped) == (["cold"], [INCARNATION])
