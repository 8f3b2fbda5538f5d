"""The local runtime as a busy stack uses it: a launch retried while the first is still
starting starts nothing more, a stop of many tasks stops them together, and a task that
ends is waited for at once (no zombie)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import SLOT_UIDS_FROM_HERE
from seedkeeper.domain.opwindow import Actor, OpRef
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper_tools.local.runtime import LocalRuntime, _end_groups, _Process

SLEEPER = (sys.executable, "-c", "import time; time.sleep(600)")
LAUNCHERS = 8  # launches of one attempt at once: a client's retries, many gateway threads
# A task that takes a second to stop, and says when it was asked to and when it is done.
SLOW_TO_STOP = """
import os, signal, sys, time
def note(what):
    with open(os.environ["STOP_LOG"], "a") as log:
        log.write(f"{what} {os.getpid()}\\n")
def stopping(*_):
    note("term")
    time.sleep(1)
    note("exit")
    sys.exit(0)
signal.signal(signal.SIGTERM, stopping)
note("ready")
time.sleep(600)
"""


def plan(slot: str) -> SlotPlan:
    return SlotPlan(
        slot=slot,
        attempt=1,
        op=OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1),
    )


def tasks_of(incarnation: str) -> list[int]:
    """The live processes started for `incarnation`: their environment names it."""
    marker = f"SEEDKEEPER_INCARNATION={incarnation}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            named = marker in environ.read_bytes().split(b"\0")
            state = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if named and state != "Z":
            found.append(int(environ.parent.name))
    return found


def pid_of(runtime: LocalRuntime, slot: str) -> int:
    record = runtime.workspace(slot).parent / "attempt-1.json"
    pid: int = json.loads(record.read_text())["pid"]
    return pid


def test_a_launch_retried_while_the_first_is_starting_starts_one_task(tmp_path: Path) -> None:
    # Given launches of the same attempt, released together
    runtime = LocalRuntime(tmp_path / "data", command=SLEEPER, slot_uids_from=SLOT_UIDS_FROM_HERE)
    # Named for this test alone: tasks_of scans every process on the machine, and other
    # tests' tasks (local:slot-1:1 ...) run beside this one.
    run = uuid.uuid4().hex[:8]
    slots = [f"launch-{run}-{index}" for index in range(5)]
    for slot in slots:
        barrier = threading.Barrier(LAUNCHERS)

        def launch(_: int, slot: str = slot, barrier: threading.Barrier = barrier) -> str:
            barrier.wait()
            return runtime.launch(plan(slot))

        # When they all launch
        with ThreadPoolExecutor(LAUNCHERS) as pool:
            answers = set(pool.map(launch, range(LAUNCHERS)))
        # Then they answer one incarnation
        assert answers == {f"local:{slot}:1"}
    try:
        # And no attempt has a second task: what runs is the one its record names. (Under
        # the full suite a sleeper once vanished, and once another test's task was counted:
        # this test's slot users and names were other tests' too, whose stops end every
        # process of their slot users. Both are now its own.)
        for slot in slots:
            assert set(tasks_of(f"local:{slot}:1")) <= {pid_of(runtime, slot)}
    finally:
        runtime.stop_all()
    # And the stack's exit stops every task it started
    for slot in slots:
        assert tasks_of(f"local:{slot}:1") == []


def test_stopping_many_tasks_asks_them_all_before_waiting_for_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given tasks that each take a second to stop
    log = tmp_path / "stops.log"
    monkeypatch.setenv("STOP_LOG", str(log))
    runtime = LocalRuntime(
        tmp_path / "data",
        command=(sys.executable, "-c", SLOW_TO_STOP),
        passthrough=("STOP_LOG",),
        slot_uids_from=SLOT_UIDS_FROM_HERE,
    )
    slots = [f"stop-{uuid.uuid4().hex[:8]}-{index}" for index in range(6)]
    for slot in slots:
        runtime.launch(plan(slot))
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text().count("ready") == len(slots)):
        assert time.monotonic() < deadline, "the tasks never started"
        time.sleep(0.05)
    # When the stack stops them all
    runtime.stop_all()
    # Then every task was asked to stop before the first of them was done
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert events.count("term") == events.count("exit") == len(slots)
    assert events.index("exit") > max(i for i, event in enumerate(events) if event == "term")
    assert all(runtime.status(f"local:{slot}:1") is TaskStatus.STOPPED for slot in slots)


def test_a_task_that_ends_is_waited_for_at_once(tmp_path: Path) -> None:
    # Given a task that ends by itself, and one that is stopped
    runtime = LocalRuntime(
        tmp_path / "data",
        command=(sys.executable, "-c", "pass"),
        slot_uids_from=SLOT_UIDS_FROM_HERE,
    )
    runtime.launch(plan("ends"))
    stopped = LocalRuntime(tmp_path / "data", command=SLEEPER, slot_uids_from=SLOT_UIDS_FROM_HERE)
    stopped.launch(plan("stopped"))
    stopped.stop("local:stopped:1")
    # Then neither is left as a zombie of this process
    for pid in (pid_of(runtime, "ends"), pid_of(runtime, "stopped")):
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, f"{pid} is a zombie: nobody waited for it"
            time.sleep(0.05)
    assert runtime.status("local:ends:1") is TaskStatus.STOPPED


def test_a_stop_never_signals_a_process_that_reused_a_stopped_groups_number(
    tmp_path: Path,
) -> None:
    """A task's group ends while its stop still waits; the machine gives the leader's pid to
    an unrelated process, which leads a group of the same number. The stop must not end it
    (the suite's own churn did this on a 32,768-pid machine)."""
    # Given an unrelated process leading its own group, under a number a stop still holds
    unrelated = subprocess.Popen(SLEEPER, process_group=0)
    try:
        ended = _Process(pid=unrelated.pid, started="0")  # the number's former owner
        # When the stop waits out its grace and sends SIGKILL to what it thinks is left
        _end_groups([ended], grace=0.2)
        # Then the unrelated process was never signalled
        assert unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait()
