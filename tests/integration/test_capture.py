"""Freeze, capture and upload with real processes, real squashfs-tools and a real HTTP
server: every process of the slot user stops (even one that left the sandbox's session)
and root's never do; a capture round-trips the checkout, with its `.git/config` scrubbed
and the live one untouched; nothing of a failed capture is left; the upload reports
failures by short reasons, never by its URL."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import SLOT_UIDS_FROM_HERE
from repos import git, make_repository, tree
from seedkeeper_task.capture import (
    LEFT_OUT,
    CaptureFailed,
    FreezeFailed,
    UploadFailed,
    capture,
    freeze,
    thaw,
    upload,
)
from seedkeeper_task.sandbox import end_user_processes, user_processes
from seedkeeper_task.slot_user import SlotUser

# The last uid of this process's range: no local runtime of this process counts that far.
SLOT_UID = SLOT_UIDS_FROM_HERE + 499
TOKEN = "token-" + secrets.token_hex(8)  # a credential planted in the live config

root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="dropping to the slot user needs root (CI runs as root)"
)
pytestmark = pytest.mark.skipif(
    shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None,
    reason="squashfs-tools is not installed (make setup installs it)",
)


@pytest.fixture
def slot() -> Iterator[SlotUser]:
    user = SlotUser(uid=SLOT_UID, gid=SLOT_UID)
    yield user
    end_user_processes(user.uid)


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder the slot user can reach (a test's tmp_path lies under root's 0700 one)."""
    where = Path(tempfile.mkdtemp(prefix="seedkeeper-capture-"))
    where.chmod(0o711)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def state(place: Path) -> Path:
    """The supervisor's state folder: root's, searchable by others."""
    folder = place / "state"
    folder.mkdir(mode=0o711)
    return folder


def give(root: Path, user: SlotUser | None) -> None:
    """Hand a tree to the slot user, as the restore leaves a checkout."""
    if user is None:
        return
    for path in [root, *root.rglob("*")]:
        os.lchown(path, user.uid, user.gid)


def checkout_of(place: Path, user: SlotUser | None) -> Path:
    """A resident's checkout: commits, an uncommitted change, ignored and untracked files,
    an executable, a symlink inside and one pointing outside, a top-level file named
    `config` (only `.git/config` is replaced), a FETCH_HEAD naming a credential."""
    repo = make_repository(place)
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "config").write_text("not git's\n")
    (repo / "passwd").symlink_to("/etc/passwd")
    (repo / ".git" / "FETCH_HEAD").write_text(
        f"abc\t\tbranch 'main' of https://user:{TOKEN}@host/x\n"
    )
    give(repo, user)
    return repo


def config_entries(path: Path) -> list[str]:
    return git(path.parent, "config", "--file", str(path), "--list").splitlines()


def unpack(archive: Path, into: Path) -> Path:
    subprocess.run(
        ["unsquashfs", "-no-progress", "-quiet", "-d", str(into), str(archive)],
        check=True,
        capture_output=True,
    )
    return into


def snapshot(root: Path) -> dict[str, tuple[str, int, str, int, int]]:
    """tree() with each entry's owner and (whole-second) modification time."""
    found = {}
    for name, (kind, mode, content) in tree(root).items():
        info = (root / name).lstat()
        found[name] = (kind, mode, content, info.st_uid, int(info.st_mtime))
    return found


def leftovers(state: Path, target: Path) -> list[str]:
    return sorted(name for name in os.listdir(state) if name != target.name)


def process_state(pid: int) -> str:
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]


def processes_of(uid: int) -> list[int]:
    return [pid for pid, _ in user_processes(uid)]


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    until = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < until, "timed out"
        time.sleep(0.02)


# -- freeze and thaw -------------------------------------------------------------------------


