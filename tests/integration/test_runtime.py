"""The slot runtimes: local processes for real, ECS against moto."""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID as ACCOUNT_ID
from moto.ecs.models import ecs_backends

from conftest import SLOT_UIDS_FROM_HERE
from fargate import fargate_cluster
from seedkeeper.adapters.runtime import (
    DESCRIBE_BATCH,
    EcsRuntime,
    RuntimeSettings,
    runtime_from,
    started_by,
)
from seedkeeper.api.answers import REFUSALS, refusal_of
from seedkeeper.domain.caller import task_id
from seedkeeper.domain.opwindow import Actor, OpRef
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, TaskState, TaskStatus
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper_tools.local.docker import DockerRuntime, slot_container
from seedkeeper_tools.local.principals import LocalCredentials, TaskKeys
from seedkeeper_tools.local.runtime import LOCAL_TASK_ENVIRONMENT, LocalRuntime

if TYPE_CHECKING:
    from mypy_boto3_ecs import ECSClient

# A stand-in slot task: writes what it was given, starts a child, and waits to be stopped.
FAKE_TASK = """
import os, pathlib, subprocess, sys, time
workspace = pathlib.Path(os.environ["SEEDKEEPER_WORKSPACE"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
given = [os.environ["SEEDKEEPER_INCARNATION"], str(child.pid), os.environ["SEEDKEEPER_PLAN"]]
(workspace / "seen.txt").write_text("\\n".join(given))
time.sleep(600)
"""


def plan(slot: str = "slot-1", attempt: int = 1) -> SlotPlan:
    return SlotPlan(
        slot=slot,
        attempt=attempt,
        op=OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=attempt),
    )


def wait_for(path: Path, seconds: float = 10.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= 2:
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def local(tmp_path: Path) -> LocalRuntime:
    return LocalRuntime(
        tmp_path / "data",
        command=(sys.executable, "-c", FAKE_TASK),
        slot_uids_from=SLOT_UIDS_FROM_HERE,
    )


def test_a_local_slot_task_runs_in_its_workspace_with_its_plan(
    local: LocalRuntime, tmp_path: Path
) -> None:
    incarnation = local.launch(plan())
    assert incarnation == "local:slot-1:1"
    seen = wait_for(local.workspace("slot-1") / "seen.txt")
    given_incarnation, child, plan_json = seen.split("\n", 2)
    assert given_incarnation == incarnation
    assert SlotPlan.from_env(plan_json) == plan()
    assert local.status(incarnation) is TaskStatus.RUNNING
    workspace = local.workspace("slot-1")
    local.stop(incarnation)
    assert local.status(incarnation) is TaskStatus.STOPPED
    assert not alive(int(child)), "stop ends the whole process group"
    assert not workspace.exists(), "a stopped task's workspace is gone with it"


def test_launching_the_same_attempt_again_starts_nothing(local: LocalRuntime) -> None:
    first = local.launch(plan())
    wait_for(local.workspace("slot-1") / "seen.txt")
    record = json.loads((local.workspace("slot-1").parent / "attempt-1.json").read_text())
    assert local.launch(plan()) == first
    again = json.loads((local.workspace("slot-1").parent / "attempt-1.json").read_text())
    assert again == record
    second = local.launch(plan(attempt=2))
    assert second == "local:slot-1:2"
    for incarnation in (first, second):
        local.stop(incarnation)


# A task that says it is ready, then ends as TASK_END says (an exit code, or a signal it
# sends itself), leaving a child in its process group unless told otherwise.
ENDING_TASK = """
import os, pathlib, signal, subprocess, sys, time
workspace = pathlib.Path(os.environ["SEEDKEEPER_WORKSPACE"])
(workspace / "work.txt").write_text("the run's work")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
(workspace / "child").write_text(str(child.pid))
while not (workspace / "end").exists():
    time.sleep(0.02)
how = (workspace / "end").read_text()
if how.startswith("SIG"):
    os.kill(os.getpid(), getattr(signal, how))
sys.exit(int(how))
"""


@pytest.fixture
def ending(tmp_path: Path) -> LocalRuntime:
    return LocalRuntime(
        tmp_path / "data",
        command=(sys.executable, "-c", ENDING_TASK),
        slot_uids_from=SLOT_UIDS_FROM_HERE,
    )


def started(runtime: LocalRuntime, slot: str, attempt: int) -> tuple[str, Path, int]:
    """Launch the attempt; answer its incarnation, workspace and the child it started."""
    incarnation = runtime.launch(plan(slot, attempt))
    workspace = runtime.workspace(slot)
    deadline = time.monotonic() + 10
    while not (workspace / "child").exists():
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.02)
    return incarnation, workspace, int((workspace / "child").read_text())


