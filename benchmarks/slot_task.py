"""The real slot task, as the local runtime starts it, for the restore and resume benchmarks.

A cell's task runs against a moto lifecycle table holding a record born for it (`launched`;
for a resume, parked through the store's own transitions, then resumed: `parked_and_resumed`)
and starts, as in a deployment, at the real checkpoint function, served in the benchmark's
process by the local function-URL gateway (`POST /tasks/start`, signed with the task's own
keys), which answers presigned GETs pointing at the link's nginx. `python -m
seedkeeper_task` is timed whole from its spawn to its settled record (interpreter start,
imports and the start call are part of what a task costs; the slot is usable once settled,
so the sandbox command, which starts then, writes the time), as the task records its restore
(`result.ms`, `result.steps`), and until it is reaped, with its CPU seconds (user + system,
the task and its children); its sandbox command also writes the task's peak RSS (VmHWM).
Every timed task runs inside the cell's CPU shape; nginx, moto and the checkpoint function
stay outside, as R2 and AWS's side are not the task's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import boto3

import harness
import workload
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding, OwnerClaim, SeedIdentity
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.plan import DEPS_PATH, PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.record import Checkpoint, SeedSucceeded, SlotRecord, State, Supported
from seedkeeper.domain.snapshots import NewSnapshot
from seedkeeper.services.rotation import Snapshots
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_task.restore.extract import UNSQUASHFS_COMMAND
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.gateway import FunctionUrlGateway
from seedkeeper_tools.local.motoserver import AtomicMotoServer
from seedkeeper_tools.local.principals import TASK_ROLE_ARN, LocalCredentials, TaskKeys

TABLE = "seedkeeper-bench"
BUCKET = "seedkeeper-bench"  # the R2 bucket the checkpoint function presigns for
REGION = harness.REGION
TASK_PARTS: int = TaskSettings.model_fields["download_parts"].default  # ranges per archive
RETENTION = 7 * 86_400  # a parked slot's checkpoint's

P = TypeVar("P")


def task_unsquashfs(shape: harness.CpuShape) -> list[str]:
    """unsquashfs as the task runs it at `shape`: its flags, and as many threads as the
    template's CPU gives it (`TaskSettings.processors`). Every baseline extracts with it."""
    cpu_units = int(shape.task_environment["SEEDKEEPER_CPU_UNITS"])
    processors = TaskSettings(cpu_units=cpu_units).processors()
    return [*UNSQUASHFS_COMMAND, "-processors", str(processors)]


def checkpoint_function(dynamodb_endpoint: str, keys: TaskKeys) -> FunctionUrlGateway:
    """The real checkpoint function, served (started) in this process by the local
    function-URL gateway, which takes each task's own keys (`keys`, as the local runtime
    issues them: its session of the task role). Its
    handler reads its settings from this process's environment when called: the lifecycle
    table at `dynamodb_endpoint` and R2's BUCKET with fake keys (nginx checks no signature);
    each run names the R2 endpoint, its nginx (`Tasks.task`)."""
    for name in [name for name in os.environ if name.startswith("SEEDKEEPER_")]:
        del os.environ[name]  # nothing from a developer's settings, as for the task
    os.environ.update(
        {
            "SEEDKEEPER_TABLE": TABLE,
            "SEEDKEEPER_DYNAMODB_ENDPOINT": dynamodb_endpoint,
            "SEEDKEEPER_R2_BUCKET": BUCKET,
            "SEEDKEEPER_R2_ACCESS_KEY_ID": "bench",
            "SEEDKEEPER_R2_SECRET_ACCESS_KEY": "bench",
            "SEEDKEEPER_TASK_ROLE_ARN": TASK_ROLE_ARN,
        }
    )
    return FunctionUrlGateway(
        "127.0.0.1",
        0,
        LocalCredentials("bench-executor", secrets.token_hex(16)),  # no executor calls here
        task_keys=keys,
        region=REGION,
    ).start()


@dataclass
class Backend:
    """AWS's side of a task, outside its CPU shape: the lifecycle table in moto and the
    checkpoint function it starts at."""

    endpoint: str  # moto's
    checkpoint_url: str
    keys: TaskKeys  # each task's own, as the local runtime gives them
    lifecycle: Lifecycle
    snapshots: SnapshotStore


