"""A stop of many local tasks, as a stack's exit does it: every task given the same grace at
once, not one after another; every exit kept and every workspace removed before the stop
returns, whoever reaps the task (a stack that exits right after its stop leaves nothing
half removed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import SLOT_UIDS_FROM_HERE
from seedkeeper.domain.opwindow import Actor, OpRef
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.runtime import TaskState, TaskStatus
from seedkeeper_tools.local.runtime import LocalRuntime
from slots import one_grace_for_all, running, signals_sent

# A task that says it is ready, then ignores SIGTERM: each takes its whole grace to stop.
DEAF = """
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
(pathlib.Path(os.environ["SEEDKEEPER_WORKSPACE"]) / "ready").write_text("")
time.sleep(600)
"""
TASKS = 16
GRACE = 1.0
# Launches tasks with a runtime of its own, then exits: its reapers go with it.
LAUNCHER = """
import pathlib, sys
from seedkeeper.domain.opwindow import Actor, OpRef
from seedkeeper.domain.plan import SlotPlan
from seedkeeper_tools.local.runtime import LocalRuntime
data, uids, *slots = sys.argv[1:]
sleeper = (sys.executable, "-c", "import time; time.sleep(600)")
runtime = LocalRuntime(pathlib.Path(data), command=sleeper, slot_uids_from=int(uids))
op = OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
for slot in slots:
    runtime.launch(SlotPlan(slot=slot, attempt=1, op=op))
"""


@pytest.fixture(autouse=True)
def _no_task_outlives_its_test(tmp_path: Path) -> Iterator[None]:
    yield
    LocalRuntime(tmp_path / "data", slot_uids_from=SLOT_UIDS_FROM_HERE).stop_all()


def deaf_runtime(data: Path) -> LocalRuntime:
    return LocalRuntime(
        data, command=(sys.executable, "-c", DEAF), slot_uids_from=SLOT_UIDS_FROM_HERE
    )


def plan(slot: str) -> SlotPlan:
    return SlotPlan(slot=slot, attempt=1, op=OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1))


def named(prefix: str, count: int) -> list[str]:
    """Slots of this test alone: other tests' tasks run beside these."""
    run = uuid.uuid4().hex[:8]
    return [f"{prefix}-{run}-{index}" for index in range(count)]


def wait_for_all(paths: list[Path], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not all(path.exists() for path in paths):
        assert time.monotonic() < deadline, "the tasks never started"
        time.sleep(0.05)


def pids(data: Path, slots: list[str]) -> list[int]:
    return [
        int(json.loads((data / "slots" / slot / "attempt-1.json").read_text())["pid"])
        for slot in slots
    ]


def leftovers(data: Path, slots: list[str]) -> list[Path]:
    """A workspace, or one renamed for its removal and not yet removed."""
    return [
        path
        for slot in slots
        for pattern in ("workspace-*", ".gone-workspace-*")
        for path in (data / "slots" / slot).glob(pattern)
    ]


def test_many_tasks_that_ignore_sigterm_are_stopped_in_one_grace_not_one_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given tasks that each take the whole grace to stop (one after another: 16 s)
    data = tmp_path / "data"
    runtime = deaf_runtime(data)
    slots = named("deaf", TASKS)
    incarnations = [runtime.launch(plan(slot)) for slot in slots]
    wait_for_all([runtime.workspace(slot) / "ready" for slot in slots])
    sent = signals_sent(monkeypatch)
    # When they are stopped together
    runtime.stop_tasks(incarnations, grace=GRACE)
    # Then each had its SIGTERM before any had its SIGKILL: one grace for all, not one each
    assert one_grace_for_all(sent, pids(data, slots)), sent
    # And none is left, each killed when its grace ran out, as its exit says
    assert not any(running(pid) for pid in pids(data, slots))
    killed = TaskState.stopped(None, "killed by SIGKILL")
    assert runtime.statuses(incarnations) == dict.fromkeys(incarnations, killed)


def test_a_stop_returns_once_every_workspace_is_removed_and_every_exit_kept(
    tmp_path: Path,
) -> None:
    """This process's reapers clear the tasks it started as soon as they end; the stop waits
    for them. (It once returned while they were still removing the checkouts: a stack that
    then exited left every workspace behind, renamed and half removed.)"""
    # Given tasks whose workspaces hold many files, as a checkout does
    data = tmp_path / "data"
    runtime = deaf_runtime(data)
    slots = named("full", 6)
    for slot in slots:
        runtime.launch(plan(slot))
    wait_for_all([runtime.workspace(slot) / "ready" for slot in slots])
    for slot in slots:
        for folder in range(30):
            checkout = runtime.workspace(slot) / "checkout" / str(folder)
            checkout.mkdir(parents=True)
            for name in range(100):
                (checkout / f"{name}.txt").write_text(name * "x")
    # When the stack's exit stops them all
    runtime.stop_all()
    # Then, as the stop returns, no workspace is left, and each task's exit is kept
    assert leftovers(data, slots) == []
    for slot in slots:
        assert (data / "slots" / slot / "attempt-1.exit").read_text() == "-9"


def test_tasks_another_process_started_are_stopped_and_cleared_here(tmp_path: Path) -> None:
    # Given tasks started by a process that is gone, with its reapers
    data = tmp_path / "data"
    slots = named("orphan", 6)
    launcher = [sys.executable, "-c", LAUNCHER, str(data), str(SLOT_UIDS_FROM_HERE), *slots]
    subprocess.run(launcher, check=True, timeout=60, env=os.environ)
    runtime = LocalRuntime(data, slot_uids_from=SLOT_UIDS_FROM_HERE)
    for slot in slots:
        (runtime.workspace(slot) / "work.txt").write_text("left by the task")
    # When this process stops them all
    runtime.stop_all()
    # Then none runs, and no workspace is left
    assert not any(running(pid) for pid in pids(data, slots))
    assert leftovers(data, slots) == []
    assert all(runtime.status(f"local:{slot}:1") is TaskStatus.STOPPED for slot in slots)
