"""The restore benchmark (`make bench`): our slot task's restore against the plain baseline.

A synthetic git repository (deterministic, at least 20,000 files) is archived at two sizes
with the project's own `build_squashfs` (zstd) and `measure`, and served by nginx on
loopback, so ranged GETs run at page-cache speed. Then, alternating within one run:

- ours: the real slot task (`python -m seedkeeper_task.supervisor`) started as the local runtime
  starts it, against a moto lifecycle table holding a record born for it. As in a
  deployment its plan carries no URL: it starts at the real checkpoint function (served in
  this process by the local function-URL gateway, `POST /tasks/start` signed with the
  task's keys), which answers a presigned GET of the archive's R2 key pointing at the same
  nginx (path-style, `/<bucket>/<key>`, laid out as a link to the archive). Then it
  downloads, verifies, extracts, fixes up, writes its marker and settles. Timed as the
  task records it (`result.ms`, `result.steps`: its restore, the start call not included)
  and as its whole process (interpreter start, imports and the start call included: each
  is part of what a task costs). Its sandbox command writes the task's peak RSS (VmHWM)
  and exits.
- the baseline: `curl -o`, `sha256sum` (the task verifies what it downloads), `unsquashfs -d`
  with the task's own flags (the same bounded caches) and `git checkout -B`, each a
  subprocess.

Both read the same archive through the same nginx from the same warm page cache, and each
run writes into a fresh journaled ext4 of its own (a loop-mounted sparse image, made before
the run and removed whole after it: as root; otherwise the work dir, and the report says
so). This machine's root filesystem is ext4 without a journal, where creating files right
after deleting many is quadratic: a tree deleted there before a timed run added seconds of
kernel time to both sides. The disk is synced before every timed run and the order of the
two alternates, so neither inherits the other's writeback. It reports medians and
ratios, and whether the targets are met; it never fails on a target (exit 1 only when the
benchmark itself breaks, such as a restore that does not seed). Inputs are cached in the
work dir (default `$TMPDIR/seedkeeper-bench`), and the figures are written there as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import resource
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

import boto3
from rich.console import Console
from rich.table import Table

from seedkeeper.adapters.r2 import backup_key
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding, OwnerClaim, SeedIdentity
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.record import SeedSucceeded, SlotRecord, State, Supported
from seedkeeper.domain.snapshots import Archive, NewSnapshot
from seedkeeper.services.rotation import Snapshots
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_task.restore.extract import UNSQUASHFS_COMMAND
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.gateway import FunctionUrlGateway, LocalCredentials
from seedkeeper_tools.local.motoserver import AtomicMotoServer
from seedkeeper_tools.publish import build_squashfs, measure

GENERATOR_VERSION = 3  # bump when the generator changes: cached inputs are rebuilt
SEED = 20_240_601
MB = 1_000_000
TABLE = "seedkeeper-bench"
BUCKET = "seedkeeper-bench"  # the R2 bucket the checkpoint function presigns for
REGION = "us-east-1"
REF = "main"
ORIGIN = "https://git.example.com/bench/synthetic.git"
RATIO_TARGET = 1.05
RSS_TARGET_MB = 150.0
# "Not growing with size": the larger archive's peak is within this of the smaller's.
RSS_FLAT_MB = 10.0
RUN_TIMEOUT = 900.0
MIN_REPEATS = 3
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Fixed identities and dates: the same inputs give the same commit.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_AUTHOR_DATE": "2024-06-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_COMMITTER_DATE": "2024-06-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


@dataclass(frozen=True)
class Size:
    label: str
    files: int  # tracked files; a few ignored files and symlinks come on top
    scale: float  # multiplies every file's size

    @property
    def key(self) -> str:
        return f"v{GENERATOR_VERSION}-{self.files}-{self.scale:g}"


# The same layout (names, kinds, relative sizes) at every size: only the bytes scale.
SIZES = (Size("1 GB", 20_000, 2.16), Size("300 MB", 20_000, 0.62), Size("100 MB", 20_000, 0.19))


class BenchError(Exception):
    """The benchmark could not measure (not a missed target)."""


# -- the synthetic repository -------------------------------------------------------------

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["ing", "er", "ex", "on"]
_KEYWORDS = [
    "def",
    "return",
    "if",
    "else",
    "for",
    "in",
    "while",
    "class",
    "import",
    "from",
    "with",
    "as",
    "try",
    "except",
    "raise",
    "yield",
    "await",
    "async",
    "lambda",
    "not",
    "and",
    "or",
    "None",
    "True",
    "False",
    "self",
    "const",
    "let",
    "func",
    "struct",
    "impl",
    "pub",
]
_PUNCTUATION = "=+-*/<>(),.:[]{}"
_CODE = (".py", ".ts", ".go", ".rs", ".java", ".c")
_ASSETS = (".png", ".woff2", ".jar", ".gz")


def _vocabulary(rng: random.Random, count: int) -> list[str]:
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def _code_lines(rng: random.Random, words: list[str], count: int) -> list[str]:
    """Source-like lines: indentation, keywords, identifiers, literals, comments."""
    lines: list[str] = []
    for _ in range(count):
        indent = "    " * rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
        kind = rng.random()
        if kind < 0.08:
            lines.append(indent + "# " + " ".join(rng.choices(words, k=rng.randint(3, 12))))
        elif kind < 0.12:
            lines.append("")
        elif kind < 0.30:
            first, second = rng.choices(words, k=2)
            arguments = ", ".join(rng.choices(words, k=rng.randint(0, 4)))
            lines.append(f"{indent}{first}_{second} = {rng.choice(words)}({arguments})")
        elif kind < 0.45:
            call = f"{rng.choice(words)}.{rng.choice(words)}"
            text = "_".join(rng.choices(words, k=2))
            lines.append(
                f'{indent}{rng.choice(_KEYWORDS)} {call}({rng.randint(0, 99999)}, "{text}"):'
            )
        elif kind < 0.60:
            lines.append(
                f"{indent}return {rng.choice(words)}[{rng.randint(0, 64)}]"
                f" + 0x{rng.getrandbits(32):08x}"
            )
        else:
            tokens = (
                rng.choice((rng.choice(words), rng.choice(_KEYWORDS), rng.choice(_PUNCTUATION)))
                for _ in range(rng.randint(3, 10))
            )
            lines.append(indent + " ".join(tokens))
    return lines


def _prose_lines(rng: random.Random, words: list[str], count: int) -> list[str]:
    lines: list[str] = []
    for _ in range(count):
        sentence = " ".join(rng.choices(words, k=rng.randint(6, 16)))
        lines.append(rng.choice(("", "", "- ", "## ", "> ")) + sentence.capitalize() + ".")
    return lines


def _data_lines(rng: random.Random, words: list[str], count: int) -> list[str]:
    lines: list[str] = []
    for _ in range(count):
        key = "_".join(rng.choices(words, k=rng.randint(1, 3)))
        value = rng.choice(
            (
                str(rng.randint(0, 10**6)),
                f'"{rng.choice(words)}"',
                "true",
                "null",
                f"{rng.random():.6f}",
            )
        )
        lines.append(f'{"  " * rng.randint(1, 4)}"{key}": {value},')
    return lines


def _directories(rng: random.Random, words: list[str], count: int) -> list[PurePosixPath]:
    tops = ("src", "lib", "tests", "docs", "tools", "vendor", "assets", "config")
    found = [PurePosixPath(top) for top in tops]
    seen = set(found)
    while len(found) < count:
        child = rng.choice(found) / rng.choice(words)
        if len(child.parts) <= 7 and child not in seen:
            seen.add(child)
            found.append(child)
    return found


def generate(root: Path, size: Size) -> int:
    """Write the working tree (deterministic); answer its size in bytes. Layout and sizes
    come from one random stream, content from another, so both sizes share one layout."""
    layout = random.Random(SEED)  # noqa: S311 - reproducible test data, not secrets
    content = random.Random(SEED + 1)  # noqa: S311
    words = _vocabulary(layout, 3000)
    pools = {
        "code": _code_lines(layout, words, 60_000),
        "prose": _prose_lines(layout, words, 20_000),
        "data": _data_lines(layout, words, 20_000),
    }
    directories = _directories(layout, words, max(8, size.files // 16))
    written = 0
    placed: list[PurePosixPath] = []
    for index in range(size.files):
        folder = layout.choice(directories)
        top = folder.parts[0]
        binary = layout.random() < (0.25 if top == "assets" else 0.015)
        stem = f"{layout.choice(words)}_{index}"
        if binary:
            name = stem + layout.choice(_ASSETS)
            count = int(min(8 * MB, layout.lognormvariate(10.5, 1.0)) * size.scale)
        else:
            kind = {"docs": "prose", "config": "data"}.get(top, "code")
            ext = {"prose": ".md", "data": ".json"}.get(kind, layout.choice(_CODE))
            executable = top == "tools" and layout.random() < 0.5
            name = stem + (".sh" if executable else ext)
            count = int(min(2 * MB, layout.lognormvariate(9.2, 1.0)) * size.scale)
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if binary:
            data = content.randbytes(max(1, count))
        else:
            lines = content.choices(pools[kind], k=max(1, count // 38))
            data = ("\n".join(lines) + "\n").encode()
            if name.endswith(".sh"):
                data = b"#!/bin/sh\n" + data
        path.write_bytes(data)
        if name.endswith(".sh"):
            path.chmod(0o755)
        written += len(data)
        placed.append(folder / name)
    for index in range(40):  # relative symlinks to a sibling, as repositories have a few
        target = layout.choice(placed)
        link = root / target.parent / f"link_{index}"
        if not os.path.lexists(link):
            link.symlink_to(target.name)
    (root / ".gitignore").write_text("build/\n*.log\n")
    build = root / "build"
    build.mkdir()
    for index in range(20):  # ignored build output: archived, never tracked
        data = "\n".join(content.choices(pools["code"], k=200)).encode()
        (build / f"out_{index}.o").write_bytes(data)
        written += len(data)
    return written


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "gc.auto=0", *args],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ | GIT_ENV,
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class Input:
    label: str
    files: int  # working-tree files (regular and symlinks), .git excluded
    entries: int  # everything in the archive
    raw_bytes: int  # the working tree's bytes, .git excluded
    commit: str
    archive: Path
    size: int
    sha256: str


def build_input(size: Size, workdir: Path, console: Console) -> Input:
    """The archive for `size`, built once and cached in the work dir."""
    archives = workdir / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    archives.chmod(0o755)  # nginx's workers read it as an unprivileged user
    archive = archives / f"synthetic-{size.key}.sqsh"
    meta_path = archives / f"synthetic-{size.key}.json"
    if archive.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("size") == archive.stat().st_size:
            console.print(f"[dim]{size.label}: cached archive {archive}[/dim]")
            return _input_from(size, archive, meta)
    console.print(f"{size.label}: generating {size.files} files (once; cached in {archives})")
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="generate-", dir=workdir))
    try:
        repo = scratch / "synthetic"
        repo.mkdir()
        raw = generate(repo, size)
        _git(repo, "init", "-q", "-b", REF)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "A synthetic repository for the restore benchmark")
        _git(repo, "repack", "-a", "-d", "-q", "--window=0")  # one pack, as a clone has
        commit = _git(repo, "rev-parse", "HEAD")
        files = entries = 0
        for folder, directories, names in os.walk(repo):
            entries += len(directories) + len(names)
            if Path(folder).relative_to(repo).parts[:1] != (".git",):
                files += len(names)  # symlinks to files are listed with the files
        staged = scratch / "archive.sqsh"
        build_squashfs(repo, staged)
        staged.chmod(0o644)
        staged.replace(archive)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    archive_size, _ = measure(archive)
    meta = {"files": files, "entries": entries, "raw_bytes": raw, "commit": commit}
    meta_path.write_text(json.dumps(meta | {"size": archive_size}, indent=2))
    console.print(
        f"{size.label}: {files} files, {raw / MB:.0f} MB raw, archive "
        f"{archive_size / MB:.0f} MB, built in {time.monotonic() - started:.0f} s"
    )
    return _input_from(size, archive, meta)


def _input_from(size: Size, archive: Path, meta: dict[str, Any]) -> Input:
    measured_size, sha256 = measure(archive)  # also warms the page cache nginx serves from
    return Input(
        label=size.label,
        files=int(meta["files"]),
        entries=int(meta["entries"]),
        raw_bytes=int(meta["raw_bytes"]),
        commit=str(meta["commit"]),
        archive=archive,
        size=measured_size,
        sha256=sha256,
    )


# -- the servers ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Nginx:
    """nginx from the distribution, with its own minimal configuration, in the foreground.
    With `accepts_puts`, its dav module also stores PUT bodies under `root` (written to
    `temp` as they arrive, renamed into place when complete: keep both on one filesystem).
    With `limit_rate` (nginx's syntax, bytes per second: "50m"), each connection's
    responses are paced to that rate; `home` names its folder (default: `nginx`)."""

    def __init__(
        self,
        root: Path,
        workdir: Path,
        *,
        temp: Path | None = None,
        accepts_puts: bool = False,
        limit_rate: str | None = None,
        home: str = "nginx",
    ) -> None:
        self.root = root
        self.home = workdir / home
        self.temp = temp or self.home / "tmp"
        self.accepts_puts = accepts_puts
        self.limit_rate = limit_rate
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, archive: Path) -> str:
        return f"{self.endpoint}/{archive.name}"

    def start(self) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.access(binary, os.X_OK):
            raise BenchError("nginx is not installed (make bench installs it as root)")
        self.home.mkdir(parents=True, exist_ok=True)
        self.temp.mkdir(parents=True, exist_ok=True)
        log = self.home / "error.log"
        temps = "\n".join(
            f'    {kind}_temp_path "{self.temp}";'
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        directives = (
            "client_max_body_size 0; dav_methods PUT DELETE; create_full_put_path on;"
            if self.accepts_puts
            else ""
        )
        if self.limit_rate is not None:
            directives += f" limit_rate {self.limit_rate};"
        config = self.home / "nginx.conf"
        config.write_text(
            f"""daemon off;
worker_processes auto;
pid "{self.home / "nginx.pid"}";
error_log "{log}" warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    default_type application/octet-stream;
{temps}
    server {{
        listen 127.0.0.1:{self.port};
        root "{self.root}";
        {directives}
    }}
}}
"""
        )
        self._process = subprocess.Popen(
            [binary, "-e", str(log), "-p", str(self.home), "-c", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            if self._process.poll() is not None:
                raise BenchError(f"nginx exited: {log.read_text()[-500:] if log.exists() else ''}")
            request = urllib.request.Request(self.endpoint + "/", method="HEAD")  # noqa: S310
            try:
                with urllib.request.urlopen(request, timeout=2):  # noqa: S310 - loopback
                    return
            except urllib.error.HTTPError:
                return  # an answer, whatever it says: nginx serves
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise BenchError("nginx did not answer on loopback") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def serve_object(root: Path, key: str, source: Path) -> None:
    """Lay `source` where an nginx serving `root` answers a presigned GET of BUCKET's `key`:
    R2's URLs are path-style, `{endpoint}/{BUCKET}/{key}?X-Amz-...`, and nginx ignores the
    query. A hard link (no copy), laid afresh: a rebuilt `source` is a new file."""
    folder = root
    for part in (BUCKET, *PurePosixPath(key).parent.parts):
        folder /= part
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)  # nginx's workers read it as an unprivileged user
    target = root / BUCKET / key
    target.unlink(missing_ok=True)
    os.link(source, target)


def checkpoint_function(dynamodb_endpoint: str) -> FunctionUrlGateway:
    """The real checkpoint function, served (started) in this process by the local
    function-URL gateway, which takes the task's keys (FAKE_AWS) as the task role's. Its
    handler reads its settings from this process's environment when called: the lifecycle
    table at `dynamodb_endpoint` and R2's BUCKET with fake keys (nginx checks no signature);
    each run names the R2 endpoint, its nginx (`Bench.task`)."""
    for name in [name for name in os.environ if name.startswith("SEEDKEEPER_")]:
        del os.environ[name]  # nothing from a developer's settings, as for the task
    os.environ.update(
        {
            "SEEDKEEPER_TABLE": TABLE,
            "SEEDKEEPER_DYNAMODB_ENDPOINT": dynamodb_endpoint,
            "SEEDKEEPER_R2_BUCKET": BUCKET,
            "SEEDKEEPER_R2_ACCESS_KEY_ID": "bench",
            "SEEDKEEPER_R2_SECRET_ACCESS_KEY": "bench",
        }
    )
    task_keys = LocalCredentials(FAKE_AWS["AWS_ACCESS_KEY_ID"], FAKE_AWS["AWS_SECRET_ACCESS_KEY"])
    return FunctionUrlGateway(
        "127.0.0.1",
        0,
        LocalCredentials("bench-executor", secrets.token_hex(16)),  # no executor calls here
        task_credentials=task_keys,
        region=REGION,
    ).start()


# -- one run of each ------------------------------------------------------------------------


@dataclass
class Timed:
    seconds: float
    max_rss_kb: int  # the process and its waited-for descendants (wait4)
    code: int


def timed_run(argv: Sequence[str], *, env: dict[str, str], log: IO[bytes]) -> Timed:
    """Run argv to completion, its wall time measured around spawn and reap."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    killer = threading.Timer(RUN_TIMEOUT, _kill_group, (process.pid,))
    killer.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        killer.cancel()
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return Timed(seconds, usage.ru_maxrss, process.returncode)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class OursRun:
    restore_s: float  # result.ms: as the task records it
    process_s: float  # the task's whole process
    steps_ms: dict[str, int]
    peak_rss_kb: int  # the task's own VmHWM
    tree_max_rss_kb: int  # the task and its children (unsquashfs, git)


