"""The sharded sweep index against moto: many shards read once each per pass, across pages
and runs resumed mid-shard; a shard count that grows or shrinks loses no slot; a retained
slot backed off (not re-read until its next look) and brought back at once by a touch or
any other write; the metric of slots retained long past their idle deadline."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from builders import EXPIRED, IDLE, NOW, stored_in, success, written
from seedkeeper.config import StoreSettings
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.models import Binding
from seedkeeper.domain.record import (
    SWEEP_SHARDS,
    SlotRecord,
    State,
    Supported,
    slot_key,
    sweep_shard,
)
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, TaskState
from seedkeeper.services.sweep import Report, Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.sweep_index import PROGRESS_KEY, START, Position, Progress, SweepIndex
from slots import Slots

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

FAR = EXPIRED + 100_000


@dataclass
class Tasks:
    """Every task running (or unknown); counts the tasks stopped and asked about."""

    running: bool = True
    stopped: list[str] = field(default_factory=list)
    asked: Counter[str] = field(default_factory=Counter)

    def launch(self, plan: Any) -> str:
        raise AssertionError("the sweep never launches")

    def launch_standby(self, standby: Any) -> str:
        raise AssertionError("no standby pool is kept here")

    def status(self, incarnation: str) -> Any:
        raise AssertionError("the sweep asks a page's tasks in one batch")

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        self.asked.update(incarnations)
        return dict.fromkeys(incarnations, RUNNING if self.running else UNKNOWN)

    def launched_for(self, incarnation: str) -> Any:
        raise AssertionError("the sweep never asks what a task was launched for")

    def stop(self, incarnation: str) -> None:
        self.stopped.append(incarnation)


def sweep(
    table: Table,
    tasks: Tasks,
    *,
    at: int,
    shards: int = 16,
    page_size: int = 100,
    max_items: int = 1000,
) -> Report:
    return Sweeper(
        index=SweepIndex(table, shards=shards),
        lifecycle=Lifecycle(table, shards=shards),
        runtime=lambda: tasks,
        snapshots=None,
        r2=None,
        settings=SweepSettings(page_size=page_size, max_items=max_items),
        retention=RetentionSettings(),
        clock=lambda: at,
    ).sweep()


def cold(lifecycle: Lifecycle, slot: str, *, idle_deadline: int) -> SlotRecord:
    """A cold slot whose task runs, idle from `idle_deadline`."""
    birth = written(
        lifecycle.birth(
            slot, Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=idle_deadline
        )
    )
    launched = transitions.Launched(
        incarnation=f"local:{slot}:1", launch=birth.window.entries[0].ref, now=NOW
    )
    return written(lifecycle.write(transitions.RECORD_INCARNATION, birth, launched))


def current(lifecycle: Lifecycle, slot: str) -> SlotRecord:
    classified = lifecycle.read(slot)
    assert isinstance(classified, Supported)
    return classified.record


def test_a_pass_over_many_shards_finds_every_due_slot_once(table: Table) -> None:
    """64 shards, 240 slots, 120 due: pages of 7 cross shard boundaries, and a pass cut
    off mid-shard resumes from the position kept in the table."""
    lifecycle = Lifecycle(table, shards=64)
    due = {f"slot-{n}" for n in range(120)}
    for n in range(240):
        slot = f"slot-{n}"
        cold(lifecycle, slot, idle_deadline=NOW + IDLE if slot in due else FAR)
    assert len({sweep_shard(slot, 64) for slot in due}) > 50  # spread over the shards

    index = SweepIndex(table, shards=64)
    found: list[str] = []
    position: Position | None = START
    queries = 0
    while position is not None:
        if len(found) > 60 and position.after is not None:  # cut off mid-shard: resumed
            index.keep_progress(64, position)
            resumed = SweepIndex(table, shards=64).progress()
            assert resumed == Progress(shards=64, resume=position)
            position = resumed.resume
            assert position is not None
        page = index.due(EXPIRED, start=position, shards=64, limit=7)
        assert len(page.slots) <= 7
        found += [entry.record.slot for entry in page.slots if isinstance(entry, Supported)]
        queries += page.queries
        position = page.next
    assert sorted(found) == sorted(due)  # every due slot, none twice, none not due
    assert queries >= 64  # every shard asked


def test_the_sweep_stops_every_idle_slot_once_across_runs_resumed_mid_shard(
    table: Table,
) -> None:
    lifecycle = Lifecycle(table, shards=64)
    due = [f"slot-{n}" for n in range(150)]
    for n in range(300):
        cold(lifecycle, f"slot-{n}", idle_deadline=NOW + IDLE if n < 150 else FAR)
    tasks = Tasks()
    runs: list[Report] = []
    mid_shard = False
    while not (runs and runs[-1].finished):
        runs.append(sweep(table, tasks, at=EXPIRED, shards=64, page_size=16, max_items=40))
        resume = SweepIndex(table, shards=64).progress().resume
        mid_shard |= resume is not None and resume.after is not None
        assert len(runs) < 20
    assert len(runs) > 3
    assert mid_shard  # cut off part-way, resumed where it stopped
    assert sorted(tasks.stopped) == sorted(f"local:{slot}:1" for slot in due)  # each once
    assert set(tasks.asked.values()) == {1}
    assert all(current(lifecycle, slot).state is State.RETIRED for slot in due)


def test_a_shard_count_that_grows_loses_nothing_and_a_touch_moves_the_slot(
    table: Table,
) -> None:
    before = Lifecycle(table, shards=4)
    for n in range(40):
        cold(before, f"slot-{n}", idle_deadline=NOW + IDLE)
    tasks = Tasks(running=False)  # every task unknown: all retained
    assert sum(sweep(table, tasks, at=EXPIRED, shards=32).retained.values()) == 40
    # Touched under the new count, a slot moves to its shard there.
    after = Lifecycle(table, shards=32)
    poll = transitions.Poll(Binding(), now=EXPIRED, idle_deadline=EXPIRED + IDLE)
    written(after.touch("slot-7", poll))
    item = table.get_item(Key=slot_key("slot-7"))["Item"]
    assert item["sweep"] == sweep_shard("slot-7", 32) != sweep_shard("slot-7", 4)


def test_a_shard_count_configured_lower_still_queries_every_shard_ever_used(
    table: Table,
) -> None:
    """Writers and the sweep on 32 shards; then configured to 4: the records still on the
    higher shards are found, because the sweep keeps the most it ever queried."""
    tasks = Tasks(running=False)
    assert sweep(table, tasks, at=NOW, shards=32).queries == 32
    written_on_32 = Lifecycle(table, shards=32)
    for n in range(40):
        cold(written_on_32, f"slot-{n}", idle_deadline=NOW + IDLE)
    assert any(int(sweep_shard(f"slot-{n}", 32)[5:]) >= 4 for n in range(40))
    lowered = sweep(table, tasks, at=EXPIRED, shards=4)
    assert sum(lowered.retained.values()) == 40
    assert lowered.queries >= 32
    assert table.get_item(Key=PROGRESS_KEY)["Item"]["shards"] == 32
    # A sweep that knows fewer never lowers the count recorded.
    SweepIndex(table, shards=4).keep_progress(4, None)
    assert table.get_item(Key=PROGRESS_KEY)["Item"]["shards"] == 32


def test_a_retained_slot_is_not_read_again_until_its_next_look(table: Table) -> None:
    """Run 1 reads and retains the slots; run 2 (one period later) reads none of them; the
    run after their next look reads them all again and backs off twice as long."""
    lifecycle = Lifecycle(table)
    for n in range(30):
        cold(lifecycle, f"slot-{n}", idle_deadline=NOW + IDLE)
    tasks = Tasks(running=False)
    first = sweep(table, tasks, at=EXPIRED)
    second = sweep(table, tasks, at=EXPIRED + 300)
    third = sweep(table, tasks, at=EXPIRED + 301)
    fourth = sweep(table, tasks, at=EXPIRED + 601)
    assert (first.read, second.read, third.read, fourth.read) == (31, 1, 31, 1)
    assert first.retained == third.retained == {"task-unknown": 30}
    record = current(lifecycle, "slot-0")
    assert (record.retains, record.next_look) == (2, EXPIRED + 301 + 600)
    assert record.idle_deadline == NOW + IDLE  # unchanged: receipts and answers say it


def test_a_touch_brings_a_backed_off_slot_back_at_once(table: Table) -> None:
    lifecycle = Lifecycle(table)
    cold(lifecycle, "slot-1", idle_deadline=NOW + IDLE)
    tasks = Tasks(running=False)
    for at in (EXPIRED, EXPIRED + 400, EXPIRED + 1100, EXPIRED + 2400):  # backed off to 20 min
        assert sweep(table, tasks, at=at).retained == {"task-unknown": 1}
    assert current(lifecycle, "slot-1").next_look == EXPIRED + 2400 + 2400
    poll = transitions.Poll(Binding(), now=EXPIRED + 2500, idle_deadline=EXPIRED + 2560)
    touched = written(lifecycle.touch("slot-1", poll))
    assert (touched.next_look, touched.retains, touched.sweep_at) == (None, None, EXPIRED + 2560)
    assert sweep(table, tasks, at=EXPIRED + 2560).read == 1  # not idle yet
    tasks.running = True
    assert sweep(table, tasks, at=EXPIRED + 2561).stopped == ["slot-1"]  # idle again: stopped


def test_a_change_of_state_is_looked_at_in_the_next_run_whatever_the_backoff(
    table: Table,
) -> None:
    """A seeding slot retained while its restore runs; its task settles the seed: the next
    run asks for its checkpoint, not the run after the backoff."""
    lifecycle = Lifecycle(table)
    seeding = stored_in(lifecycle, "slot-1", State.SEEDING)
    tasks = Tasks()
    assert sweep(table, tasks, at=EXPIRED).retained == {"seeding": 1}
    backed_off = current(lifecycle, "slot-1")
    assert backed_off.next_look == EXPIRED + 300
    restore = seeding.window.entries[0].ref
    verdict = transitions.Verdict(attempt=1, restore=restore, result=success(), now=EXPIRED + 1)
    written(lifecycle.write(transitions.SETTLE_SEED, backed_off, verdict))
    assert sweep(table, tasks, at=EXPIRED + 2).checkpoints_requested == ["slot-1"]


def test_a_retain_that_loses_to_a_touch_writes_no_backoff(table: Table) -> None:
    """The owner's poll lands between the sweep's read and its retain: the retain's write
    fails (another `rev`), and the touch's `sweep_at` stands."""
    lifecycle = Lifecycle(table)
    record = cold(lifecycle, "slot-1", idle_deadline=NOW + IDLE)

    class TouchedWhileAsked(Tasks):
        def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
            poll = transitions.Poll(Binding(), now=EXPIRED, idle_deadline=EXPIRED + IDLE)
            written(lifecycle.touch("slot-1", poll))
            return dict.fromkeys(incarnations, UNKNOWN)

    assert sweep(table, TouchedWhileAsked(), at=EXPIRED).retained == {"task-unknown": 1}
    after = current(lifecycle, "slot-1")
    assert after.rev == record.rev + 1  # the touch only
    assert (after.next_look, after.sweep_at) == (None, EXPIRED + IDLE)