def end(workspace: Path, how: str) -> None:
    """Tell the ending task how to end: written whole, then renamed into place, so the task
    never reads the file half written (an empty read once ended one with exit code 1)."""
    staged = workspace / "end.tmp"
    staged.write_text(how)
    staged.rename(workspace / "end")


def until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def runtime_pid(runtime: LocalRuntime, incarnation: str) -> int:
    _, slot, attempt = incarnation.split(":")
    launched = runtime.workspace(slot).parent / f"attempt-{attempt}.json"
    pid: int = json.loads(launched.read_text())["pid"]
    return pid


@pytest.mark.parametrize(
    ("how", "detail"), [("3", "exit code 3"), ("SIGKILL", "killed by SIGKILL")]
)
def test_a_task_that_stopped_by_itself_says_how_and_its_workspace_and_processes_are_gone(
    ending: LocalRuntime, how: str, detail: str
) -> None:
    """As a Fargate task's container and storage end with its essential container: what it
    left running in its group is ended, its workspace removed, and its status says why."""
    incarnation, workspace, child = started(ending, "slot-1", 1)
    end(workspace, how)
    # Its reaper (in this process, which launched it) removes it as soon as it ends.
    until(lambda: not workspace.exists(), "the workspace's removal")

    states = ending.statuses([incarnation, "local:slot-9:1"])
    assert states == {
        incarnation: TaskState(TaskStatus.STOPPED, "task-stopped", detail),
        "local:slot-9:1": UNKNOWN,
    }
    assert not workspace.exists()
    assert not alive(child), "what it left in its group ended with it"
    # Another runtime on the data directory (a restarted stack) says the same.
    again = LocalRuntime(ending.workspace("slot-1").parents[2], slot_uids_from=SLOT_UIDS_FROM_HERE)
    assert again.statuses([incarnation]) == {incarnation: states[incarnation]}


def test_each_attempt_starts_in_a_fresh_workspace_and_another_attempts_stop_spares_it(
    ending: LocalRuntime,
) -> None:
    first, first_workspace, _ = started(ending, "slot-1", 1)
    second, second_workspace, _ = started(ending, "slot-1", 2)
    assert first_workspace != second_workspace
    assert ending.workspace("slot-1") == second_workspace  # the latest attempt's
    assert sorted(p.name for p in second_workspace.iterdir()) == ["child", "work.txt"]

    end(first_workspace, "0")
    until(lambda: ending.status(first) is TaskStatus.STOPPED, "the first attempt's end")
    assert ending.statuses([first, second]) == {
        first: TaskState(TaskStatus.STOPPED, "task-stopped", "exit code 0"),
        second: RUNNING,
    }
    assert not first_workspace.exists()
    assert (second_workspace / "work.txt").read_text() == "the run's work"
    ending.stop(second)
    assert not second_workspace.exists()


def test_a_task_gone_with_no_reaper_to_say_how_is_stopped_its_workspace_gone(
    tmp_path: Path,
) -> None:
    """The process that launched it is gone (a restarted stack): nobody kept its exit."""
    data = tmp_path / "data"
    launcher = f"""
import sys
from pathlib import Path
from seedkeeper.domain.caller import task_id
from seedkeeper.domain.opwindow import Actor, OpRef
from seedkeeper.domain.plan import SlotPlan
from seedkeeper_tools.local.runtime import LocalRuntime
runtime = LocalRuntime(Path({str(data)!r}), command=(sys.executable, "-c", {FAKE_TASK!r}),
                       slot_uids_from={SLOT_UIDS_FROM_HERE})
op = OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
print(runtime.launch(SlotPlan(slot="slot-1", attempt=1, op=op)))
"""
    launched = subprocess.run(
        [sys.executable, "-c", launcher], check=True, capture_output=True, text=True
    )
    incarnation = launched.stdout.splitlines()[-1]  # after its log lines
    local = LocalRuntime(data, slot_uids_from=SLOT_UIDS_FROM_HERE)
    workspace = local.workspace("slot-1")
    wait_for(workspace / "seen.txt")
    os.killpg(runtime_pid(local, incarnation), signal.SIGKILL)
    until(lambda: local.status(incarnation) is TaskStatus.STOPPED, "the task's end")
    assert local.statuses([incarnation]) == {
        incarnation: TaskState(TaskStatus.STOPPED, "task-stopped", "process gone")
    }
    assert not workspace.exists()


