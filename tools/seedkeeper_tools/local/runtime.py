"""The local runtime: slot tasks as processes on this machine, one slot user (uid and
group) each, their workspaces and process records under the data directory. Chosen by
`SEEDKEEPER_RUNTIME=local` (the local stack); never shipped to Lambda.

Launching is idempotent per attempt: the incarnation file it keeps answers a retried launch.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from seedkeeper.adapters.runtime import SLOT_UIDS_FROM, not_a_credential
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.observability import logger
from seedkeeper_task.sandbox import end_user_processes, let_slot_user_reach

# What an ECS slot task is given (template.yaml's SlotTaskDefinition, the image's ENV, what
# ECS sets), read from the local stack's environment: the store's keys stand in for the
# task role. Never an R2 key, a session token or any other SEEDKEEPER_* setting.
LOCAL_TASK_ENVIRONMENT = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TERM",
    "TZ",
    "PYTHONUNBUFFERED",
    "PYTHONPATH",  # reaches the supervisor (tests load a sitecustomize), never the sandbox
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "SEEDKEEPER_TABLE",
    "SEEDKEEPER_DYNAMODB_ENDPOINT",
    "SEEDKEEPER_RESTORE_TIMEOUT",
    "SEEDKEEPER_DOWNLOAD_PARTS",
    "SEEDKEEPER_DOWNLOAD_STALL_TIMEOUT",
    "SEEDKEEPER_DOWNLOAD_RETRIES",
    "SEEDKEEPER_SANDBOX_COMMAND",
)


@dataclass(frozen=True)
class _Process:
    pid: int
    started: str  # the process's start time in clock ticks: tells a reused pid apart


class LocalRuntime:
    """Slot tasks as local processes, each in its own process group, with a workspace per
    slot under `data_dir`. What it launched is recorded on disk, so status and stop work
    from another process or after a restart of the caller.

    A task gets what an ECS task gets (LOCAL_TASK_ENVIRONMENT) and, when this process is
    root, the slot user to drop to: a uid (and group) of the slot's own, recorded beside its
    workspace, so one slot's sandbox can neither write another's tree nor outlive its stop
    (every process of that uid is ended with the task). A sandbox cannot list the slots, or
    read a task's log or record."""

    def __init__(
        self,
        data_dir: Path,
        command: tuple[str, ...] = (),
        *,
        slot_uids_from: int = SLOT_UIDS_FROM,
        passthrough: tuple[str, ...] = (),
    ) -> None:
        self._root = data_dir.resolve() / "slots"
        self._command = command or (sys.executable, "-m", "seedkeeper_task")
        self._slot_uids_from = slot_uids_from
        self._passthrough = not_a_credential(passthrough)

    def workspace(self, slot: str) -> Path:
        return self._root / slot / "workspace"

    def launch(self, plan: SlotPlan) -> str:
        incarnation = f"local:{plan.slot}:{plan.attempt}"
        record = self._record(incarnation)
        if record.exists():  # this attempt was launched already: the same task
            return incarnation
        workspace = self.workspace(plan.slot)
        workspace.mkdir(parents=True, exist_ok=True)
        # Searchable, not listable: a slot user reaches its own workspace by name.
        for folder in (self._root, workspace.parent):
            folder.chmod(0o711)
        if os.geteuid() == 0:
            for folder in let_slot_user_reach(workspace):
                logger.warning("folder made searchable for the slot user", folder=str(folder))
        log_path = record.parent / f"attempt-{plan.attempt}.log"
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        process = subprocess.Popen(
            self._command,
            env=self._environment(plan, incarnation, workspace),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends all it started
        )
        os.close(log)
        record.write_text(json.dumps({"pid": process.pid, "started": _start_time(process.pid)}))
        return incarnation

    def slot_uid(self, slot: str) -> int | None:
        """The uid (and gid) of the slot's own user, once a root runtime gave it one."""
        try:
            return int((self._root / slot / "uid").read_text())
        except (OSError, ValueError):
            return None

    def _allocate_slot_uid(self, slot: str) -> int:
        """The slot's uid: the one it has, else the next never given, under a lock shared
        by every runtime on this data directory (the gateway's handlers, a CLI)."""
        given = self.slot_uid(slot)
        if given is not None:
            return given
        with (self._root / ".uids.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            counter = self._root / ".next-uid"
            uid = int(counter.read_text()) if counter.exists() else self._slot_uids_from
            while _is_an_account(uid):  # never a person's or a service's: its processes end
                uid += 1
            counter.write_text(str(uid + 1))
            (self._root / slot / "uid").write_text(str(uid))
        return uid

    def _environment(self, plan: SlotPlan, incarnation: str, workspace: Path) -> dict[str, str]:
        names = (*LOCAL_TASK_ENVIRONMENT, *self._passthrough)
        environment = {name: os.environ[name] for name in names if name in os.environ}
        environment |= {
            PLAN_VARIABLE: plan.to_env(),
            "SEEDKEEPER_WORKSPACE": str(workspace),
            "SEEDKEEPER_INCARNATION": incarnation,
        }
        if os.geteuid() == 0:
            uid = str(self._allocate_slot_uid(plan.slot))
            environment |= {"SEEDKEEPER_SLOT_UID": uid, "SEEDKEEPER_SLOT_GID": uid}
        return environment

    def status(self, incarnation: str) -> TaskStatus:
        process = self._process(incarnation)
        if process is None:
            return TaskStatus.UNKNOWN
        alive = _start_time(process.pid) == process.started and not _is_zombie(process.pid)
        return TaskStatus.RUNNING if alive else TaskStatus.STOPPED

    def stop(self, incarnation: str, grace: float = 5.0) -> None:
        """SIGTERM to the task's process group, SIGKILL after `grace` seconds; returns once
        no process of the group is left (the task's children included), nor of the slot's
        own user (the sandbox leads its own session, and may have left it)."""
        process = self._process(incarnation)
        if process is None:
            return
        if self.status(incarnation) is TaskStatus.RUNNING:
            self._end_group(process, grace)
        uid = self.slot_uid(incarnation.split(":")[1])
        if uid is not None and os.geteuid() == 0:
            end_user_processes(uid)  # a container's end would end them all

    def _end_group(self, process: _Process, grace: float) -> None:
        for sent, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sent)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                _reap(process.pid)
                if not _group_alive(process.pid):
                    return
                time.sleep(0.05)

    def stop_all(self) -> None:
        """Every task this data directory's runtime ever launched (a local stack's exit)."""
        for record in sorted(self._root.glob("*/attempt-*.json")):
            attempt = record.stem.removeprefix("attempt-")
            self.stop(f"local:{record.parent.name}:{attempt}", grace=2.0)

    def _record(self, incarnation: str) -> Path:
        _, slot, attempt = incarnation.split(":")
        folder = self._root / slot
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"attempt-{attempt}.json"

    def _process(self, incarnation: str) -> _Process | None:
        if not re.fullmatch(r"local:[A-Za-z0-9._-]+:\d+", incarnation):
            return None
        record = self._record(incarnation)
        if not record.exists():
            return None
        fields = json.loads(record.read_text())
        return _Process(pid=int(fields["pid"]), started=str(fields["started"]))


def _is_an_account(uid: int) -> bool:
    """Whether the uid, or the group of that number, names an account on this machine
    (a directory service's included)."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


def _start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat; empty when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _group_alive(group: int) -> bool:
    """Whether any process of the process group is still running (zombies are done)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[2] == str(group) and fields[0] != "Z":
            return True
    return False


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _reap(pid: int) -> None:
    """A child of this process is only gone once waited for."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