@contextlib.contextmanager
def backend(workdir: Path) -> Iterator[Backend]:
    """moto with the lifecycle table, and the checkpoint function in this process, until
    the block ends."""
    moto = AtomicMotoServer().start()
    keys = TaskKeys(workdir)
    gateway = checkpoint_function(moto.endpoint, keys)
    try:
        dynamodb = boto3.client("dynamodb", endpoint_url=moto.endpoint, region_name=REGION)
        create_table(dynamodb, TABLE, load_template())
        resource = boto3.resource("dynamodb", endpoint_url=moto.endpoint, region_name=REGION)
        table = resource.Table(TABLE)
        yield Backend(moto.endpoint, gateway.url, keys, Lifecycle(table), SnapshotStore(table))
    finally:
        gateway.stop()
        moto.stop()


@dataclass
class TaskRun:
    restore_s: float  # result.ms: as the task records it
    process_s: float  # the task's process, from its spawn to its settled record
    exit_s: float  # from its spawn until it is reaped (its sandbox command ran, it exited)
    steps_ms: dict[str, int]
    peak_rss_kb: int  # the task's own VmHWM
    tree_max_rss_kb: int  # the task and its children (unsquashfs, find, git)
    cpu_s: float  # user + system, the task and its children, until it exited

    @classmethod
    def of(cls, timed: harness.Timed, result: SeedSucceeded, folder: Path, slot: str) -> TaskRun:
        """The task's run, from its process (`timed`), its settled result and what its
        sandbox command wrote into `folder`."""
        return cls(
            restore_s=result.ms / 1000,
            process_s=ready_s(timed, folder, slot),
            exit_s=timed.seconds,
            steps_ms=dict(result.steps),
            peak_rss_kb=peak_rss_kb(folder, slot),
            tree_max_rss_kb=timed.max_rss_kb,
            cpu_s=timed.cpu_s,
        )


def task_steps(runs: Sequence[TaskRun]) -> dict[str, float]:
    """The task's steps (medians over `runs`, s), what else its restore did, and its
    process's own cost around it."""
    names = sorted({name for run in runs for name in run.steps_ms})
    medians = {
        name: statistics.median(run.steps_ms.get(name, 0) for run in runs) / 1000 for name in names
    }
    medians["other (preflight, cleanup)"] = statistics.median(
        run.restore_s - sum(run.steps_ms.values()) / 1000 for run in runs
    )
    medians["process (interpreter, imports, start call, settle)"] = statistics.median(
        run.process_s - run.restore_s for run in runs
    )
    return medians


def ready_s(timed: harness.Timed, folder: Path, slot: str) -> float:
    """Seconds from the task's spawn to its settled record: its sandbox command, which
    starts right after the settle, wrote the time it started (`Tasks.task`)."""
    try:
        return float((folder / "ready").read_text()) - timed.started_at
    except (OSError, ValueError) as unreadable:
        raise harness.BenchError(f"{slot}: no start time from the sandbox command") from unreadable


def peak_rss_kb(folder: Path, slot: str) -> int:
    """The task's own peak RSS, as its sandbox command wrote it."""
    try:
        return int((folder / "vmhwm").read_text().split()[1])  # "VmHWM:   123456 kB"
    except (OSError, IndexError, ValueError) as unreadable:
        raise harness.BenchError(f"{slot}: no VmHWM from the sandbox command") from unreadable


