"""The checkpoint benchmark (`make bench`): our checkpoint against `tar --zstd | curl -T -`.

The trees are the restore benchmark's snapshots (its generator and its cached archives: a
repository with history and a node_modules-like deps tree, about 120,000 files at 300 MB
and three times as many at 1 GB; other sizes scale the 300 MB one's file counts). Each run
starts from a fresh journaled ext4 (a loop-mounted image, as a Fargate task's disk is fresh
and journaled; see LOCAL-AWS-NOTES) onto which both archives are extracted, untimed, as the
restore lays them out (the deps tree in the checkout). Then, alternating within one run:

- ours: the supervisor's checkpoint, as a process of its own: an interpreter that imports
  the supervisor's modules and builds its clients, then `capture.freeze` (no sandbox:
  the sync alone), `capture.capture` (mksquashfs zstd, then sha256 and md5 in one pass),
  asks this process for a presigned PUT (the checkpoint function's part:
  `R2.presign_put`, so its `Content-MD5` and `x-amz-checksum-sha256` are sent), and
  `capture.upload`s the file. Timed as a whole process (interpreter start included) and
  from the freeze to the upload's answer (what a running supervisor spends). Its peak
  RSS is its own VmHWM, reset (`clear_refs`) once its modules and clients are loaded,
  so it counts the standing footprint plus what checkpointing adds, never a child's.
- the baseline: `tar --zstd -cf - checkout | tee >(sha256sum) | curl -T -` with a
  presigned PUT that names no checksum. The sha256 on the side is its integrity check
  (what it sent, compared with what arrived, untimed): one more reader of the stream, on
  the other core. It cannot sign a checksum as ours does: a stream's hash is known only
  after it is sent.

Both PUT to the same server: nginx's dav module on loopback (default; the body written to
tmpfs as it arrives), or moto (`--server moto`; about 9 s per GB, most of it moto's). No
bandwidth cap: nginx's `limit_rate` paces responses, not request bodies, and the restore
benchmark has none either. After each run what arrived is checked (size, sha256) and
removed. It reports medians with their spread and paired ratios; it never fails on a
target (exit 1 only when it cannot measure). Inputs are cached in the work dir (default
`$TMPDIR/seedkeeper-bench`, shared with the restore benchmark), figures written there.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.table import Table

from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2
from seedkeeper_tools.local.motoserver import AtomicMotoServer
from seedkeeper_tools.publish import measure

if TYPE_CHECKING:
    from benchmarks import links, restore
    from mypy_boto3_s3 import S3Client
else:
    import links
    import restore  # the script's own folder is on sys.path: its trees and helpers

BUCKET = "seedkeeper-bench"
EXPIRES = 900
DEFAULT_SIZES = (300, 1000)  # MB of archive, as the restore benchmark labels its sizes
DEFAULT_PAIRS = 3
CAPTURE_TIMEOUT = 900.0
UPLOAD_TIMEOUT = 60.0
MB = restore.MB

# The supervisor's checkpoint in a process of its own (see the module docstring). One JSON
# line out after the capture, one in (the presigned PUT) on stdin, one out at the end; out
# through a descriptor of their own (argv[5]), so nothing a module prints gets in the way.
DRIVER = r"""
import json, os, re, resource, sys, time
from pathlib import Path

import seedkeeper_task.supervisor  # the modules a supervisor holds while it waits
from seedkeeper_task import capture as module
from seedkeeper_task.watch import MAX_CHECKPOINT_BYTES

def status(name):
    with open("/proc/self/status") as file:
        return int(re.search(name + r":\s+(\d+) kB", file.read()).group(1))