def test_slots_retained_long_after_their_idle_deadline_are_counted_by_reason(
    table: Table, capsys: pytest.CaptureFixture[str]
) -> None:
    lifecycle = Lifecycle(table)
    cold(lifecycle, "idle-for-long", idle_deadline=NOW)
    cold(lifecycle, "idle-a-while", idle_deadline=NOW + 3000)
    report = sweep(table, Tasks(running=False), at=NOW + 3601)
    assert report.retained == {"task-unknown": 2}
    assert report.retained_long == {"task-unknown": 1}
    emitted = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line
    ]
    long = [m for m in emitted if "SlotsRetainedLong" in m]
    assert [(m["reason"], m["SlotsRetainedLong"][0]) for m in long] == [("task-unknown", 1)]


def test_every_writer_puts_a_record_on_its_shard_under_the_configured_count(
    slots: Slots, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer with an idea of the count of its own (a default, say) would put a slot on a
    shard a sweep configured with fewer never queries: each reads it (the slot task writes
    only through the checkpoint function, which is one of them)."""
    monkeypatch.setenv("SEEDKEEPER_SWEEP_SHARDS", "3")
    slot = "slot-7"
    assert sweep_shard(slot, 3) != sweep_shard(slot, SWEEP_SHARDS)  # the test can tell
    stack = slots.stack
    assert slots.seed(slots.body(None, slot=slot))[0] == 200
    assert stack.wire_item(slot)["sweep"] == {"S": sweep_shard(slot, 3)}
    stack.store.table_resource().update_item(  # as if written under another count
        Key=slot_key(slot),
        UpdateExpression="SET sweep = :other",
        ExpressionAttributeValues={":other": sweep_shard(slot, SWEEP_SHARDS)},
    )

    lifecycle = StoreSettings().lifecycle()
    poll = transitions.Poll(
        Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=NOW + IDLE
    )
    assert isinstance(lifecycle.touch(slot, poll), Written)

    assert stack.wire_item(slot)["sweep"] == {"S": sweep_shard(slot, 3)}