def head(checkout: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass(frozen=True)
class Parkable:
    """A size's checkpoint object, as the supervisor captured the seeded checkout."""

    path: Path  # in the served folder
    size: int
    sha256: str
    md5: str
    worktree: int  # entries of the captured checkout outside .git


@dataclass
class Tasks:
    """The real slot task on one link (its nginx) at one CPU shape."""

    backend: Backend
    nginx: harness.Nginx
    environment: dict[str, str]  # what every subprocess inherits: no SEEDKEEPER_*, fake AWS
    shape: harness.CpuShape  # the task's CPU: every timed command runs inside it

    @property
    def lifecycle(self) -> Lifecycle:
        return self.backend.lifecycle

    def record(self, case: workload.Input) -> None:
        """The snapshot the task's seed names, and its archives where its grants point."""
        for archived in case.archives:
            key = backup_key(archived.backup_id)
            harness.serve_object(self.nginx.root, key, archived.path, bucket=BUCKET)
        snapshot = NewSnapshot(
            resource=case.checkout.backup_id,
            ref=workload.REF,
            sha=case.commit,
            created_at=int(time.time()),
            checkout=case.checkout.archive,
            deps=case.deps.archive,
            lockfile_hash=case.lockfile_hash,
        )
        Snapshots(self.backend.snapshots, r2=None).record(snapshot)

    def seed(self, case: workload.Input, slot: str, workspace: Path, folder: Path) -> TaskRun:
        """A slot born for `case`'s seed, seeded by the task into `workspace`, checked."""
        record, op = self.launched(case, slot)
        assert record.incarnation is not None  # recorded by `launched`
        timed = self.task(SlotPlan.of(record, op), record.incarnation, workspace, folder)
        return TaskRun.of(timed, self.seeded(slot, case, timed, workspace, folder), folder, slot)

    def launched(
        self, case: workload.Input, slot: str, *, now: int | None = None
    ) -> tuple[SlotRecord, OpRef]:
        """A record born for `case`'s seed at `now` and its incarnation recorded, as the
        local runtime leaves it before the task starts: (the record, its restore op)."""
        seed = SeedIdentity(
            resource=case.checkout.backup_id,
            ref=workload.REF,
            sha=case.commit,
            checkout_backup_id=case.checkout.backup_id,
            deps_backup_id=case.deps.backup_id,
        )
        owner = OwnerClaim(
            run=f"run-{slot}",
            requester="bench",
            thread="bench",
            repository="bench/synthetic",
            ref=workload.REF,
            head=case.commit,
        )
        now = int(time.time()) if now is None else now
        born = self.lifecycle.birth(
            slot,
            Binding(owner=owner, seed=seed, origin=workload.ORIGIN),
            now=now,
            idle_deadline=now + 3600,
            requires=self.backend.snapshots.recorded_check(seed),
        )
        if not isinstance(born, Written) or born.entry is None:
            raise harness.BenchError(f"{slot}: the birth was refused: {born}")
        incarnation = f"local:{slot}:{born.record.attempt}"
        recorded = self.lifecycle.write(
            transitions.RECORD_INCARNATION,
            born.record,
            transitions.Launched(incarnation=incarnation, launch=born.entry.ref, now=now),
        )
        if not isinstance(recorded, Written):
            raise harness.BenchError(f"{slot}: the incarnation was not recorded: {recorded}")
        return recorded.record, born.entry.ref

    def task(
        self, plan: SlotPlan, incarnation: str, workspace: Path, folder: Path
    ) -> harness.Timed:
        """The real slot task of `plan` in `incarnation`, started as the local runtime starts
        it and timed whole, its start call included; its sandbox command, which starts once
        the record is settled, writes the time (`ready_s`) and the task's peak RSS (VmHWM)
        into `folder` and exits. Its log: `folder`/task.log."""
        hwm, ready = folder / "vmhwm", folder / "ready"
        keys = self.backend.keys.issue(incarnation)
        probe = (
            f"date +%s.%N > {shlex.quote(str(ready))}; "
            f"grep VmHWM /proc/$PPID/status > {shlex.quote(str(hwm))}"
        )
        environment = (
            self.environment
            | self.nginx.client_environment()
            | {
                PLAN_VARIABLE: plan.to_env(),
                "SEEDKEEPER_WORKSPACE": str(workspace),
                "SEEDKEEPER_INCARNATION": incarnation,
                # Its own session of the task role, for its API alone (the checkpoint function).
                "AWS_ACCESS_KEY_ID": keys.access_key,
                "AWS_SECRET_ACCESS_KEY": keys.secret_key,
                "SEEDKEEPER_CHECKPOINT_URL": self.backend.checkpoint_url,
                "SEEDKEEPER_SANDBOX_COMMAND": json.dumps(["sh", "-c", probe]),
            }
            | self.shape.task_environment
        )
        # The checkpoint function runs in this process: its grants point at this run's nginx.
        os.environ["SEEDKEEPER_R2_ENDPOINT"] = self.nginx.endpoint
        harness.settle_disk()
        with (folder / "task.log").open("wb") as log:
            task = self.shape.wrap([sys.executable, "-m", "seedkeeper_task"])
            return harness.timed_run(task, env=environment, log=log)

    def seeded(
        self,
        slot: str,
        case: workload.Input,
        timed: harness.Timed,
        workspace: Path,
        folder: Path,
        *,
        resumed: bool = False,
    ) -> SeedSucceeded:
        """The task's settled result, checked: exit 0, `seeded` with `case`'s commit (from
        the checkpoint when `resumed`), the checkout's HEAD on it, the deps tree in place."""
        classified = self.lifecycle.read(slot)
        record = classified.record if isinstance(classified, Supported) else None
        result = record.result if record is not None else None
        checkout = workspace / CHECKOUT
        if (
            timed.code != 0
            or record is None
            or record.state is not State.SEEDED
            or not isinstance(result, SeedSucceeded)
            or result.resumed != resumed
            or result.head != case.commit
            or head(checkout) != case.commit
            or not (checkout / DEPS_PATH / ".package-lock.json").is_file()
        ):
            tail = (folder / "task.log").read_text(errors="replace")[-2000:]
            raise harness.BenchError(
                f"{slot} did not seed (exit {timed.code}): {classified}\n{tail}"
            )
        return result

    def parked_and_resumed(
        self, case: workload.Input, slot: str, parkable: Parkable
    ) -> tuple[SlotRecord, OpRef]:
        """A record parked on `parkable` through the store's transitions (the slot seeded
        two hours ago, idle since one), then resumed by its owner's seed as the seed
        function does (`RESUME` through `Lifecycle.apply`) and its new incarnation recorded:
        (the record, the resume's restore op)."""
        now = int(time.time())
        born = now - 7200
        record, restore_op = self.launched(case, slot, now=born)
        result = SeedSucceeded(
            ref=workload.REF, head=case.commit, from_backup=case.checkout.backup_id, steps={}, ms=0
        )
        verdict = transitions.Verdict(
            attempt=record.attempt, restore=restore_op, result=result, now=born
        )
        record = self._write(transitions.SETTLE_SEED, record, verdict).record
        idle = record.idle_deadline + 1
        asked = self._write(transitions.REQUEST_CHECKPOINT, record, transitions.At(idle))
        assert asked.entry is not None  # the checkpoint op it reserved
        upload = asked.entry.ref
        freezing = transitions.Freezing(attempt=record.attempt, op=upload, now=idle)
        record = self._write(transitions.FREEZE, asked.record, freezing).record
        assert record.incarnation is not None
        made = Checkpoint(
            key=f"checkpoints/{slot}/{record.incarnation.replace(':', '-')}/1.sqsh",
            size=parkable.size,
            etag=f'"{parkable.md5}"',
            sha256=parkable.sha256,
            created_at=idle,
            expires_at=now + RETENTION,
            owner=record.owner,
            incarnation=record.incarnation,
        )
        uploaded = transitions.Uploaded(checkpoint=made, upload=upload, now=idle)
        record = self._write(transitions.RECORD_CHECKPOINT, record, uploaded).record
        fenced = self._write(transitions.FENCE_PARK, record, transitions.At(idle))
        assert fenced.entry is not None  # the stop it reserved
        parked = transitions.Parked(stop=fenced.entry.ref, now=idle, expires_at=made.expires_at)
        record = self._write(transitions.PARK, fenced.record, parked).record
        poll = transitions.Poll(record.binding, now=now, idle_deadline=now + 3600)
        resumed = _written(self.lifecycle.apply(slot, transitions.RESUME, poll), "resume")
        if resumed.entry is None or not resumed.record.resuming:
            raise harness.BenchError(f"{slot}: the resume reserved no restore: {resumed}")
        incarnation = f"local:{slot}:{resumed.record.attempt}"
        launched = transitions.Launched(incarnation=incarnation, launch=resumed.entry.ref, now=now)
        record = self._write(transitions.RECORD_INCARNATION, resumed.record, launched).record
        return record, resumed.entry.ref

    def _write(
        self, transition: transitions.Transition[P], record: SlotRecord, params: P
    ) -> Written:
        return _written(self.lifecycle.write(transition, record, params), transition.name)


def _written(outcome: object, name: str) -> Written:
    if not isinstance(outcome, Written):
        raise harness.BenchError(f"{name} was not written: {outcome}")
    return outcome
