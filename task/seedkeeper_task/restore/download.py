"""Download one archive over a presigned GET URL, straight to disk, and verify it.

Why it is built this way:

- Several ranged GETs, not one stream: one connection to R2 is slower than a few, and one
  slow connection must not hold up the archive. The file is cut into contiguous ranges
  (`plan_ranges`) that `parts` workers take in file order, each on a kept-alive connection,
  writing with `os.pwrite` at the range's offsets through a fixed 256 KiB buffer, so memory
  stays bounded whatever the size. Each read is at most one receive (`_OneReceive`): the
  bytes that arrived before a reset or a stall are written and credited, never thrown
  away with the read that failed.
- Progress is judged by bytes arriving: the socket timeout is the stall timeout (never past
  the deadline), and a range that breaks, stalls or comes back short is re-requested from
  its last written byte, with a small exponential backoff. A client error other than
  408/429 fails at once: an expired or forbidden presigned URL does not heal.
- A server that ignores `Range` (200 to a ranged GET) makes the download fall back to one
  stream that resumes from the contiguous written prefix.
- Hashing is off the critical path: a hasher thread follows the contiguous written prefix
  of the file, reading it back from the page cache while later ranges still arrive. Ranges
  are taken in file order and are at most about `SEGMENT_BYTES` long, so the prefix trails
  the download by a few ranges and only that tail is left to hash after the last byte.
- The presigned URL is a credential: no exception, message or thread name carries it.
- On failure or cancellation every worker is stopped before the error is raised: their
  sockets are shut down, a write gate lets no new write start and waits out the one in
  flight, and the threads are joined (bounded). The caller may remove the target at once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import itertools
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal
from urllib.parse import urlsplit

from seedkeeper.errors import SeedkeeperError

__all__ = [
    "CHUNK_BYTES",
    "SEGMENT_BYTES",
    "THREAD_PREFIX",
    "DownloadFailed",
    "DownloadStats",
    "download",
    "parse_content_range",
    "plan_ranges",
]

MIB = 1024 * 1024
# One read and one pwrite at most: a worker's whole buffer, resident while it downloads (a
# task runs 16). 1 GB's deps archive, 8 ranges: 1 MiB reads and 4 MiB hash reads grew the
# process by 12.8 MB; these by 3.8 MB, as fast on a 50 MiB/s link, 2% slower on loopback.
CHUNK_BYTES = 256 * 1024
HASH_CHUNK_BYTES = MIB
MIN_RANGE_BYTES = 4 * MIB  # smaller ranges cost a round trip for little
SEGMENT_BYTES = 16 * MIB  # the longest range of a large file: bounds the unhashed tail
THREAD_PREFIX = "seedkeeper-download"

_JOIN_TIMEOUT = 5.0
_CANCEL_POLL = 0.05
_BACKOFF_BASE = 0.1
_BACKOFF_MAX = 2.0
_RETRYABLE_STATUS = frozenset({408, 429})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes \*/(\d+)")
_call_ids = itertools.count(1)


@dataclass(frozen=True)
class DownloadStats:
    bytes: int  # the verified size of the archive
    seconds: float
    retries: int  # ranges re-requested after a failure or a stall


class DownloadFailed(SeedkeeperError):
    """The download or its verification failed. `step` is "download" or "verify"; `reason`
    a short token ("deadline", "cancelled", "http-403", "size-mismatch", "sha256-mismatch",
    "retries-exhausted", ...); `detail` what the last retried failure was, if any. The
    message never contains the URL: presigned URLs are credentials."""

    def __init__(self, step: Literal["download", "verify"], reason: str, detail: str = "") -> None:
        super().__init__(f"{step} failed: {reason}" + (f" (last: {detail})" if detail else ""))
        self.step: Literal["download", "verify"] = step
        self.reason = reason
        self.detail = detail


def plan_ranges(
    size: int, parts: int, *, segment: int = SEGMENT_BYTES, min_range: int = MIN_RANGE_BYTES
) -> list[tuple[int, int]]:
    """Cut [0, size) into contiguous half-open ranges in file order, sizes within one byte.

    A small file gets fewer than `parts` ranges, none under `min_range` (each costs a round
    trip). With several parts, a large file gets a multiple of `parts` ranges of at most
    `segment` bytes: taken in order, they keep the written prefix (what the hasher can read)
    close behind the download, and a fast connection takes over work from a slow one."""
    if size < 0 or parts < 1 or segment < 1 or min_range < 1:
        raise ValueError("size must be >= 0, and parts, segment and min_range >= 1")
    if size == 0:
        return []
    count = max(1, min(parts, size // min_range))
    if count == parts > 1:  # one stream is already in file order
        count = parts * -(-size // (parts * segment))
    return [(size * i // count, size * (i + 1) // count) for i in range(count)]


def parse_content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """(first, last, total) of a 206's `Content-Range: bytes first-last/total`; total is
    None for `*`. None when the header is missing or malformed."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if match is None:
        return None
    first, last, total = match.groups()
    return int(first), int(last), None if total == "*" else int(total)