def test_status_and_stop_work_from_a_new_runtime_on_the_same_data_dir(
    local: LocalRuntime, tmp_path: Path
) -> None:
    incarnation = local.launch(plan())
    wait_for(local.workspace("slot-1") / "seen.txt")
    restarted = LocalRuntime(tmp_path / "data", slot_uids_from=SLOT_UIDS_FROM_HERE)
    assert restarted.status(incarnation) is TaskStatus.RUNNING
    restarted.stop(incarnation)
    assert restarted.status(incarnation) is TaskStatus.STOPPED
    assert local.status(incarnation) is TaskStatus.STOPPED


def test_an_incarnation_nobody_launched_is_unknown(local: LocalRuntime) -> None:
    assert local.status("local:slot-9:1") is TaskStatus.UNKNOWN
    assert local.status("arn:aws:ecs:us-east-1:123456789012:task/c/abc") is TaskStatus.UNKNOWN
    local.stop("local:slot-9:1")  # nothing to stop: no error


def task_environment(incarnation: str, local: LocalRuntime) -> dict[str, str]:
    wait_for(local.workspace(incarnation.split(":")[1]) / "seen.txt")
    _, slot, attempt = incarnation.split(":")
    launched = local.workspace(slot).parent / f"attempt-{attempt}.json"
    pid = json.loads(launched.read_text())["pid"]
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if entry)


@pytest.mark.parametrize(("cpu", "told"), [(1024, "1024"), (2560, "2048"), (None, None)])
def test_a_local_task_is_told_the_cpu_it_may_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu: int | None, told: str | None
) -> None:
    """As the task definition tells a task its SlotCpu: the cores it runs on, in units, so
    it sizes its extractions' and captures' threads by them; without a limit, nothing."""
    monkeypatch.delenv("SEEDKEEPER_CPU_UNITS", raising=False)
    if cpu is not None and cpu // 1024 > len(os.sched_getaffinity(0)):
        pytest.skip("this machine has fewer cores than the task's CPU")
    local = LocalRuntime(
        tmp_path / "data",
        command=(sys.executable, "-c", FAKE_TASK),
        slot_uids_from=SLOT_UIDS_FROM_HERE,
        cpu=cpu,
    )
    incarnation = local.launch(plan())
    try:
        assert task_environment(incarnation, local).get("SEEDKEEPER_CPU_UNITS") == told
    finally:
        local.stop(incarnation)


def test_a_local_task_gets_what_an_ecs_task_gets_and_no_r2_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = {
        "SEEDKEEPER_R2_ACCESS_KEY_ID": "r2-key",
        "SEEDKEEPER_R2_SECRET_ACCESS_KEY": "r2-secret",
        "SEEDKEEPER_R2_ENDPOINT": "http://127.0.0.1:1",
        "AWS_SESSION_TOKEN": "session-token",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
        "SEEDKEEPER_GATEWAY_SECRET": "anything-else",
        "UNRELATED": "x",
        "TASK_HOOK": "a test's hook, passed by name",
    }
    for name, value in hostile.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEEDKEEPER_TABLE", "the-table")  # the functions', never a task's
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "store-key")  # the store's, never a task's
    # Where the task checkpoints (the gateway's checkpoint route) and how often it looks.
    monkeypatch.setenv("SEEDKEEPER_CHECKPOINT_URL", "http://127.0.0.1:8787")
    monkeypatch.setenv("SEEDKEEPER_WATCH_INTERVAL", "2")
    command = (sys.executable, "-c", FAKE_TASK)
    local = LocalRuntime(
        tmp_path / "data",
        command=command,
        passthrough=("TASK_HOOK",),
        slot_uids_from=SLOT_UIDS_FROM_HERE,
    )

    incarnation = local.launch(plan())

    given = task_environment(incarnation, local)
    # Keys of its own, its session of the task role (good at the checkpoint function alone),
    # revoked once it stopped.
    keys = TaskKeys(tmp_path / "data")
    assert keys.find(given["AWS_ACCESS_KEY_ID"]) == (
        LocalCredentials(given["AWS_ACCESS_KEY_ID"], given["AWS_SECRET_ACCESS_KEY"]),
        task_id(incarnation),
    )
    local.stop(incarnation)
    assert keys.find(given["AWS_ACCESS_KEY_ID"]) is None
    assert "SEEDKEEPER_TABLE" not in given
    assert given["SEEDKEEPER_CHECKPOINT_URL"] == "http://127.0.0.1:8787"
    assert given["SEEDKEEPER_WATCH_INTERVAL"] == "2"
    assert given["TASK_HOOK"] == hostile["TASK_HOOK"]
    assert not set(given) & (set(hostile) - {"TASK_HOOK"}), given
    added = {PLAN_VARIABLE, "SEEDKEEPER_WORKSPACE", "SEEDKEEPER_INCARNATION", "TASK_HOOK"}
    added |= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    if os.geteuid() == 0:
        added |= {"SEEDKEEPER_SLOT_UID", "SEEDKEEPER_SLOT_GID"}
        own = str(local.slot_uid("slot-1"))
        assert (given["SEEDKEEPER_SLOT_UID"], given["SEEDKEEPER_SLOT_GID"]) == (own, own)
    assert set(given) <= set(LOCAL_TASK_ENVIRONMENT) | added
    # Another slot's user can list neither the slots nor a slot's folder, nor read its log.
    slot_folder = local.workspace("slot-1").parent
    for folder in (slot_folder.parent, slot_folder):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o711
    assert stat.S_IMODE((slot_folder / "attempt-1.log").stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="slot users exist only under a root runtime")
