"""Where slot tasks run: ECS Fargate in AWS; on one machine, containers of the slot image
or local processes, which the local stack's distribution provides as entry points of the
group `seedkeeper.runtimes` (the layer never imports the tools that run them). One small
interface, chosen by configuration; nothing else in Seedkeeper knows which it is.

Launching is idempotent per attempt, so a retried launch never starts a second task: ECS
by the RunTask client token, Docker by the container's name, the local processes by the
attempt record they create first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import AfterValidator, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters import aws
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, Launch, TaskState, TaskStatus
from seedkeeper.domain.standby import STANDBY_VARIABLE, StandbyPlan
from seedkeeper.errors import RuntimeUnavailable

if TYPE_CHECKING:
    from boto3.session import Session
    from mypy_boto3_ecs import ECSClient
    from mypy_boto3_ecs.type_defs import TaskTypeDef


class SlotRuntime(Protocol):
    def launch(self, plan: SlotPlan) -> str:
        """Start the slot task for `plan`; answer its incarnation."""
        ...

    def launch_standby(self, standby: StandbyPlan) -> str:
        """Start a standby's task (it waits for its assignment); answer its incarnation."""
        ...

    def status(self, incarnation: str) -> TaskStatus: ...

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        """Each task's state, a stopped one's with why, asked in as few calls as the
        platform takes; one it knows nothing of now is UNKNOWN, never stopped."""
        ...

    def stop(self, incarnation: str) -> None: ...

    def launched_for(self, incarnation: str) -> Launch | None:
        """The slot and attempt this runtime launched the task `incarnation` for (its plan);
        None when it launched no such task, or cannot tell now."""
        ...


# The first uid of the local slot users: one uid (and group) per slot, far above any
# account's, so no two slots, and no person, ever share one.
SLOT_UIDS_FROM = 1_000_000


def not_a_credential(names: tuple[str, ...]) -> tuple[str, ...]:
    refused = [name for name in names if name.startswith(("AWS_", "SEEDKEEPER_"))]
    if refused:
        raise ValueError(f"may not pass {refused} to slot tasks")
    return names


class RuntimeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    runtime: Literal["ecs", "docker", "local"] = "ecs"
    # ECS
    cluster: str | None = None
    task_definition: str | None = None
    container: str = "slot"
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()
    assign_public_ip: bool = False
    # local (processes) and docker
    data_dir: Path = Path(".seedkeeper")
    # docker: the slot image `make image` builds
    slot_image: str = "seedkeeper-slot-task:local"
    # Where a root local runtime's slot users start: each slot gets its own uid from here
    # (the ECS image's one slot user per task is uid 1000). An unprivileged runtime cannot
    # drop, so its tasks run their sandboxes as itself and say so.
    local_slot_uids_from: Annotated[int, Field(ge=1000, le=4_000_000_000)] = SLOT_UIDS_FROM
    # The task's CPU units (Fargate's: 1024 a vCPU). Local tasks run at that shape when
    # set: a container gets that many CPUs (`--cpus`; unset, the task definition's default
    # SlotCpu), a process that many cores (its affinity; unset, no limit).
    slot_cpu: Annotated[int, Field(ge=256, le=16_384)] | None = None
    # More variables for local tasks, by name (JSON list): test hooks, a debugger's.
    local_task_passthrough: Annotated[tuple[str, ...], AfterValidator(not_a_credential)] = ()


# The entry point group naming the local runtimes: each a `(RuntimeSettings) -> SlotRuntime`.
RUNTIME_ENTRY_POINTS = "seedkeeper.runtimes"


def runtime_from(settings: RuntimeSettings, session: Session | None = None) -> SlotRuntime:
    """The runtime `settings` name; ECS's client from `session` (None: the process's)."""
    if settings.runtime != "ecs":
        return installed_runtime(settings.runtime)(settings)
    if not settings.cluster:
        raise RuntimeUnavailable("ecs runtime needs a cluster")
    return EcsRuntime(aws.client(session or aws.session(), "ecs"), settings)


