"""Slots seeded for real: the seed function invoked as Lambda would, the local runtime
running the real slot task, moto standing in for DynamoDB and R2."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.credentials import Credentials

from functions import event, invoke, load_function
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.domain.record import Supported
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.snapshots import Archive, NewSnapshot
from seedkeeper_task.restore.download import parse_content_range
from seedkeeper_task.sandbox import STATE_DIR
from seedkeeper_task.settings import STOP_MARGIN, CheckpointSettings
from seedkeeper_task.supervisor import CHECKOUT, MARKER
from seedkeeper_task.task_api import TaskApi
from seedkeeper_tools.local.principals import TaskKeys
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.publish import publish

if TYPE_CHECKING:
    from conftest import Stack

seed_function = load_function("seed")
ORIGIN = "https://git.example.com/acme/widgets.git"


@dataclass
class Slots:
    stack: Stack
    runtime: LocalRuntime
    root: Path

    def publish(self, repo: Path, deps: Path | None = None) -> dict[str, Any]:
        """Publish `repo` and answer the seed handle as status reports it."""
        recorded = publish(
            resource="widgets",
            checkout=repo,
            snapshots=self.stack.snapshots,
            r2=self.stack.r2,
            deps=deps,
            lockfile_hash="lock-1" if deps else None,
        )
        handle = self.stack.snapshots.status("widgets").seed_handle
        assert handle is not None
        assert handle.sha == recorded.current.sha
        return {"resource": "widgets", **handle.model_dump()}

    def body(
        self, seed: dict[str, Any] | None, slot: str = "slot-1", **claim: str
    ) -> dict[str, Any]:
        if seed is None:
            return {"slot": slot, "seed": None}
        owner = {
            "run": "run-1",
            "requester": "alice",
            "thread": "thread-1",
            "repository": "acme/widgets",
            "ref": seed["ref"],
            "head": seed["sha"],
        } | claim
        return {"slot": slot, "seed": seed, "claim": owner, "origin": ORIGIN}

    def seed(self, body: dict[str, Any]) -> tuple[int, Any]:
        return invoke(seed_function, event("seed-new", body=body))

    def settle(self, body: dict[str, Any], seconds: float = 90) -> tuple[int, Any]:
        """Poll as the executor does until the answer is final."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status, answer = self.seed(body)
            if status != 202:
                return status, answer
            time.sleep(0.2)
        raise AssertionError(f"still seeding after {seconds}s: {self.log(body['slot'])}")

    def workspace(self, slot: str = "slot-1") -> Path:
        return self.runtime.workspace(slot)

    def attempts(self, slot: str = "slot-1") -> list[str]:
        return sorted(p.name for p in self.workspace(slot).parent.glob("attempt-*.json"))

    def log(self, slot: str) -> str:
        logs = sorted(self.workspace(slot).parent.glob("attempt-*.log"))
        return "\n".join(path.read_text()[-3000:] for path in logs)

    def record(self, slot: str = "slot-1") -> Any:
        classified = self.stack.store.lifecycle().read(slot)
        assert isinstance(classified, Supported), classified
        return classified.record

    def kill(self, incarnation: str) -> None:
        """SIGKILL the task's process group, as a lost host would end it, and wait until
        the runtime sees it stopped."""
        self.runtime.crash(incarnation)
        wait_for(lambda: self.runtime.status(incarnation) is TaskStatus.STOPPED, incarnation)


def task_api(root: Path, slot: str, incarnation: str, stop: threading.Event) -> TaskApi:
    """The API of the task `incarnation` of `slot`, as the task itself calls it: the checkpoint
    function the environment names (the `checkpoint_function` fixture's), signed with the
    keys the local runtime gives that task on `root / "data"`."""
    keys = TaskKeys(root / "data").issue(incarnation)
    return TaskApi(
        os.environ["SEEDKEEPER_CHECKPOINT_URL"],
        slot,
        incarnation,
        stop,
        stop_budget=CheckpointSettings().stop_timeout - STOP_MARGIN,
        credentials=Credentials(keys.access_key, keys.secret_key),
    )


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what} after {seconds}s"
        time.sleep(0.02)


def record_archive(
    slots: Slots, backup_id: str, body: bytes, *, size: int, sha256: str, sha: str
) -> dict[str, Any]:
    """Put bytes in R2 under backup_id and record them as the resource's current snapshot."""
    s3 = boto3.client("s3", endpoint_url=slots.stack.endpoint, region_name="auto")
    bucket = slots.stack.r2_settings.bucket or ""
    s3.put_object(Bucket=bucket, Key=backup_key(backup_id), Body=body)
    slots.stack.snapshots.record(
        NewSnapshot(
            resource="widgets",
            ref="main",
            sha=sha,
            created_at=1_800_000_000,
            checkout=Archive(backup_id=backup_id, size=size, sha256=sha256),
        )
    )
    return {
        "resource": "widgets",
        "ref": "main",
        "sha": sha,
        "checkout_backup_id": backup_id,
        "deps_backup_id": None,
    }