def test_another_slots_sandbox_cannot_reach_a_slots_workspace(tmp_path: Path) -> None:
    """Slot users are one slot's each: a file the checkout holds readable by all (as an
    archive's 644 files are) is read by its own slot's user, never by another's, who
    could guess the path (slot names are the executor's, attempts count from 1)."""
    local = LocalRuntime(
        tmp_path / "data",
        command=(sys.executable, "-c", FAKE_TASK),
        slot_uids_from=SLOT_UIDS_FROM_HERE,
    )
    mine, theirs = (local.launch(plan(slot)) for slot in ("slot-1", "slot-2"))
    try:
        readable = local.workspace("slot-1") / "checkout" / "README"
        readable.parent.mkdir()
        readable.write_text("the run's work")
        readable.chmod(0o644)
        for slot, can in (("slot-1", True), ("slot-2", False)):
            uid = local.slot_uid(slot)
            assert uid is not None
            read = subprocess.run(
                ["cat", str(readable)], user=uid, group=uid, capture_output=True, check=False
            )
            assert (read.returncode == 0) is can, (slot, read)
    finally:
        local.stop(mine)
        local.stop(theirs)


def test_a_local_task_may_be_given_all_the_task_definition_gives() -> None:
    """template.yaml's slot container environment, name for name: a variable added there
    reaches local tasks too (the Docker runtime reads the names from the template)."""
    environment = slot_container()["Environment"]
    assert isinstance(environment, list)
    assert {str(variable["Name"]) for variable in environment} <= set(LOCAL_TASK_ENVIRONMENT)


def test_the_configuration_loads_the_local_runtimes_the_tools_install(tmp_path: Path) -> None:
    """By entry point (`seedkeeper.runtimes`), with the settings they are configured by."""
    local = runtime_from(RuntimeSettings(runtime="local", data_dir=tmp_path, slot_cpu=1024))
    docker = runtime_from(RuntimeSettings(runtime="docker", data_dir=tmp_path))
    assert isinstance(local, LocalRuntime)
    assert isinstance(docker, DockerRuntime)
    assert local._cores is not None
    assert len(local._cores) == 1


def test_a_runtime_not_installed_is_unavailable_not_an_import_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The layer alone (Lambda, `sam local invoke`) has no local runtime: a sweep or a seed
    configured for one is told so, as a refusal it handles."""
    monkeypatch.setattr("seedkeeper.adapters.runtime.RUNTIME_ENTRY_POINTS", "nothing.here")
    with pytest.raises(RuntimeUnavailable, match="local runtime is not installed"):
        runtime_from(RuntimeSettings(runtime="local", data_dir=tmp_path))


def test_a_runtime_installed_but_broken_is_unavailable_not_an_import_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its entry point is registered but its module does not import (a partial install):
    told as a runtime that is not there, its cause kept for the log."""
    broken = EntryPoint("local", "seedkeeper_no_such_module:runtime", "seedkeeper.runtimes")
    monkeypatch.setattr(
        "seedkeeper.adapters.runtime.entry_points", lambda **_: EntryPoints((broken,))
    )
    with pytest.raises(RuntimeUnavailable, match="local runtime cannot be loaded") as raised:
        runtime_from(RuntimeSettings(runtime="local", data_dir=tmp_path))
    assert isinstance(raised.value.__cause__, ImportError)
    assert not raised.value.retryable


