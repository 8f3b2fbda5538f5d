"""The sandbox: the run's command, which is the repository's own code (DESIGN §9).

It runs as the slot user, in its own session, with no supplementary group, in the checkout,
with an environment built from an allow-list: no plan, no presigned URL, no AWS or R2
credential, no credentials-endpoint variable. The supervisor that starts it stays root and
makes itself undumpable, so its /proc entries (environ, mem) are closed to the slot user.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from seedkeeper_task.slot_user import SlotUser

# The supervisor's folder in a workspace: root's, searchable only (the marker is root's too).
STATE_DIR = ".seedkeeper"
_LINE = 4096  # bytes of sandbox output per logged line
_KILL_ROUNDS = 50  # a user forking while it is killed needs a few rounds, never unbounded

# Taken from the supervisor's environment when set; nothing else ever is.
SANDBOX_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "TERM", "TZ")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_PR_SET_DUMPABLE = 4


def sandbox_environment(supervisor: Mapping[str, str], home: Path) -> dict[str, str]:
    kept = {name: supervisor[name] for name in SANDBOX_ENVIRONMENT if name in supervisor}
    return {"PATH": _DEFAULT_PATH, **kept, "HOME": str(home)}


def make_undumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): no process of another (or, unprivileged, the same) user
    may read this one's /proc/<pid>/environ or mem, nor ptrace it. The environment the
    process started with stays in its memory even after os.environ drops a variable."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def fresh_home(home: Path, user: SlotUser | None) -> Path:
    """An empty HOME the slot user owns: nothing an earlier run (perhaps another owner's)
    left there is handed on. Its parent must be the supervisor's, so nothing can be
    planted at its name."""
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o700)
    if user is not None:
        os.chown(home, user.uid, user.gid)
    return home


def start(
    command: Sequence[str], *, cwd: Path, home: Path, user: SlotUser | None
) -> subprocess.Popen[bytes]:
    """The sandbox's process, the leader of its own session (no controlling terminal to
    push input into, one process group to end)."""
    dropped = user.subprocess_kwargs() if user is not None else {}
    return subprocess.Popen(
        list(command),
        cwd=cwd,
        env=sandbox_environment(os.environ, home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # relayed (`relay_output`), never the supervisor's own log
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **dropped,
    )


def relay_output(process: subprocess.Popen[bytes], log: Callable[[str], None]) -> threading.Thread:
    """The sandbox's output handed to `log` line by line (at most _LINE bytes each), for the
    supervisor to log as a field of its own events: whatever the sandbox prints, it never
    writes a line of the supervisor's log itself."""

    def pump() -> None:
        assert process.stdout is not None
        while line := process.stdout.readline(_LINE):
            log(line.decode(errors="replace").rstrip("\n"))

    relay = threading.Thread(target=pump, name="sandbox-output", daemon=True)
    relay.start()
    return relay


def end(process: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """SIGTERM the sandbox's process group, SIGKILL it after `grace` seconds. What left the
    group is ended with the rest of the slot user's processes (`end_user_processes`)."""
    for sent, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sent)
        except ProcessLookupError:
            break
        try:
            return process.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


def let_slot_user_reach(folder: Path) -> list[Path]:
    """Give others search (never read) permission on `folder` and each folder above it
    that lacks it, so a slot user can reach its workspace by path (git and HOME need it);
    answer what was changed. Nothing below can be listed through this."""
    changed: list[Path] = []
    for each in reversed([folder, *folder.parents]):
        mode = each.lstat().st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            os.chmod(each, stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append(each)
    return changed


def end_user_processes(uid: int) -> None:
    """SIGKILL every process whose real uid is the slot user's, until none is left. The
    slot user is one slot's alone, so this ends whatever its sandbox left running, however
    it left the sandbox's session (a container's end would end it too), and guarantees no
    process of that user runs while the supervisor works in its tree. Real uid, read from
    /proc/<pid>/status: an undumpable process's /proc folder looks root's, and a setuid
    program run by the slot user keeps the slot user as its real uid."""
    if uid in (0, os.getuid()):
        raise ValueError("the slot user must be neither root nor the supervisor's user")
    for _ in range(_KILL_ROUNDS):
        members = user_processes(uid)
        if not members:
            return
        for pid, _ in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.02)


def user_processes(uid: int) -> list[tuple[int, str]]:
    """(pid, state letter) of each live process whose real uid is `uid`, read from
    /proc/<pid>/status (the uid kill(-1) and permission checks go by; an undumpable
    process's /proc folder looks root's). Zombies and dead ones run nothing: left out."""
    return [(pid, state) for pid, state, _ in _user_statuses(uid)]


def stopped_children_holding_parents(uid: int) -> list[int]:
    """The user's stopped processes whose parent is in uninterruptible sleep ("D"). A
    process that spawned through vfork (dash runs commands so, posix_spawn does) waits
    so until its child execs or exits: stopped before its exec, the child holds its
    parent, which no SIGSTOP reaches until the child goes on."""
    statuses = {pid: (state, parent) for pid, state, parent in _user_statuses(uid)}
    return [
        pid
        for pid, (state, parent) in statuses.items()
        if state in ("T", "t") and statuses.get(parent, ("", 0))[0] == "D"
    ]


def _user_statuses(uid: int) -> list[tuple[int, str, int]]:
    """(pid, state letter, parent pid) of each live process whose real uid is `uid`."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        state = fields.get("State", "").strip()[:1]
        if fields.get("Uid", "").split()[:1] == [str(uid)] and state not in ("Z", "X"):
            found.append((int(entry.name), state, int(fields.get("PPid", "0").strip() or 0)))
    return found