@root_only
def test_freeze_stops_every_process_of_the_slot_user_and_thaw_resumes_them(
    slot: SlotUser,
) -> None:
    sandbox = subprocess.Popen(
        ["/bin/sh", "-c", "setsid sleep 600 & exec sleep 601"],
        cwd="/",
        start_new_session=True,
        **slot.subprocess_kwargs(),
    )
    bystander = subprocess.Popen(["sleep", "600"])  # root's, like the supervisor
    try:
        wait_for(lambda: len(processes_of(slot.uid)) == 2)
        (escaped,) = [pid for pid in processes_of(slot.uid) if pid != sandbox.pid]
        wait_for(lambda: os.getsid(escaped) == escaped)  # it left the sandbox's session
        assert os.getsid(sandbox.pid) == sandbox.pid

        freeze(slot, sandbox.pid)

        assert {process_state(pid) for pid in (sandbox.pid, escaped)} == {"T"}
        assert process_state(bystander.pid) != "T"
        assert process_state(os.getpid()) != "T"

        thaw(slot, sandbox.pid)

        wait_for(lambda: "T" not in {process_state(pid) for pid in (sandbox.pid, escaped)})
    finally:
        bystander.kill()
        bystander.wait()
        end_user_processes(slot.uid)
        sandbox.wait()


@root_only
def test_thaw_resumes_nothing_in_the_supervisors_session_that_is_not_the_slot_users(
    slot: SlotUser,
) -> None:
    """kill(2) lets SIGCONT reach any process in the sender's session, whoever owns it: a
    helper in the supervisor's session (the local stack's, a terminal's) would resume what
    was stopped there (a job suspended with Ctrl-Z, another slot's supervisor stopped for a
    debugger). The helper signals from a session of its own."""
    sandbox = subprocess.Popen(
        ["sleep", "600"], cwd="/", start_new_session=True, **slot.subprocess_kwargs()
    )
    suspended = subprocess.Popen(["sleep", "600"])  # root's, in this test's session
    try:
        wait_for(lambda: processes_of(slot.uid) == [sandbox.pid])
        os.kill(suspended.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(suspended.pid) == "T")
        assert os.getsid(suspended.pid) == os.getsid(0)

        freeze(slot, sandbox.pid)
        thaw(slot, sandbox.pid)

        wait_for(lambda: process_state(sandbox.pid) != "T")
        time.sleep(0.2)  # a SIGCONT would have landed by now
        assert process_state(suspended.pid) == "T"
    finally:
        suspended.kill()
        suspended.wait()
        end_user_processes(slot.uid)
        sandbox.wait()


# A process that spawns through vfork (dash runs commands so; posix_spawn does) waits in
# uninterruptible sleep until its child execs. Here the child opens a FIFO before its exec
# (a posix_spawn file action), which blocks until a reader comes: the freeze stops the
# child first, and its parent can stop only once the child goes on to exec.
VFORK_SANDBOX = """
import os, sys
os.posix_spawn("/bin/true", ["true"], {}, file_actions=[
    (os.POSIX_SPAWN_OPEN, 1, sys.argv[1], os.O_WRONLY, 0)])
"""


@root_only
def test_freeze_lets_a_stopped_vfork_child_go_on_so_that_its_parent_stops(
    slot: SlotUser, place: Path
) -> None:
    fifo = place / "fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o666)  # the slot user writes it
    sandbox = subprocess.Popen(
        ["/usr/bin/python3", "-c", VFORK_SANDBOX, str(fifo)],
        cwd="/",
        start_new_session=True,
        **slot.subprocess_kwargs(),
    )
    try:
        wait_for(lambda: len(processes_of(slot.uid)) == 2)
        (child,) = [pid for pid in processes_of(slot.uid) if pid != sandbox.pid]
        wait_for(lambda: process_state(sandbox.pid) == "D")  # held by its child
        # The FIFO's reader comes once the freeze has stopped the child (root's, so the
        # freeze leaves it running).
        reader = subprocess.Popen(
            ["/bin/sh", "-c", f"sleep 1; cat {fifo}"], stdout=subprocess.DEVNULL
        )
        freeze(slot, sandbox.pid, timeout=8)

        assert [state for _, state in user_processes(slot.uid)] == ["T"]
        assert process_state(sandbox.pid) == "T"
        assert reader.wait(5) == 0  # the child reached its exec
        thaw(slot, sandbox.pid)
        assert sandbox.wait(5) == 0
        assert child not in processes_of(slot.uid)
    finally:
        end_user_processes(slot.uid)
        sandbox.wait()


@root_only
def test_freeze_and_thaw_with_no_process_of_the_slot_user_left(slot: SlotUser) -> None:
    assert processes_of(slot.uid) == []
    freeze(slot, None)
    thaw(slot, None)


@root_only
def test_freeze_refuses_root_as_the_slot_user() -> None:
    with pytest.raises(ValueError, match="neither root"):
        freeze(SlotUser(uid=0, gid=0), None)


