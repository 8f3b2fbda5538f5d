"""The Docker runtime: each slot task runs as a container of the slot image, as Fargate runs
it. Chosen by `SEEDKEEPER_RUNTIME=docker` (`seedkeeper local --runtime docker`); never
shipped to Lambda.

A container gets what the ECS task gets: the task definition's environment and what ECS
sets, the plan as the RunTask override, the image's user, its CPUs and memory (SlotCpu,
SlotMemory: a restore runs at the task's own shape), `/workspace` on a volume of its own
(the task definition's `workspace` volume, on Fargate's ephemeral storage: gone when the
task is; not the image's overlay, through which a restore's files are written at half the
speed), an init process
(the task definition's `InitProcessEnabled`), and on stop SIGTERM, then SIGKILL after the
task definition's `StopTimeout`. Only the task role differs: keys of the task's own stand in
for its session of it (`principals.TaskKeys`), good at the checkpoint function alone.
Containers use the host's network, where the local gateway listens.

Launching is idempotent per attempt: the container's name is the attempt's, and Docker
creates a name once. A stopped container is kept (ECS keeps a stopped task visible, and a
status must still tell it stopped, with why) until the stack that started it stops
(`stop_all`); no later attempt reaches its filesystem: each runs in a container of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from seedkeeper.adapters.runtime import RuntimeSettings, not_a_credential, started_by
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, Launch, TaskState, TaskStatus
from seedkeeper.domain.standby import STANDBY_VARIABLE, StandbyPlan
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper.observability import logger
from seedkeeper_tools.infra import load_template
from seedkeeper_tools.local.principals import TaskKeys

DEFAULT_IMAGE = "seedkeeper-slot-task:local"
# What ECS sets in every Fargate container (the task role's credentials endpoint aside).
ECS_ENVIRONMENT = ("AWS_REGION", "AWS_DEFAULT_REGION")
# What a deployment may add to the task definition (a sandbox command, restore tuning);
# passed on when the local stack's environment sets it.
TASK_DEFINITION_OPTIONS = (
    "SEEDKEEPER_SANDBOX_COMMAND",
    "SEEDKEEPER_RESTORE_TIMEOUT",
    "SEEDKEEPER_DOWNLOAD_PARTS",
    "SEEDKEEPER_DOWNLOAD_STALL_TIMEOUT",
    "SEEDKEEPER_DOWNLOAD_RETRIES",
    "SEEDKEEPER_STANDBY_POLL",
)
# Where the task definition mounts its `workspace` volume (the image's SEEDKEEPER_WORKSPACE).
WORKSPACE = "/workspace"
_PREFIX = "docker:"
_LIVE = {"created", "running", "restarting", "paused", "removing"}
_ENDED = {"exited", "dead"}
_INSPECT_BATCH = 100  # containers a `docker inspect`
# Containers a `docker stop`: it stops at most 50 at a time (the CLI's parallelOperation),
# and the 51st would wait for one of those to end before its SIGTERM.
_STOP_BATCH = 50
_CLI_TIMEOUT = 60.0  # a daemon that answers nothing for this long is unavailable


def slot_container() -> dict[str, object]:
    """template.yaml's slot container definition: its environment, stop timeout and init."""
    definition = load_template()["Resources"]["SlotTaskDefinition"]["Properties"]
    container: dict[str, object] = definition["ContainerDefinitions"][0]
    return container