def download(
    url: str,
    target: Path,
    *,
    size: int,
    sha256: str,
    deadline: float,
    parts: int = 4,
    stall_timeout: float = 15.0,
    max_retries: int = 5,
    cancel: threading.Event | None = None,
) -> DownloadStats:
    """Download `url` into `target` (created or truncated to `size`) and verify its size and
    sha256, all by `deadline` (an absolute `time.monotonic()`).

    `parts` ranged GETs run in parallel; a connection that delivers nothing for
    `stall_timeout` seconds is abandoned and its range resumed; each range may be retried
    `max_retries` times in a row without progress. Setting `cancel` stops the download.
    Raises DownloadFailed; when it does, none of this call's threads writes to `target`."""
    if size < 0 or parts < 1 or stall_timeout <= 0 or max_retries < 0:
        raise ValueError("size and max_retries must be >= 0, parts >= 1, stall_timeout > 0")
    started = time.monotonic()
    endpoint = _Endpoint.parse(url)
    if cancel is not None and cancel.is_set():
        raise DownloadFailed("download", "cancelled")
    if started >= deadline:
        raise DownloadFailed("download", "deadline")
    job = _Job(
        endpoint,
        target,
        size=size,
        sha256=sha256,
        deadline=deadline,
        parts=parts,
        stall_timeout=stall_timeout,
        max_retries=max_retries,
        cancel=cancel,
    )
    try:
        job.run()
    finally:
        job.shutdown()
    return DownloadStats(bytes=size, seconds=time.monotonic() - started, retries=job.retries)


# -- internals ------------------------------------------------------------------------------


class _Stopped(Exception):
    """This worker's pool was stopped (failure, cancel, deadline, fallback): quit quietly."""


class _Retry(Exception):
    """One request failed transiently: re-request the range from its last written byte."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _RangeIgnored(Exception):
    """The server answered a ranged GET with the whole object."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


@dataclass(frozen=True, repr=False)  # no repr: the target holds the signature
class _Endpoint:
    https: bool
    host: str
    port: int | None
    target: str  # path and query

    @classmethod
    def parse(cls, url: str) -> _Endpoint:
        try:
            split = urlsplit(url)
            port = split.port
        except ValueError:
            raise DownloadFailed("download", "bad-url") from None
        target = (split.path or "/") + (f"?{split.query}" if split.query else "")
        if (
            split.scheme not in ("http", "https")
            or not split.hostname
            or any(char <= " " or char == "\x7f" for char in target)
        ):
            raise DownloadFailed("download", "bad-url")
        return cls(split.scheme == "https", split.hostname, port, target)

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=_tls_context()
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


@dataclass
class _Range:
    start: int
    end: int  # exclusive
    next: int  # the first byte not yet written