@pytest.mark.parametrize("name", ["AWS_SESSION_TOKEN", "SEEDKEEPER_R2_SECRET_ACCESS_KEY"])
def test_no_credential_can_be_passed_to_local_tasks_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RuntimeSettings(local_task_passthrough=(name,))


# -- ECS ------------------------------------------------------------------------------


@pytest.fixture
def ecs(aws_credentials: None) -> Iterator[tuple[ECSClient, RuntimeSettings]]:
    with mock_aws():
        client = boto3.client("ecs")
        settings = fargate_cluster(boto3.client("ec2"), client)
        yield client, settings


def test_ecs_launch_passes_the_plan_and_names_the_slot(
    ecs: tuple[ECSClient, RuntimeSettings],
) -> None:
    client, settings = ecs
    runtime = EcsRuntime(client, settings)
    incarnation = runtime.launch(plan("slot.with.dots"))
    assert incarnation.startswith("arn:aws:ecs:")
    (task,) = client.describe_tasks(cluster="seedkeeper", tasks=[incarnation])["tasks"]
    assert task["startedBy"] == started_by("slot.with.dots")
    assert len(task["startedBy"]) <= 36
    (override,) = task["overrides"]["containerOverrides"]
    assert override["name"] == "slot"
    (variable,) = override["environment"]
    assert variable["name"] == PLAN_VARIABLE
    assert SlotPlan.from_env(variable["value"]) == plan("slot.with.dots")
    assert runtime.status(incarnation) is TaskStatus.RUNNING
    runtime.stop(incarnation)
    assert runtime.status(incarnation) is TaskStatus.STOPPED


def test_ecs_statuses_are_asked_in_batches_and_a_stopped_task_says_why(
    ecs: tuple[ECSClient, RuntimeSettings],
) -> None:
    client, settings = ecs
    runtime = EcsRuntime(client, settings)
    tasks = [runtime.launch(plan(f"slot-{n}")) for n in range(DESCRIBE_BATCH + 5)]
    spot, ours = tasks[0], tasks[-1]
    client.stop_task(cluster="seedkeeper", task=spot, reason="Your Spot Task was interrupted.")
    # Moto cannot interrupt a Spot task: its task is given the stop code ECS would give.
    backend = ecs_backends[ACCOUNT_ID]["us-east-1"]
    backend.tasks["seedkeeper"][spot].stop_code = "SpotInterruption"  # type: ignore[attr-defined]
    runtime.stop(ours)
    missing = "arn:aws:ecs:us-east-1:123456789012:task/seedkeeper/0123456789abcdef"
    asked: list[int] = []
    client.meta.events.register(
        "before-parameter-build.ecs.DescribeTasks",
        lambda params, **_: asked.append(len(params["tasks"])),
    )

    states = runtime.statuses([*tasks, missing, "local:slot-1:1"])

    assert asked == [DESCRIBE_BATCH, 6]  # the local incarnation is never asked about
    assert states[spot].status is TaskStatus.STOPPED
    assert states[spot].reason == "spot-interruption"
    assert states[spot].detail.startswith("Your Spot Task was interrupted.")
    assert (states[ours].status, states[ours].reason) == (TaskStatus.STOPPED, "task-stopped")
    assert "seedkeeper" in states[ours].detail  # our StopTask's reason
    assert {states[task] for task in tasks[1:-1]} == {RUNNING}
    assert states[missing] == states["local:slot-1:1"] == UNKNOWN


def test_ecs_status_of_a_task_it_does_not_know_is_unknown(
    ecs: tuple[ECSClient, RuntimeSettings],
) -> None:
    client, settings = ecs
    runtime = EcsRuntime(client, settings)
    missing = "arn:aws:ecs:us-east-1:123456789012:task/seedkeeper/0123456789abcdef"
    assert runtime.status(missing) is TaskStatus.UNKNOWN
    assert runtime.status("local:slot-1:1") is TaskStatus.UNKNOWN


def test_started_by_is_the_slot_when_it_fits() -> None:
    assert started_by("slot-1") == "slot-1"
    assert started_by("a" * 37) != "a" * 37
    assert started_by("a" * 37) == started_by("a" * 37)


