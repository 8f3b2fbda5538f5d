"""The Docker runtime's side of a launch and of a status, with a `docker` on PATH that
records what it was given: the plan's presigned URLs reach the container's environment,
never an argv (which any local user reads in /proc), and only the task definition's
variables go along; a page's containers are inspected at once, a stopped one says why."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seedkeeper.domain.caller import task_id
from seedkeeper.domain.models import OwnerClaim
from seedkeeper.domain.opwindow import Actor, OpRef
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, TaskState, TaskStatus
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper_tools.local.docker import DockerRuntime
from slots import fake_docker

# Records its argv and environment, then answers as `docker run --detach` does, or fails
# with Docker's message when FAKE_DOCKER_ANSWER says so. `inspect --type container`
# answers as Docker does from the containers FAKE_DOCKER_CONTAINERS holds (JSON, by name):
# those it knows, and an error for each other.
FAKE_DOCKER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_DOCKER_CALLS"], "a") as calls:
    calls.write(json.dumps({"argv": sys.argv[1:], "environment": dict(os.environ)}) + "\\n")
if sys.argv[1:3] == ["inspect", "--type"] and "FAKE_DOCKER_CONTAINERS" in os.environ:
    with open(os.environ["FAKE_DOCKER_CONTAINERS"]) as listed:
        known = json.load(listed)
    names = sys.argv[4:]
    print(json.dumps([known[name] for name in names if name in known]))
    for name in names:
        if name not in known:
            sys.stderr.write(f"Error: No such container: {name}\\n")
    sys.exit(1 if set(names) - set(known) else 0)
answer = os.environ.get("FAKE_DOCKER_ANSWER", "")
if answer:
    sys.stderr.write(answer + "\\n")
    sys.exit(125)
print("0123456789ab")
"""


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return fake_docker(tmp_path, monkeypatch, FAKE_DOCKER)


def recorded(calls: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in calls.read_text().splitlines()]


def plan(slot: str = "slot-1") -> SlotPlan:
    return SlotPlan(
        slot=slot,
        attempt=2,
        op=OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=2),
        owner=OwnerClaim(
            run="run-1",
            requester="alice",
            thread="thread-1",
            repository="acme/widgets",
            ref="main",
            head="a" * 40,
        ),
    )


def test_the_plan_travels_in_the_environment_never_in_an_argv(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_TABLE", "the-table")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "store-key")
    monkeypatch.setenv("SEEDKEEPER_R2_SECRET_ACCESS_KEY", "r2-secret")  # never a task's
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", '["true"]')
    incarnation = DockerRuntime(tmp_path).launch(plan())

    [run] = recorded(calls)
    argv, environment = run["argv"], run["environment"]
    assert isinstance(argv, list)
    assert isinstance(environment, dict)
    assert incarnation == f"docker:{argv[argv.index('--name') + 1]}"
    assert "alice" not in json.dumps(argv)
    assert SlotPlan.from_env(environment[PLAN_VARIABLE]) == plan()
    given = {argv[index + 1] for index, word in enumerate(argv) if word == "--env"}
    assert given == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "SEEDKEEPER_SANDBOX_COMMAND",
        "AWS_EXECUTION_ENV",
        "SEEDKEEPER_CPU_UNITS",
        PLAN_VARIABLE,
        "SEEDKEEPER_INCARNATION",
    }
    # Its own session of the task role, never the store's keys.
    assert environment["AWS_ACCESS_KEY_ID"] == f"seedkeeper-task-{task_id(incarnation)}"
    assert argv[argv.index("--stop-timeout") :][:2] == ["--stop-timeout", "120"]
    assert "--init" in argv
    assert argv[argv.index("--network") :][:2] == ["--network", "host"]