@dataclass
class _Link:
    """A worker's connection. `keeper` holds a reference to the socket's descriptor, so only
    `_Pool.close_link` (under the pool's lock) ever really closes it: `_Pool.abort` can never
    shut down a descriptor number that was closed and reused meanwhile."""

    conn: http.client.HTTPConnection
    sock: socket.socket
    keeper: socket.SocketIO
    response: http.client.HTTPResponse | None = None


class _Pool:
    """One generation of workers: their stop flag, their open sockets and their write gate."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._links: list[_Link] = []
        self._writing = 0

    def adopt(self, conn: http.client.HTTPConnection) -> _Link:
        sock = conn.sock
        assert sock is not None
        link = _Link(conn, sock, sock.makefile("rb", buffering=0))
        with self._lock:
            if not self.stop.is_set():
                self._links.append(link)
                return link
        self._close(link)
        raise _Stopped

    def close_link(self, link: _Link) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)
            self._close(link)

    @staticmethod
    def _close(link: _Link) -> None:
        for closable in (link.response, link.conn, link.keeper, link.sock):
            if closable is not None:
                with contextlib.suppress(OSError):
                    closable.close()

    def abort(self) -> None:
        """Stop the workers: no write starts after this, and blocked reads wake up."""
        with self._lock:
            self.stop.set()
            for link in self._links:
                with contextlib.suppress(OSError):
                    link.sock.shutdown(socket.SHUT_RDWR)

    def begin_write(self) -> bool:
        with self._lock:
            if self.stop.is_set():
                return False
            self._writing += 1
            return True

    def end_write(self) -> None:
        with self._lock:
            self._writing -= 1
            if not self._writing:
                self._idle.notify_all()

    def drain(self) -> None:
        """After `abort`: wait out the write in flight, one pwrite of at most a chunk."""
        with self._lock:
            while self._writing:
                self._idle.wait()

    def join(self, until: float) -> None:
        for thread in self.threads:
            thread.join(max(0.0, until - time.monotonic()))


class _Job:
    """One call of `download`: the range plan, the workers, the hasher, the outcome."""

    def __init__(
        self,
        endpoint: _Endpoint,
        target: Path,
        *,
        size: int,
        sha256: str,
        deadline: float,
        parts: int,
        stall_timeout: float,
        max_retries: int,
        cancel: threading.Event | None,
    ) -> None:
        self._endpoint = endpoint
        self._target = target
        self._size = size
        self._sha256 = sha256.lower()
        self._deadline = deadline
        self._parts = parts
        self._stall_timeout = stall_timeout
        self._max_retries = max_retries
        self._cancel = cancel
        self._name = f"{THREAD_PREFIX}-{next(_call_ids)}"
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)  # the hasher waits for written bytes
        self._changed = threading.Condition(self._lock)  # the caller waits for an outcome
        self._ranges = [_Range(first, end, first) for first, end in plan_ranges(size, parts)]
        self._claimed = 0  # ranges before this index were handed out
        self._first_open = 0  # ranges before this index are complete
        self._single = len(self._ranges) <= 1
        self._fallback = False
        self._failure: tuple[Literal["download", "verify"], str, str] | None = None
        self._digest: str | None = None
        self._hash_stop = False
        self._pools: list[_Pool] = []
        self._hasher: threading.Thread | None = None
        self._fd = -1
        self.retries = 0

    # -- the caller's thread ----------------------------------------------------------------

    def run(self) -> None:
        try:
            self._fd = os.open(self._target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(self._fd, self._size)
        except OSError:
            raise DownloadFailed("download", "write-failed") from None
        self._hasher = self._spawn(self._hash, "hash")
        self._start_pool(min(self._parts, len(self._ranges)))
        self._wait()
        if os.fstat(self._fd).st_size != self._size:
            raise DownloadFailed("verify", "size-mismatch")
        if self._digest != self._sha256:
            raise DownloadFailed("verify", "sha256-mismatch")

    def _wait(self) -> None:
        while True:
            with self._lock:
                if self._failure is None and self._digest is None and not self._fallback:
                    remaining = self._deadline - time.monotonic()
                    if self._cancel is not None:
                        remaining = min(remaining, _CANCEL_POLL)
                    self._changed.wait(max(0.0, remaining))
                failure, done, fallback = self._failure, self._digest is not None, self._fallback
            if failure is not None:
                raise DownloadFailed(*failure)  # raised afresh: no worker context chained
            if done:
                return
            if self._cancel is not None and self._cancel.is_set():
                raise DownloadFailed("download", "cancelled")
            if time.monotonic() >= self._deadline:
                raise DownloadFailed("download", "deadline")
            if fallback:
                self._fall_back()

    def _fall_back(self) -> None:
        """Stop the ranged workers and go on with one stream from the written prefix."""
        pool = self._pools[-1]
        pool.abort()
        pool.drain()
        pool.join(time.monotonic() + _JOIN_TIMEOUT)
        with self._lock:
            prefix = self._prefix()
            self._ranges = [_Range(0, self._size, prefix)]
            self._claimed = self._first_open = 0
            self._single = True
            self._fallback = False
            self.retries += 1
        self._start_pool(1)

    def _start_pool(self, workers: int) -> None:
        pool = _Pool()
        self._pools.append(pool)
        for index in range(workers):
            pool.threads.append(
                self._spawn(lambda: _Worker(self, pool).run(), f"g{len(self._pools)}w{index}")
            )

    def _spawn(self, target: Callable[[], None], suffix: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"{self._name}-{suffix}", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """Stop every thread of this call (bounded wait); no write can happen after this."""
        for pool in self._pools:
            pool.abort()
        with self._lock:
            self._hash_stop = True
            self._progress.notify_all()
        for pool in self._pools:
            pool.drain()
        until = time.monotonic() + _JOIN_TIMEOUT
        for pool in self._pools:
            pool.join(until)
        if self._hasher is not None:
            self._hasher.join(max(0.0, until - time.monotonic()))
        if self._fd >= 0:
            os.close(self._fd)  # drained: no worker writes through it any more
            self._fd = -1

    # -- shared state (workers and hasher) ------------------------------------------------------

    def fail(
        self, pool: _Pool | None, step: Literal["download", "verify"], reason: str, detail: str = ""
    ) -> None:
        with self._lock:
            stopped = self._hash_stop if pool is None else pool.stop.is_set()
            if self._failure is None and not stopped:
                self._failure = (step, reason, detail)
                self._changed.notify_all()

    def want_fallback(self, pool: _Pool) -> None:
        with self._lock:
            if not pool.stop.is_set():
                self._fallback = True
                self._changed.notify_all()

    def claim(self, pool: _Pool) -> _Range | None:
        with self._lock:
            while not pool.stop.is_set() and self._claimed < len(self._ranges):
                claimed = self._ranges[self._claimed]
                self._claimed += 1
                if claimed.next < claimed.end:
                    return claimed
            return None

    def advance(self, claimed: _Range, count: int) -> None:
        with self._lock:
            claimed.next += count
            self._progress.notify_all()

    def count_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def _prefix(self) -> int:
        """How far the file is written without a gap (lock held)."""
        ranges = self._ranges
        while (
            self._first_open < len(ranges)
            and ranges[self._first_open].next >= ranges[self._first_open].end
        ):
            self._first_open += 1
        return ranges[self._first_open].next if self._first_open < len(ranges) else self._size

    def _hash(self) -> None:
        """Follow the written prefix with sha256, reading it back from the page cache."""
        digest = hashlib.sha256()
        view = memoryview(bytearray(HASH_CHUNK_BYTES))
        hashed = 0
        try:
            fd = os.open(self._target, os.O_RDONLY)
        except OSError:
            self.fail(None, "verify", "read-failed")
            return
        try:
            while True:
                with self._lock:
                    while not self._hash_stop and hashed < self._size and self._prefix() <= hashed:
                        self._progress.wait()
                    if self._hash_stop:
                        return
                    if hashed >= self._size:
                        self._digest = digest.hexdigest()
                        self._changed.notify_all()
                        return
                    ready = min(self._prefix() - hashed, HASH_CHUNK_BYTES)
                count = os.preadv(fd, [view[:ready]], hashed)
                if count <= 0:
                    raise OSError("the target is shorter than its written prefix")
                digest.update(view[:count])
                hashed += count
        except OSError:
            self.fail(None, "verify", "read-failed")
        finally:
            os.close(fd)

    # -- what workers need ------------------------------------------------------------------

    @property
    def endpoint(self) -> _Endpoint:
        return self._endpoint

    @property
    def size(self) -> int:
        return self._size

    @property
    def single(self) -> bool:
        return self._single

    @property
    def max_retries(self) -> int:
        return self._max_retries

    def timeout(self, pool: _Pool) -> float:
        """The socket timeout: the stall timeout, never past the deadline."""
        remaining = self._deadline - time.monotonic()
        if pool.stop.is_set() or remaining <= 0:
            raise _Stopped
        return min(self._stall_timeout, remaining)

    def write(self, pool: _Pool, data: memoryview, offset: int) -> None:
        if not pool.begin_write():
            raise _Stopped
        try:
            while data:
                written = os.pwrite(self._fd, data, offset)
                data, offset = data[written:], offset + written
        except OSError:
            raise DownloadFailed("download", "write-failed") from None
        finally:
            pool.end_write()


class _Worker:
    """Takes ranges in file order and fetches each to the end, resuming after failures."""

    def __init__(self, job: _Job, pool: _Pool) -> None:
        self._job = job
        self._pool = pool
        self._buffer = memoryview(bytearray(CHUNK_BYTES))
        self._link: _Link | None = None

    def run(self) -> None:
        job, pool = self._job, self._pool
        try:
            while (claimed := job.claim(pool)) is not None:
                self._fetch(claimed)
        except _Stopped:
            pass
        except _RangeIgnored:
            job.want_fallback(pool)
        except DownloadFailed as failed:
            job.fail(pool, failed.step, failed.reason, failed.detail)
        except Exception as unexpected:  # a bug still ends the download, naming only its type
            job.fail(pool, "download", f"internal-{type(unexpected).__name__}")
        finally:
            self._drop_link()

    def _drop_link(self) -> None:
        if self._link is not None:
            self._pool.close_link(self._link)
            self._link = None

    def _fetch(self, claimed: _Range) -> None:
        job = self._job
        failures = 0
        while claimed.next < claimed.end:
            before = claimed.next
            try:
                if not self._get(claimed):
                    self._drop_link()
            except _Retry as failed:
                self._drop_link()
                job.timeout(self._pool)  # raises _Stopped when stopped or out of time
                failures = 1 if claimed.next > before else failures + 1
                if failures > job.max_retries:
                    raise DownloadFailed("download", "retries-exhausted", failed.reason) from None
                job.count_retry()
                delay = min(_BACKOFF_BASE * 2 ** (failures - 1), _BACKOFF_MAX)
                if self._pool.stop.wait(min(delay, job.timeout(self._pool))):
                    raise _Stopped from None

    def _connect(self) -> _Link:
        if self._link is None:
            conn = self._job.endpoint.connection(self._job.timeout(self._pool))
            try:
                conn.connect()
            except (OSError, http.client.HTTPException, ValueError) as failed:
                conn.close()
                raise _Retry(_retry_reason(failed)) from None
            self._link = self._pool.adopt(conn)
        return self._link

    def _get(self, claimed: _Range) -> bool:
        """One GET of the rest of `claimed`; True when the connection can be reused."""
        job, pool = self._job, self._pool
        link = self._connect()
        try:
            link.sock.settimeout(job.timeout(pool))
            link.conn.request(
                "GET",
                job.endpoint.target,
                headers={"Range": f"bytes={claimed.next}-{claimed.end - 1}"},
            )
            response = link.response = link.conn.getresponse()
        except (OSError, http.client.HTTPException, ValueError) as failed:
            raise _Retry(_retry_reason(failed)) from None
        if not response.chunked:  # chunked framing needs whole reads (never seen from R2)
            response.fp = _OneReceive(response.fp)  # type: ignore[assignment]
        status = response.status
        if status == 206:
            skip, stop_at = 0, self._accept_range(response, claimed)
        elif status == 200:
            if response.length is not None and response.length != job.size:
                raise DownloadFailed("verify", "size-mismatch")
            if not job.single:
                raise _RangeIgnored
            skip, stop_at = claimed.next, claimed.end  # the body starts at byte 0
        elif status in _RETRYABLE_STATUS or status >= 500:
            raise _Retry(f"http-{status}")
        elif status == 416:
            match = _UNSATISFIED_RANGE.fullmatch(response.getheader("Content-Range", "").strip())
            if match is not None and int(match.group(1)) != job.size:
                raise DownloadFailed("verify", "size-mismatch")
            raise DownloadFailed("download", "http-416")
        else:
            raise DownloadFailed("download", f"http-{status}")
        self._stream(link, response, claimed, skip, stop_at)
        return response.isclosed() and not response.will_close

    def _accept_range(self, response: http.client.HTTPResponse, claimed: _Range) -> int:
        """Where the 206's body ends; it must start where the range resumes."""
        parsed = parse_content_range(response.getheader("Content-Range"))
        if parsed is None:
            raise _Retry("bad-content-range")
        first, last, total = parsed
        if total is not None and total != self._job.size:
            raise DownloadFailed("verify", "size-mismatch")
        if first != claimed.next or last < first or last >= claimed.end:
            raise _Retry("bad-content-range")
        return last + 1

    def _stream(
        self,
        link: _Link,
        response: http.client.HTTPResponse,
        claimed: _Range,
        skip: int,
        stop_at: int,
    ) -> None:
        """Write the body into `claimed` from its next byte up to `stop_at`, after skipping
        `skip` leading bytes (a 200's body starts at byte 0).

        Over TLS a receive hands over one record (16 KiB): the buffer is filled over several
        receives before each write, and what arrived before a failure is written first."""
        job, pool, buffer = self._job, self._pool, self._buffer
        while claimed.next < stop_at:
            want = min(len(buffer), skip or stop_at - claimed.next)
            filled, failure = 0, None
            try:
                link.sock.settimeout(job.timeout(pool))
                while filled < want:
                    count = response.readinto(buffer[filled:want])
                    if count <= 0:
                        failure = "short-read"
                        break
                    filled += count
            except (OSError, http.client.HTTPException, ValueError) as failed:
                failure = _retry_reason(failed)
            if skip:
                skip -= filled
            elif filled:
                job.write(pool, buffer[:filled], claimed.next)
                job.advance(claimed, filled)
            if failure is not None:
                raise _Retry(failure)


class _OneReceive:
    """A response's body stream whose `readinto` returns after at most one receive.

    `HTTPResponse.readinto` (which keeps the body's length and the connection's reuse
    right) calls its stream's `readinto`; a buffered reader's fills the whole buffer over
    many receives, and when one of them fails, the bytes before it are lost with the
    exception. `readinto1` hands over what has arrived, into the same fixed buffer."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def readinto(self, buffer: memoryview) -> int:
        return self._stream.readinto1(buffer)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _retry_reason(failed: BaseException) -> str:
    """A token for a transient failure; never its message (it may hold the host or URL)."""
    if isinstance(failed, TimeoutError):
        return "stall"
    if isinstance(failed, ConnectionError | http.client.RemoteDisconnected):
        return "reset"
    if isinstance(failed, http.client.IncompleteRead):
        return "short-read"
    if isinstance(failed, OSError):
        return "network"
    return "protocol"