def verdict(answer: dict[str, Any]) -> tuple[bool, str, str]:
    return answer["seeded"], answer["reason"], answer["step"]


def squashfs_of(source: Path, target: Path) -> bytes:
    argv = ["mksquashfs", str(source), str(target), "-comp", "zstd", "-noappend", "-quiet"]
    subprocess.run([*argv, "-no-progress"], check=True)
    return target.read_bytes()


def assert_no_half_tree(slots: Slots, slot: str) -> None:
    workspace = slots.workspace(slot)
    assert not (workspace / CHECKOUT).exists()
    assert not (workspace / STATE_DIR / MARKER).exists()
    assert not (workspace / STATE_DIR / "downloads").exists()
    assert not [p for p in workspace.iterdir() if ".staging" in p.name]


class TamperingProxy(http.server.ThreadingHTTPServer):
    """Stands between the slot task and R2. Modes: "stall" holds archive GETs until
    released; "truncate" sends half of each body and hangs up; for ranged GETs,
    "error5xx" answers 503, "reset" sends the body up to the object's midpoint and resets
    the connection (an RST), "stall-midway" sends it up to the midpoint and goes silent
    until released. `only`: the one object (its key) the mode applies to; others pass."""

    def __init__(self, upstream: str, mode: str = "stall", *, only: str | None = None) -> None:
        self.upstream = upstream
        self.mode = mode
        self.only = only
        self.release = threading.Event()
        self.gets = threading.Event()
        self.ranges: list[str] = []  # the Range header of each ranged GET, in order
        self.paths: list[str] = []  # the path of each GET (its query left out), in order
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up on a stalled or cut answer is part of the tests."""


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: TamperingProxy

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        proxy, ranged = self.server, "Range" in self.headers
        proxy.gets.set()
        proxy.paths.append(self.path.partition("?")[0])
        if ranged:
            proxy.ranges.append(self.headers["Range"])
        mode = proxy.mode if ranged or proxy.mode in ("stall", "truncate") else None
        if proxy.only is not None and not self.path.partition("?")[0].endswith(f"/{proxy.only}"):
            mode = None
        if mode == "stall":
            proxy.release.wait(120)
        if mode == "error5xx":
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        request = urllib.request.Request(proxy.upstream + self.path)  # noqa: S310
        if ranged:
            request.add_header("Range", self.headers["Range"])
        assert request.full_url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(request, timeout=30) as upstream:  # noqa: S310 - loopback
            body = upstream.read()
            self.send_response(upstream.status)
            for name in ("Content-Range", "Content-Type", "ETag"):
                if upstream.headers.get(name):
                    self.send_header(name, upstream.headers[name])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            content_range = upstream.headers.get("Content-Range")
        if mode == "truncate":
            body = body[: len(body) // 2]
        elif mode in ("reset", "stall-midway"):
            body = body[: _to_midpoint(content_range)]
        self.wfile.write(body)
        if mode == "reset":
            linger = struct.pack("ii", 1, 0)  # the close sends an RST, not a FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            self.rfile.close()
            self.connection.close()
        elif mode == "stall-midway":
            proxy.release.wait(120)


def _to_midpoint(content_range: str | None) -> int:
    """How many bytes of a 206's body lie before the middle of the whole object."""
    parsed = parse_content_range(content_range)
    assert parsed is not None, content_range
    first, _, total = parsed
    assert total is not None, content_range
    return max(0, total // 2 - first)


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """`docker` on PATH is `script` (Python), which notes each call in the file answered."""
    folder = tmp_path / "bin"
    folder.mkdir()
    docker = folder / "docker"
    docker.write_text(script)
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_CALLS", str(tmp_path / "calls.jsonl"))
    return tmp_path / "calls.jsonl"


def signals_sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every (process group, signal) this process sends with `os.killpg` from now on, in
    order, each still sent: what a stop did, without timing it."""
    sent: list[tuple[int, int]] = []
    real = os.killpg

    def kill(group: int, signal_number: int) -> None:
        sent.append((group, signal_number))
        real(group, signal_number)

    monkeypatch.setattr(os, "killpg", kill)
    return sent


def one_grace_for_all(sent: list[tuple[int, int]], groups: list[int]) -> bool:
    """Each group had its SIGTERM before any had its SIGKILL (one after another, the first
    is killed before the second is asked), and each then had its SIGKILL."""
    terms = [index for index, (group, sig) in enumerate(sent) if sig == signal.SIGTERM]
    kills = [index for index, (group, sig) in enumerate(sent) if sig == signal.SIGKILL]
    termed = {sent[index][0] for index in terms}
    killed = {sent[index][0] for index in kills}
    everyone = set(groups)
    return bool(kills) and max(terms) < min(kills) and everyone <= termed and everyone <= killed
