"""Freeze the sandbox, capture the checkout as a squashfs, upload it (DESIGN §10, step 2-3).

- `freeze` stops every process of the slot user, not only the sandbox's process group (a
  process may leave it with setsid): a short-lived helper running AS the slot user, in a
  session of its own, sends SIGSTOP to -1, which reaches every process that user may
  signal except the helper itself; the supervisor is root and is spared. Then it waits
  until each of them is seen stopped, and syncs. `thaw` sends SIGCONT the same way.
- `capture` runs mksquashfs as the slot user (least privilege on hostile data, like the
  restore's unsquashfs: a hard link to a root-only file cannot be read into a capture),
  with the checkout's `.git/config` left out and a credential-free rendering of it put in
  its place (a pseudo file), so the live config, which the sandbox owns, is never touched.
- `upload` streams the file in one HTTP(S) PUT to a presigned URL. The URL is a bearer
  credential: no exception or log line carries it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import io
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from seedkeeper.errors import SeedkeeperError
from seedkeeper_task.restore.repository import (
    FETCH_HEAD,
    SafeGit,
    UnsafeRepository,
    check_layout,
    credential_findings,
    empty_home,
    read_config,
    render_config,
    repository_format,
    without_credentials,
)
from seedkeeper_task.sandbox import stopped_children_holding_parents, user_processes
from seedkeeper_task.slot_user import SlotUser

__all__ = [
    "CaptureFailed",
    "Captured",
    "FreezeFailed",
    "UploadFailed",
    "capture",
    "freeze",
    "thaw",
    "upload",
]

MIB = 1024 * 1024
CHUNK_BYTES = MIB  # one read, one hash update, one send: the whole buffer

# -exit-on-error: without it mksquashfs skips a directory it cannot open and stores an
# unreadable file as an EMPTY file, exiting 0 (4.5.1 and 4.6.1 alike): a capture that
# silently lost work. -no-xattrs: the restore keeps only user.* ones, and a capture needs
# none. Owners, modes, symlinks (never followed), fifos and hard links are kept as they are.
# zstd level 3, not mksquashfs's 15: measured on the 300 MB benchmark tree, 2.1 s for
# 309 MB against 24.6 s for 299 MB; a checkpoint races a platform's stop timeout. -b 1M,
# squashfs's largest block, not 128K: 12 % less to upload and hash (277.5 MB against
# 315.1 MB for that tree); its mksquashfs is faster at 1 vCPU (5.4 s against 5.8 s) and
# slower at 2 (3.8 s against 3.2 s), which the smaller upload repays on a 1 Gbit/s link
# (RELIABILITY.md, "Checkpoint, 300 MB"). -mem: mksquashfs's caches default to a quarter of
# memory (664 MB at 300 MB), the same speed at 128 MiB, and a task must keep room for its
# sandbox.
_MKSQUASHFS_OPTIONS = (
    "-comp",
    "zstd",
    "-Xcompression-level",
    "3",
    "-b",
    "1M",
    "-mem",
    "128M",
    "-noappend",
    "-no-progress",
    "-quiet",
    "-no-xattrs",
    "-exit-on-error",
)
GIT_CONFIG = ".git/config"
# Left out of a capture unread: each may name a credential (FETCH_HEAD's lines carry the
# fetched URL; a per-worktree config is not scrubbed; legacy remote definitions), and the
# restore's `make_safe` removes every one of them anyway, so a resume loses nothing.
LEFT_OUT = tuple(f".git/{name}" for name in (FETCH_HEAD, "config.worktree", "remotes", "branches"))
_OUTPUT = "capture.sqsh"
_SCRUBBED = "config"
_STDERR_TAIL = 600
_POLL = 0.05  # how often a wait looks at the cancel event, the deadline and the size
_FREEZE_TIMEOUT = 10.0
_HELPER_TIMEOUT = 10.0
_ERROR_BODY_BYTES = 64 * 1024
_S3_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")
_HELPER_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


class FreezeFailed(SeedkeeperError):
    """The signalling helper failed, or a process of the slot user did not stop in time.
    `reason`: "freeze-failed", "freeze-incomplete" or "thaw-failed"."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f": {detail}" if detail else ""))
        self.reason = reason
        self.detail = detail


