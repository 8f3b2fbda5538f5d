"""The download engine against a real HTTP server on 127.0.0.1 that supports ranges and
injects faults: error statuses, resets, stalls, truncated bodies, ignored ranges."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from seedkeeper_task.restore.download import (
    CHUNK_BYTES,
    THREAD_PREFIX,
    DownloadFailed,
    DownloadStats,
    download,
    plan_ranges,
)

MIB = 1024 * 1024
SIZE = 24 * MIB
SIGNATURE = "X-Amz-Signature=0123456789abcdef-never-in-a-message"
RANGE_HEADER = re.compile(r"bytes=(\d+)-(\d*)")
STARTS = [first for first, _ in plan_ranges(SIZE, 4)]  # 0, 6, 12, 18 MiB
DRIBBLE = CHUNK_BYTES * 3 // 4  # less than one read
TLS_RECORD = 16 * 1024  # the most one receive over TLS hands over
# Paced bodies, (bytes, seconds between): "records" as TLS hands a body over; "trickle"
# never silent long enough to stall, a buffer filled only after 20 s.
PACED = {"records": (TLS_RECORD, 0.0005), "trickle": (256, 0.02)}
# How long the server stays silent (a stall, a dribble, a hang) unless the test ends first:
# longer than any deadline or stall timeout here, so a download that ends while a request
# is silent was ended by the client, never by the server giving up (`outwaited`).
SILENCE = 60.0
# A deadline or stall timeout the server's silences end before: a download still running
# then has waited for the server, which `outwaited` counts.
OUTLASTED = 2 * SILENCE

# (range start or None without a Range header, how many times that start was asked) -> fault
Fault = Callable[[int | None, int], str | None]


class RangeServer(ThreadingHTTPServer):
    """Serves one file with Range support; `fault` decides how to misbehave per request.

    Faults: "status:<code>", "ignore-range" (200 with the whole body), "truncate" (half the
    body, then close), "reset" (half the body, then RST), "stall" (half the body, then
    silence), "dribble" (DRIBBLE bytes, then silence), "hang" (no answer at all), "slow"
    (the body in small, paced pieces; `streaming` is released once per body begun)."""

    daemon_threads = True

    def __init__(self, path: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.file = path
        self.size = path.stat().st_size
        self.fault: Fault = lambda start, hit: None
        self.lock = threading.Lock()
        self.requests: list[tuple[int | None, str | None]] = []  # (start, fault)
        self.hits: Counter[int | None] = Counter()
        self.release = threading.Event()  # ends stalls and hangs at teardown
        self.streaming = threading.Semaphore(0)
        self.outwaited = 0  # silences that lasted until the server gave up
        self.paced_bytes = 0  # sent in paced bodies' pieces

    def silence(self) -> None:
        """Say nothing more until the test ends (or SILENCE has passed, counted)."""
        if not self.release.wait(SILENCE):
            with self.lock:
                self.outwaited += 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/backups/b1.sqsh?{SIGNATURE}"

    def starts(self) -> list[int | None]:
        with self.lock:
            return [start for start, _ in self.requests]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up mid-body is part of the tests."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RangeServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        server, size = self.server, self.server.size
        match = RANGE_HEADER.fullmatch(self.headers.get("Range", ""))
        start = int(match.group(1)) if match else None
        with server.lock:
            server.hits[start] += 1
            fault = server.fault(start, server.hits[start])
            server.requests.append((start, fault))
        if fault is not None and fault.startswith("status:"):
            self._head(int(fault.removeprefix("status:")), 0)
            return
        if fault == "hang":
            server.silence()
            self.close_connection = True
            return
        if match is None or fault == "ignore-range":
            first, last = 0, size - 1
            self._head(200, size)
        else:
            first = int(match.group(1))
            last = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
            if first >= size:
                self._head(416, 0, {"Content-Range": f"bytes */{size}"})
                return
            self._head(206, last - first + 1, {"Content-Range": f"bytes {first}-{last}/{size}"})
        self._body(first, last + 1, fault)

    def _head(self, status: int, length: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()

    def _body(self, first: int, end: int, fault: str | None) -> None:
        with self.server.file.open("rb") as source:
            if fault == "dribble":
                self.connection.sendfile(source, first, min(DRIBBLE, end - first))
                self.close_connection = True
                self.server.silence()
            elif fault in ("truncate", "reset", "stall"):
                self.connection.sendfile(source, first, (end - first) // 2)
                self.close_connection = True
                if fault == "reset":
                    linger = struct.pack("ii", 1, 0)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    self.connection.close()
                elif fault == "stall":
                    self.server.silence()
            elif fault in PACED:  # pieces of a size, a pause apart, until the test ends
                size, pause = PACED[fault]
                for offset in range(first, end, size):
                    sent = self.connection.sendfile(source, offset, min(size, end - offset))
                    with self.server.lock:
                        self.server.paced_bytes += sent
                    if self.server.release.wait(pause):
                        break
            elif fault == "slow":
                for offset in range(first, end, 64 * 1024):
                    self.connection.sendfile(source, offset, min(64 * 1024, end - offset))
                    if offset == first:
                        self.server.streaming.release()
                    time.sleep(0.01)
            else:
                self.connection.sendfile(source, first, end - first)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, str]:
    data = os.urandom(SIZE)
    path = tmp_path_factory.mktemp("served") / "b1.sqsh"
    path.write_bytes(data)
    return path, data, hashlib.sha256(data).hexdigest()


@pytest.fixture
def server(archive: tuple[Path, bytes, str]) -> Iterator[RangeServer]:
    served = RangeServer(archive[0])
    thread = threading.Thread(
        target=served.serve_forever, kwargs={"poll_interval": 0.05}, name="test-range-server"
    )
    thread.start()
    yield served
    served.release.set()
    served.shutdown()
    served.server_close()
    thread.join(5)


@dataclass
class Fetch:
    """Calls `download` for the served archive with test-friendly defaults."""

    server: RangeServer
    target: Path
    data: bytes
    sha256: str

    def __call__(self, **overrides: Any) -> DownloadStats:
        arguments: dict[str, Any] = {
            "size": len(self.data),
            "sha256": self.sha256,
            "deadline": time.monotonic() + 10,
            "parts": 4,
            "stall_timeout": 2.0,
            "max_retries": 5,
        } | overrides
        return download(self.server.url, self.target, **arguments)

    def fails(self, **overrides: Any) -> DownloadFailed:
        """The failure; checks what every failure guarantees."""
        with pytest.raises(DownloadFailed) as caught:
            self(**overrides)
        failed = caught.value
        for text in (str(failed), repr(failed), failed.reason, failed.detail):
            assert SIGNATURE not in text
            assert "b1.sqsh" not in text
        assert failed.__cause__ is None
        assert self.server.outwaited == 0  # ended by the client, not by the server
        assert download_threads() == []
        assert_quiet(self.target)
        return failed


def download_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def assert_quiet(target: Path) -> None:
    """Nothing writes into the target any more: its size, mtime and content stay put."""
    if not target.exists():
        return
    before = target.stat()
    digest = hashlib.sha256(target.read_bytes()).digest()
    time.sleep(0.15)
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert hashlib.sha256(target.read_bytes()).digest() == digest


@pytest.fixture
def fetch(server: RangeServer, archive: tuple[Path, bytes, str], tmp_path: Path) -> Fetch:
    return Fetch(server, tmp_path / "download.sqsh", archive[1], archive[2])


def test_downloads_in_parallel_ranges_and_verifies(fetch: Fetch, server: RangeServer) -> None:
    stats = fetch()

    assert fetch.target.read_bytes() == fetch.data
    assert stats.bytes == SIZE
    assert stats.retries == 0
    assert sorted(s for s in server.starts() if s is not None) == STARTS
    assert download_threads() == []


def test_one_part_is_one_stream(fetch: Fetch, server: RangeServer) -> None:
    stats = fetch(parts=1)

    assert fetch.target.read_bytes() == fetch.data
    assert (stats.retries, server.starts()) == (0, [0])


@dataclass(frozen=True)
class Case:
    fault: str
    hits: int  # the first this many requests of the faulty range misbehave
    resumes_at: int | None  # where the range's next request starts, when deterministic


RANGE = STARTS[2]
HALF = (STARTS[3] - STARTS[2]) // 2

RECOVERABLE = {
    "500 twice": Case("status:500", 2, RANGE),
    "503": Case("status:503", 1, RANGE),
    "429": Case("status:429", 1, RANGE),
    "408": Case("status:408", 1, RANGE),
    "reset mid-range": Case("reset", 1, None),
    "truncated body": Case("truncate", 1, RANGE + HALF),
    "stall mid-range": Case("stall", 1, RANGE + HALF),
}


@pytest.mark.parametrize("case", RECOVERABLE.values(), ids=RECOVERABLE.keys())
def test_a_range_recovers_from(case: Case, fetch: Fetch, server: RangeServer) -> None:
    """A stall lasts past the download's deadline: only the client's stall timeout can end
    it."""
    server.fault = lambda start, hit: case.fault if start == RANGE and hit <= case.hits else None

    stats = fetch(stall_timeout=0.3)

    assert fetch.target.read_bytes() == fetch.data
    assert stats.retries == case.hits
    resumed = [
        start for start in server.starts() if start is not None and RANGE <= start < STARTS[3]
    ]
    assert len(resumed) == case.hits + 1
    if case.resumes_at is not None:
        assert resumed[-1] == case.resumes_at
    assert download_threads() == []


def test_bytes_before_each_stall_are_kept_so_a_range_cut_every_time_completes(
    fetch: Fetch, server: RangeServer
) -> None:
    """Every request of the range stalls after less than one read's worth of bytes: those
    bytes are written and credited, so each retry resumes further on and the range never
    runs out of retries (a read that threw them away would never make progress)."""
    server.fault = lambda start, hit: (
        "dribble" if start is not None and RANGE <= start < STARTS[3] else None
    )

    fetch(stall_timeout=0.1, max_retries=1)

    assert fetch.target.read_bytes() == fetch.data
    resumed = [
        start for start in server.starts() if start is not None and RANGE <= start < STARTS[3]
    ]
    assert resumed == list(range(RANGE, STARTS[3], DRIBBLE))


def test_a_body_arriving_a_record_at_a_time_is_written_a_buffer_at_a_time(
    fetch: Fetch, server: RangeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over TLS each receive hands over one 16 KiB record: the worker fills its buffer over
    several before it writes (each write is a trip through the range's bookkeeping, which
    cost the task about 0.8 s of CPU in 300 MB at 1 vCPU)."""
    server.fault = lambda start, hit: "records"
    writes: list[int] = []
    real_pwrite = os.pwrite

    def counting_pwrite(fd: int, data: Any, offset: int) -> int:
        writes.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", counting_pwrite)

    fetch()

    assert fetch.target.read_bytes() == fetch.data
    assert len(writes) <= 2 * SIZE // CHUNK_BYTES  # a record per write would be 1,536