@dataclass
class BaselineRun:
    total_s: float
    steps_s: dict[str, float]
    max_rss_kb: dict[str, int]


class Disks:
    """A new journaled ext4 per run, on a loop-mounted sparse image (root only); otherwise
    a plain folder on the work dir's own filesystem, and the report says so."""

    def __init__(self) -> None:
        self.mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
        self.loop = os.geteuid() == 0 and Path(self.mkfs).exists() and bool(shutil.which("mount"))

    @property
    def description(self) -> str:
        if self.loop:
            return "a fresh ext4 (journaled) per run, loop-mounted"
        return "the work dir's filesystem (no loop mount without root): NOT fresh per run"

    @contextlib.contextmanager
    def fresh(self, folder: Path, capacity: int) -> Iterator[Path]:
        mount = folder / "fs"
        mount.mkdir()
        if not self.loop:
            yield mount
            return
        image = folder / "fs.img"
        with image.open("wb") as sparse:
            sparse.truncate(capacity)
        # Inode tables and journal written now: no lazy init thread writing during a run.
        run_checked(
            [self.mkfs, "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image)]
        )
        run_checked(["mount", "-o", "loop", str(image), str(mount)])
        try:
            yield mount
        finally:
            unmount(mount)
            image.unlink(missing_ok=True)


def capacity(case: Input) -> int:
    """A run's filesystem: room for the tree, its .git, an archive or capture beside it
    and ext4's overhead; the image is sparse, so the room costs nothing unused."""
    return 3 * case.raw_bytes + 2 * case.size + case.entries * 8192 + 512 * 1024**2


def run_checked(argv: Sequence[str]) -> None:
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"{argv[0]} exited {done.returncode}: {done.stderr[-500:]}")