class CaptureFailed(SeedkeeperError):
    """No capture was made, and nothing of the attempt is left on disk. `reason` is a short
    token: "capture-timeout", "capture-cancelled", "capture-failed" (mksquashfs failed;
    `detail` is its stderr tail), "too-large", "unsafe-repository" (a checkout the restore
    would refuse; `detail` names the layout or key, never a value), "hash-failed"."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f": {detail}" if detail else ""))
        self.reason = reason
        self.detail = detail


class UploadFailed(SeedkeeperError):
    """The PUT did not succeed. `reason`: "http-<status>" (with "-<Code>" when an S3 error
    body names one, e.g. "http-400-BadDigest"), "connection-failed", "timeout",
    "cancelled", "bad-url", "size-mismatch", "read-failed". Never the URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"upload failed: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Captured:
    path: Path
    size: int
    sha256: str  # hex
    md5: str  # hex: what an S3-compatible ETag of a single-part PUT is
    scrubbed: tuple[str, ...] = ()  # credentials left out of the captured config (names only)


# -- freeze and thaw -------------------------------------------------------------------------


def freeze(user: SlotUser | None, group: int | None, *, timeout: float = _FREEZE_TIMEOUT) -> None:
    """Stop the sandbox, then sync (the flush is part of the freeze: when this returns,
    nothing of the slot user runs and what it wrote is on disk).

    With a slot user: every process of that user, wherever its session, through a helper
    running as the user; then wait (at most `timeout` s, re-sending each round) until each
    is seen stopped: a process in uninterruptible sleep stops only when it leaves it, and
    a vfork child stopped before its exec is let go so that its parent can leave it.
    Without one (an unprivileged developer's stack, where the sandbox runs as the
    supervisor's own user and kill(-1) would stop the supervisor's siblings): SIGSTOP to
    the sandbox's process group only. Neither: nothing to freeze.

    `group` matters only without a slot user. Raises FreezeFailed; the caller should
    `thaw` then, since some processes may be stopped."""
    if user is not None:
        _check_slot_uid(user.uid)
        deadline = time.monotonic() + timeout
        while running := _running(user.uid):
            if time.monotonic() >= deadline:
                raise FreezeFailed("freeze-incomplete", f"{len(running)} process(es) still running")
            _signal_all(user, signal.SIGSTOP, "freeze-failed")
            time.sleep(_POLL)
            _let_go(user, stopped_children_holding_parents(user.uid))  # stopped next round
    elif group is not None:
        with contextlib.suppress(ProcessLookupError):  # the group has ended: nothing runs
            os.killpg(group, signal.SIGSTOP)
    os.sync()


def thaw(user: SlotUser | None, group: int | None) -> None:
    """SIGCONT to the same set of processes `freeze` stopped."""
    if user is not None:
        _check_slot_uid(user.uid)
        _signal_all(user, signal.SIGCONT, "thaw-failed")
    elif group is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)


def _check_slot_uid(uid: int) -> None:
    # kill(-1) as root, or as the supervisor's own user, would stop the supervisor's world.
    if uid in (0, os.getuid()):
        raise ValueError("the slot user must be neither root nor the supervisor's user")


def _signal_all(user: SlotUser, sent: signal.Signals, reason: str) -> None:
    """kill(-1, sent) as the slot user: the kernel lets it reach only that user's own
    processes, never root's."""
    if not user_processes(user.uid):
        return  # kill(-1) would fail with ESRCH, and no process of the user can appear
    try:
        done = _kill_as(user, sent, ["-1"])
    except (OSError, subprocess.SubprocessError) as failed:
        raise FreezeFailed(reason, type(failed).__name__) from None
    if done.returncode != 0 and user_processes(user.uid):  # ESRCH: all exited meanwhile
        tail = os.fsdecode(done.stderr).strip()[-_STDERR_TAIL:]
        raise FreezeFailed(reason, f"helper exited {done.returncode}: {tail}")


def _let_go(user: SlotUser, pids: list[int]) -> None:
    """SIGCONT to these processes, as the slot user (a pid reused meanwhile by another
    user's process is never signalled). Best effort: one that has exited is no matter,
    and the freeze's next round looks again."""
    if pids:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _kill_as(user, signal.SIGCONT, [str(pid) for pid in pids])


def _kill_as(
    user: SlotUser, sent: signal.Signals, targets: list[str]
) -> subprocess.CompletedProcess[bytes]:
    """/bin/sh's builtin kill, run as the slot user: the supervisor's interpreter may not be
    reachable by the slot user (a virtualenv under root's home). In a session of its own:
    kill(2) lets SIGCONT reach every process of the sender's session, whoever owns it, and
    the supervisor's session is the local stack's (a terminal's), not the slot's."""
    script = f'kill -s {sent.name.removeprefix("SIG")} -- "$@"'
    return subprocess.run(
        ["/bin/sh", "-c", script, "kill", *targets],
        cwd="/",
        env=_HELPER_ENVIRONMENT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=_HELPER_TIMEOUT,
        check=False,
        start_new_session=True,
        **user.subprocess_kwargs(),
    )