def test_a_range_answered_whole_falls_back_to_one_stream(fetch: Fetch, server: RangeServer) -> None:
    server.fault = lambda start, hit: "ignore-range" if start == RANGE and hit == 1 else None

    stats = fetch()

    assert fetch.target.read_bytes() == fetch.data
    assert stats.retries == 1
    assert len(server.starts()) <= len(STARTS) + 1  # the four ranges, then one stream


def test_a_server_that_never_honours_range_still_gives_the_file(
    fetch: Fetch, server: RangeServer
) -> None:
    server.fault = lambda start, hit: "ignore-range"

    stats = fetch()

    assert fetch.target.read_bytes() == fetch.data
    assert stats.retries == 1


def test_a_whole_answer_after_a_break_skips_what_is_written(
    fetch: Fetch, server: RangeServer
) -> None:
    server.fault = lambda start, hit: "truncate" if start == 0 else "ignore-range"

    stats = fetch(parts=1)

    assert fetch.target.read_bytes() == fetch.data
    assert stats.retries == 1
    assert server.starts() == [0, SIZE // 2]


@pytest.mark.parametrize("status", [403, 404, 400])
def test_a_client_error_fails_at_once(status: int, fetch: Fetch, server: RangeServer) -> None:
    """Not retried, and waiting neither for the other ranges (they hang) nor the deadline:
    the failure comes while the server still holds them (`fails` checks `outwaited`)."""
    server.fault = lambda start, hit: f"status:{status}" if start == RANGE else "hang"

    failed = fetch.fails(deadline=time.monotonic() + OUTLASTED)

    assert (failed.step, failed.reason) == ("download", f"http-{status}")
    assert server.hits[RANGE] == 1


def test_a_range_that_keeps_failing_exhausts_its_retries(fetch: Fetch, server: RangeServer) -> None:
    """Failed once out of retries, while the other ranges still hang (as above)."""
    server.fault = lambda start, hit: "status:500" if start == RANGE else "hang"

    failed = fetch.fails(max_retries=2, deadline=time.monotonic() + OUTLASTED)

    assert (failed.step, failed.reason, failed.detail) == (
        "download",
        "retries-exhausted",
        "http-500",
    )
    assert server.hits[RANGE] == 3


def test_a_wrong_sha256_fails_verification(fetch: Fetch) -> None:
    failed = fetch.fails(sha256="0" * 64)

    assert (failed.step, failed.reason) == ("verify", "sha256-mismatch")


@pytest.mark.parametrize("delta", [1, -1, 10 * MIB], ids=["one more", "one less", "far more"])
def test_a_wrong_size_fails_verification(delta: int, fetch: Fetch, server: RangeServer) -> None:
    failed = fetch.fails(size=SIZE + delta)

    assert (failed.step, failed.reason) == ("verify", "size-mismatch")
    assert max(server.hits.values()) == 1  # found in the first answers: nothing re-requested


def test_the_deadline_bounds_the_whole_download(fetch: Fetch, server: RangeServer) -> None:
    """A request that is never answered, with a stall timeout longer than the server's
    silence: only the deadline can end the download before the server gives up, and
    `fails` checks that it did not (`outwaited`)."""
    server.fault = lambda start, hit: "hang" if start == RANGE else None

    failed = fetch.fails(deadline=time.monotonic() + 0.5, stall_timeout=OUTLASTED)

    assert (failed.step, failed.reason) == ("download", "deadline")


def test_a_body_that_trickles_in_fails_on_the_deadline_not_when_a_buffer_fills(
    fetch: Fetch, server: RangeServer
) -> None:
    """Bytes keep coming, each receive well within the stall timeout, far too slowly to fill
    a buffer before the deadline: every receive is bounded by the deadline too, so the
    download ends while the trickle's first buffer is still filling."""
    server.fault = lambda start, hit: "trickle" if start == RANGE else None

    failed = fetch.fails(deadline=time.monotonic() + 0.5)

    assert (failed.step, failed.reason) == ("download", "deadline")
    assert server.paced_bytes < CHUNK_BYTES


def test_stalls_that_repeat_until_the_deadline_fail_on_the_deadline(
    fetch: Fetch, server: RangeServer
) -> None:
    server.fault = lambda start, hit: "hang" if start == RANGE else None

    failed = fetch.fails(deadline=time.monotonic() + 1.0, stall_timeout=0.2, max_retries=100)

    assert (failed.step, failed.reason) == ("download", "deadline")
    assert server.hits[RANGE] >= 2  # each stall was noticed and the range asked again


@pytest.mark.parametrize("fault", ["hang", "slow"])
def test_cancel_stops_promptly(fault: str, fetch: Fetch, server: RangeServer) -> None:
    """Cancelled once a range hangs (it would until after the deadline and the stall
    timeout), or once every range streams (a slow body takes about a second): "cancelled",
    not a deadline, a stall or a finished file, says the cancel ended it."""
    cancel = threading.Event()
    if fault == "hang":

        def hang_and_cancel(start: int | None, hit: int) -> str | None:
            if start != RANGE:
                return None
            cancel.set()  # the range is asked for, and will never be answered
            return "hang"

        server.fault = hang_and_cancel
    else:
        server.fault = lambda start, hit: "slow"

        def cancel_once_every_range_streams() -> None:
            for _ in STARTS:
                server.streaming.acquire(timeout=SILENCE)
            cancel.set()

        threading.Thread(target=cancel_once_every_range_streams, daemon=True).start()

    failed = fetch.fails(cancel=cancel, stall_timeout=10)

    assert (failed.step, failed.reason) == ("download", "cancelled")
