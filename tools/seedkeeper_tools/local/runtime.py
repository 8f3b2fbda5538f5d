"""The local runtime: slot tasks as processes on this machine, one slot user (uid and
group) each, their workspaces and process records under the data directory. Chosen by
`SEEDKEEPER_RUNTIME=local` (the local stack); never shipped to Lambda.

Launching is idempotent per attempt: the attempt's record is created exclusively (and
locked until it names the process) before anything starts, so of two launches of one attempt,
however close, one starts the task and the other answers the same incarnation.

As on Fargate, each attempt's task starts in a fresh workspace of its own, and a task that
stopped takes its workspace with it: whatever found it stopped (its reaper, a status, a
stop) ends what is left of its processes and removes the workspace.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from seedkeeper.adapters.runtime import SLOT_UIDS_FROM, RuntimeSettings, not_a_credential
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, Launch, TaskState, TaskStatus
from seedkeeper.domain.standby import LOCAL_STANDBY_PREFIX, STANDBY_VARIABLE, StandbyPlan
from seedkeeper.observability import logger
from seedkeeper_task.restore.extract import remove_tree
from seedkeeper_task.sandbox import end_user_processes, let_slot_user_reach
from seedkeeper_tools.local.principals import TaskKeys

# What an ECS slot task is given (template.yaml's SlotTaskDefinition, the image's ENV, what
# ECS sets), read from the local stack's environment; and keys of its own, its session of the
# task role (`principals.TaskKeys`), for the checkpoint function only. Never the store's
# keys, an R2 key, a session token or any other SEEDKEEPER_* setting.
LOCAL_TASK_ENVIRONMENT = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TERM",
    "TZ",
    "PYTHONUNBUFFERED",
    "PYTHONPATH",  # reaches the supervisor (tests load a sitecustomize), never the sandbox
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "SEEDKEEPER_RESTORE_TIMEOUT",
    "SEEDKEEPER_DOWNLOAD_PARTS",
    "SEEDKEEPER_DOWNLOAD_STALL_TIMEOUT",
    "SEEDKEEPER_DOWNLOAD_RETRIES",
    "SEEDKEEPER_SANDBOX_COMMAND",
    # The checkpoint function (the local gateway, which takes the task's own keys there
    # only) and how often the task reads its record for a checkpoint request.
    "SEEDKEEPER_CHECKPOINT_URL",
    "SEEDKEEPER_WATCH_INTERVAL",
    "SEEDKEEPER_STANDBY_POLL",  # how often a standby asks for its assignment
    "SEEDKEEPER_CPU_UNITS",  # its CPU (set from `cpu` when given): its helpers' threads
    # A platform stop's checkpoint budget, and how long a lost slot's record is kept.
    "SEEDKEEPER_STOP_TIMEOUT",
    "SEEDKEEPER_PARK_RETENTION",
)


# Slot tasks yield the CPU to the stack (ECS runs them on capacity of their own): a storm of
# starting tasks must not starve the gateway and the store that answer the executors. They
# yield to anything else busy on the machine too: a restore is slower there, never refused.
TASK_NICENESS = 19
# A stop sends SIGTERM, then SIGKILL to what is left after the grace period; this long after
# that, a process that survived SIGKILL is given up on.
KILL_WAIT = 5.0
# A stack's exit gives its tasks this long: its store, in memory, goes with it, so nothing a
# stopping task would write there is kept.
EXIT_GRACE = 2.0
# Where a root runtime claims its slot users' uids, machine-wide: root's, in tmpfs.
UID_CLAIMS = Path("/run/seedkeeper/slot-uids")
# Stopped tasks' workspaces removed side by side: removing a tree mostly waits on the disk
# (20 checkouts of 5,000 files: 42 s one after another, 6 s eight at a time).
CLEARED_AT_ONCE = 8


@dataclass(frozen=True)
class _Process:
    pid: int
    started: str  # the process's start time in clock ticks: tells a reused pid apart


# The reaper of each task this process started, until it has cleared its task: a stop waits
# for it, so that the exit is kept and the workspace gone when the stop returns (a stack
# that exits right after its stop would leave them half written, half removed).
_reapers: dict[_Process, threading.Thread] = {}


class LocalRuntime:
    """Slot tasks as local processes, each in its own process group, with a workspace per
    attempt under `data_dir`. What it launched is recorded on disk, so status and stop work
    from another process or after a restart of the caller.

    A task gets what an ECS task gets (LOCAL_TASK_ENVIRONMENT) and, when this process is
    root, the slot user to drop to: a uid (and group) of the slot's own, recorded beside its
    workspace, so one slot's sandbox can neither write another's tree nor outlive its stop
    (every process of that uid is ended with the task). A sandbox cannot list the slots, or
    read a task's log or record."""

    @classmethod
    def from_settings(cls, settings: RuntimeSettings) -> LocalRuntime:
        """The runtime `SEEDKEEPER_RUNTIME=local` names (the `seedkeeper.runtimes` entry
        point the layer loads)."""
        return cls(
            settings.data_dir,
            slot_uids_from=settings.local_slot_uids_from,
            passthrough=settings.local_task_passthrough,
            cpu=settings.slot_cpu,
        )

    def __init__(
        self,
        data_dir: Path,
        command: tuple[str, ...] = (),
        *,
        slot_uids_from: int = SLOT_UIDS_FROM,
        passthrough: tuple[str, ...] = (),
        uid_claims: Path = UID_CLAIMS,
        cpu: int | None = None,
    ) -> None:
        """`cpu`: the task's CPU units; each task then runs on that many of this machine's
        cores (its affinity, inherited by all it starts). None: on all of them."""
        self._root = data_dir.resolve() / "slots"
        self._uid_claims = uid_claims
        self._keys = TaskKeys(data_dir)
        self._command = command or (sys.executable, "-m", "seedkeeper_task")
        self._slot_uids_from = slot_uids_from
        self._passthrough = not_a_credential(passthrough)
        cores = sorted(os.sched_getaffinity(0))
        # The last cores: the stack (its functions, its store) keeps the first to itself.
        self._cores = set(cores[-max(1, cpu // 1024) :]) if cpu else None

    def workspace(self, slot: str) -> Path:
        """The workspace of the slot's latest attempt (its first's before any launch): gone
        once that attempt's task stopped."""
        return self._workspace(slot, self._latest_attempt(slot) or 1)

    def _workspace(self, slot: str, attempt: int) -> Path:
        return self._root / slot / f"workspace-{attempt}"

    def _latest_attempt(self, slot: str) -> int | None:
        launched = (self._root / slot).glob("attempt-*.json")
        return max((int(record.stem.removeprefix("attempt-")) for record in launched), default=None)

    def launch(self, plan: SlotPlan) -> str:
        return self._launch(plan.slot, plan.attempt, {PLAN_VARIABLE: plan.to_env()})

    def launch_standby(self, standby: StandbyPlan) -> str:
        """A standby's task, as a slot of its own (`_standby-<id>`, a name no executor can
        give): its workspace, and its slot user, are the slot's it is assigned to."""
        slot = LOCAL_STANDBY_PREFIX + standby.standby
        return self._launch(slot, 1, {STANDBY_VARIABLE: standby.to_env()})

    def _launch(self, slot: str, attempt: int, plan: dict[str, str]) -> str:
        incarnation = f"local:{slot}:{attempt}"
        record = self._record(incarnation)
        claim = _create_locked(record)
        if claim is None:  # this attempt was launched already, or is being: the same task
            return incarnation
        with os.fdopen(claim, "w") as claimed:
            try:
                process = self._start(slot, attempt, plan, incarnation, record.parent)
            except BaseException:
                record.unlink()  # nothing started: a later launch of the attempt may start it
                raise
            claimed.write(json.dumps({"pid": process.pid, "started": process.started}))
        return incarnation

    def workspace_of(self, incarnation: str) -> Path:
        """The workspace of the task `incarnation` (a standby's too): gone once it stopped."""
        _, slot, attempt = incarnation.split(":")
        return self._workspace(slot, int(attempt))

    def slot_uid_of(self, incarnation: str) -> int | None:
        """The uid the task `incarnation` runs its sandbox as (a standby's: its own)."""
        return self.slot_uid(incarnation.split(":")[1])

    def _start(
        self, slot: str, attempt: int, plan: dict[str, str], incarnation: str, folder: Path
    ) -> _Process:
        # The attempt's own: only its launch, which holds its record, creates it. One that is
        # there already was left by a launch that started nothing.
        workspace = self._workspace(slot, attempt)
        workspace.mkdir(parents=True, exist_ok=True)
        # Searchable, not listable: a slot user reaches its own workspace by name.
        for searchable in (self._root, workspace.parent):
            searchable.chmod(0o711)
        if os.geteuid() == 0:
            for reached in let_slot_user_reach(workspace.parent):
                logger.warning("folder made searchable for the slot user", folder=str(reached))
            # Root's, searchable by the slot's own group alone (its user's gid is its uid):
            # slot names are the executor's and attempts count from 1, so another slot's
            # sandbox could guess the path and read every file the archive made readable.
            os.chown(workspace, 0, self._allocate_slot_uid(slot))
            workspace.chmod(0o710)
        log = os.open(
            folder / f"attempt-{attempt}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
        )
        try:
            process = subprocess.Popen(
                self._command,
                env=self._environment(slot, plan, incarnation, workspace),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # A process group of its own, so a stop ends all it started; in the stack's
                # session, so its scheduling group is the stack's and its niceness counts.
                process_group=0,
            )
        finally:
            os.close(log)
        with contextlib.suppress(ProcessLookupError):  # it may have ended already
            os.setpriority(os.PRIO_PROCESS, process.pid, TASK_NICENESS)
            if self._cores is not None:  # before it starts a thread: all of them inherit it
                os.sched_setaffinity(process.pid, self._cores)
        started = _Process(pid=process.pid, started=_start_time(process.pid))  # before the reap
        reaper = threading.Thread(
            target=self._reap,
            args=(process, started, slot, attempt),
            name=f"reap-{incarnation}",
            daemon=True,
        )
        _reapers[started] = reaper
        reaper.start()
        return started

    def _reap(
        self, process: subprocess.Popen[bytes], task: _Process, slot: str, attempt: int
    ) -> None:
        """Waited for as soon as it ends, whoever stops it (no zombie is left behind); how it
        ended is kept for a status to tell, and what it leaves goes with it."""
        returncode = process.wait()
        exit_record = self._root / slot / f"attempt-{attempt}.exit"
        draft = exit_record.with_name(f".{exit_record.name}.{secrets.token_hex(4)}")
        try:
            draft.write_text(str(returncode))
            draft.replace(exit_record)  # whole or not at all, for a status read at once
        except OSError as error:  # a status then says only that the process is gone
            logger.warning("a task's exit is not kept", record=str(exit_record), error=str(error))
        self._clear(slot, attempt, task)
        _reapers.pop(task, None)  # done: a stop has nothing to wait for

    def _clear(self, slot: str, attempt: int, task: _Process) -> None:
        """A stopped task's processes and workspace end with it, as a Fargate task's
        container and storage do: what is left of its group (and, root, of its slot user
        when no later attempt of the slot was launched: that one's sandbox is its own), then
        the workspace. Kept while anything of the group survives SIGKILL: looked at again by
        the next status or stop. Never a running task's, never another attempt's."""
        workspace = self._workspace(slot, attempt)
        group = {task.pid: task.started}
        if not workspace.exists() or _is_running(task):
            return
        # One look at a time, in any process (a reaper, a status and a stop may look at
        # once): the clearing is over when the workspace is gone, so a look that comes
        # second finds it gone and ends nothing of the slot's user started since.
        with (workspace.parent / ".clearing.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not workspace.exists():
                return
            if _still_ours(group):
                _end_groups([task], grace=0)
                if _still_ours(group):
                    return
            uid = self.slot_uid(slot)
            if os.geteuid() == 0 and uid is not None and self._latest_attempt(slot) == attempt:
                end_user_processes(uid)
            self._keys.revoke(f"local:{slot}:{attempt}")  # as its session would expire
            gone = workspace.with_name(f".gone-{workspace.name}-{secrets.token_hex(4)}")
            try:
                workspace.rename(gone)
            except FileNotFoundError:
                return
        try:
            remove_tree(gone)
        except OSError as error:
            logger.warning("a stopped task's workspace is left", folder=str(gone), error=str(error))

    def slot_uid(self, slot: str) -> int | None:
        """The uid (and gid) of the slot's own user, once a root runtime gave it one."""
        try:
            return int((self._root / slot / "uid").read_text())
        except (OSError, ValueError):
            return None

    def _allocate_slot_uid(self, slot: str) -> int:
        """The slot's uid: the one it has, else the next this data directory never gave
        that no one else holds, under a lock shared by every runtime on this data directory
        (the gateway's handlers, a CLI). A uid is claimed machine-wide (`_claim`): every
        stack counts from the same base, and two slots of two stacks sharing a uid would
        share a freeze and a stop."""
        given = self.slot_uid(slot)
        if given is not None:
            return given
        with (self._root / ".uids.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            counter = self._root / ".next-uid"
            uid = int(counter.read_text()) if counter.exists() else self._slot_uids_from
            while not self._claim(uid):
                uid += 1
            counter.write_text(str(uid + 1))
            (self._root / slot / "uid").write_text(str(uid))
        return uid

    def _claim(self, uid: int) -> bool:
        """Claims `uid` for this data directory's slots, machine-wide (a file of the uid's
        in UID_CLAIMS, made once, naming the data directory; tmpfs, so a reboot frees
        them). Never a person's or a service's uid (its processes would end with a task's),
        nor one some process runs as, nor one another data directory claimed."""
        if _is_an_account(uid) or uid in _real_uids():
            return False
        self._uid_claims.mkdir(mode=0o700, parents=True, exist_ok=True)
        claim = self._uid_claims / str(uid)
        try:
            descriptor = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                return claim.read_text() == str(self._root)  # ours from an earlier run
            except OSError:
                return False
        with os.fdopen(descriptor, "w") as claimed:
            claimed.write(str(self._root))
        return True

    def _environment(
        self, slot: str, plan: dict[str, str], incarnation: str, workspace: Path
    ) -> dict[str, str]:
        names = (*LOCAL_TASK_ENVIRONMENT, *self._passthrough)
        environment = {name: os.environ[name] for name in names if name in os.environ}
        keys = self._keys.issue(incarnation)
        if self._cores is not None:  # the CPU it may use, as the task definition tells it
            environment["SEEDKEEPER_CPU_UNITS"] = str(len(self._cores) * 1024)
        environment |= plan | {
            "SEEDKEEPER_WORKSPACE": str(workspace),
            "SEEDKEEPER_INCARNATION": incarnation,
            "AWS_ACCESS_KEY_ID": keys.access_key,
            "AWS_SECRET_ACCESS_KEY": keys.secret_key,
        }
        if os.geteuid() == 0:
            uid = str(self._allocate_slot_uid(slot))
            environment |= {"SEEDKEEPER_SLOT_UID": uid, "SEEDKEEPER_SLOT_GID": uid}
        return environment

    def status(self, incarnation: str) -> TaskStatus:
        return self._state(incarnation).status

    def launched_for(self, incarnation: str) -> Launch | None:
        """The attempt a task this runtime launched was for: its incarnation names it, and
        the attempt's record says it was launched."""
        if self._process(incarnation) is None:
            return None
        _, slot, attempt = incarnation.split(":")
        return Launch(slot, int(attempt))

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        return {incarnation: self._state(incarnation) for incarnation in incarnations}

    def _state(self, incarnation: str) -> TaskState:
        """A stopped task's workspace is gone once this answers (`_clear`); why it stopped is
        the exit its reaper kept, when one did."""
        process = self._process(incarnation)
        if process is None:
            return UNKNOWN
        if _is_running(process):
            return RUNNING
        _, slot, attempt = incarnation.split(":")
        self._clear(slot, int(attempt), process)
        return TaskState.stopped(None, self._exit(slot, attempt))

    def _exit(self, slot: str, attempt: str) -> str:
        try:
            returncode = int((self._root / slot / f"attempt-{attempt}.exit").read_text())
        except (OSError, ValueError):
            return "process gone"
        if returncode >= 0:
            return f"exit code {returncode}"
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"

    def stop(self, incarnation: str, grace: float = 5.0) -> None:
        """SIGTERM to the task's process group, SIGKILL after `grace` seconds; returns once
        no process of the group is left (the task's children included), nor of the slot's
        own user (the sandbox leads its own session, and may have left it), and the task's
        workspace is gone."""
        self.stop_tasks([incarnation], grace)

    def crash(self, incarnation: str) -> None:
        """SIGKILL the task's process group with no warning, as a lost host ends a task (the
        demo's and the tests' crash): it writes nothing more. Returns once the group is gone."""
        process = self._process(incarnation)
        if process is None or not _is_running(process):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT
        while _still_ours({process.pid: process.started}) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop_all(self) -> None:
        """Every task this data directory's runtime ever launched (a local stack's exit)."""
        records = sorted(self._root.glob("*/attempt-*.json"))
        attempts = [
            (record.parent.name, record.stem.removeprefix("attempt-")) for record in records
        ]
        incarnations = [f"local:{slot}:{attempt}" for slot, attempt in attempts]
        self.stop_tasks(incarnations, grace=EXIT_GRACE)

    def stop_tasks(self, incarnations: Iterable[str], grace: float) -> None:
        """`stop` for many tasks at once: each is signalled in turn, then all are waited for
        together and cleared together, so stopping a hundred takes about as long as stopping
        one."""
        launched = {
            incarnation: process
            for incarnation in incarnations
            if (process := self._process(incarnation)) is not None
        }
        _end_groups([process for process in launched.values() if _is_running(process)], grace)
        if os.geteuid() == 0:
            slots = {incarnation.split(":")[1] for incarnation in launched}
            given = {uid for uid in map(self.slot_uid, slots) if uid is not None}
            for uid in given & _real_uids():  # one look at /proc, not one for each slot
                end_user_processes(uid)  # a container's end would end them all
        with ThreadPoolExecutor(CLEARED_AT_ONCE) as pool:
            list(pool.map(self._clear_stopped, launched, launched.values()))

    def _clear_stopped(self, incarnation: str, task: _Process) -> None:
        """A stopped task's exit kept and its workspace gone: by its reaper, waited for, when
        this process started it; else here. One still running (it survived SIGKILL) is left
        as `_clear` leaves it."""
        reaper = _reapers.get(task)
        if reaper is not None and not _is_running(task):
            reaper.join()
        _, slot, attempt = incarnation.split(":")
        self._clear(slot, int(attempt), task)

    def _record(self, incarnation: str) -> Path:
        _, slot, attempt = incarnation.split(":")
        folder = self._root / slot
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"attempt-{attempt}.json"

    def _process(self, incarnation: str) -> _Process | None:
        if not re.fullmatch(r"local:[A-Za-z0-9._-]+:\d+", incarnation):
            return None
        try:
            with self._record(incarnation).open() as record:
                fcntl.flock(record, fcntl.LOCK_SH)  # a launch under way writes it first
                text = record.read()
        except FileNotFoundError:
            return None
        if not text:  # its launcher died before starting anything
            return None
        fields = json.loads(text)
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


def _create_locked(path: Path) -> int | None:
    """A descriptor of `path`, newly created and already locked (LOCK_EX), so no reader sees
    it before its writer is done; None when `path` exists. Closing the descriptor unlocks."""
    draft = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    try:
        os.link(draft, path)  # fails if it exists: the one exclusive step
    except FileExistsError:
        os.close(descriptor)
        return None
    finally:
        draft.unlink()
    return descriptor


def _is_running(process: _Process) -> bool:
    return _start_time(process.pid) == process.started and not _is_zombie(process.pid)


def _end_groups(processes: list[_Process], grace: float) -> None:
    """SIGTERM to every group, then SIGKILL to those left after `grace` seconds; returns
    once none is left, or KILL_WAIT seconds after the SIGKILL."""
    left = {process.pid: process.started for process in processes}
    for group in left:
        # What it takes a task to stop, it does at the stack's priority, not the one it
        # yielded to start (only root may raise it back: others stop at their own pace).
        with contextlib.suppress(PermissionError, ProcessLookupError):
            os.setpriority(os.PRIO_PGRP, group, 0)
    for sent, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT)):
        for group in _still_ours(left):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sent)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = {group: left[group] for group in _still_ours(left)}
        if not left:
            return


def _still_ours(groups: dict[int, str]) -> set[int]:
    """The groups (leader pid → its start time) that still have a running process. A group's
    number is free again once its last member is gone: a new process given that pid leads
    a group of the same number, which is not ours (its start time differs), and nothing of
    ours is left in it (Linux never reuses a pid a live group still uses)."""
    members: set[int] = set()
    imposters: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, group = int(stat.parent.name), int(fields[2])
        if pid in groups and fields[19] != groups[pid]:
            imposters.add(pid)
        elif fields[0] != "Z":
            members.add(group)
    return (members & set(groups)) - imposters


def _real_uids() -> set[int]:
    """The real uid of every running process, read as `end_user_processes` reads it."""
    uids = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        if not fields.get("State", "").strip().startswith("Z"):
            uids.add(int(fields["Uid"].split()[0]))
    return uids


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