def _running(uid: int) -> list[int]:
    """The user's processes not yet stopped ("T", or "t" when traced)."""
    return [pid for pid, state in user_processes(uid) if state not in ("T", "t")]


# -- capture ---------------------------------------------------------------------------------


def capture(
    checkout: Path,
    target: Path,
    *,
    user: SlotUser | None,
    timeout: float,
    cancel: threading.Event | None = None,
    max_bytes: int | None = None,
    processors: int | None = None,
) -> Captured:
    """Capture `checkout` (worktree, `.git`, untracked and ignored files, modes, owners,
    symlinks as links) into `target`, a zstd squashfs, and measure it.

    The checkout must already be frozen. It is checked as the restore will check it
    (`check_layout`, `repository_format`): a capture the restore would refuse is refused
    now ("unsafe-repository"), so a slot is never parked on an unusable checkpoint.
    Its `.git/config` is read as the slot user (by git, includes never followed) and
    captured scrubbed (`without_credentials`, `render_config`: comments and layout are not
    kept); absent, none is captured. `LEFT_OUT` files are not captured.

    Protection: mksquashfs runs as the slot user in a fresh folder beside `target`,
    `.<name>.capture-<128-bit token>`, mode 0700 and the slot user's (it must write there);
    the scrubbed config is written there by root. When mksquashfs has exited, the output is
    opened without following links, checked (a regular file of the slot user with one
    link), made root's with mode 0600 through that descriptor, hashed through it, and
    renamed to `target`: after that the slot user can neither change nor read it. The
    folder is then removed. `target`'s parent must be root's, writable by no one else, and
    searchable by the slot user (the supervisor's 0711 state directory is).

    Hashing (sha256 and md5, one pass, 1 MiB reads) follows mksquashfs rather than
    running while it writes: mksquashfs seeks back to write its superblock and tables,
    so its output cannot be streamed or hashed as it is produced.

    `timeout` (seconds) bounds the whole call; `cancel` is looked at every 50 ms; the
    output may grow to `max_bytes`; mksquashfs runs `processors` compressing threads (None:
    one per processor it sees). On every failure mksquashfs (its whole process group)
    is killed and reaped and the folder removed: no partial file is left."""
    deadline = time.monotonic() + timeout
    if user is not None:
        _check_slot_uid(user.uid)
    if processors is not None and processors < 1:
        raise ValueError("processors must be at least 1")
    _stop_if(cancel, deadline)
    try:
        check_layout(checkout)
    except UnsafeRepository as unsafe:
        raise CaptureFailed("unsafe-repository", str(unsafe)) from None
    work = target.with_name(f".{target.name[:128]}.capture-{secrets.token_hex(16)}")
    # mkdir is exclusive: the folder is fresh, never a planted one.
    work.mkdir(mode=0o700)
    try:
        if user is not None:
            os.chown(work, user.uid, user.gid)
        scrubbed, pseudo = _scrubbed_config(checkout, work, user, deadline)
        output = work / _OUTPUT
        argv = ["mksquashfs", str(checkout), str(output), *_MKSQUASHFS_OPTIONS]
        if processors is not None:
            argv += ["-processors", str(processors)]
        if pseudo is not None:
            argv += ["-p", pseudo]
        argv += ["-e", GIT_CONFIG, *LEFT_OUT]  # last: -e takes every argument after it
        _mksquashfs(argv, output, user=user, deadline=deadline, cancel=cancel, max_bytes=max_bytes)
        size, sha256, md5 = _seal_and_hash(output, user, deadline, cancel)
        os.replace(output, target)
    except subprocess.TimeoutExpired:
        raise CaptureFailed("capture-timeout") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Captured(target, size, sha256, md5, scrubbed)


def _stop_if(cancel: threading.Event | None, deadline: float) -> None:
    if cancel is not None and cancel.is_set():
        raise CaptureFailed("capture-cancelled")
    if time.monotonic() >= deadline:
        raise CaptureFailed("capture-timeout")