def test_without_a_slot_user_freeze_stops_the_sandboxs_process_group() -> None:
    sandbox = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        freeze(None, sandbox.pid)
        wait_for(lambda: process_state(sandbox.pid) == "T")
        assert process_state(os.getpid()) != "T"
        thaw(None, sandbox.pid)
        wait_for(lambda: process_state(sandbox.pid) != "T")
    finally:
        sandbox.kill()
        sandbox.wait()
    freeze(None, sandbox.pid)  # a group that has ended: nothing to freeze
    freeze(None, None)
    thaw(None, None)


def test_freeze_failed_carries_its_reason() -> None:
    failed = FreezeFailed("freeze-incomplete", "1 process(es) still running")
    assert (failed.reason, str(failed)) == (
        "freeze-incomplete",
        "freeze-incomplete: 1 process(es) still running",
    )


# -- capture ---------------------------------------------------------------------------------


@root_only
def test_a_capture_round_trips_the_checkout(place: Path, state: Path, slot: SlotUser) -> None:
    repo = checkout_of(place, slot)
    before = snapshot(repo)
    config_before = config_entries(repo / ".git" / "config")
    target = state / "7.sqsh"

    captured = capture(repo, target, user=slot, timeout=60)

    data = target.read_bytes()
    assert captured.path == target
    assert captured.size == len(data)
    assert captured.sha256 == hashlib.sha256(data).hexdigest()
    assert captured.md5 == hashlib.md5(data, usedforsecurity=False).hexdigest()
    assert captured.scrubbed == ()
    info = target.lstat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o600)
    assert leftovers(state, target) == []
    assert snapshot(repo) == before  # the live checkout is untouched

    copy = unpack(target, place / "unpacked")
    restored = snapshot(copy)
    # Left out: FETCH_HEAD names a credential; git init made an empty legacy `branches`.
    assert {".git/FETCH_HEAD", ".git/branches"} <= set(before)
    assert not set(LEFT_OUT) & set(restored)
    expected = {name: entry for name, entry in before.items() if name not in LEFT_OUT}
    restored_config, live_config = restored.pop(".git/config"), expected.pop(".git/config")
    assert restored == expected  # contents, modes, symlink targets, owners, times
    assert restored["passwd"][:3] == ("link", 0, "/etc/passwd")  # kept as a link
    assert restored["src/tool.sh"][1] & 0o111
    assert restored_config[1] == live_config[1]  # the config keeps its mode and owner
    assert restored_config[3] == live_config[3] == slot.uid
    assert config_entries(copy / ".git" / "config") == config_before
    for status in (["status", "--porcelain"], ["status", "--porcelain", "--ignored"]):
        assert git(copy, *status) == git(repo, *status)
    assert git(repo, "status", "--porcelain", "--ignored")  # there is work to compare


def test_a_capture_as_the_supervisors_own_user(place: Path, state: Path) -> None:
    """An unprivileged developer's stack: no slot user, the same round trip."""
    repo = checkout_of(place, None)
    target = state / "1.sqsh"

    captured = capture(repo, target, user=None, timeout=60)

    assert captured.size == target.stat().st_size
    copy = unpack(target, place / "unpacked")
    assert git(copy, "status", "--porcelain", "--ignored") == git(
        repo, "status", "--porcelain", "--ignored"
    )


