"""The other end of the checkpoint benchmark's link: where nginx stores what is PUT, the
presigning R2 client, the checks of what arrived, and the TCP losses a run caused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import harness
from checkpoint_scripts import MIB, PART_BYTES
from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2
from seedkeeper_tools.publish import measure

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET = "seedkeeper-bench"
TCP_COUNTERS = ("RetransSegs", "TCPTimeouts")  # recorded per run: losses on the link


def r2_client(endpoint: str) -> S3Client:
    """The functions' R2 client (its dialect: path-style, checksums only when required)."""
    return aws.r2_client(aws.session(), endpoint, "bench", "bench-secret")


# -- the store: nginx's dav module, its bodies on tmpfs --------------------------------------


class Store:
    """Where the links' nginx writes what is PUT: a fresh folder on tmpfs (/dev/shm) when
    there is one, so the server's writes never meet the client's disk, as a remote store's
    never would; each body is written to `temp` as it arrives and renamed into `root` when
    complete, the answer (201) coming after that."""

    def __init__(self) -> None:
        shm = Path("/dev/shm")  # noqa: S108 - a fresh folder made in it by mkdtemp
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.data = Path(tempfile.mkdtemp(prefix="seedkeeper-checkpoint-store-", dir=base))
        self.root, self.temp = self.data / "store", self.data / "temp"
        self.description = "tmpfs" if base is not None else "the temp dir's filesystem"

    def __enter__(self) -> Store:
        self.data.chmod(0o755)  # mkdtemp's 0700 would keep nginx's workers out
        for folder in (self.root, self.temp):
            folder.mkdir()
            # nginx started as root writes as its unprivileged worker user: a folder of
            # this benchmark's own, removed when it ends.
            folder.chmod(0o777)
        return self

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.data, ignore_errors=True)

    def path(self, key: str) -> Path:
        return self.root / BUCKET / key

    def stored(self, key: str) -> tuple[int, str] | None:
        """What arrived under `key`: its size and sha256."""
        path = self.path(key)
        return measure(path) if path.exists() else None

    def remove_prefix(self, key: str) -> None:
        """`key` and every object named after it (its parts)."""
        folder = self.path(key).parent
        for path in folder.glob(f"{self.path(key).name}*"):
            path.unlink(missing_ok=True)


@dataclass
class Wire:
    """One link as the runs reach it: its nginx, and the checkpoint function's R2 client
    presigning for that endpoint (path-style: `/<bucket>/<key>`)."""

    spec: harness.LinkSpec
    server: harness.Nginx
    r2: R2
    client: S3Client

    @classmethod
    def of(cls, spec: harness.LinkSpec, server: harness.Nginx) -> Wire:
        client = r2_client(server.endpoint)
        return cls(spec, server, R2(client, BUCKET), client)


def check_parts(store: Store, key: str, uploaded: dict[str, Any]) -> None:
    """Each part arrived as the uploader hashed it, numbered without a gap, all but the
    last a whole part; concatenated in order they are one valid zstd stream."""
    parts = uploaded["parts"]
    if [number for number, _, _ in parts] != list(range(1, len(parts) + 1)) or not parts:
        raise harness.BenchError(f"the streaming parts are numbered {parts}")
    if sum(size for _, size, _ in parts) != uploaded["bytes"]:
        raise harness.BenchError("the streaming parts do not add up to what was read")
    paths = []
    for number, size, sha256 in parts:
        path = store.path(f"{key}.part-{number:05d}")
        arrived = measure(path) if path.exists() else None
        if arrived != (size, sha256):
            raise harness.BenchError(f"part {number} arrived as {arrived}, sent {size} {sha256}")
        if number < len(parts) and size != PART_BYTES:
            raise harness.BenchError(f"part {number} holds {size} bytes, not {PART_BYTES}")
        paths.append(path)
    for marker in (".create", ".complete"):
        if not store.path(key + marker).exists():
            raise harness.BenchError(f"the streaming upload's {marker} request did not arrive")
    tester = subprocess.Popen(
        ["zstd", "-t", "-q", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert tester.stdin is not None
    try:
        for path in paths:
            with path.open("rb") as part:
                shutil.copyfileobj(part, tester.stdin, MIB)
    except BrokenPipeError:
        pass  # zstd stopped reading: its status says why
    finally:
        with contextlib.suppress(BrokenPipeError):
            tester.stdin.close()
    assert tester.stderr is not None
    errors = tester.stderr.read()
    tester.wait()
    if tester.returncode != 0:
        raise harness.BenchError(f"the streaming parts are no zstd stream: {errors[-300:]!r}")


def tcp_counters() -> dict[str, int]:
    """This network namespace's TCP retransmitted segments and retransmission timeouts so
    far: during a run, the sender's (every client here sends from this namespace)."""
    counters: dict[str, int] = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        with contextlib.suppress(OSError):
            lines = Path(path).read_text().splitlines()
            for names, values in zip(lines[::2], lines[1::2], strict=False):
                if names.split()[0] in {"Tcp:", "TcpExt:"}:
                    counters |= dict(
                        zip(names.split()[1:], map(int, values.split()[1:]), strict=False)
                    )
    return {name: counters.get(name, 0) for name in TCP_COUNTERS}


def tree_bytes(root: Path) -> int:
    """Every entry's own size under `root`, links not followed."""
    total = 0
    for folder, directories, names in os.walk(root):
        for name in (*directories, *names):
            total += os.lstat(os.path.join(folder, name)).st_size
    return total