def _scrubbed_config(
    checkout: Path, work: Path, user: SlotUser | None, deadline: float
) -> tuple[tuple[str, ...], str | None]:
    """The credentials dropped (names) and the pseudo file definition that puts the
    scrubbed config in the capture (None: the checkout has no config). git reads the live
    file as the slot user: if it were swapped for a link after `check_layout`, only what
    that user may read could be reached, and only a parseable config is ever written."""
    live = checkout / GIT_CONFIG
    if not os.path.lexists(live):
        return (), None
    with empty_home() as home:
        git = SafeGit(
            checkout,
            ceiling=checkout,
            home=home,
            user=user,
            timeout=max(0.0, deadline - time.monotonic()),
        )
        try:
            entries = read_config(git, live)
            repository_format(entries)
            text = render_config(without_credentials(entries))
        except (UnsafeRepository, ValueError) as unsafe:
            raise CaptureFailed("unsafe-repository", str(unsafe)) from None
    original = live.lstat()
    scrubbed = work / _SCRUBBED
    descriptor = os.open(scrubbed, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "w") as scrubbed_file:
        scrubbed_file.write(text)
    # mksquashfs runs a pseudo file's command with /bin/sh: the path is quoted.
    mode = f"{stat.S_IMODE(original.st_mode) & 0o777:o}"
    owner = f"{original.st_uid} {original.st_gid}"
    pseudo = f"{GIT_CONFIG} f {mode} {owner} cat {shlex.quote(str(scrubbed))}"
    return tuple(credential_findings(entries)), pseudo


def _mksquashfs(
    argv: list[str],
    output: Path,
    *,
    user: SlotUser | None,
    deadline: float,
    cancel: threading.Event | None,
    max_bytes: int | None,
) -> None:
    """Run mksquashfs as the slot user, in a session of its own (its pseudo file commands
    are its children: one killpg ends them all), with no environment of ours."""
    dropped = user.subprocess_kwargs() if user is not None else {}
    environment = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}
    try:
        process = subprocess.Popen(
            argv,
            cwd="/",
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **dropped,
        )
    except FileNotFoundError:
        raise CaptureFailed("capture-failed", "mksquashfs is not installed") from None
    try:
        while True:
            _stop_if(cancel, deadline)
            if max_bytes is not None and _size(output) > max_bytes:
                raise CaptureFailed("too-large")
            try:
                _, errors = process.communicate(timeout=_POLL)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()  # reaped: nothing still writes into what is removed
    if process.returncode != 0:
        tail = os.fsdecode(errors).strip()[-_STDERR_TAIL:]
        raise CaptureFailed("capture-failed", f"mksquashfs exited {process.returncode}: {tail}")
    if max_bytes is not None and _size(output) > max_bytes:  # it finished between two looks
        raise CaptureFailed("too-large")


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


def _seal_and_hash(
    output: Path, user: SlotUser | None, deadline: float, cancel: threading.Event | None
) -> tuple[int, str, str]:
    """Take the output from the slot user (root's, 0600), then measure it, all through one
    descriptor opened without following links."""
    try:
        descriptor = os.open(output, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        raise CaptureFailed("capture-failed", "mksquashfs left no output") from None
    with os.fdopen(descriptor, "rb", buffering=0) as sealed:
        info = os.fstat(descriptor)
        maker = os.geteuid() if user is None else user.uid
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != maker:
            raise CaptureFailed("capture-failed", "the output is not the file mksquashfs made")
        if user is not None:
            os.fchown(descriptor, os.geteuid(), os.getegid())
        os.fchmod(descriptor, 0o600)
        sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
        buffer = memoryview(bytearray(CHUNK_BYTES))
        size = 0
        try:
            while count := sealed.readinto(buffer):
                _stop_if(cancel, deadline)
                sha256.update(buffer[:count])
                md5.update(buffer[:count])
                size += count
        except OSError:
            raise CaptureFailed("hash-failed") from None
    return size, sha256.hexdigest(), md5.hexdigest()


# -- upload ----------------------------------------------------------------------------------


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def upload(
    url: str,
    path: Path,
    headers: Mapping[str, str],
    *,
    size: int,
    timeout: float,
    cancel: threading.Event | None = None,
) -> None:
    """PUT `path` to `url` (http or https) in one request: `headers` exactly as given
    (a presigned URL may sign them) plus Content-Length = `size`, the body streamed in
    1 MiB chunks. `timeout` is the socket timeout: no connect, send or receive may stall
    longer. `cancel` is looked at between chunks and every 50 ms by a watcher that shuts
    the socket down, so a send blocked on a stalled server ends too.

    Succeeds on a 2xx answer; otherwise raises UploadFailed. A server that answers early
    (an S3 store rejecting a signature before the body is sent) and closes is reported by
    its answer when it can still be read. `headers` may not hold Content-Length
    (ValueError)."""
    if any(name.lower() == "content-length" for name in headers):
        raise ValueError("Content-Length is the upload's own header")
    https, host, port, request_target = _endpoint(url)
    try:
        source = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        raise UploadFailed("read-failed") from None
    with os.fdopen(source, "rb", buffering=0) as body:
        if os.fstat(source).st_size != size:
            raise UploadFailed("size-mismatch")
        if cancel is not None and cancel.is_set():
            raise UploadFailed("cancelled")
        connection: http.client.HTTPConnection
        if https:
            connection = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=_tls_context()
            )
        else:
            connection = http.client.HTTPConnection(host, port, timeout=timeout)
        finished = threading.Event()
        watcher: threading.Thread | None = None
        try:
            try:
                connection.connect()
            except (OSError, http.client.HTTPException):
                raise UploadFailed(_cancelled_or(cancel, "connection-failed")) from None
            assert connection.sock is not None
            watcher = _watch(cancel, finished, connection.sock)
            status, error_body = _put(
                connection,
                body,
                request_target=request_target,
                headers=headers,
                size=size,
                cancel=cancel,
            )
        finally:
            finished.set()
            connection.close()
        if watcher is not None:
            watcher.join()
    if not 200 <= status < 300:
        code = _S3_CODE.search(error_body)
        raise UploadFailed(f"http-{status}" + (f"-{code.group(1).decode()}" if code else ""))


