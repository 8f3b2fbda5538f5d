"""`seedkeeper local`'s exit with many slots: the platform stopping every task at once. Each
is given its grace at the same time, not one after another, and none is left after.

Not timed: the tasks here are deaf to SIGTERM (their sandbox ignores it, and the supervisor
waits for it), so one after another the first would be SIGKILLed before the second had its
SIGTERM; together, every task has its SIGTERM before any has its SIGKILL. The signals the
stop sends are watched, in order."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest

from conftest import SLOT_UIDS_FROM_HERE
from executor import client_for
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper_client import Cold
from seedkeeper_task.sandbox import user_processes
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.stack import LocalStack
from slots import one_grace_for_all, running, signals_sent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a sandbox the stop must end runs as a slot user: root (CI)"
)

SLOTS = 20
DEAF_SANDBOX = ["sh", "-c", "trap '' TERM; exec sleep 600"]  # sleep inherits the ignore


def in_group(group: int) -> list[int]:
    """The live processes of a process group."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_the_local_stack_stops_many_slots_at_once_and_leaves_no_process(
    tmp_path: Path, aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a stack whose slot tasks each run a sandbox deaf to SIGTERM
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(DEAF_SANDBOX))
    local = LocalStack(
        data_dir=tmp_path / "data",
        port=0,
        credentials=LocalCredentials("local-test", secrets.token_hex(16)),
        sweep_interval=3600,
    ).start()
    runtime = LocalRuntime(local.data_dir, slot_uids_from=SLOT_UIDS_FROM_HERE)
    slots = [f"cold-{index}" for index in range(SLOTS)]
    try:
        client = client_for(local)
        for slot in slots:
            assert isinstance(client.seed(slot, None), Cold)
        # And every sandbox running (a task stopped while it starts goes at once)
        deadline = time.monotonic() + 120
        while not all(
            (uid := runtime.slot_uid(slot)) is not None and user_processes(uid) for slot in slots
        ):
            assert time.monotonic() < deadline, "the slots' sandboxes never started"
            time.sleep(0.2)
    except BaseException:
        local.stop()
        raise
    records = [runtime.workspace(slot).parent / "attempt-1.json" for slot in slots]
    tasks = [int(json.loads(record.read_text())["pid"]) for record in records]
    uids = [runtime.slot_uid(slot) for slot in slots]

    # When the stack stops
    sent = signals_sent(monkeypatch)
    local.stop()

    # Then each task had its SIGTERM before any had its SIGKILL: one grace for all
    assert one_grace_for_all(sent, tasks), sent
    # And no task process is left, nor anything of its group or of its slot's user
    assert [pid for pid in tasks if running(pid)] == []
    assert [pid for task in tasks for pid in in_group(task)] == []
    assert [pid for uid in uids if uid is not None for pid, _ in user_processes(uid)] == []
    # And each task's workspace is gone (none left half removed), and it says it stopped
    assert list((local.data_dir / "slots").glob("*/*workspace-*")) == []
    incarnations = [f"local:{slot}:1" for slot in slots]
    states = runtime.statuses(incarnations)
    assert {state.status for state in states.values()} == {TaskStatus.STOPPED}
