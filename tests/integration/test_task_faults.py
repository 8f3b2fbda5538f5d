"""The slot task under faults, through the seed function with real slot tasks: killed at
each step of its restore (its workspace goes with it, as a Fargate task's storage does, and
the next attempt restores into a fresh one), and facing an R2 that errs, resets or stalls.

A kill is made deterministic without any hook in the task: a sitecustomize first on the
task's PYTHONPATH blocks the thread that gets where the test says (the entry to or the
return from a named function; the downloads run in threads of their own) after creating a
file; the test waits for that file, then kills the task's process group."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repos import git
from seedkeeper.domain import transitions
from seedkeeper.domain.record import State
from seedkeeper.domain.refused import Refused
from seedkeeper_task.restore.download import plan_ranges
from seedkeeper_task.sandbox import STATE_DIR
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.supervisor import CHECKOUT, MARKER, Marker
from slots import Slots, TamperingProxy, assert_no_half_tree, verdict, wait_for

# TASK_BLOCK_AT "<profile event>:<qualified name>" of a seedkeeper function: the task's main
# thread creates the file TASK_REACHED names there, then blocks.
SITECUSTOMIZE = """
import os
import sys
import threading
import time

def _block(frame, event, arg):
    code = frame.f_code
    if (event, code.co_qualname) == _AT and "/seedkeeper" in code.co_filename:
        open(os.environ["TASK_REACHED"], "x").close()
        time.sleep(600)

if "TASK_BLOCK_AT" in os.environ:
    _AT = tuple(os.environ["TASK_BLOCK_AT"].split(":"))
    sys.setprofile(_block)
    threading.setprofile(_block)
"""

# step -> (where the task blocks, what it has left in the workspace there)
KILLS = {
    # every byte written and hashed, the size and sha256 not yet compared
    "verify": ("return:_Job._wait", f"{STATE_DIR}/downloads/checkout.sqsh"),
    # unsquashfs done into the staging tree, which is not yet checked or renamed
    "extract": ("call:check_tree", f".{CHECKOUT}.staging-*"),
    # the checkout in place, git not yet fixed up, no marker
    "fixup": ("call:SlotTask._fix_up", f"{CHECKOUT}/.git"),
    # the checkout and its marker written, nothing settled
    "settle": ("call:SlotTask._settle", f"{STATE_DIR}/{MARKER}"),
}


@pytest.fixture
def task_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SITECUSTOMIZE, loaded by every slot task this test launches."""
    folder = tmp_path / "hooks"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(folder), prepend=os.pathsep)
    # The local runtime hands a task only what an ECS task gets: the hook's variables too.
    monkeypatch.setenv("SEEDKEEPER_LOCAL_TASK_PASSTHROUGH", '["TASK_BLOCK_AT", "TASK_REACHED"]')
    return folder


