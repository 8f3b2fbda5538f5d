"""The sandbox: the run's command, which is the repository's own code (DESIGN §9).

It runs as the slot user, in its own session, with no supplementary group, in the checkout,
with an environment built from an allow-list: no plan, no presigned URL, no AWS or R2
credential, no credentials-endpoint variable. The supervisor that starts it stays root and
makes itself undumpable, so its /proc entries (environ, mem) are closed to the slot user.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from seedkeeper.slot_user import SlotUser

# The supervisor's folder in a workspace (root's: the sandbox cannot write it), and its record
# of the sandbox's session there, so a local runtime can end what the sandbox left running.
STATE_DIR = ".seedkeeper"
SESSION_RECORD = "sandbox.json"
_KILL_ROUNDS = 50  # a session forking while it is killed needs a few rounds, never unbounded

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
        start_new_session=True,
        **dropped,
    )


def end(process: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """SIGTERM the sandbox's process group, SIGKILL it after `grace` seconds. What left the
    group (a new session of its own) is out of reach: the container's end ends it."""
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


def record_session(
    workspace: Path, process: subprocess.Popen[bytes], user: SlotUser | None
) -> None:
    """Where the sandbox's session can be found once the supervisor is gone: its leader's
    pid is the session id, and only processes of the sandbox's user are ever ended."""
    state = workspace / STATE_DIR
    state.mkdir(mode=0o755, exist_ok=True)
    uid = user.uid if user is not None else os.getuid()
    staged = state / f".{SESSION_RECORD}.tmp"
    staged.write_text(json.dumps({"session": process.pid, "uid": uid}))
    staged.replace(state / SESSION_RECORD)


def end_session(workspace: Path) -> None:
    """SIGKILL every process left in the recorded sandbox session that runs as the sandbox's
    user (read from /proc/<pid>/status: an undumpable process's /proc folder looks root's),
    until none is left. The sandbox leads its own session, so ending the task's process
    group leaves it running; a container's end would not."""
    record = workspace / STATE_DIR / SESSION_RECORD
    try:
        fields = json.loads(record.read_text())
        session, uid = int(fields["session"]), int(fields["uid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    for _ in range(_KILL_ROUNDS):
        members = _session_members(session, uid)
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.02)
    record.unlink(missing_ok=True)


def _session_members(session: int, uid: int) -> list[int]:
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            status = (entry / "status").read_text()
        except OSError:
            continue
        real_uid = next(
            (line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), ""
        )
        if fields[0] != "Z" and int(fields[3]) == session and real_uid == str(uid):
            members.append(int(entry.name))
    return members