def test_a_capture_runs_as_many_threads_as_it_is_given_in_1_mib_blocks(
    place: Path, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's vCPUs bound mksquashfs's threads (a Fargate task sees more processors
    than its quota lets it use); squashfs's largest block makes the capture smaller."""
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(list(argv))
        return real_popen(argv, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    target = state / "1m.sqsh"

    capture(checkout_of(place, None), target, user=None, timeout=60, processors=1)

    (mksquashfs,) = [argv for argv in started if argv[0] == "mksquashfs"]
    assert mksquashfs[mksquashfs.index("-processors") + 1] == "1"
    superblock = subprocess.run(
        ["unsquashfs", "-s", str(target)], capture_output=True, check=True, text=True
    ).stdout
    assert "Block size 1048576" in superblock
    with pytest.raises(ValueError, match="processors"):
        capture(place, state / "none.sqsh", user=None, timeout=60, processors=0)


@root_only
def test_credentials_are_scrubbed_from_the_capture_and_kept_in_the_live_config(
    place: Path, state: Path, slot: SlotUser
) -> None:
    repo = checkout_of(place, None)
    git(repo, "remote", "add", "origin", f"https://user:{TOKEN}@host/x")
    git(repo, "config", "http.extraheader", f"AUTHORIZATION: bearer {TOKEN}")
    git(repo, "config", "credential.helper", f"store --file /tmp/{TOKEN}")
    give(repo, slot)
    live = repo / ".git" / "config"
    live_bytes, live_info = live.read_bytes(), live.lstat()

    captured = capture(repo, state / "2.sqsh", user=slot, timeout=60)

    assert live.read_bytes() == live_bytes
    assert (live.lstat().st_mtime_ns, live.lstat().st_ino) == (
        live_info.st_mtime_ns,
        live_info.st_ino,
    )
    assert TOKEN.encode() in live_bytes
    assert sorted(captured.scrubbed) == [
        "credential.helper",
        "http.extraheader",
        "remote.origin.url",
    ]
    copy = unpack(captured.path, place / "unpacked")
    entries = config_entries(copy / ".git" / "config")
    assert "remote.origin.url=https://host/x" in entries
    assert not [entry for entry in entries if entry.startswith(("credential.", "http."))]
    assert [
        path for path in copy.rglob("*") if path.is_file() and TOKEN.encode() in path.read_bytes()
    ] == []


@root_only
def test_a_checkout_without_a_config_is_captured_without_one(
    place: Path, state: Path, slot: SlotUser
) -> None:
    repo = checkout_of(place, slot)
    (repo / ".git" / "config").unlink()

    captured = capture(repo, state / "3.sqsh", user=slot, timeout=60)

    copy = unpack(captured.path, place / "unpacked")
    assert not os.path.lexists(copy / ".git" / "config")
    assert (copy / "README.md").read_text() == "# widgets\n"


def root_secret(place: Path) -> Path:
    secret = place / "root-secret"
    secret.write_text(f"[core]\n\tsecret = {TOKEN}\n")
    secret.chmod(0o600)
    return secret


@root_only
@pytest.mark.parametrize("how", ["symlink", "hard link"])
def test_a_config_leading_to_a_root_only_file_is_refused_and_never_read(
    place: Path, state: Path, slot: SlotUser, how: str
) -> None:
    """A symlink fails the restore's layout check. A hard link (root made it here; the
    kernel's protected_hardlinks stops the slot user) looks like a regular file: git reads
    it as the slot user, who may not, so it cannot be parsed."""
    repo = checkout_of(place, slot)
    config = repo / ".git" / "config"
    config.unlink()
    if how == "symlink":
        config.symlink_to(root_secret(place))
    else:
        os.link(root_secret(place), config)
    target = state / "4.sqsh"

    with pytest.raises(CaptureFailed) as failed:
        capture(repo, target, user=slot, timeout=60)

    assert failed.value.reason == "unsafe-repository"
    assert TOKEN not in str(failed.value)
    assert not os.path.lexists(target)
    assert leftovers(state, target) == []


@root_only
def test_a_root_only_file_linked_into_the_worktree_fails_the_capture(
    place: Path, state: Path, slot: SlotUser
) -> None:
    """mksquashfs runs as the slot user: what that user cannot read never enters a capture,
    and a file it cannot read fails the capture rather than being stored empty."""
    repo = checkout_of(place, slot)
    os.link(root_secret(place), repo / "harvested")
    target = state / "5.sqsh"

    with pytest.raises(CaptureFailed) as failed:
        capture(repo, target, user=slot, timeout=60)

    assert failed.value.reason == "capture-failed"
    assert "harvested" in failed.value.detail
    assert not os.path.lexists(target)
    assert leftovers(state, target) == []


@root_only
@pytest.mark.parametrize("layout", ["symlink", "gitfile"])
def test_a_git_directory_the_restore_would_refuse_is_not_captured(
    place: Path, state: Path, slot: SlotUser, layout: str
) -> None:
    repo = checkout_of(place, slot)
    real = repo.parent / "elsewhere.git"
    (repo / ".git").rename(real)
    if layout == "symlink":
        (repo / ".git").symlink_to(real)
    else:
        (repo / ".git").write_text(f"gitdir: {real}\n")
    target = state / "6.sqsh"

    with pytest.raises(CaptureFailed) as failed:
        capture(repo, target, user=slot, timeout=60)

    assert failed.value.reason == "unsafe-repository"
    assert not os.path.lexists(target)
    assert leftovers(state, target) == []


@pytest.fixture
def big_checkout(place: Path, slot: SlotUser) -> Path:
    """A checkout mksquashfs does not finish at once (64 MiB, incompressible)."""
    repo = checkout_of(place, None)
    with (repo / "random.bin").open("wb") as big:
        for _ in range(64):
            big.write(os.urandom(1024 * 1024))
    give(repo, slot if os.geteuid() == 0 else None)
    return repo


def user_here(slot: SlotUser) -> SlotUser | None:
    return slot if os.geteuid() == 0 else None


def test_a_capture_past_its_timeout_leaves_nothing(
    big_checkout: Path, state: Path, slot: SlotUser
) -> None:
    """mksquashfs is stopped (SIGSTOP) as soon as it starts, so the deadline passes while
    it runs whatever the machine's speed; a capture that never gave up would hang until
    pytest-timeout fails the test."""
    target = state / "8.sqsh"
    stalled = threading.Event()

    def stall_mksquashfs() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for pid, _ in user_processes(slot.uid if os.geteuid() == 0 else os.getuid()):
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "mksquashfs":
                        os.kill(pid, signal.SIGSTOP)
                        stalled.set()
                        return
            time.sleep(0.002)

    staller = threading.Thread(target=stall_mksquashfs)
    staller.start()
    with pytest.raises(CaptureFailed) as failed:
        capture(big_checkout, target, user=user_here(slot), timeout=2)
    staller.join()

    assert stalled.is_set()  # mksquashfs stopped for good: only the timeout could end it
    assert failed.value.reason == "capture-timeout"
    assert not os.path.lexists(target)
    assert leftovers(state, target) == []
    assert processes_of(slot.uid) == []  # mksquashfs was killed and reaped


def test_a_cancelled_capture_leaves_nothing(
    big_checkout: Path, state: Path, slot: SlotUser
) -> None:
    target = state / "9.sqsh"
    cancel = threading.Event()

    def cancel_once_writing() -> None:
        wait_for(lambda: list(state.glob(".9.sqsh.capture-*/capture.sqsh")))
        cancel.set()

    canceller = threading.Thread(target=cancel_once_writing)
    canceller.start()
    with pytest.raises(CaptureFailed) as failed:
        capture(big_checkout, target, user=user_here(slot), timeout=60, cancel=cancel)
    canceller.join()

    assert failed.value.reason == "capture-cancelled"
    assert not os.path.lexists(target)
    assert leftovers(state, target) == []
    assert processes_of(slot.uid) == []


def test_a_capture_larger_than_allowed_leaves_nothing(
    big_checkout: Path, state: Path, slot: SlotUser
) -> None:
    target = state / "10.sqsh"

    with pytest.raises(CaptureFailed) as failed:
        capture(big_checkout, target, user=user_here(slot), timeout=60, max_bytes=1024 * 1024)

    assert failed.value.reason == "too-large"
    assert not os.path.lexists(target)
    assert leftovers(state, target) == []


def test_a_cancel_set_before_the_capture_starts_nothing(place: Path, state: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CaptureFailed) as failed:
        capture(checkout_of(place, None), state / "11.sqsh", user=None, timeout=60, cancel=cancel)
    assert failed.value.reason == "capture-cancelled"
    assert os.listdir(state) == []


# -- upload ----------------------------------------------------------------------------------

SIGNATURE = "X-Amz-Signature=" + secrets.token_hex(16)  # the URL's bearer credential
# How long a stalling server holds a request unless the test ends first; an upload's socket
# timeout outlasts it, so one still blocked then is ended by the server giving up
# (`outwaited`), never by its cancel.
STALL = 30.0


class Recorder(ThreadingHTTPServer):
    """Answers a PUT as `mode` says, and records what it was sent."""

    daemon_threads = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.release = threading.Event()
        self.outwaited = 0  # stalls that lasted until the server gave up

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/checkpoints/s/i/7.sqsh?{SIGNATURE}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_PUT(self) -> None:
        mode, length = self.server.mode, int(self.headers["Content-Length"])
        if mode == "close-mid-body":
            self.rfile.read(length // 4)
            self.close_connection = True
            self.connection.close()  # unread bytes pending: the peer sees a reset
            return
        if mode == "stall":
            if not self.server.release.wait(STALL):
                self.server.outwaited += 1
            return
        body = self.rfile.read(length)
        self.server.requests.append((self.command, self.path, dict(self.headers), body))
        answers = {
            "ok": (200, b""),
            "forbidden": (403, b"<Error><Code>AccessDenied</Code></Error>"),
            "bad-digest": (400, b"<?xml version='1.0'?><Error><Code>BadDigest</Code></Error>"),
        }
        status, answer = answers[mode]
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Callable[[str], Recorder]]:
    started: list[Recorder] = []

    def start(mode: str) -> Recorder:
        server = Recorder(mode)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.release.set()
        server.shutdown()
        server.server_close()


def payload(place: Path, size: int) -> Path:
    path = place / "payload.sqsh"
    path.write_bytes(os.urandom(size))
    return path


def assert_no_url(failed: UploadFailed) -> None:
    shown = "".join(traceback.format_exception(failed)) + repr(failed)
    assert SIGNATURE not in shown
    assert "checkpoints/s/i" not in shown


def test_an_upload_puts_the_file_with_the_given_headers(
    place: Path, serve: Callable[[str], Recorder]
) -> None:
    server = serve("ok")
    path = payload(place, 3 * 1024 * 1024 + 17)
    headers = {"x-amz-checksum-sha256": "abc=", "Content-Type": "application/octet-stream"}

    upload(server.url(), path, headers, size=path.stat().st_size, timeout=10)

    ((method, request_path, received, body),) = server.requests
    assert (method, body) == ("PUT", path.read_bytes())
    assert request_path == f"/checkpoints/s/i/7.sqsh?{SIGNATURE}"
    assert received["x-amz-checksum-sha256"] == "abc="
    assert received["Content-Type"] == "application/octet-stream"
    assert received["Content-Length"] == str(path.stat().st_size)
    assert "Accept-Encoding" not in received


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("forbidden", "http-403-AccessDenied"), ("bad-digest", "http-400-BadDigest")],
)
def test_an_upload_refused_names_the_status_and_the_stores_code(
    place: Path, serve: Callable[[str], Recorder], mode: str, reason: str
) -> None:
    server = serve(mode)
    path = payload(place, 1024)

    with pytest.raises(UploadFailed) as failed:
        upload(server.url(), path, {}, size=1024, timeout=10)

    assert failed.value.reason == reason
    assert_no_url(failed.value)