def unmount(mount: Path) -> None:
    """Unmount (the loop device detaches itself); lazily if something still holds it."""
    done = subprocess.run(["umount", str(mount)], check=False, capture_output=True)
    if done.returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def unmount_leftovers(runs: Path) -> None:
    """A run killed outright leaves its filesystem mounted under `runs`: unmount it first,
    so removing `runs` never descends into one still in use."""
    with contextlib.suppress(OSError):
        mounts = Path("/proc/mounts").read_text().splitlines()
        for line in reversed(mounts):
            point = line.split()[1].replace("\\040", " ")
            if point.startswith(f"{runs}/"):
                unmount(Path(point))


@dataclass
class Bench:
    workdir: Path
    nginx: Nginx
    endpoint: str
    checkpoint_url: str  # the checkpoint function the task starts at
    lifecycle: Lifecycle
    snapshots: SnapshotStore
    environment: dict[str, str]  # what every subprocess inherits: no SEEDKEEPER_*, fake AWS
    # Each run extracts into a fresh journaled filesystem: this machine's root filesystem
    # (ext4 without a journal) makes creating files right after deleting many quadratic.
    disks: Disks = field(default_factory=Disks)
    slots: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def run_dir(self, name: str) -> Path:
        folder = self.workdir / "runs" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def record(self, case: Input) -> None:
        """The snapshot the task's seed names, and its archive where its grant points."""
        serve_object(self.nginx.root, backup_key(case.archive.stem), case.archive)
        archive = Archive(backup_id=case.archive.stem, size=case.size, sha256=case.sha256)
        snapshot = NewSnapshot(
            resource=case.archive.stem,
            ref=REF,
            sha=case.commit,
            created_at=int(time.time()),
            checkout=archive,
        )
        Snapshots(self.snapshots, r2=None).record(snapshot)

    def ours(self, case: Input) -> OursRun:
        slot = f"bench-{next(self.slots)}"
        folder = self.run_dir(slot)
        record, op = self.launched(case, slot)
        assert record.incarnation is not None  # recorded by `launched`
        plan = SlotPlan.of(record, op)
        with self.disks.fresh(folder, capacity(case)) as root:
            workspace = root / "workspace"
            workspace.mkdir()
            timed = self.task(plan, record.incarnation, workspace, folder)
            result = self.seeded(slot, case, timed, workspace, folder)
        peak = peak_rss_kb(folder, slot)
        shutil.rmtree(folder)
        return OursRun(
            restore_s=result.ms / 1000,
            process_s=timed.seconds,
            steps_ms=dict(result.steps),
            peak_rss_kb=peak,
            tree_max_rss_kb=timed.max_rss_kb,
        )

    def launched(
        self, case: Input, slot: str, *, now: int | None = None
    ) -> tuple[SlotRecord, OpRef]:
        """A record born for `case`'s seed at `now` and its incarnation recorded, as the
        local runtime leaves it before the task starts: (the record, its restore op)."""
        seed = SeedIdentity(
            resource=case.archive.stem,
            ref=REF,
            sha=case.commit,
            checkout_backup_id=case.archive.stem,
        )
        owner = OwnerClaim(
            run=f"run-{slot}",
            requester="bench",
            thread="bench",
            repository="bench/synthetic",
            ref=REF,
            head=case.commit,
        )
        now = int(time.time()) if now is None else now
        born = self.lifecycle.birth(
            slot,
            Binding(owner=owner, seed=seed, origin=ORIGIN),
            now=now,
            idle_deadline=now + 3600,
            requires=self.snapshots.recorded_check(seed),
        )
        if not isinstance(born, Written) or born.entry is None:
            raise BenchError(f"{slot}: the birth was refused: {born}")
        incarnation = f"local:{slot}:{born.record.attempt}"
        recorded = self.lifecycle.write(
            transitions.RECORD_INCARNATION,
            born.record,
            transitions.Launched(incarnation=incarnation, launch=born.entry.ref, now=now),
        )
        if not isinstance(recorded, Written):
            raise BenchError(f"{slot}: the incarnation was not recorded: {recorded}")
        return recorded.record, born.entry.ref

    def task(self, plan: SlotPlan, incarnation: str, workspace: Path, folder: Path) -> Timed:
        """The real slot task of `plan` in `incarnation`, started as the local runtime starts
        it and timed whole, its start call included; its sandbox command writes the task's
        peak RSS (VmHWM) into `folder` and exits. Its log: `folder`/task.log."""
        hwm = folder / "vmhwm"
        probe = f"grep VmHWM /proc/$PPID/status > {shlex.quote(str(hwm))}"
        environment = self.environment | {
            PLAN_VARIABLE: plan.to_env(),
            "SEEDKEEPER_WORKSPACE": str(workspace),
            "SEEDKEEPER_INCARNATION": incarnation,
            "SEEDKEEPER_TABLE": TABLE,
            "SEEDKEEPER_DYNAMODB_ENDPOINT": self.endpoint,
            "SEEDKEEPER_CHECKPOINT_URL": self.checkpoint_url,
            "SEEDKEEPER_SANDBOX_COMMAND": json.dumps(["sh", "-c", probe]),
        }
        # The checkpoint function runs in this process: its grants point at this run's nginx.
        os.environ["SEEDKEEPER_R2_ENDPOINT"] = self.nginx.endpoint
        _settle_disk()
        with (folder / "task.log").open("wb") as log:
            return timed_run([sys.executable, "-m", "seedkeeper_task"], env=environment, log=log)

    def seeded(
        self,
        slot: str,
        case: Input,
        timed: Timed,
        workspace: Path,
        folder: Path,
        *,
        resumed: bool = False,
    ) -> SeedSucceeded:
        """The task's settled result, checked: exit 0, `seeded` with `case`'s commit (from
        the checkpoint when `resumed`), and the checkout's HEAD on it."""
        classified = self.lifecycle.read(slot)
        record = classified.record if isinstance(classified, Supported) else None
        result = record.result if record is not None else None
        checkout = workspace / CHECKOUT
        if (
            timed.code != 0
            or record is None
            or record.state is not State.SEEDED
            or not isinstance(result, SeedSucceeded)
            or result.resumed != resumed
            or result.head != case.commit
            or _head(checkout) != case.commit
        ):
            tail = (folder / "task.log").read_text(errors="replace")[-2000:]
            raise BenchError(f"{slot} did not seed (exit {timed.code}): {classified}\n{tail}")
        return result

    def baseline(self, case: Input) -> BaselineRun:
        """`curl -o`, `sha256sum` (the task verifies too), `unsquashfs` with the task's own
        flags (the same bounded caches, the same strictness) and `git checkout -B`, each a
        subprocess, into a fresh journaled filesystem; the digest and HEAD checked."""
        folder = self.run_dir(f"baseline-{next(self.slots)}")
        steps: dict[str, float] = {}
        rss: dict[str, int] = {}
        with self.disks.fresh(folder, capacity(case)) as root:
            archive, checkout = root / "archive.sqsh", root / "checkout"
            commands = {
                "curl": ["curl", "-s", "-f", "-o", str(archive), self.nginx.url(case.archive)],
                "sha256sum": ["sha256sum", str(archive)],
                "unsquashfs": [*UNSQUASHFS_COMMAND, "-d", str(checkout), str(archive)],
                "checkout": ["git", "-C", str(checkout), "checkout", "-q", "-B", REF, case.commit],
            }
            _settle_disk()
            for name, argv in commands.items():
                log = folder / f"{name}.log"
                with log.open("wb") as output:
                    timed = timed_run(argv, env=self.environment, log=output)
                if timed.code != 0:
                    tail = log.read_text(errors="replace")[-2000:]
                    raise BenchError(f"baseline {name} exited {timed.code}:\n{tail}")
                steps[name], rss[name] = timed.seconds, timed.max_rss_kb
            digest = (folder / "sha256sum.log").read_text().split()[:1]
            if digest != [case.sha256] or _head(checkout) != case.commit:
                raise BenchError("the baseline's archive or HEAD is not the snapshot's")
        shutil.rmtree(folder)
        return BaselineRun(total_s=sum(steps.values()), steps_s=steps, max_rss_kb=rss)