class DockerRuntime:
    @classmethod
    def from_settings(cls, settings: RuntimeSettings) -> DockerRuntime:
        """The runtime `SEEDKEEPER_RUNTIME=docker` names (the `seedkeeper.runtimes` entry
        point the layer loads)."""
        return cls(
            settings.data_dir,
            settings.slot_image,
            passthrough=settings.local_task_passthrough,
            cpu=settings.slot_cpu,
        )

    def __init__(
        self,
        data_dir: Path,
        image: str = DEFAULT_IMAGE,
        *,
        passthrough: tuple[str, ...] = (),
        cpu: int | None = None,
    ) -> None:
        """`cpu`: the task's CPU units (None: the task definition's default, SlotCpu)."""
        container = slot_container()
        self._image = image
        # The task's shape, as Fargate gives it: its CPUs (a quota, as Fargate's vCPU is)
        # and its memory, the task definition's defaults.
        parameters = load_template()["Parameters"]
        # Never more than the machine has: Docker refuses a quota beyond its CPUs.
        cpus = (cpu or int(parameters["SlotCpu"]["Default"])) / 1024
        self._cpus = min(cpus, len(os.sched_getaffinity(0)))
        # What the task definition tells a task of its CPU (SEEDKEEPER_CPU_UNITS = SlotCpu):
        # here the quota it really gets, so it runs as many threads as it may use.
        self._cpu_units = round(self._cpus * 1024)
        self._memory = int(parameters["SlotMemory"]["Default"])
        self._stop_timeout = int(str(container["StopTimeout"]))
        linux = container.get("LinuxParameters", {})
        self._init = isinstance(linux, dict) and linux.get("InitProcessEnabled") is True
        environment = container.get("Environment", [])
        assert isinstance(environment, list)
        self._definition_names = tuple(str(variable["Name"]) for variable in environment)
        self._passthrough = not_a_credential(passthrough)
        # This data directory's containers (one stack's), by label and name prefix.
        self._stack = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]
        self._keys = TaskKeys(data_dir)

    def check(self) -> None:
        """Raises RuntimeUnavailable, saying why, unless the engine answers and has the image."""
        found = _docker(["docker", "image", "inspect", "--format", "{{.Id}}", self._image])
        if found.returncode != 0:
            why = _last_line(found.stderr)
            if "No such image" in why:
                why = f"no image {self._image}: build it with `make image`"
            raise RuntimeUnavailable(f"docker: {why}")

    def launch(self, plan: SlotPlan) -> str:
        return self._run(self._name(plan), plan.slot, {PLAN_VARIABLE: plan.to_env()})

    def launch_standby(self, standby: StandbyPlan) -> str:
        """A standby's container: named after its id (`_<id>`, which no slot's name part can
        be: a slot id starts with a letter or digit), labelled with no slot."""
        name = f"seedkeeper-{self._stack}-_{standby.standby}-1"
        return self._run(name, "", {STANDBY_VARIABLE: standby.to_env()})

    def _run(self, name: str, slot: str, plan: dict[str, str]) -> str:
        environment = self._environment(plan, _PREFIX + name)
        command = [
            "docker", "run", "--detach", "--quiet", "--name", name,
            "--network", "host", *(["--init"] if self._init else []),
            "--stop-timeout", str(self._stop_timeout),
            "--cpus", f"{self._cpus:g}", "--memory", f"{self._memory}m",
            "--mount", f"type=volume,destination={WORKSPACE}",
            "--label", f"seedkeeper.stack={self._stack}",
            "--label", f"seedkeeper.slot={slot}",
            # Names only: each value comes from this process's environment, never argv.
            *(argument for variable in environment for argument in ("--env", variable)),
            self._image,
        ]  # fmt: skip
        result = _docker(command, environment=os.environ | environment)
        if result.returncode != 0:
            if "is already in use" not in result.stderr:
                raise RuntimeUnavailable(f"docker run: {_last_line(result.stderr)}")
            # This attempt's container exists: the same task (started unless it never was).
            if self._state(name) == "created":
                started = _docker(["docker", "start", name])
                if started.returncode != 0:  # no task runs: the launch stays open
                    raise RuntimeUnavailable(f"docker start: {_last_line(started.stderr)}")
        return _PREFIX + name

    def status(self, incarnation: str) -> TaskStatus:
        return self.statuses([incarnation])[incarnation].status

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        """`docker inspect` of many containers at once. One it does not know (another
        stack's, or removed), or an engine that does not answer, is UNKNOWN."""
        states = dict.fromkeys(incarnations, UNKNOWN)
        names = {
            name: incarnation
            for incarnation in states
            if (name := self._container(incarnation)) is not None
        }
        listed = list(names)
        for start in range(0, len(listed), _INSPECT_BATCH):
            batch = listed[start : start + _INSPECT_BATCH]
            try:
                # Answers those it knows, and fails for the others: its output still counts.
                result = _docker(["docker", "inspect", "--type", "container", *batch])
                found = json.loads(result.stdout or "[]")
            except (RuntimeUnavailable, json.JSONDecodeError):
                continue
            for container in found if isinstance(found, list) else []:
                name = str(container.get("Name", "")).removeprefix("/")
                if name in names:
                    states[names[name]] = _task_state(container.get("State") or {})
        return states

    def launched_for(self, incarnation: str) -> Launch | None:
        """The attempt this stack's container `incarnation` was launched for: its name ends
        in the attempt, and its label names the slot (the name may hold only a digest)."""
        name = self._container(incarnation)
        if name is None:
            return None
        result = _docker(
            ["docker", "inspect", "--format", '{{index .Config.Labels "seedkeeper.slot"}}', name]
        )
        if result.returncode != 0:
            return None
        return Launch(result.stdout.strip(), int(name.rsplit("-", 1)[1]))

    def stop(self, incarnation: str) -> None:
        """`docker stop`: SIGTERM, SIGKILL after the stop timeout; returns once the
        container has exited (ECS answers at once and stops the task later)."""
        name = self._container(incarnation)
        if name is None:
            return
        result = self._stop_containers([name])
        if result.returncode != 0 and "No such container" not in result.stderr:
            raise RuntimeUnavailable(f"docker stop: {_last_line(result.stderr)}")

    def stop_all(self) -> None:
        """Stops every container this stack started, together (one stop timeout for all,
        however many), then removes them (their workspaces go with them, as a stopped
        task's ephemeral storage does)."""
        listed = _docker(
            [
                "docker",
                "ps",
                "--all",
                "--quiet",
                "--filter",
                f"label=seedkeeper.stack={self._stack}",
            ]
        )
        containers = listed.stdout.split()
        if not containers:
            return
        batches = [
            containers[start : start + _STOP_BATCH]
            for start in range(0, len(containers), _STOP_BATCH)
        ]
        with ThreadPoolExecutor(len(batches)) as pool:
            list(pool.map(self._stop_containers, batches))
        _docker(["docker", "rm", "--force", "--volumes", *containers])
        self._keys.revoke_all()
        logger.info("slot containers stopped and removed", count=len(containers))

    def _stop_containers(self, containers: list[str]) -> subprocess.CompletedProcess[str]:
        """`docker stop`: SIGTERM to each, SIGKILL after the task definition's stop timeout."""
        return _docker(
            ["docker", "stop", "--time", str(self._stop_timeout), *containers],
            timeout=self._stop_timeout + _CLI_TIMEOUT,
        )

    def _name(self, plan: SlotPlan) -> str:
        return f"seedkeeper-{self._stack}-{started_by(plan.slot)}-{plan.attempt}"

    def _container(self, incarnation: str) -> str | None:
        """This stack's container named by `incarnation`, or None for any other."""
        name = incarnation.removeprefix(_PREFIX)
        pattern = rf"seedkeeper-{self._stack}-[A-Za-z0-9_-]{{1,36}}-\d+"
        if not incarnation.startswith(_PREFIX) or re.fullmatch(pattern, name) is None:
            return None
        return name

    def _state(self, name: str) -> str | None:
        result = _docker(["docker", "inspect", "--format", "{{.State.Status}}", name])
        return result.stdout.strip() if result.returncode == 0 else None

    def _environment(self, plan: dict[str, str], incarnation: str) -> dict[str, str]:
        names = (
            *self._definition_names,
            *ECS_ENVIRONMENT,
            *TASK_DEFINITION_OPTIONS,
            *self._passthrough,
        )
        environment = {name: os.environ[name] for name in names if name in os.environ}
        keys = self._keys.issue(incarnation)
        return (
            environment
            | plan
            | {
                "AWS_EXECUTION_ENV": "AWS_ECS_FARGATE",
                "SEEDKEEPER_CPU_UNITS": str(self._cpu_units),
                "SEEDKEEPER_INCARNATION": incarnation,
                "AWS_ACCESS_KEY_ID": keys.access_key,
                "AWS_SECRET_ACCESS_KEY": keys.secret_key,
            }
        )


def _docker(
    command: list[str], *, environment: dict[str, str] | None = None, timeout: float = _CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as unavailable:
        raise RuntimeUnavailable(f"docker: {type(unavailable).__name__}") from unavailable


def _task_state(state: dict[str, Any]) -> TaskState:
    """A container's `State` as inspected: an out-of-memory kill is the cause when Docker
    says so; its exit code and error the detail."""
    status = state.get("Status")
    if status in _LIVE:
        return RUNNING
    if status not in _ENDED:
        return UNKNOWN
    said = [f"exit code {state.get('ExitCode')}", str(state.get("Error") or "")]
    cause = "OOMKilled" if state.get("OOMKilled") else None
    return TaskState.stopped(cause, "; ".join(part for part in said if part))


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else "no answer"