def test_a_server_closing_mid_body_fails_the_upload(
    place: Path, serve: Callable[[str], Recorder]
) -> None:
    server = serve("close-mid-body")
    path = payload(place, 16 * 1024 * 1024)

    with pytest.raises(UploadFailed) as failed:
        upload(server.url(), path, {}, size=path.stat().st_size, timeout=10)

    assert failed.value.reason == "connection-failed"
    assert_no_url(failed.value)


def test_an_upload_to_nobody_fails_to_connect(place: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    # closed again: nothing listens there
    path = payload(place, 10)
    url = f"http://127.0.0.1:{port}/checkpoints/s/i/7.sqsh?{SIGNATURE}"

    with pytest.raises(UploadFailed) as failed:
        upload(url, path, {}, size=10, timeout=5)

    assert failed.value.reason == "connection-failed"
    assert_no_url(failed.value)


def test_a_cancelled_upload_stops_even_while_the_server_stalls(
    place: Path, serve: Callable[[str], Recorder]
) -> None:
    server = serve("stall")
    path = payload(place, 64 * 1024 * 1024)  # more than the socket buffers hold
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()

    with pytest.raises(UploadFailed) as failed:
        upload(server.url(), path, {}, size=path.stat().st_size, timeout=2 * STALL, cancel=cancel)

    assert failed.value.reason == "cancelled"
    assert server.outwaited == 0  # ended by the cancel while the server still stalled


def test_an_upload_of_a_file_of_another_size_sends_nothing(
    place: Path, serve: Callable[[str], Recorder]
) -> None:
    server = serve("ok")
    path = payload(place, 100)

    with pytest.raises(UploadFailed) as failed:
        upload(server.url(), path, {}, size=101, timeout=5)

    assert failed.value.reason == "size-mismatch"
    assert server.requests == []


def test_a_malformed_url_is_refused_without_being_shown(place: Path) -> None:
    path = payload(place, 10)
    with pytest.raises(UploadFailed) as failed:
        upload(f"ftp://host/x?{SIGNATURE}", path, {}, size=10, timeout=5)
    assert failed.value.reason == "bad-url"
    assert_no_url(failed.value)