def installed_runtime(name: str) -> Callable[[RuntimeSettings], SlotRuntime]:
    """The local stack's runtime `name`, from the entry points installed here: on the
    developer's machine, never in Lambda (the layer alone, as `sam local invoke` runs it,
    has none)."""
    found = entry_points(group=RUNTIME_ENTRY_POINTS, name=name)
    if not found:
        raise RuntimeUnavailable(f"the {name} runtime is not installed")
    try:
        factory: Callable[[RuntimeSettings], SlotRuntime] = next(iter(found)).load()
    except ImportError as broken:  # registered, but its module does not import: not there
        raise RuntimeUnavailable(f"the {name} runtime cannot be loaded") from broken
    return factory


def started_by(slot: str) -> str:
    """ECS allows 36 characters of [A-Za-z0-9_-]: the slot itself when it fits, else a
    stable digest of it."""
    if re.fullmatch(r"[A-Za-z0-9_-]{1,36}", slot):
        return slot
    return "sk-" + hashlib.sha256(slot.encode()).hexdigest()[:33]


# A standby's tasks are started by this (a slot's, by the slot: `started_by`).
STANDBY_STARTED_BY = "seedkeeper-standby"
# DescribeTasks takes at most this many tasks a call.
DESCRIBE_BATCH = 100


class EcsRuntime:
    def __init__(self, client: ECSClient, settings: RuntimeSettings) -> None:
        self._ecs = client
        self._settings = settings

    def launch(self, plan: SlotPlan) -> str:
        # Idempotent per attempt: a retry of this launch returns the same task.
        return self._run_task(
            started_by(plan.slot), _client_token(plan), PLAN_VARIABLE, plan.to_env()
        )

    def launch_standby(self, standby: StandbyPlan) -> str:
        # Idempotent per standby: its id is the client token.
        return self._run_task(
            STANDBY_STARTED_BY, standby.standby, STANDBY_VARIABLE, standby.to_env()
        )

    def _run_task(self, starter: str, token: str, variable: str, value: str) -> str:
        """RunTask of the slot task definition with one variable in its container override."""
        settings = self._settings
        assert settings.cluster is not None
        # Those that only look at tasks (the sweep's stops aside, the checkpoint function's
        # DescribeTasks) are given the cluster alone.
        if not (settings.task_definition and settings.subnets):
            raise RuntimeUnavailable("ecs runtime needs task_definition and subnets to launch")
        try:
            response = self._ecs.run_task(
                cluster=settings.cluster,
                taskDefinition=settings.task_definition,
                launchType="FARGATE",
                count=1,
                startedBy=starter,
                clientToken=token,
                networkConfiguration={
                    "awsvpcConfiguration": {
                        "subnets": list(settings.subnets),
                        "securityGroups": list(settings.security_groups),
                        "assignPublicIp": "ENABLED" if settings.assign_public_ip else "DISABLED",
                    }
                },
                overrides={
                    "containerOverrides": [
                        {
                            "name": settings.container,
                            "environment": [{"name": variable, "value": value}],
                        }
                    ]
                },
            )
        except (ClientError, BotoCoreError) as error:
            existing = _task_holding_the_token(error)
            if existing is not None:
                return existing
            code = _code(error)
            transient = isinstance(error, BotoCoreError) or code in _TRANSIENT_CODES
            raise RuntimeUnavailable(code, retryable=transient) from error
        tasks = response.get("tasks", [])
        if not tasks:
            reasons = [f.get("reason", "") for f in response.get("failures", [])]
            # No capacity now (RESOURCE:CPU, RESOURCE:MEMORY, RESOURCE:ENI...) or no agent:
            # nothing was started, and the same launch may well start it later.
            transient = bool(reasons) and all(
                reason.startswith("RESOURCE:") or reason == "AGENT" for reason in reasons
            )
            raise RuntimeUnavailable(
                f"RunTask started nothing ({','.join(reasons)})", retryable=transient
            )
        return tasks[0]["taskArn"]

    def status(self, incarnation: str) -> TaskStatus:
        return self.statuses([incarnation])[incarnation].status

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        """DescribeTasks, DESCRIBE_BATCH tasks a call. A task ECS does not know (`MISSING`: it
        keeps a stopped one visible for at least an hour, not for ever), and a batch it did
        not answer, is UNKNOWN."""
        states = dict.fromkeys(incarnations, UNKNOWN)
        arns = [incarnation for incarnation in states if incarnation.startswith("arn:")]
        for start in range(0, len(arns), DESCRIBE_BATCH):
            try:
                response = self._ecs.describe_tasks(
                    cluster=self._settings.cluster or "", tasks=arns[start : start + DESCRIBE_BATCH]
                )
            except (ClientError, BotoCoreError):
                continue
            for task in response.get("tasks", []):
                if task.get("taskArn") in states:
                    states[task["taskArn"]] = self._state(task)
        return states

    def _state(self, task: TaskTypeDef) -> TaskState:
        """Stopped only once ECS says STOPPED (STOPPING and DEPROVISIONING still run, or
        may): its stopCode as the cause, its stoppedReason and the slot container's exit
        as the detail."""
        if task.get("lastStatus") != "STOPPED":
            return RUNNING
        said = [task.get("stoppedReason", "")]
        for container in task.get("containers", []):
            if container.get("name") == self._settings.container:
                exit_code = container.get("exitCode")
                said.append(f"exit code {exit_code}" if exit_code is not None else "")
                said.append(container.get("reason", ""))
        return TaskState.stopped(task.get("stopCode"), "; ".join(part for part in said if part))

    def launched_for(self, incarnation: str) -> Launch | None:
        """The plan RunTask's container override carried (only the seed function's RunTask
        sets it), read back with DescribeTasks."""
        if not incarnation.startswith("arn:"):
            return None
        try:
            response = self._ecs.describe_tasks(
                cluster=self._settings.cluster or "", tasks=[incarnation]
            )
        except (ClientError, BotoCoreError):
            return None
        for task in response.get("tasks", []):
            if task.get("taskArn") != incarnation:
                continue
            for container in task.get("overrides", {}).get("containerOverrides", []):
                if container.get("name") != self._settings.container:
                    continue
                for variable in container.get("environment", []):
                    if variable.get("name") == PLAN_VARIABLE:
                        return _launch_of(variable.get("value", ""))
        return None

    def stop(self, incarnation: str) -> None:
        try:
            self._ecs.stop_task(
                cluster=self._settings.cluster or "", task=incarnation, reason="seedkeeper"
            )
        except (ClientError, BotoCoreError) as error:
            raise RuntimeUnavailable(_code(error)) from error