def _endpoint(url: str) -> tuple[bool, str, int | None, str]:
    """(https, host, port, path and query), or "bad-url" (never saying what the URL was)."""
    try:
        split = urlsplit(url)
        port = split.port
    except ValueError:
        raise UploadFailed("bad-url") from None
    request_target = (split.path or "/") + (f"?{split.query}" if split.query else "")
    if (
        split.scheme not in ("http", "https")
        or not split.hostname
        or any(char <= " " or char == "\x7f" for char in request_target)
    ):
        raise UploadFailed("bad-url")
    return split.scheme == "https", split.hostname, port, request_target


def _watch(
    cancel: threading.Event | None, finished: threading.Event, sock: socket.socket
) -> threading.Thread | None:
    """A thread that shuts the socket down when `cancel` is set before `finished` is."""
    if cancel is None:
        return None

    def watch() -> None:
        while not finished.wait(_POLL):
            if cancel.is_set():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                return

    watcher = threading.Thread(target=watch, name="seedkeeper-upload-cancel", daemon=True)
    watcher.start()
    return watcher


def _put(
    connection: http.client.HTTPConnection,
    body: io.FileIO,
    *,
    request_target: str,
    headers: Mapping[str, str],
    size: int,
    cancel: threading.Event | None,
) -> tuple[int, bytes]:
    """Send the request and read the answer: (status, at most 64 KiB of its body)."""
    sent = 0
    try:
        given = {name.lower() for name in headers}
        connection.putrequest(
            "PUT",
            request_target,
            skip_host="host" in given,
            skip_accept_encoding=True,
        )
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(size))
        connection.endheaders()
        buffer = memoryview(bytearray(CHUNK_BYTES))
        while sent < size:
            if cancel is not None and cancel.is_set():
                raise UploadFailed("cancelled")
            count = body.readinto(buffer[: min(CHUNK_BYTES, size - sent)])
            if not count:
                raise UploadFailed("size-mismatch")  # the file shrank under us
            connection.send(buffer[:count])
            sent += count
    except OSError as failed:
        # A stall or a cancel has no answer to wait for; a reset may follow one.
        stopped = isinstance(failed, TimeoutError) or (cancel is not None and cancel.is_set())
        early = None if stopped else _early_answer(connection)
        if early is not None:
            return early
        raise UploadFailed(_network_reason(failed, cancel)) from None
    except http.client.HTTPException:
        raise UploadFailed(_cancelled_or(cancel, "connection-failed")) from None
    try:
        response = connection.getresponse()
        return response.status, response.read(_ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException) as failed:
        raise UploadFailed(_network_reason(failed, cancel)) from None


def _early_answer(connection: http.client.HTTPConnection) -> tuple[int, bytes] | None:
    """A response the server sent before it stopped reading the body, if one arrived."""
    try:
        response = connection.getresponse()
        return response.status, response.read(_ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        return None


def _network_reason(failed: BaseException, cancel: threading.Event | None) -> str:
    """A token, never the exception's message (it may name the host)."""
    return _cancelled_or(
        cancel, "timeout" if isinstance(failed, TimeoutError) else "connection-failed"
    )


def _cancelled_or(cancel: threading.Event | None, reason: str) -> str:
    return "cancelled" if cancel is not None and cancel.is_set() else reason