steps = {}
def timed(name, function):
    def wrapper(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            steps[name] = steps.get(name, 0.0) + time.perf_counter() - begun
    return wrapper

module._mksquashfs = timed("mksquashfs", module._mksquashfs)
module._seal_and_hash = timed("hash (sha256, md5)", module._seal_and_hash)
resident = status("VmRSS")
try:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM from here on: the footprint plus the checkpoint's peak
    reset = True
except OSError:
    reset = False
checkout, target = Path(sys.argv[1]), Path(sys.argv[2])
channel = os.fdopen(int(sys.argv[5]), "w")
started = time.perf_counter()
timed("freeze (sync)", module.freeze)(None, None)
captured = timed("capture", module.capture)(
    checkout, target, user=None, timeout=float(sys.argv[3]), max_bytes=MAX_CHECKPOINT_BYTES
)
facts = {"size": captured.size, "sha256": captured.sha256, "md5": captured.md5}
print(json.dumps(facts), file=channel, flush=True)
begun = time.perf_counter()
grant = json.loads(sys.stdin.readline())
steps["presign (this benchmark)"] = time.perf_counter() - begun
headers = {k: v for k, v in grant["headers"].items() if k.lower() != "content-length"}
timed("upload", module.upload)(
    grant["url"], target, headers, size=captured.size, timeout=float(sys.argv[4])
)
checkpoint = time.perf_counter() - started
print(json.dumps({
    "checkpoint_s": checkpoint,
    "steps_s": steps,
    "peak_rss_kb": status("VmHWM"),
    "resident_kb": resident,
    "hwm_reset": reset,
    "children_max_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), file=channel, flush=True)
"""

# $1: the folder holding `checkout`, $2: where the sha256 goes, $3: the URL. `wait $!`
# waits for the process substitution, so its sum is written when the script ends.
BASELINE = (
    "set -o pipefail; "
    'tar --zstd -cf - -C "$1" checkout | tee >(sha256sum > "$2") '
    '| curl -sS --fail -T - -o /dev/null "$3"; '
    "status=$?; wait $!; exit $status"
)


# -- the servers ----------------------------------------------------------------------------


class Sink(Protocol):
    name: str

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def stored(self, key: str) -> tuple[int, str] | None: ...  # size, sha256
    def remove(self, key: str) -> None: ...

    @property
    def endpoint(self) -> str: ...


def _shared_memory_dir(prefix: str) -> Path:
    """A fresh folder on tmpfs (/dev/shm) when there is one: the server's writes never
    meet the client's disk, as a remote store's never would. Else under the temp dir."""
    shm = Path("/dev/shm")  # noqa: S108 - a fresh folder made in it by mkdtemp
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class NginxSink:
    """nginx's dav module (the restore benchmark's nginx, taking PUTs): a PUT's body is
    written to a temp file on tmpfs as it arrives and renamed into place when complete;
    the answer (201) comes after that."""

    name = "nginx (dav, body on tmpfs)"

    def __init__(self, home: Path) -> None:
        self.data = _shared_memory_dir("seedkeeper-checkpoint-sink-")
        store, temp = self.data / "store", self.data / "temp"
        self._server = links.Nginx(store, home, temp=temp, accepts_puts=True)

    @property
    def endpoint(self) -> str:
        return self._server.endpoint

    def start(self) -> None:
        self.data.chmod(0o755)  # mkdtemp's 0700 would keep nginx's workers out
        for folder in (self.data / "store", self.data / "temp"):
            folder.mkdir()
            # nginx started as root writes as its unprivileged worker user: a folder of
            # this benchmark's own, removed when it stops.
            folder.chmod(0o777)
        self._server.start()

    def _path(self, key: str) -> Path:
        return self.data / "store" / BUCKET / key

    def stored(self, key: str) -> tuple[int, str] | None:
        path = self._path(key)
        if not path.exists():
            return None
        return measure(path)

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def stop(self) -> None:
        self._server.stop()
        shutil.rmtree(self.data, ignore_errors=True)


class MotoSink:
    """moto's S3 in this process, unsigned: the local stack's signed store refuses bodies
    over 64 MiB (MAX_BODY), so a checkpoint of these sizes cannot go there. moto reads the
    whole body, then checks Content-MD5 (and keeps the checksum) before it answers."""

    name = "moto (S3, in memory)"

    def __init__(self) -> None:
        self._server = AtomicMotoServer()
        self._client: S3Client | None = None

    @property
    def endpoint(self) -> str:
        return self._server.endpoint

    def start(self) -> None:
        self._server.start()
        self._client = r2_client(self.endpoint)
        self._client.create_bucket(
            Bucket=BUCKET,
            CreateBucketConfiguration={"LocationConstraint": "auto"},  # type: ignore[typeddict-item]
        )

    def stored(self, key: str) -> tuple[int, str] | None:
        assert self._client is not None
        try:
            body = self._client.get_object(Bucket=BUCKET, Key=key)["Body"]
        except self._client.exceptions.NoSuchKey:
            return None
        digest, size = hashlib.sha256(), 0
        for chunk in body.iter_chunks(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
        return size, digest.hexdigest()

    def remove(self, key: str) -> None:
        assert self._client is not None
        self._client.delete_object(Bucket=BUCKET, Key=key)

    def stop(self) -> None:
        self._server.stop()


def r2_client(endpoint: str) -> S3Client:
    """The functions' R2 client (its dialect: path-style, checksums only when required)."""
    return aws.r2_client(aws.session(), endpoint, "bench", "bench-secret")


# -- a fresh filesystem per run -------------------------------------------------------------


# -- one run of each ------------------------------------------------------------------------


@dataclass
class OursRun:
    process_s: float  # the whole process: interpreter start, imports, clients, checkpoint
    checkpoint_s: float  # freeze to the upload's answer, as a running supervisor spends it
    steps_s: dict[str, float]
    peak_rss_kb: int  # VmHWM, reset once the modules and clients were loaded
    resident_kb: int  # VmRSS before the checkpoint: the standing footprint
    hwm_reset: bool
    mksquashfs_max_rss_kb: int  # its children's (mksquashfs, git) largest
    size: int


@dataclass
class BaselineRun:
    seconds: float
    max_rss_kb: int  # the pipeline's largest process (wait4)
    size: int


@dataclass
class Bench:
    workdir: Path
    sink: Sink
    r2: R2
    client: S3Client
    disks: restore.Disks
    environment: dict[str, str]
    checkout_bytes: dict[str, int] = field(default_factory=dict)
    counter: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @contextlib.contextmanager
    def prepared(self, case: restore.Input, name: str) -> Iterator[tuple[Path, Path]]:
        """A fresh filesystem holding the checkout as the restore leaves it (the archives
        extracted, settled): (the filesystem's root, the run's own folder)."""
        folder = self.workdir / "checkpoint-runs" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            with self.disks.fresh(folder, restore.capacity(case)) as root:
                restore.unpack(case, root / "checkout")
                (root / "state").mkdir(mode=0o711)  # the supervisor's state folder
                if case.label not in self.checkout_bytes:
                    self.checkout_bytes[case.label] = _tree_bytes(root / "checkout")
                restore._settle_disk()
                yield root, folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def ours(self, case: restore.Input) -> OursRun:
        slot = f"bench-{next(self.counter)}"
        key = f"checkpoints/{slot}/local-{slot}-1/1.sqsh"  # the checkpoint function's layout
        with self.prepared(case, slot) as (root, folder):
            arguments = [
                str(root / "checkout"),
                str(root / "state" / "checkpoint.sqsh"),
                str(CAPTURE_TIMEOUT),
                str(UPLOAD_TIMEOUT),
            ]
            with (folder / "driver.log").open("wb") as log:
                timed, captured, result = self._drive(arguments, key, log)
            if timed.code != 0 or captured is None or result is None:
                tail = (folder / "driver.log").read_text(errors="replace")[-2000:]
                raise links.BenchError(f"our checkpoint exited {timed.code}:\n{tail}")
        arrived = self.sink.stored(key)
        self.sink.remove(key)
        if arrived != (captured["size"], captured["sha256"]):
            raise links.BenchError(f"our upload arrived as {arrived}, not {captured}")
        return OursRun(
            process_s=timed.seconds,
            checkpoint_s=result["checkpoint_s"],
            steps_s=result["steps_s"],
            peak_rss_kb=result["peak_rss_kb"],
            resident_kb=result["resident_kb"],
            hwm_reset=result["hwm_reset"],
            mksquashfs_max_rss_kb=result["children_max_rss_kb"],
            size=captured["size"],
        )

    def _drive(
        self, arguments: list[str], key: str, log: IO[bytes]
    ) -> tuple[restore.Timed, dict[str, Any] | None, dict[str, Any] | None]:
        """Run the driver, answering its one request for a presigned PUT as the checkpoint
        function would; timed from spawn to reap."""
        readable, writable = os.pipe()
        started = time.perf_counter()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", DRIVER, *arguments, str(writable)],
                env=self.environment,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(writable,),
                start_new_session=True,
            )
        finally:
            os.close(writable)  # the driver's alone: its exit ends our reads
        killer = threading.Timer(restore.RUN_TIMEOUT, restore._kill_group, (process.pid,))
        killer.start()
        captured = result = None
        try:
            assert process.stdin is not None
            with process.stdin, os.fdopen(readable, "rb") as channel:
                line = channel.readline()
                if line:
                    captured = json.loads(line)
                    put = self.r2.presign_put(
                        key,
                        EXPIRES,
                        size=captured["size"],
                        sha256=captured["sha256"],
                        md5=captured["md5"],
                    )
                    grant = {"url": put.url, "headers": put.headers}
                    with contextlib.suppress(BrokenPipeError):
                        process.stdin.write(json.dumps(grant).encode() + b"\n")
                        process.stdin.flush()
                    line = channel.readline()
                    result = json.loads(line) if line else None
                _, status, usage = os.wait4(process.pid, 0)
        finally:
            killer.cancel()
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        return restore.Timed(seconds, usage.ru_maxrss, process.returncode), captured, result

    def baseline(self, case: restore.Input) -> BaselineRun:
        name = f"baseline-{next(self.counter)}"
        key = f"baselines/{name}.tar.zst"
        url = self.client.generate_presigned_url(
            "put_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=EXPIRES
        )
        with self.prepared(case, name) as (root, folder):
            checksum = folder / "sha256"
            argv = ["bash", "-c", BASELINE, "baseline", str(root), str(checksum), url]
            with (folder / "baseline.log").open("wb") as log:
                timed = restore.timed_run(argv, env=self.environment, log=log)
            if timed.code != 0:
                tail = (folder / "baseline.log").read_text(errors="replace")[-2000:]
                raise links.BenchError(f"the baseline exited {timed.code}:\n{tail}")
            sent = checksum.read_text().split()[0] if checksum.exists() else None
        arrived = self.sink.stored(key)
        self.sink.remove(key)
        if arrived is None or arrived[1] != sent:
            raise links.BenchError(f"the baseline's upload arrived as {arrived}, sent {sent}")
        return BaselineRun(seconds=timed.seconds, max_rss_kb=timed.max_rss_kb, size=arrived[0])


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, directories, names in os.walk(root):
        for name in (*directories, *names):
            total += os.lstat(os.path.join(folder, name)).st_size
    return total


# -- the report -----------------------------------------------------------------------------


@dataclass
class Result:
    case: restore.Input
    checkout_bytes: int
    ours: list[OursRun]
    baseline: list[BaselineRun]

    def ratios(self, attribute: str) -> list[float]:
        """Each run's ratio to the baseline run of its pair: their spread shows the noise."""
        return [
            getattr(ours, attribute) / base.seconds
            for ours, base in zip(self.ours, self.baseline, strict=True)
        ]

    def peak_rss_mb(self) -> list[float]:
        return [run.peak_rss_kb * 1024 / MB for run in self.ours]

    def step_medians(self) -> dict[str, float]:
        """Our steps in their order; capture() holds mksquashfs and the hash, and what
        else it does (the layout check, the config read by git, the rename)."""

        def median(name: str) -> float:
            return statistics.median(run.steps_s.get(name, 0.0) for run in self.ours)

        return {
            "process start, imports, clients": statistics.median(
                run.process_s - run.checkpoint_s for run in self.ours
            ),
            "freeze (the sync)": median("freeze (sync)"),
            "capture": median("capture"),
            "  mksquashfs": median("mksquashfs"),
            "  sha256 and md5, one pass": median("hash (sha256, md5)"),
            "  layout check, config read, rename": statistics.median(
                run.steps_s.get("capture", 0.0)
                - run.steps_s.get("mksquashfs", 0.0)
                - run.steps_s.get("hash (sha256, md5)", 0.0)
                for run in self.ours
            ),
            "presigned PUT asked for": median("presign (this benchmark)"),
            "upload": median("upload"),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "size": self.case.label,
            "files": self.case.files,
            "entries": self.case.entries,
            "checkout_mb": self.checkout_bytes / MB,
            "ours_capture_mb": statistics.median(run.size for run in self.ours) / MB,
            "baseline_tar_zst_mb": statistics.median(run.size for run in self.baseline) / MB,
            "median_baseline_s": statistics.median(run.seconds for run in self.baseline),
            "median_ours_checkpoint_s": statistics.median(run.checkpoint_s for run in self.ours),
            "median_ours_process_s": statistics.median(run.process_s for run in self.ours),
            "paired_ratios_checkpoint": self.ratios("checkpoint_s"),
            "paired_ratios_process": self.ratios("process_s"),
            "peak_rss_mb": self.peak_rss_mb(),
            "resident_before_mb": [run.resident_kb * 1024 / MB for run in self.ours],
            "mksquashfs_max_rss_mb": [run.mksquashfs_max_rss_kb * 1024 / MB for run in self.ours],
            "baseline_max_rss_mb": [run.max_rss_kb * 1024 / MB for run in self.baseline],
            "ours_steps_median_s": self.step_medians(),
            "runs": {
                "ours": [asdict(run) for run in self.ours],
                "baseline": [asdict(run) for run in self.baseline],
            },
        }


def report(
    console: Console, results: list[Result], bench: Bench, pairs: int, workdir: Path
) -> None:
    table = Table(
        title=f"Checkpoint vs tar --zstd | tee >(sha256sum) | curl -T - ({pairs} alternating "
        "pairs per size; medians, paired ratios as median (min-max))"
    )
    for column in (
        "size",
        "files",
        "checkout MB",
        "baseline s",
        "ours: checkpoint s",
        "ratio",
        "ours: process s",
        "ratio",
        "peak RSS MB (max)",
        "capture / tar.zst MB",
    ):
        table.add_column(column, justify="left" if column == "size" else "right")
    for result in results:
        summary = result.summary()
        peaks = result.peak_rss_mb()
        table.add_row(
            result.case.label,
            f"{result.case.files:,}",
            f"{result.checkout_bytes / MB:.1f}",
            f"{summary['median_baseline_s']:.2f}",
            f"{summary['median_ours_checkpoint_s']:.2f}",
            restore.spread(result.ratios("checkpoint_s")),
            f"{summary['median_ours_process_s']:.2f}",
            restore.spread(result.ratios("process_s")),
            f"{statistics.median(peaks):.1f} ({max(peaks):.1f})",
            f"{summary['ours_capture_mb']:.1f} / {summary['baseline_tar_zst_mb']:.1f}",
        )
    console.print(table)
    console.print(
        "[dim]ours: checkpoint = freeze to the upload's answer (a running supervisor's "
        "cost); process = the same plus interpreter start, imports and clients.[/dim]"
    )

    steps = Table(title="Where our time goes (medians, seconds), and memory (MB)")
    steps.add_column("size")
    steps.add_column("ours: step", justify="left")
    steps.add_column("s", justify="right")
    for result in results:
        medians = result.step_medians()
        for index, (name, seconds) in enumerate(medians.items()):
            steps.add_row(result.case.label if index == 0 else "", name, f"{seconds:.2f}")
        summary = result.summary()
        memory = {
            "supervisor before the checkpoint (VmRSS)": summary["resident_before_mb"],
            # wait4's max RSS counts what a child shares with its parent when forked: at
            # small sizes it shows the parent's, so read these two as upper bounds.
            "mksquashfs, at most (wait4)": summary["mksquashfs_max_rss_mb"],
            "baseline, its largest process, at most (wait4)": summary["baseline_max_rss_mb"],
        }
        for index, (name, values) in enumerate(memory.items()):
            steps.add_row(
                "", f"{name} MB", f"{statistics.median(values):.1f}", end_section=index == 2
            )
    console.print(steps)
    if not all(run.hwm_reset for result in results for run in result.ours):
        console.print(
            "[yellow]VmHWM could not be reset: the peak includes the process start[/yellow]"
        )
    console.print(
        f"[dim]server: {bench.sink.name} on loopback, no bandwidth cap; disk: "
        f"{bench.disks.description}; the tree as the restore leaves it (extracted, synced, "
        "in the page cache), its capture written beside it as the supervisor does.[/dim]"
    )

    console.print("[bold]Targets[/bold] (the issue sets none for the time: see the ratios)")
    for result in results:
        peak = max(result.peak_rss_mb())
        restore._verdict(
            console,
            peak <= restore.RSS_TARGET_MB,
            f"{result.case.label}: the supervisor's peak RSS while checkpointing {peak:.1f} MB "
            f"(max of {len(result.ours)}), target <= {restore.RSS_TARGET_MB:.0f} MB",
        )
    if len(results) >= 2:
        ordered = sorted(results, key=lambda result: result.checkout_bytes)
        small, large = ordered[0], ordered[-1]
        growth = max(large.peak_rss_mb()) - max(small.peak_rss_mb())
        restore._verdict(
            console,
            growth <= restore.RSS_FLAT_MB,
            f"peak RSS {max(small.peak_rss_mb()):.1f} MB at {small.case.label}, "
            f"{max(large.peak_rss_mb()):.1f} MB at {large.case.label}: {growth:+.1f} MB "
            f"(flat: within {restore.RSS_FLAT_MB:.0f} MB)",
        )
    figures = workdir / "checkpoint-results.json"
    figures.write_text(
        json.dumps(
            {
                "pairs": pairs,
                "cpus": os.cpu_count(),
                "server": bench.sink.name,
                "disk": bench.disks.description,
                "bandwidth": "unlimited loopback",
                "mksquashfs": restore._version(["mksquashfs", "-version"]),
                "tar": restore._version(["tar", "--version"]),
                "zstd": restore._version(["zstd", "--version"]),
                "targets": {"peak_rss_mb": restore.RSS_TARGET_MB, "flat_mb": restore.RSS_FLAT_MB},
                "results": [result.summary() for result in results],
            },
            indent=2,
        )
    )
    console.print(f"figures: {figures}")


# -- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        default=list(DEFAULT_SIZES),
        metavar="MB",
        help="snapshot sizes in MB (the restore benchmark's: 300, 1000, 100; others scale "
        "the 300 MB one's file counts)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=int(os.environ.get("CHECKPOINT_PAIRS", DEFAULT_PAIRS)),
        help="alternating pairs per size (default: $CHECKPOINT_PAIRS or 3)",
    )
    parser.add_argument("--server", choices=("nginx", "moto"), default="nginx")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "seedkeeper-bench",
        help="cached inputs (shared with restore.py), scratch runs, checkpoint-results.json",
    )
    options = parser.parse_args(argv)
    if options.pairs < 1 or any(megabytes < 1 for megabytes in options.sizes):
        parser.error("--pairs and --sizes must be positive")
    console = Console(width=max(Console().width, 140))  # the tables stay readable in a log
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    runs = workdir / "checkpoint-runs"
    restore.unmount_leftovers(runs)
    shutil.rmtree(runs, ignore_errors=True)
    for tool in ("git", "mksquashfs", "unsquashfs", "tar", "zstd", "curl", "bash"):
        if shutil.which(tool) is None:
            console.print(f"[red]{tool} is not installed[/red]")
            return 1
    os.environ.update(restore.FAKE_AWS)
    sink: Sink = (
        NginxSink(workdir / "checkpoint-nginx") if options.server == "nginx" else MotoSink()
    )
    disks = restore.Disks()
    try:
        inputs = [
            restore.build_input(restore.size_of(megabytes), workdir, console)
            for megabytes in options.sizes
        ]
        sink.start()
        client = r2_client(sink.endpoint)
        bench = Bench(
            workdir=workdir,
            sink=sink,
            r2=R2(client, BUCKET),
            client=client,
            disks=disks,
            # As the restore benchmark's task runs: none of a developer's SEEDKEEPER_, AWS_
            # or GIT_ settings, fake credentials; the table's name for the supervisor's client.
            environment=restore._environment(workdir) | {"SEEDKEEPER_TABLE": BUCKET},
        )
        results = measure_all(console, bench, inputs, options.pairs)
    except links.BenchError as broken:
        console.print(f"[red]the benchmark could not measure:[/red] {broken}")
        return 1
    finally:
        sink.stop()
        restore.unmount_leftovers(runs)
        shutil.rmtree(runs, ignore_errors=True)
    report(console, results, bench, options.pairs, workdir)
    return 0  # a report, not a gate


def measure_all(
    console: Console, bench: Bench, inputs: list[restore.Input], pairs: int
) -> list[Result]:
    console.print(
        f"server: {bench.sink.name}; disk: {bench.disks.description}; "
        "warming up: one untimed run of each at the smallest size"
    )
    smallest = min(inputs, key=lambda case: case.size)
    bench.ours(smallest)
    bench.baseline(smallest)
    results: list[Result] = []
    for case in inputs:
        result = Result(case, 0, [], [])
        for index in range(pairs):  # alternating: neither always goes first
            if index % 2 == 0:
                result.ours.append(bench.ours(case))
                result.baseline.append(bench.baseline(case))
            else:
                result.baseline.append(bench.baseline(case))
                result.ours.append(bench.ours(case))
            ours = result.ours[-1]
            console.print(
                f"  {case.label} #{index + 1}: baseline {result.baseline[-1].seconds:.2f} s, "
                f"ours {ours.checkpoint_s:.2f} s (process {ours.process_s:.2f} s, "
                f"peak RSS {ours.peak_rss_kb * 1024 / MB:.1f} MB)"
            )
        result.checkout_bytes = bench.checkout_bytes[case.label]
        results.append(result)
    return results


if __name__ == "__main__":
    sys.exit(main())