def test_a_container_is_told_where_to_checkpoint_and_how_often_to_look(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the task definition tells an ECS task: the checkpoint function's URL (the local
    gateway, reached over the host's network) and the watch interval."""
    monkeypatch.setenv("SEEDKEEPER_CHECKPOINT_URL", "http://127.0.0.1:8787")
    monkeypatch.setenv("SEEDKEEPER_WATCH_INTERVAL", "2")
    DockerRuntime(tmp_path).launch(plan())

    [run] = recorded(calls)
    argv, environment = run["argv"], run["environment"]
    assert isinstance(argv, list)
    assert isinstance(environment, dict)
    given = {argv[index + 1] for index, word in enumerate(argv) if word == "--env"}
    assert {"SEEDKEEPER_CHECKPOINT_URL", "SEEDKEEPER_WATCH_INTERVAL"} <= given
    assert environment["SEEDKEEPER_CHECKPOINT_URL"] == "http://127.0.0.1:8787"
    assert environment["SEEDKEEPER_WATCH_INTERVAL"] == "2"
    assert argv[argv.index("--network") :][:2] == ["--network", "host"]


def test_a_launch_docker_refuses_is_unavailable_not_a_task(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DOCKER_ANSWER", "docker: Cannot connect to the Docker daemon.")
    with pytest.raises(RuntimeUnavailable, match="Cannot connect"):
        DockerRuntime(tmp_path).launch(plan())


def test_another_runtimes_incarnation_is_unknown_without_asking_docker(
    calls: Path, tmp_path: Path
) -> None:
    runtime = DockerRuntime(tmp_path)
    other_stack = DockerRuntime(tmp_path / "elsewhere")
    name = other_stack.launch(plan())
    calls.unlink()
    for incarnation in (
        "local:slot-1:2",
        "arn:aws:ecs:us-east-1:123456789012:task/c/abc",
        name,  # another stack's container
        "docker:seedkeeper-../../etc",
    ):
        assert runtime.status(incarnation) is TaskStatus.UNKNOWN
        runtime.stop(incarnation)
    assert not calls.exists()


def test_a_container_that_exists_but_cannot_start_is_unavailable_not_a_task(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried launch finds the attempt's container created but never started (the first
    `docker run` died between create and start); a start Docker refuses is no task."""
    folder = Path(os.environ["PATH"].split(os.pathsep)[0])
    (folder / "docker").write_text(
        FAKE_DOCKER.replace(
            'answer = os.environ.get("FAKE_DOCKER_ANSWER", "")',
            'answer = {"run": "Conflict. The container name is already in use",'
            ' "start": "Error: cannot start"}.get(sys.argv[1], "")\n'
            'if sys.argv[1] == "inspect":\n    print("created"); sys.exit(0)',
        )
    )
    with pytest.raises(RuntimeUnavailable, match="docker start"):
        DockerRuntime(tmp_path).launch(plan())
    asked = [call["argv"] for call in recorded(calls)]
    assert [argv[0] for argv in asked if isinstance(argv, list)] == ["run", "inspect", "start"]


def inspected(name: str, status: str, exit_code: int = 0, **more: object) -> dict[str, object]:
    """A container as `docker inspect` shows it (the fields read here)."""
    state = {"Status": status, "ExitCode": exit_code, "OOMKilled": False, "Error": ""}
    return {"Name": f"/{name}", "State": state | more}


def test_statuses_inspect_a_pages_containers_at_once_and_a_stopped_one_says_why(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = DockerRuntime(tmp_path)
    running, crashed, killed, ended, removed = (
        runtime.launch(plan(slot)) for slot in ("running", "crashed", "oom", "ended", "removed")
    )
    other_stack = DockerRuntime(tmp_path / "elsewhere").launch(plan("other"))
    name = {
        incarnation: incarnation.removeprefix("docker:")
        for incarnation in (running, crashed, killed, ended)
    }
    containers = {
        name[running]: inspected(name[running], "running"),
        name[crashed]: inspected(name[crashed], "exited", 1, Error="exec format error"),
        name[killed]: inspected(name[killed], "exited", 137, OOMKilled=True),
        name[ended]: inspected(name[ended], "dead", 143),
    }
    listed = tmp_path / "containers.json"
    listed.write_text(json.dumps(containers))
    monkeypatch.setenv("FAKE_DOCKER_CONTAINERS", str(listed))
    calls.unlink()

    states = runtime.statuses([running, crashed, killed, ended, removed, other_stack, "local:x:1"])

    [inspect] = [call["argv"] for call in recorded(calls)]
    assert inspect == [
        "inspect", "--type", "container",
        *(i.removeprefix("docker:") for i in (running, crashed, killed, ended, removed)),
    ]  # fmt: skip
    assert states == {
        running: RUNNING,
        crashed: TaskState(TaskStatus.STOPPED, "task-stopped", "exit code 1; exec format error"),
        killed: TaskState(TaskStatus.STOPPED, "oom-killed", "exit code 137"),
        ended: TaskState(TaskStatus.STOPPED, "task-stopped", "exit code 143"),
        removed: UNKNOWN,  # Docker no longer knows it: never a reason to call it stopped
        other_stack: UNKNOWN,
        "local:x:1": UNKNOWN,
    }
    assert runtime.status(killed) is TaskStatus.STOPPED


def test_an_engine_that_does_not_answer_knows_nothing_of_any_task(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = DockerRuntime(tmp_path)
    incarnation = runtime.launch(plan())
    monkeypatch.setenv("FAKE_DOCKER_ANSWER", "Cannot connect to the Docker daemon.")
    assert runtime.statuses([incarnation]) == {incarnation: UNKNOWN}


# (the machine's cores, the task's CPU units) -> the container's --cpus
EXPECTED_CPUS = {(2, None): "2", (1, None): "1", (4, 1024): "1", (2, 8192): "2"}


@pytest.mark.parametrize(("cores", "cpu"), list(EXPECTED_CPUS))
def test_a_container_gets_the_tasks_cpus_never_more_than_the_machine_has(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, *, cpu: int | None
) -> None:
    # The task definition's default is 2 vCPU; Docker refuses a quota beyond the machine's.
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    DockerRuntime(tmp_path, cpu=cpu).launch(plan())
    [run] = recorded(calls)
    argv = run["argv"]
    assert isinstance(argv, list)
    assert argv[argv.index("--cpus") + 1] == EXPECTED_CPUS[(cores, cpu)]
    # The task is told the CPU it gets, and sizes its helpers' threads by it.
    environment = run["environment"]
    assert isinstance(environment, dict)
    assert environment["SEEDKEEPER_CPU_UNITS"] == str(int(EXPECTED_CPUS[(cores, cpu)]) * 1024)
    assert argv[argv.index("--mount") + 1] == "type=volume,destination=/workspace"