def _launch_of(plan: str) -> Launch | None:
    try:
        launched = SlotPlan.from_env(plan)
    except ValueError:
        return None
    return Launch(launched.slot, launched.attempt)


def _client_token(plan: SlotPlan) -> str:
    """One per attempt: a relaunch of the attempt sends the same request (the plan holds no
    URL, nothing fresh), so within the token's life ECS answers the task it started."""
    return f"{hashlib.sha256(plan.slot.encode()).hexdigest()[:48]}-{plan.attempt}"


def _task_holding_the_token(error: ClientError | BotoCoreError) -> str | None:
    """The attempt's task when ECS refuses the token as in use by a different request (a
    release changed the task definition between a launch and its relaunch): that task is
    the attempt's, never a second one."""
    if not isinstance(error, ClientError) or _code(error) != "ConflictException":
        return None
    holders = error.response.get("resourceIds")
    if isinstance(holders, list) and holders and isinstance(holders[0], str):
        return holders[0]
    return None


# RunTask's answers that say "not now": throttled, or a fault of its own (ECS's errors).
_TRANSIENT_CODES = frozenset(
    {
        "ThrottlingException",
        "ServerException",
        "ServiceUnavailableException",
        "LimitExceededException",
    }
)


def _code(error: ClientError | BotoCoreError) -> str:
    if isinstance(error, ClientError):
        return error.response.get("Error", {}).get("Code") or "unknown"
    return type(error).__name__