def kill_at(
    step: str, slots: Slots, body: dict[str, Any], hooks: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Seed `body`, kill its task on reaching `step`, and check what holds while it is
    blocked and once it is dead: the slot is retained, seeding, its restore unsettled, and
    the task's workspace (the debris it held) is gone. Answers that workspace."""
    slot = body["slot"]
    reached = hooks / f"{slot}.reached"
    monkeypatch.setenv("TASK_BLOCK_AT", KILLS[step][0])
    monkeypatch.setenv("TASK_REACHED", str(reached))
    status, answer = slots.seed(body)
    assert (status, answer["state"], answer["attempt"]) == (202, "seeding", 1)
    wait_for(reached.exists, f"{slot} to reach {step}: {slots.log(slot)}")

    polled = slots.seed(body)  # the task is alive: the same attempt, no second task
    assert polled == (202, answer)
    assert slots.attempts(slot) == ["attempt-1.json"]
    workspace = slots.workspace(slot)
    assert list(workspace.glob(KILLS[step][1])), "the step left nothing to be debris"
    monkeypatch.delenv("TASK_BLOCK_AT")  # the next attempt runs through
    slots.kill(answer["incarnation"])

    assert not workspace.exists(), "the killed task's workspace went with it"
    record = slots.record(slot)
    assert (record.state, record.attempt) == (State.SEEDING, 1)
    assert record.window.unsettled == 1  # the detached restore: the sweep retains the slot
    assert isinstance(
        transitions.FENCE.decide(record, transitions.At(now=record.idle_deadline + 1)),
        Refused,
    )
    return workspace


def retry(slots: Slots, body: dict[str, Any]) -> tuple[int, Any]:
    """The poll after the task died launches attempt 2; poll on until the answer is final."""
    slot = body["slot"]
    status, answer = slots.seed(body)
    assert (status, answer["state"], answer["attempt"]) == (202, "seeding", 2)
    assert answer["incarnation"] == f"local:{slot}:2"
    settled = slots.settle(body)
    assert slots.attempts(slot) == ["attempt-1.json", "attempt-2.json"]
    return settled


@pytest.mark.parametrize("step", KILLS)
def test_a_task_killed_at_a_step_stays_seeding_and_the_next_attempt_restores_afresh(
    step: str, slots: Slots, repo: Path, task_hooks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = slots.publish(repo)
    body = slots.body(seed, slot=f"killed-{step}")
    killed = kill_at(step, slots, body, task_hooks, monkeypatch)

    slot = body["slot"]
    status, answer = retry(slots, body)
    assert (status, answer["seeded"], answer["incarnation"]) == (200, True, f"local:{slot}:2")
    workspace = slots.workspace(slot)
    assert workspace != killed
    assert not killed.exists()
    assert git(workspace / CHECKOUT, "rev-parse", "HEAD") == seed["sha"]
    assert Marker.model_validate_json((workspace / STATE_DIR / MARKER).read_text()).attempt == 2
    assert not (workspace / STATE_DIR / "downloads").exists()
    assert not [p for p in workspace.iterdir() if ".staging" in p.name]
    record = slots.record(slot)
    assert (record.state, record.attempt) == (State.SEEDED, 2)
    # The killed attempt's restore stays an unknown obligation: it still blocks retirement.
    assert [entry.status.value for entry in record.window.entries] == ["unknown", "settled"]


@pytest.fixture
def r2_fault(
    request: pytest.FixtureRequest, slots: Slots, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TamperingProxy]:
    proxy = TamperingProxy(slots.stack.endpoint, mode=request.param)
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", proxy.endpoint)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("r2_fault", ["error5xx", "reset", "stall-midway"], indirect=True)
def test_an_r2_that_keeps_failing_costs_bounded_retries_then_fails_at_download(
    r2_fault: TamperingProxy,
    slots: Slots,
    repo: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if r2_fault.mode == "stall-midway":  # 15 s by default
        monkeypatch.setenv("SEEDKEEPER_DOWNLOAD_STALL_TIMEOUT", "0.3")
    body = slots.body(slots.publish(repo), slot=r2_fault.mode)
    assert slots.seed(body)[0] == 202
    status, answer = slots.settle(body)

    assert (status, *verdict(answer)) == (200, False, "seed-failed", "download")
    assert "retries-exhausted" in answer["detail"]
    # Each range: its first GET and max_retries more without progress, none after.
    current = slots.stack.snapshots.status("widgets").current
    assert current is not None
    ranges = plan_ranges(current.checkout.size, TaskSettings().download_parts)
    max_retries = TaskSettings().download_retries
    assert 1 < len(r2_fault.ranges) <= len(ranges) * (max_retries + 1), r2_fault.ranges
    assert_no_half_tree(slots, body["slot"])
    assert slots.attempts(body["slot"]) == ["attempt-1.json"], slots.log(body["slot"])
    record = slots.record(body["slot"])
    assert (record.state, record.window.unsettled) == (State.SEED_FAILED, 0)
