"""The idle sweep end to end with the local runtime: real slot processes, real restores.
Afterwards only the positively-unseeded idle slots are gone; every seeded checkout is intact
on disk."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from functions import Context, event, load_function
from repos import tree
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import SWEEP_SHARDS, State
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.services.sweep import Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Written
from seedkeeper.store.sweep_index import SweepIndex
from seedkeeper_task.supervisor import CHECKOUT
from slots import Slots, TamperingProxy, record_archive, squashfs_of

sweep_function = load_function("idle_sweep")
LATER = 10**10  # every deadline has passed


def wait_until(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition never held")


def test_only_positively_unseeded_idle_slots_are_stopped(
    slots: Slots, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lifecycle = slots.stack.store.lifecycle()
    # Cold slots: one idle and running, one whose task already stopped, one with work in
    # flight, one touched long after the others.
    for slot in ("cold-idle", "cold-stopped", "cold-busy", "cold-touched"):
        assert slots.seed(slots.body(None, slot=slot))[0] == 200
    record = json.loads((slots.workspace("cold-stopped").parent / "attempt-1.json").read_text())
    os.killpg(record["pid"], signal.SIGKILL)
    wait_until(lambda: slots.runtime.status("local:cold-stopped:1") is TaskStatus.STOPPED)
    busy = slots.record("cold-busy")
    reserved = lifecycle.write(
        transitions.RESERVE,
        busy,
        transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=1),
    )
    assert isinstance(reserved, Written)
    touched = slots.record("cold-touched")
    lifecycle.touch(
        "cold-touched",
        transitions.Poll(
            Binding(owner=None, seed=None, origin=None), now=LATER, idle_deadline=LATER + 600
        ),
    )

    # Seeded, failed and still-seeding slots, each with a real task.
    seeded_body = slots.body(slots.publish(repo), slot="seeded")
    slots.seed(seeded_body)
    assert slots.settle(seeded_body)[1]["seeded"] is True
    checkout = slots.workspace("seeded") / CHECKOUT
    (checkout / "unpublished.txt").write_text("the run's work\n")
    image = squashfs_of(repo, tmp_path / "good.sqsh")
    corrupted = image[:-1] + bytes([image[-1] ^ 0xFF])
    failed_seed = record_archive(
        slots,
        "widgets-broken",
        corrupted,
        size=len(image),
        sha256=hashlib.sha256(image).hexdigest(),
        sha=seeded_body["seed"]["sha"],
    )
    failed_body = slots.body(failed_seed, slot="failed")
    slots.seed(failed_body)
    assert slots.settle(failed_body)[1]["seeded"] is False
    proxy = TamperingProxy(slots.stack.endpoint, mode="stall")
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", proxy.endpoint)
    seeding_body = slots.body(slots.publish(repo), slot="seeding")
    assert slots.seed(seeding_body)[0] == 202
    assert proxy.gets.wait(30)
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", slots.stack.endpoint)

    before = tree(checkout)
    report = Sweeper(
        index=SweepIndex(slots.stack.table),
        lifecycle=lifecycle,
        runtime=lambda: slots.runtime,
        snapshots=None,
        r2=None,
        settings=SweepSettings(),
        retention=RetentionSettings(),
        clock=lambda: LATER,
    ).sweep()

    assert report.stopped == ["cold-idle"]
    assert report.checkpoints_requested == ["seeded"]  # asked, never stopped
    assert slots.runtime.status("local:cold-idle:1") is TaskStatus.STOPPED
    assert slots.record("cold-idle").state is State.RETIRED
    assert report.left == {"task-stopped": 1}
    assert slots.record("cold-stopped").state is State.UNSEEDED
    assert report.retained == {
        "unsettled-operations": 1,
        "seed-failed": 1,
        "seeding": 1,
    }
    for slot, state in [
        ("cold-busy", State.UNSEEDED),
        ("cold-touched", State.UNSEEDED),
        ("seeded", State.CHECKPOINTING),
        ("failed", State.SEED_FAILED),
        ("seeding", State.SEEDING),
    ]:
        assert slots.record(slot).state is state
        assert slots.runtime.status(f"local:{slot}:1") is TaskStatus.RUNNING, slot
    assert tree(checkout) == before
    assert (checkout / "unpublished.txt").read_text() == "the run's work\n"
    assert touched.rev < slots.record("cold-touched").rev
    proxy.release.set()
    proxy.shutdown()


def test_the_scheduled_function_sweeps_with_the_configured_runtime(slots: Slots) -> None:
    assert slots.seed(slots.body(None, slot="cold-1"))[0] == 200
    summary = sweep_function(event("idle-sweep"), Context())
    assert summary == {
        "read": 1,  # the progress item: nothing has expired yet
        "queries": SWEEP_SHARDS,  # one per shard, each answering nothing
        "stopped": [],
        "checkpoints_requested": [],
        "parked": [],
        "lost": [],
        "retained": {},
        "retained_long": {},
        "left": {},
        "finished": True,
        "debts_paid": 0,
        # No pool kept: the blank one looked at (none was ever kept), nothing done.
        "standbys": {"launched": 0, "retired": 0, "stopped": 0, "start_failures": 0, "free": {}},
    }
    assert slots.runtime.status("local:cold-1:1") is TaskStatus.RUNNING