@pytest.mark.skipif(os.geteuid() != 0, reason="slot users are given by a root runtime only")
def test_two_stacks_on_one_machine_never_give_two_slots_one_uid(tmp_path: Path) -> None:
    """Each data directory counts its slot users from the same base: two stacks on one
    machine would give their first slots one uid, and one stack's freeze or stop (every
    process of that uid) would reach the other's sandbox. A uid is the machine's, claimed
    once: each stack's slots get uids no other stack holds, a restarted stack its own."""
    first, second = (
        LocalRuntime(
            tmp_path / name,
            command=(sys.executable, "-c", FAKE_TASK),
            slot_uids_from=SLOT_UIDS_FROM_HERE + 400,
        )
        for name in ("first", "second")
    )
    launched = [(runtime, runtime.launch(plan())) for runtime in (first, second)]
    try:
        uids = [runtime.slot_uid("slot-1") for runtime in (first, second)]
        assert None not in uids
        assert uids[0] != uids[1]
        again = LocalRuntime(tmp_path / "first", slot_uids_from=SLOT_UIDS_FROM_HERE + 400)
        assert again.slot_uid("slot-1") == uids[0]
    finally:
        for runtime, incarnation in launched:
            runtime.stop(incarnation)


@pytest.mark.skipif(os.geteuid() != 0, reason="slot users are given by a root runtime only")
def test_a_slot_user_is_never_an_account_of_this_machine(tmp_path: Path) -> None:
    """Every process of a slot's user is ended with its task: that user must be no one
    else. A range that starts at an account's uid (65534 is `nobody`) skips it."""
    assert pwd.getpwuid(65534)
    local = LocalRuntime(
        tmp_path / "data", command=(sys.executable, "-c", FAKE_TASK), slot_uids_from=65534
    )
    incarnation = local.launch(plan())
    local.stop(incarnation)
    given = local.slot_uid("slot-1")
    assert given is not None
    assert given > 65534
    with pytest.raises(KeyError):
        pwd.getpwuid(given)


# What ECS answers RunTask when it cannot start the task now, and when it never will.
RUN_TASK_ERRORS = [
    pytest.param({"error": "ThrottlingException"}, True, id="throttled"),
    pytest.param({"error": "ServerException"}, True, id="ecs-fault"),
    pytest.param({"failures": ["RESOURCE:MEMORY"]}, True, id="no-capacity"),
    pytest.param({"failures": ["RESOURCE:ENI", "AGENT"]}, True, id="no-eni-no-agent"),
    pytest.param({"error": "AccessDeniedException"}, False, id="access-denied"),
    pytest.param({"error": "InvalidParameterException"}, False, id="invalid"),
    pytest.param({"failures": ["MISSING"]}, False, id="missing"),
]


@pytest.mark.parametrize(("answer", "retryable"), RUN_TASK_ERRORS)
def test_a_runtask_that_starts_nothing_says_whether_to_retry(
    ecs: tuple[ECSClient, RuntimeSettings], answer: dict[str, Any], retryable: bool
) -> None:
    """moto never runs out of capacity: ECS's own answers are played by botocore's Stubber
    on a real client. No capacity, throttling and ECS's faults are a retry-later (503, the
    record still seeding with its launch open, so the next poll launches the same attempt
    again); anything else is the deployment's fault (500)."""
    client, settings = ecs
    with Stubber(client) as ecs_answers:
        if "error" in answer:
            ecs_answers.add_client_error("run_task", service_error_code=answer["error"])
        else:
            failures = [{"arn": "", "reason": reason} for reason in answer["failures"]]
            ecs_answers.add_response("run_task", {"tasks": [], "failures": failures})
        with pytest.raises(RuntimeUnavailable) as unavailable:
            EcsRuntime(client, settings).launch(plan("slot-1"))
    assert unavailable.value.retryable is retryable
    refused = refusal_of(unavailable.value)
    assert refused.reason == ("retry-later" if retryable else "internal-error")
    assert REFUSALS[refused.reason] == (503 if retryable else 500)


def test_a_token_in_use_by_another_request_answers_the_task_that_holds_it(
    ecs: tuple[ECSClient, RuntimeSettings],
) -> None:
    """A relaunch whose request differs from the first launch's (a release changed the
    task definition meanwhile): ECS refuses the token and names the task holding it, which
    is the attempt's. Never a second task, never a 500."""
    client, settings = ecs
    holder = "arn:aws:ecs:us-east-1:000000000000:task/seedkeeper/0123456789abcdef"
    with Stubber(client) as ecs_answers:
        ecs_answers.add_client_error(
            "run_task",
            service_error_code="ConflictException",
            modeled_fields={"resourceIds": [holder]},
        )
        assert EcsRuntime(client, settings).launch(plan("slot-1")) == holder