def _settle_disk() -> None:
    """Start each timed run with no dirty pages from the one before (untimed)."""
    os.sync()
    time.sleep(0.2)


def _head(checkout: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def peak_rss_kb(folder: Path, slot: str) -> int:
    """The task's own peak RSS, as its sandbox command wrote it."""
    try:
        return int((folder / "vmhwm").read_text().split()[1])  # "VmHWM:   123456 kB"
    except (OSError, IndexError, ValueError) as unreadable:
        raise BenchError(f"{slot}: no VmHWM from the sandbox command") from unreadable


# -- the report -----------------------------------------------------------------------------


@dataclass
class Result:
    case: Input
    ours: list[OursRun]
    baseline: list[BaselineRun]

    @property
    def baseline_s(self) -> float:
        return statistics.median(run.total_s for run in self.baseline)

    @property
    def restore_s(self) -> float:
        return statistics.median(run.restore_s for run in self.ours)

    @property
    def process_s(self) -> float:
        return statistics.median(run.process_s for run in self.ours)

    @property
    def peak_rss_mb(self) -> float:
        return max(run.peak_rss_kb for run in self.ours) * 1024 / MB

    def paired_ratios(self) -> list[float]:
        """Each run's ratio to the baseline run next to it: their spread shows the noise."""
        return [
            ours.restore_s / base.total_s
            for ours, base in zip(self.ours, self.baseline, strict=True)
        ]

    def step_medians(self) -> dict[str, float]:
        names = sorted({name for run in self.ours for name in run.steps_ms})
        medians = {
            name: statistics.median(run.steps_ms.get(name, 0) for run in self.ours) / 1000
            for name in names
        }
        medians["other (preflight, cleanup)"] = statistics.median(
            run.restore_s - sum(run.steps_ms.values()) / 1000 for run in self.ours
        )
        medians["process overhead (interpreter, imports, start call, settle)"] = statistics.median(
            run.process_s - run.restore_s for run in self.ours
        )
        return medians

    def summary(self) -> dict[str, Any]:
        return {
            "size": self.case.label,
            "files": self.case.files,
            "archive_entries": self.case.entries,
            "raw_mb": self.case.raw_bytes / MB,
            "archive_mb": self.case.size / MB,
            "median_baseline_s": self.baseline_s,
            "median_ours_restore_s": self.restore_s,
            "ratio_restore": self.restore_s / self.baseline_s,
            "paired_ratios_restore": self.paired_ratios(),
            "median_ours_process_s": self.process_s,
            "ratio_process": self.process_s / self.baseline_s,
            "peak_rss_mb": self.peak_rss_mb,
            "ours_steps_median_s": self.step_medians(),
            "baseline_steps_median_s": {
                name: statistics.median(run.steps_s[name] for run in self.baseline)
                for name in self.baseline[0].steps_s
            },
            "ours_tree_max_rss_mb": max(run.tree_max_rss_kb for run in self.ours) * 1024 / MB,
            "baseline_max_rss_mb": {
                name: max(run.max_rss_kb[name] for run in self.baseline) * 1024 / MB
                for name in self.baseline[0].max_rss_kb
            },
            "runs": {
                "ours": [asdict(run) for run in self.ours],
                "baseline": [asdict(run) for run in self.baseline],
            },
        }


def report(console: Console, results: list[Result], repeats: int, workdir: Path) -> None:
    table = Table(
        title="Restore vs curl + sha256sum + unsquashfs + git checkout (medians, alternating runs)"
    )
    for column in (
        "size",
        "files",
        "archive MB",
        "runs",
        "baseline s",
        "ours: restore s",
        "ratio",
        "ours: process s",
        "ratio",
        "peak RSS MB",
    ):
        table.add_column(column, justify="left" if column == "size" else "right")
    for result in results:
        table.add_row(
            result.case.label,
            f"{result.case.files:,}",
            f"{result.case.size / MB:.1f}",
            f"{len(result.ours)} + {len(result.baseline)}",
            f"{result.baseline_s:.2f}",
            f"{result.restore_s:.2f}",
            f"{result.restore_s / result.baseline_s:.2f}",
            f"{result.process_s:.2f}",
            f"{result.process_s / result.baseline_s:.2f}",
            f"{result.peak_rss_mb:.1f}",
        )
    console.print(table)

    steps = Table(title="Where the time goes (medians, seconds)")
    steps.add_column("size")
    steps.add_column("ours: step", justify="left")
    steps.add_column("s", justify="right")
    steps.add_column("baseline: step", justify="left")
    steps.add_column("s", justify="right")
    for result in results:
        summary = result.summary()
        ours = list(summary["ours_steps_median_s"].items())
        base = list(summary["baseline_steps_median_s"].items())
        for index in range(max(len(ours), len(base))):
            left = ours[index] if index < len(ours) else ("", None)
            right = base[index] if index < len(base) else ("", None)
            steps.add_row(
                result.case.label if index == 0 else "",
                left[0],
                "" if left[1] is None else f"{left[1]:.2f}",
                right[0],
                "" if right[1] is None else f"{right[1]:.2f}",
            )
        steps.add_row(
            "",
            "max RSS, the task and its children MB",
            f"{summary['ours_tree_max_rss_mb']:.0f}",
            "max RSS, unsquashfs MB",
            f"{summary['baseline_max_rss_mb']['unsquashfs']:.0f}",
            end_section=True,
        )
    console.print(steps)
    inherited = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
    console.print(
        "[dim]max RSS with children comes from wait4: it counts what a child shares with its "
        f"parent when forked (this process: {inherited:.0f} MB; the task: its own peak), so "
        "read it as an upper bound. The task's peak RSS (VmHWM) is its own.[/dim]"
    )

    console.print("[bold]Targets[/bold]")
    for result in results:
        ratio = result.restore_s / result.baseline_s
        paired = result.paired_ratios()
        _verdict(
            console,
            ratio <= RATIO_TARGET,
            f"{result.case.label}: restore ratio {ratio:.2f} (paired runs: median "
            f"{statistics.median(paired):.2f}, {min(paired):.2f} to {max(paired):.2f}), "
            f"target <= {RATIO_TARGET}",
        )
        _verdict(
            console,
            result.peak_rss_mb <= RSS_TARGET_MB,
            f"{result.case.label}: task peak RSS {result.peak_rss_mb:.1f} MB, "
            f"target <= {RSS_TARGET_MB:.0f} MB",
        )
    if len(results) >= 2:
        ordered = sorted(results, key=lambda result: result.case.size)
        small, large = ordered[0], ordered[-1]
        growth = large.peak_rss_mb - small.peak_rss_mb
        _verdict(
            console,
            growth <= RSS_FLAT_MB,
            f"peak RSS {small.peak_rss_mb:.1f} MB at {small.case.size / MB:.0f} MB, "
            f"{large.peak_rss_mb:.1f} MB at {large.case.size / MB:.0f} MB: "
            f"{growth:+.1f} MB (flat: within {RSS_FLAT_MB:.0f} MB)",
        )
    figures = workdir / "results.json"
    figures.write_text(
        json.dumps(
            {
                "repeats": repeats,
                "cpus": os.cpu_count(),
                "unsquashfs": _version(["unsquashfs", "-version"]),
                "git": _version(["git", "--version"]),
                "targets": {"ratio": RATIO_TARGET, "peak_rss_mb": RSS_TARGET_MB},
                "results": [result.summary() for result in results],
            },
            indent=2,
        )
    )
    console.print(f"disk: {Disks().description}")
    console.print(f"figures: {figures}")


def _verdict(console: Console, met: bool, text: str) -> None:
    console.print(f"  {'[green]met[/green]    ' if met else '[red]NOT met[/red]'} {text}")


def _version(argv: list[str]) -> str:
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    return (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else ""


# -- main -----------------------------------------------------------------------------------


def _environment(workdir: Path) -> dict[str, str]:
    """What the task and the baseline both run with: nothing from a developer's
    SEEDKEEPER_*, AWS_* or GIT_* settings nor their git configuration (a slot container has
    none), fake credentials."""
    keep = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SEEDKEEPER_", "AWS_", "GIT_"))
    }
    isolated_git = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return keep | FAKE_AWS | isolated_git | {"TMPDIR": str(workdir / "tmp")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help=f"runs of each method per size (at least {MIN_REPEATS}; more while the budget lasts)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=480.0,
        help="seconds for the timed runs of all sizes, past the first MIN_REPEATS pairs",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "seedkeeper-bench",
        help="cached inputs, scratch runs and results.json",
    )
    parser.add_argument(
        "--sizes", nargs="+", choices=[size.label for size in SIZES], help="a subset of sizes"
    )
    options = parser.parse_args(argv)
    console = Console(width=max(Console().width, 120))  # the tables stay readable in a log
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    unmount_leftovers(workdir / "runs")
    shutil.rmtree(workdir / "runs", ignore_errors=True)
    sizes = [size for size in SIZES if options.sizes is None or size.label in options.sizes]
    for tool in ("git", "mksquashfs", "unsquashfs", "curl", "sha256sum"):
        if shutil.which(tool) is None:
            console.print(f"[red]{tool} is not installed (make bench installs it as root)[/red]")
            return 1
    os.environ.update(FAKE_AWS)
    try:
        inputs = [build_input(size, workdir, console) for size in sizes]
        results = measure_all(console, workdir, inputs, options.repeats, options.budget)
    except BenchError as broken:
        console.print(f"[red]the benchmark could not measure:[/red] {broken}")
        return 1
    finally:
        unmount_leftovers(workdir / "runs")
        shutil.rmtree(workdir / "runs", ignore_errors=True)
    report(console, results, options.repeats, workdir)
    return 0  # a report, not a gate


def measure_all(
    console: Console, workdir: Path, inputs: list[Input], repeats: int, budget: float
) -> list[Result]:
    """At least MIN_REPEATS alternating pairs per size, up to `repeats` while the time
    budget allows."""
    nginx = Nginx(workdir / "archives", workdir)
    moto = AtomicMotoServer().start()
    gateway = checkpoint_function(moto.endpoint)
    try:
        nginx.start()
        dynamodb = boto3.client("dynamodb", endpoint_url=moto.endpoint, region_name=REGION)
        create_table(dynamodb, TABLE, load_template())
        table = boto3.resource("dynamodb", endpoint_url=moto.endpoint, region_name=REGION)
        bench = Bench(
            workdir=workdir,
            nginx=nginx,
            endpoint=moto.endpoint,
            checkpoint_url=gateway.url,
            lifecycle=Lifecycle(table.Table(TABLE)),
            snapshots=SnapshotStore(table.Table(TABLE)),
            environment=_environment(workdir),
        )
        for case in inputs:  # the records the task reads its archive's size and sha256 from
            bench.record(case)
        console.print("warming up: one untimed run of each (imports, page cache)")
        bench.ours(inputs[0])
        bench.baseline(inputs[0])
        results: list[Result] = []
        deadline = time.monotonic() + budget
        for position, case in enumerate(inputs):
            result = Result(case, [], [])
            started = time.monotonic()
            for index in range(max(repeats, MIN_REPEATS)):  # ABBA: neither always goes first
                if index >= MIN_REPEATS:
                    share = (deadline - started) / (len(inputs) - position)
                    pair = (time.monotonic() - started) / index
                    if index >= repeats or time.monotonic() - started + pair > share:
                        break
                if index % 2 == 0:
                    result.ours.append(bench.ours(case))
                    result.baseline.append(bench.baseline(case))
                else:
                    result.baseline.append(bench.baseline(case))
                    result.ours.append(bench.ours(case))
                console.print(
                    f"  {case.label} #{index + 1}: baseline {result.baseline[-1].total_s:.2f} s,"
                    f" ours {result.ours[-1].restore_s:.2f} s (process"
                    f" {result.ours[-1].process_s:.2f} s) {result.ours[-1].steps_ms}"
                )
            results.append(result)
        return results
    finally:
        gateway.stop()
        nginx.stop()
        moto.stop()
        shutil.rmtree(nginx.root / BUCKET, ignore_errors=True)  # links only: the cache stays


if __name__ == "__main__":
    sys.exit(main())
