"""The checkpoint benchmark (`make bench`): our checkpoint against tar+openssl+curl and a
streaming multipart upload, per link and CPU shape.

The trees are the restore benchmark's snapshots (its generator and its cached archives: a
repository with history and a node_modules-like deps tree, about 120,000 files at 300 MB
and three times as many at 1 GB; other sizes scale the 300 MB one's file counts).

Cells: every link of `--links` at every CPU shape of `--cpus` (1 and 2 vCPU by default),
every size. The links are `links.py`'s:

- total (default): HTTPS to nginx in a network namespace, each direction capped at
  1 Gbit/s by tbf (so the uploads are capped too), 30 ms of round trip, TLS 1.3 with a
  self-signed certificate every client here trusts (`client_environment`: ours' Python ssl
  through SSL_CERT_FILE, curl through `--cacert`).
- loopback (default): plain HTTP, unlimited.
- per-connection is not measured (asked for, it is skipped with a message): nginx's
  `limit_rate` paces only what nginx sends (responses), never a request body, so an upload
  on it is unlimited loopback.

Each cell has `--rounds` (at least 5) rounds; each round runs the three methods in an
order drawn from `random.Random(--seed)`, and every order is recorded. Each run starts from
a fresh journaled ext4 (a loop-mounted image, as a Fargate task's disk is fresh and
journaled; see LOCAL-AWS-NOTES) onto which both archives are extracted, untimed, as the
restore lays them out (the deps tree in the checkout), then synced. Every timed command
(ours' process, each baseline step, the streaming pipeline) runs inside the cell's CPU
shape (`CpuShape.wrap`: a CFS-quota cgroup, as ECS gives a task its vCPUs), with all it
starts. nginx (TLS, the bodies written to tmpfs), the delay line and this process (the
checkpoint function's presign) stay outside, on this machine's same cores: at as many vCPU
as the machine has cores, they compete with the task and the total link runs below its
cap (the report says so).

- ours: the supervisor's checkpoint, as a process of its own (DRIVER): an interpreter that
  imports the supervisor's modules and builds its clients, then `capture.freeze` (no
  sandbox: the sync alone), `capture.capture` (mksquashfs zstd level 3 in 1 MiB blocks,
  as many threads as the shape's vCPUs, as the supervisor runs it from the task's
  SEEDKEEPER_CPU_UNITS; then sha256 and md5 in one pass), asks this process for a
  presigned PUT (the checkpoint function's part:
  `R2.presign_put`, so its `Content-MD5` and `x-amz-checksum-sha256` are signed and sent),
  and `capture.upload`s the file in one PUT (http.client over Python's ssl, whose default
  context reads SSL_CERT_FILE). Timed from the freeze to the upload's answer (what a
  running supervisor spends: the headline) and as a whole process (interpreter start and
  imports included). Its CPU seconds are the checkpoint's own (the process's from the
  freeze on, plus mksquashfs' and git's). Its peak RSS is its own VmHWM, reset
  (`clear_refs`) once its modules and clients are loaded, so it counts the standing
  footprint plus what checkpointing adds, never a child's.
- tar+openssl+curl: three commands one after another, as a shell user writes them, each
  timed as a process of its own: `tar -I 'zstd -3 -T0' -cf <fs>/state/checkout.tar.zst
  -C <fs> checkout`, `openssl dgst -sha256` of that file, and `curl -T` of it to a
  presigned PUT that signs its length and `x-amz-checksum-sha256` (presigned by this
  process between the second and third, untimed, as ours asks the function), with
  `-H 'Expect:'`: curl would otherwise wait a round trip for `100 Continue` before the
  body, which ours does not. Its time is the sum of the three.
- streaming: `tar -I 'zstd -3 -T0' -cf - -C <fs> checkout | python -I -c UPLOADER`. The
  uploader (stdlib only, a process of its own) reads the stream in 16 MiB parts, hashes
  each (hashlib sha256) and PUTs them up to 4 at once, over 4 keep-alive HTTP(S)
  connections opened while tar starts, as `<key>.part-00001`, ... with
  `x-amz-checksum-sha256`: what S3's multipart UploadPart with per-part checksums puts on
  the wire; nginx's dav module stores each part as an object. The two small requests
  multipart adds are modelled with their round trips: CreateMultipartUpload as an empty
  PUT of `<key>.create`, sent as it starts (parts wait for its answer, the first one's
  compression does not), and CompleteMultipartUpload as a PUT of the parts' list (number
  and checksum each, as Complete's XML) after the last part's answer. Parts are unsigned
  (nginx checks no signature; a SigV4 signature costs a few HMACs per part). At most 5
  parts are in memory (4 in flight, one being read). Timed as the whole pipeline; the
  uploader notes when tar's last byte arrived and when the last part was answered.

Checked after each run, untimed, then removed: ours' and curl's object arrived with the
size and sha256 that were sent; the streaming parts arrived each with the size and sha256
the uploader hashed, numbered without a gap, every part but the last 16 MiB, and
concatenated in order they are one valid zstd stream (`zstd -t`: its content checksum).

Report (rich tables): per cell, each method's median time (min-max), its CPU seconds
(user+sys of the run's processes, wait4) and CPU seconds per vCPU (a floor: no run ends
sooner), the bytes it sent and the link's floor for them (`LinkSpec.floor_s`: one object;
the streaming parts all at once through the total cap), the TCP segments this namespace
retransmitted during it and its retransmission timeouts (the senders' losses at the
link's queue), paired ratios (ours against each baseline of the same round) as median
(min-max); where the time goes; peak RSS; the targets: ours (the checkpoint, freeze to
answer) <= 1.0x the streaming baseline per cell, peak RSS <= 150 MB and flat in size.
Where ours loses to streaming, its capture and upload seconds and what overlapping them
could buy at best. It never fails on a target (exit 1 only when it cannot measure). Inputs
are cached in the work dir (default `$TMPDIR/seedkeeper-bench`, shared with the other
benchmarks); the figures and every raw run are written there as checkpoint-results.json.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import random
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
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2
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
DEFAULT_LINKS = ("total", "loopback")
CAPTURE_TIMEOUT = 900.0
UPLOAD_TIMEOUT = 60.0
MB = restore.MB
MIB = 1024 * 1024
PART_BYTES = 16 * MIB
PART_STREAMS = 4
TOOLS = ("git", "mksquashfs", "unsquashfs", "tar", "zstd", "openssl", "curl", "bash")

OURS = "ours"
FILE = "tar+openssl+curl"
STREAMING = "streaming"
METHODS = (OURS, FILE, STREAMING)
BASELINES = (FILE, STREAMING)
STREAMING_TARGET = 1.0  # ours / streaming, at most (issue 31)
TCP_COUNTERS = ("RetransSegs", "TCPTimeouts")  # recorded per run: losses on the link

# The supervisor's checkpoint in a process of its own (see the module docstring). One JSON
# line out after the capture, one in (the presigned PUT) on stdin, one out at the end; out
# through a descriptor of their own (argv[5]), so nothing a module prints gets in the way.
DRIVER = r"""
import json, os, re, resource, sys, time
from pathlib import Path

import seedkeeper_task.supervisor  # the modules a supervisor holds while it waits
from seedkeeper_task import capture as module
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.watch import MAX_CHECKPOINT_BYTES

def status(name):
    with open("/proc/self/status") as file:
        return int(re.search(name + r":\s+(\d+) kB", file.read()).group(1))

def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime

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
cpu_before = cpu(resource.RUSAGE_SELF)
started = time.perf_counter()
timed("freeze (sync)", module.freeze)(None, None)
captured = timed("capture", module.capture)(
    checkout,
    target,
    user=None,
    timeout=float(sys.argv[3]),
    max_bytes=MAX_CHECKPOINT_BYTES,
    processors=TaskSettings().processors(),  # as the supervisor passes it, from its CPU
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
    "checkpoint_cpu_s": cpu(resource.RUSAGE_SELF) - cpu_before + cpu(resource.RUSAGE_CHILDREN),
    "steps_s": steps,
    "peak_rss_kb": status("VmHWM"),
    "resident_kb": resident,
    "hwm_reset": reset,
    "children_max_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), file=channel, flush=True)
"""

# The streaming baseline's uploader (see the module docstring): argv[1] the object's URL
# (scheme, host, port, /bucket/key), argv[2] the part size, argv[3] how many at once,
# argv[4] where its record goes (JSON). Exits 1 when a request fails.
UPLOADER = r"""
import base64, fcntl, hashlib, http.client, json, queue, ssl, sys, threading, time
from urllib.parse import urlsplit

started_at, started = time.time(), time.perf_counter()
target = urlsplit(sys.argv[1])
part_bytes, streams, record = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
context = ssl.create_default_context() if target.scheme == "https" else None
jobs = queue.Queue()
free = queue.Queue()  # the part buffers: those in flight and one being read
for _ in range(streams + 1):
    free.put(bytearray(part_bytes))
created = threading.Event()
failures, parts, marks = [], {}, {}
try:
    fcntl.fcntl(0, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MiB reads from tar, not 64 KiB
except OSError:
    pass

def since():
    return time.perf_counter() - started

def put(connection, suffix, body, headers):
    connection.request("PUT", target.path + suffix, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    if not 200 <= response.status < 300:
        raise RuntimeError(f"PUT {suffix}: HTTP {response.status}")

def worker():
    if context is None:
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
    else:
        connection = http.client.HTTPSConnection(
            target.hostname, target.port, timeout=60, context=context
        )
    try:
        connection.connect()  # the handshakes while tar starts
    except OSError:
        pass  # the first request tries again and reports it
    while (job := jobs.get()) is not None:
        try:
            job(connection)
        except Exception as failed:
            failures.append(repr(failed))
        finally:
            jobs.task_done()
    connection.close()

def create(connection):
    try:
        put(connection, ".create", b"", {"Content-Length": "0"})
        marks["create_s"] = since()
    finally:
        created.set()

def part(number, buffer, size):
    def job(connection):
        try:
            view = memoryview(buffer)[:size]
            digest = hashlib.sha256(view).digest()
            created.wait()
            if failures:
                return
            checksum = base64.b64encode(digest).decode()
            headers = {"Content-Length": str(size), "x-amz-checksum-sha256": checksum}
            put(connection, f".part-{number:05d}", view, headers)
            parts[number] = (size, digest.hex(), checksum)
        finally:
            free.put(buffer)
    return job

workers = [threading.Thread(target=worker, daemon=True) for _ in range(streams)]
for thread in workers:
    thread.start()
jobs.put(create)
source = sys.stdin.buffer.raw
number = total = 0
while not failures:
    buffer = free.get()
    view, size = memoryview(buffer), 0
    while size < part_bytes:
        count = source.readinto(view[size:])
        if not count:
            break
        size += count
    del view
    if size:
        number += 1
        total += size
        jobs.put(part(number, buffer, size))
    else:
        free.put(buffer)
    if size < part_bytes:
        break
marks["eof_s"] = since()
jobs.join()
marks["parts_s"] = since()
if not failures:
    listing = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ChecksumSHA256>{parts[n][2]}</ChecksumSHA256></Part>"
        for n in sorted(parts)
    )
    body = f"<CompleteMultipartUpload>{listing}</CompleteMultipartUpload>".encode()
    length = {"Content-Length": str(len(body))}
    jobs.put(lambda connection: put(connection, ".complete", body, length))
    jobs.join()
    marks["complete_s"] = since()
for _ in workers:
    jobs.put(None)
with open("/proc/self/status") as status:
    hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
with open(record, "w") as out:
    json.dump({
        "started_at": started_at,
        "bytes": total,
        "parts": [[n, parts[n][0], parts[n][1]] for n in sorted(parts)],
        "marks_s": marks,
        "peak_rss_kb": hwm,
        "failures": failures,
    }, out)
sys.exit(1 if failures or len(parts) != number else 0)
"""

# $1: the folder holding `checkout`, $2: the interpreter, $3: UPLOADER, then its arguments.
STREAM_PIPELINE = (
    'set -o pipefail; tar -I "zstd -3 -T0" -cf - -C "$1" checkout | "$2" -I -c "$3" "${@:4}"'
)


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

    spec: links.LinkSpec
    server: links.Nginx
    r2: R2
    client: S3Client

    @classmethod
    def of(cls, spec: links.LinkSpec, server: links.Nginx) -> Wire:
        client = r2_client(server.endpoint)
        return cls(spec, server, R2(client, BUCKET), client)


# -- one run of each ------------------------------------------------------------------------


@dataclass
class Run:
    method: str
    round: int  # 0-based, in its cell
    position: int  # 0-based place in its round's order
    seconds: float  # the headline: ours' checkpoint (freeze to answer), a baseline's total
    cpu_s: float  # user + system of what `seconds` covers (ours: the checkpoint's)
    sent: list[int]  # the objects' sizes (bytes): one, or the streaming parts
    steps_s: dict[str, float]
    max_rss_kb: int  # wait4's: the largest process of the run (ours: with its children)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent)


@dataclass
class Bench:
    workdir: Path
    store: Store
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
                restore.settle_disk()
                yield root, folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def run(self, method: str, case: restore.Input, wire: Wire, shape: links.CpuShape) -> Run:
        before = tcp_counters()
        if method == OURS:
            run = self.ours(case, wire, shape)
        elif method == FILE:
            run = self.file_baseline(case, wire, shape)
        else:
            run = self.streaming(case, wire, shape)
        after = tcp_counters()
        run.details["tcp"] = {name: after[name] - before[name] for name in TCP_COUNTERS}
        return run

    # ours

    def ours(self, case: restore.Input, wire: Wire, shape: links.CpuShape) -> Run:
        slot = f"bench-{next(self.counter)}"
        key = f"checkpoints/{slot}/local-{slot}-1/1.sqsh"  # the checkpoint function's layout
        with self.prepared(case, slot) as (root, folder):
            arguments = [
                str(root / "checkout"),
                str(root / "state" / "checkpoint.sqsh"),
                str(CAPTURE_TIMEOUT),
                str(UPLOAD_TIMEOUT),
            ]
            environment = (
                self.environment | wire.server.client_environment() | shape.task_environment
            )
            with (folder / "driver.log").open("wb") as log:
                timed, captured, result = self._drive(
                    shape=shape,
                    arguments=arguments,
                    environment=environment,
                    wire=wire,
                    key=key,
                    log=log,
                )
            if timed.code != 0 or captured is None or result is None:
                tail = (folder / "driver.log").read_text(errors="replace")[-2000:]
                raise links.BenchError(f"our checkpoint exited {timed.code}:\n{tail}")
        arrived = self.store.stored(key)
        self.store.remove_prefix(key)
        if arrived != (captured["size"], captured["sha256"]):
            raise links.BenchError(f"our upload arrived as {arrived}, not {captured}")
        return Run(
            method=OURS,
            round=0,
            position=0,
            seconds=result["checkpoint_s"],
            cpu_s=result["checkpoint_cpu_s"],
            sent=[captured["size"]],
            steps_s=result["steps_s"],
            max_rss_kb=timed.max_rss_kb,
            details={
                "process_s": timed.seconds,
                "process_cpu_s": timed.cpu_s,
                "peak_rss_kb": result["peak_rss_kb"],  # VmHWM, reset once loaded
                "resident_kb": result["resident_kb"],  # VmRSS before: the standing footprint
                "hwm_reset": result["hwm_reset"],
                "children_max_rss_kb": result["children_max_rss_kb"],  # mksquashfs, git
            },
        )

    def _drive(
        self,
        *,
        shape: links.CpuShape,
        arguments: list[str],
        environment: dict[str, str],
        wire: Wire,
        key: str,
        log: IO[bytes],
    ) -> tuple[restore.Timed, dict[str, Any] | None, dict[str, Any] | None]:
        """Run the driver inside `shape`, answering its one request for a presigned PUT as
        the checkpoint function would; timed from spawn to reap."""
        readable, writable = os.pipe()
        started = time.perf_counter()
        try:
            process = subprocess.Popen(
                shape.wrap([sys.executable, "-c", DRIVER, *arguments, str(writable)]),
                env=environment,
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
                    put = wire.r2.presign_put(
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
        cpu = usage.ru_utime + usage.ru_stime
        return (
            restore.Timed(seconds, usage.ru_maxrss, process.returncode, 0.0, cpu),
            captured,
            result,
        )

    # tar+openssl+curl

    def file_baseline(self, case: restore.Input, wire: Wire, shape: links.CpuShape) -> Run:
        name = f"file-{next(self.counter)}"
        key = f"baselines/{name}/checkout.tar.zst"
        with self.prepared(case, name) as (root, folder):
            archive, digest = root / "state" / "checkout.tar.zst", folder / "sha256"
            log_path = folder / "baseline.log"
            steps: dict[str, restore.Timed] = {}
            with log_path.open("wb") as log:

                def step(label: str, argv: list[str]) -> None:
                    timed = restore.timed_run(shape.wrap(argv), env=self.environment, log=log)
                    if timed.code != 0:
                        log.flush()
                        tail = log_path.read_text(errors="replace")[-2000:]
                        raise links.BenchError(f"{label} exited {timed.code}:\n{tail}")
                    steps[label] = timed

                step(
                    "tar -I 'zstd -3 -T0'",
                    ["tar", "-I", "zstd -3 -T0", "-cf", str(archive), "-C", str(root), "checkout"],
                )
                step(
                    "openssl dgst -sha256",
                    ["openssl", "dgst", "-sha256", "-r", "-out", str(digest), str(archive)],
                )
                sha256 = digest.read_text().split()[0]
                size = archive.stat().st_size
                checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
                url = wire.client.generate_presigned_url(
                    "put_object",
                    Params={
                        "Bucket": BUCKET,
                        "Key": key,
                        "ContentLength": size,
                        "ChecksumSHA256": checksum,
                    },
                    ExpiresIn=EXPIRES,
                )
                step(
                    "curl -T",
                    [
                        "curl",
                        "-sS",
                        "--fail",
                        *wire.server.curl_options(),
                        "-H",
                        "Expect:",
                        "-H",
                        f"x-amz-checksum-sha256: {checksum}",
                        "-T",
                        str(archive),
                        "-o",
                        os.devnull,
                        url,
                    ],
                )
        arrived = self.store.stored(key)
        self.store.remove_prefix(key)
        if arrived != (size, sha256):
            raise links.BenchError(
                f"the tar+openssl+curl upload arrived as {arrived}, sent {size} {sha256}"
            )
        return Run(
            method=FILE,
            round=0,
            position=0,
            seconds=sum(timed.seconds for timed in steps.values()),
            cpu_s=sum(timed.cpu_s for timed in steps.values()),
            sent=[size],
            steps_s={label: timed.seconds for label, timed in steps.items()},
            max_rss_kb=max(timed.max_rss_kb for timed in steps.values()),
            details={
                "cpu_steps_s": {label: timed.cpu_s for label, timed in steps.items()},
                "max_rss_kb_steps": {label: timed.max_rss_kb for label, timed in steps.items()},
            },
        )

    # streaming

    def streaming(self, case: restore.Input, wire: Wire, shape: links.CpuShape) -> Run:
        name = f"stream-{next(self.counter)}"
        key = f"baselines/{name}/checkout.tar.zst"
        with self.prepared(case, name) as (root, folder):
            record, log_path = folder / "uploader.json", folder / "streaming.log"
            argv = [
                "bash",
                "-c",
                STREAM_PIPELINE,
                "streaming",
                str(root),
                sys.executable,
                UPLOADER,
                f"{wire.server.endpoint}/{BUCKET}/{key}",
                str(PART_BYTES),
                str(PART_STREAMS),
                str(record),
            ]
            environment = self.environment | wire.server.client_environment()
            with log_path.open("wb") as log:
                timed = restore.timed_run(shape.wrap(argv), env=environment, log=log)
            if timed.code != 0 or not record.exists():
                tail = log_path.read_text(errors="replace")[-2000:]
                raise links.BenchError(f"the streaming baseline exited {timed.code}:\n{tail}")
            uploaded = json.loads(record.read_text())
        try:
            self._check_parts(key, uploaded)
        finally:
            self.store.remove_prefix(key)
        marks = uploaded["marks_s"]
        offset = uploaded["started_at"] - timed.started_at  # the uploader's start in the run
        last_byte = offset + marks["eof_s"]
        answered = offset + marks["parts_s"]
        return Run(
            method=STREAMING,
            round=0,
            position=0,
            seconds=timed.seconds,
            cpu_s=timed.cpu_s,
            sent=[size for _, size, _ in uploaded["parts"]],
            steps_s={
                "tar | zstd, until its last byte": last_byte,
                "the parts in flight then": answered - last_byte,
                "complete, exit": timed.seconds - answered,
            },
            max_rss_kb=timed.max_rss_kb,
            details={
                "parts": len(uploaded["parts"]),
                "uploader_peak_rss_kb": uploaded["peak_rss_kb"],
                "uploader_marks_s": marks,
                "uploader_started_s": offset,
            },
        )

    def _check_parts(self, key: str, uploaded: dict[str, Any]) -> None:
        """Each part arrived as the uploader hashed it, numbered without a gap, all but the
        last a whole part; concatenated in order they are one valid zstd stream."""
        parts = uploaded["parts"]
        if [number for number, _, _ in parts] != list(range(1, len(parts) + 1)) or not parts:
            raise links.BenchError(f"the streaming parts are numbered {parts}")
        if sum(size for _, size, _ in parts) != uploaded["bytes"]:
            raise links.BenchError("the streaming parts do not add up to what was read")
        paths = []
        for number, size, sha256 in parts:
            path = self.store.path(f"{key}.part-{number:05d}")
            arrived = measure(path) if path.exists() else None
            if arrived != (size, sha256):
                raise links.BenchError(f"part {number} arrived as {arrived}, sent {size} {sha256}")
            if number < len(parts) and size != PART_BYTES:
                raise links.BenchError(f"part {number} holds {size} bytes, not {PART_BYTES}")
            paths.append(path)
        for marker in (".create", ".complete"):
            if not self.store.path(key + marker).exists():
                raise links.BenchError(f"the streaming upload's {marker} request did not arrive")
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
            raise links.BenchError(f"the streaming parts are no zstd stream: {errors[-300:]!r}")


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


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, directories, names in os.walk(root):
        for name in (*directories, *names):
            total += os.lstat(os.path.join(folder, name)).st_size
    return total


# -- the report -----------------------------------------------------------------------------


@dataclass
class Cell:
    spec: links.LinkSpec
    vcpus: int
    case: restore.Input
    checkout_bytes: int = 0
    orders: list[tuple[str, ...]] = field(default_factory=list)
    runs: dict[str, list[Run]] = field(default_factory=lambda: {method: [] for method in METHODS})

    @property
    def where(self) -> str:
        return f"{self.spec.name}, {self.vcpus} vCPU, {self.case.label}"

    def median(self, method: str, attribute: str = "seconds") -> float:
        return statistics.median(float(getattr(run, attribute)) for run in self.runs[method])

    def ours_detail(self, name: str) -> list[float]:
        return [float(run.details[name]) for run in self.runs[OURS]]

    def paired(self, baseline: str, *, process: bool = False) -> list[float]:
        """Each round's ours over that round's `baseline`: their spread shows the noise."""
        ours = self.ours_detail("process_s") if process else [r.seconds for r in self.runs[OURS]]
        return [
            mine / theirs.seconds for mine, theirs in zip(ours, self.runs[baseline], strict=True)
        ]

    def link_floor_s(self, method: str) -> float:
        """The least time the link takes to carry what `method` sent (its median run's
        objects; the streaming parts all at once)."""
        return statistics.median(self.spec.floor_s(run.sent, 1) for run in self.runs[method])

    def tcp(self, method: str, counter: str) -> float:
        """The median of a TCP counter's growth during the runs of `method`."""
        return statistics.median(float(run.details["tcp"][counter]) for run in self.runs[method])

    def peak_rss_mb(self) -> list[float]:
        return [kb * 1024 / MB for kb in self.ours_detail("peak_rss_kb")]

    def step_medians(self, method: str) -> dict[str, float]:
        runs = self.runs[method]

        def median(name: str) -> float:
            return statistics.median(run.steps_s.get(name, 0.0) for run in runs)

        if method != OURS:
            return {name: median(name) for name in runs[0].steps_s}
        # capture() holds mksquashfs and the hash, and what else it does (the layout check,
        # the config read by git, the rename).
        return {
            "process start, imports, clients": statistics.median(
                run.details["process_s"] - run.seconds for run in runs
            ),
            "freeze (the sync)": median("freeze (sync)"),
            "capture": median("capture"),
            "  mksquashfs": median("mksquashfs"),
            "  sha256 and md5, one pass": median("hash (sha256, md5)"),
            "  layout check, config read, rename": statistics.median(
                run.steps_s.get("capture", 0.0)
                - run.steps_s.get("mksquashfs", 0.0)
                - run.steps_s.get("hash (sha256, md5)", 0.0)
                for run in runs
            ),
            "presigned PUT asked for": median("presign (this benchmark)"),
            "upload": median("upload"),
        }

    def overlapped_s(self) -> float:
        """Ours at best if its upload ran during its capture, as streaming's does: the
        wall time less the shorter of the two, never under its CPU seconds per vCPU."""
        steps = self.step_medians(OURS)
        hidden = min(steps["freeze (the sync)"] + steps["capture"], steps["upload"])
        return max(self.median(OURS) - hidden, self.median(OURS, "cpu_s") / self.vcpus)

    def summary(self) -> dict[str, Any]:
        return {
            "link": self.spec.name,
            "vcpus": self.vcpus,
            "size": self.case.label,
            "files": self.case.files,
            "entries": self.case.entries,
            "checkout_mb": self.checkout_bytes / MB,
            "rounds": len(self.orders),
            "orders": [list(order) for order in self.orders],
            "median_s": {method: self.median(method) for method in METHODS},
            "median_ours_process_s": statistics.median(self.ours_detail("process_s")),
            "median_cpu_s": {method: self.median(method, "cpu_s") for method in METHODS},
            "median_mb_sent": {
                method: statistics.median(run.bytes_sent for run in self.runs[method]) / MB
                for method in METHODS
            },
            "link_floor_s": {method: self.link_floor_s(method) for method in METHODS},
            "paired_ratios": {baseline: self.paired(baseline) for baseline in BASELINES},
            "paired_ratios_process": {
                baseline: self.paired(baseline, process=True) for baseline in BASELINES
            },
            "steps_median_s": {method: self.step_medians(method) for method in METHODS},
            "ours_overlapped_at_best_s": self.overlapped_s(),
            "peak_rss_mb": self.peak_rss_mb(),
            "runs": {method: [asdict(run) for run in self.runs[method]] for method in METHODS},
        }


def report(
    console: Console, cells: list[Cell], bench: Bench, setting: dict[str, Any], workdir: Path
) -> None:
    for name, spec in setting["links"].items():
        console.print(f"[dim]link {name}: {spec['label']}[/dim]")
    for shape in setting["cpu_shapes"]:
        console.print(f"[dim]CPU {shape}, every timed command inside it[/dim]")
    console.print(_cells_table(cells))
    console.print(
        "[dim]ours = freeze to the upload's answer (what a running supervisor spends); ours' "
        "process adds its interpreter start, imports and clients. CPU = user+sys of the "
        "run's processes (ours: from the freeze on, with mksquashfs); CPU/vCPU is a floor no "
        "run can beat. Link floor: the bytes each sent, at the link's cap after its round "
        "trips. Ratios are paired (each round's ours over that round's baseline).[/dim]"
    )
    cores = os.cpu_count() or 1
    if any(cell.vcpus >= cores and cell.spec.total is not None for cell in cells):
        console.print(
            f"[yellow]This machine has {cores} cores: at {cores} vCPU the task may take all "
            "of them, and nginx (TLS, the bodies), the delay line and the kernel's forwarding "
            "compete with it for the CPU the total link needs; there the link is slower than "
            "its cap, for every method alike.[/yellow]"
        )
    console.print(_steps_table(cells))
    console.print(_memory_table(cells))
    if not all(run.details["hwm_reset"] for cell in cells for run in cell.runs[OURS]):
        console.print(
            "[yellow]VmHWM could not be reset: the peak includes the process start[/yellow]"
        )
    console.print(
        f"[dim]store: nginx's dav module, bodies on {bench.store.description}, outside the "
        f"CPU shape; disk: {bench.disks.description}; the tree as the restore leaves it "
        "(extracted, synced, in the page cache), each capture or archive written beside it."
        "[/dim]"
    )
    _targets(console, cells)
    figures = workdir / "checkpoint-results.json"
    figures.write_text(
        json.dumps(
            setting
            | {
                "cores": os.cpu_count(),
                "disk": bench.disks.description,
                "store": f"nginx dav, bodies on {bench.store.description}",
                "streaming": {"part_bytes": PART_BYTES, "parts_at_once": PART_STREAMS},
                "mksquashfs": restore._version(["mksquashfs", "-version"]),
                "tar": restore._version(["tar", "--version"]),
                "zstd": restore._version(["zstd", "--version"]),
                "openssl": restore._version(["openssl", "version"]),
                "curl": restore._version(["curl", "--version"]),
                "targets": {
                    "ours_over_streaming": STREAMING_TARGET,
                    "peak_rss_mb": restore.RSS_TARGET_MB,
                    "flat_mb": restore.RSS_FLAT_MB,
                },
                "cells": [cell.summary() for cell in cells],
            },
            indent=2,
        )
    )
    console.print(f"figures and raw runs: {figures}")


def _cells_table(cells: list[Cell]) -> Table:
    table = Table(
        title="Checkpoint per cell: ours vs tar+openssl+curl and streaming multipart "
        "(medians in s, (min-max) over the rounds; paired ratios as median (min-max))"
    )
    for column in (
        "cell",
        "method",
        "s",
        "ours / it",
        "ours' process / it",
        "CPU s",
        "CPU / vCPU",
        "MB sent",
        "link floor s",
        "TCP retrans. (RTOs)",
    ):
        table.add_column(column, justify="left" if column in ("cell", "method") else "right")
    for cell in cells:
        for index, method in enumerate(METHODS):
            runs = cell.runs[method]
            seconds = [run.seconds for run in runs]
            ours = method == OURS
            table.add_row(
                cell.where if index == 0 else "",
                f"ours ({len(runs)} rounds)" if ours else method,
                restore.spread(seconds),
                "" if ours else restore.spread(cell.paired(method)),
                "" if ours else restore.spread(cell.paired(method, process=True)),
                f"{cell.median(method, 'cpu_s'):.2f}",
                f"{cell.median(method, 'cpu_s') / cell.vcpus:.2f}",
                f"{statistics.median(run.bytes_sent for run in runs) / MB:.1f}",
                f"{cell.link_floor_s(method):.2f}",
                f"{cell.tcp(method, 'RetransSegs'):.0f} ({cell.tcp(method, 'TCPTimeouts'):.0f})",
            )
        process = cell.ours_detail("process_s")
        table.add_row(
            "",
            "ours' process",
            restore.spread(process),
            "",
            "",
            f"{statistics.median(cell.ours_detail('process_cpu_s')):.2f}",
            "",
            "",
            "",
            "",
            end_section=True,
        )
    return table


def _steps_table(cells: list[Cell]) -> Table:
    table = Table(title="Where the time goes (medians, seconds)")
    for heading in ("cell", "ours: step", "s", f"{FILE}: step", "s", f"{STREAMING}: step", "s"):
        table.add_column(heading, justify="right" if heading == "s" else "left")
    for cell in cells:
        restore.add_side_by_side(
            table, cell.where, [cell.step_medians(method) for method in METHODS]
        )
    return table


def _memory_table(cells: list[Cell]) -> Table:
    table = Table(title="Memory (MB; medians, max in brackets)")
    for heading in (
        "cell",
        "ours: peak RSS (VmHWM)",
        "ours: before (VmRSS)",
        "mksquashfs, at most",
        f"{FILE}: largest, at most",
        f"{STREAMING}: uploader (VmHWM)",
        f"{STREAMING}: largest, at most",
    ):
        table.add_column(heading, justify="left" if heading == "cell" else "right")

    def shown(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({max(values):.1f})"

    def mb(values: list[int] | list[float]) -> list[float]:
        return [value * 1024 / MB for value in values]

    for cell in cells:
        table.add_row(
            cell.where,
            shown(cell.peak_rss_mb()),
            shown(mb(cell.ours_detail("resident_kb"))),
            # wait4's max RSS counts what a child shares with its parent when forked: read
            # these as upper bounds.
            shown(mb(cell.ours_detail("children_max_rss_kb"))),
            shown(mb([run.max_rss_kb for run in cell.runs[FILE]])),
            shown(mb([run.details["uploader_peak_rss_kb"] for run in cell.runs[STREAMING]])),
            shown(mb([run.max_rss_kb for run in cell.runs[STREAMING]])),
        )
    return table


def _targets(console: Console, cells: list[Cell]) -> None:
    console.print("[bold]Targets[/bold] (paired medians; ours = freeze to the upload's answer)")
    for cell in cells:
        ratio = statistics.median(cell.paired(STREAMING))
        restore._verdict(
            console,
            ratio <= STREAMING_TARGET,
            f"{cell.where}: ours / {STREAMING} {ratio:.2f} ({cell.median(OURS):.2f} s against "
            f"{cell.median(STREAMING):.2f} s), target <= {STREAMING_TARGET}",
        )
    peaks: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for cell in cells:
        peaks[cell.case.label] = max(peaks.get(cell.case.label, 0.0), *cell.peak_rss_mb())
        sizes[cell.case.label] = cell.case.size
    for label, peak in peaks.items():
        restore._verdict(
            console,
            peak <= restore.RSS_TARGET_MB,
            f"{label}: the supervisor's peak RSS while checkpointing {peak:.1f} MB (max over "
            f"every cell), target <= {restore.RSS_TARGET_MB:.0f} MB",
        )
    if len(peaks) >= 2:
        small, large = min(sizes, key=sizes.__getitem__), max(sizes, key=sizes.__getitem__)
        growth = peaks[large] - peaks[small]
        restore._verdict(
            console,
            abs(growth) <= restore.RSS_FLAT_MB,
            f"peak RSS {peaks[small]:.1f} MB at {small}, {peaks[large]:.1f} MB at {large}: "
            f"{growth:+.1f} MB (flat: within {restore.RSS_FLAT_MB:.0f} MB)",
        )
    losing = [cell for cell in cells if statistics.median(cell.paired(STREAMING)) > 1.0]
    if not losing:
        return
    console.print(
        "[bold]Where ours loses to streaming[/bold]: it uploads only after capturing "
        "(mksquashfs seeks back to write its superblock and tables, so its output is hashed "
        "and sent once complete), where streaming sends each part as it is compressed"
    )
    winning = 0
    for cell in losing:
        steps = cell.step_medians(OURS)
        capture = steps["freeze (the sync)"] + steps["capture"]
        compressed = cell.step_medians(STREAMING)["tar | zstd, until its last byte"]
        best = cell.overlapped_s()
        winning += best <= cell.median(STREAMING) * STREAMING_TARGET
        console.print(
            f"  {cell.where}: capture {capture:.2f} s, then upload {steps['upload']:.2f} s "
            f"(link floor {cell.link_floor_s(OURS):.2f} s for its "
            f"{cell.median(OURS, 'bytes_sent') / MB:.1f} MB; streaming compresses in "
            f"{compressed:.2f} s to {cell.median(STREAMING, 'bytes_sent') / MB:.1f} MB, with "
            f"CPU {cell.median(STREAMING, 'cpu_s'):.2f} s against ours' "
            f"{cell.median(OURS, 'cpu_s'):.2f} s); overlapped, at best {best:.2f} s (the wall "
            f"less the shorter of the two, never under its CPU / {cell.vcpus} vCPU): "
            f"{best / cell.median(STREAMING):.2f}x streaming's {cell.median(STREAMING):.2f} s"
        )
    console.print(
        f"  streaming our capture would meet the target, at best, in {winning} of the "
        f"{len(losing)} cells ours loses; in the rest its capture alone costs more than "
        "streaming's compression and upload."
    )


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
    links.add_cell_options(parser)
    parser.set_defaults(links=list(DEFAULT_LINKS))
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "seedkeeper-bench",
        help="cached inputs (shared with restore.py), scratch runs, checkpoint-results.json",
    )
    options = parser.parse_args(argv)
    links.unwind_on_sigterm()
    if any(megabytes < 1 for megabytes in options.sizes):
        parser.error("--sizes must be positive")
    console = Console(width=max(Console().width, 200))  # the tables stay readable in a log
    skipped = [name for name in options.links if links.LINKS[name].per_connection is not None]
    for name in skipped:
        console.print(
            f"[yellow]{name}: skipped. nginx's limit_rate paces only what nginx sends "
            "(responses), never a request body: an upload on it is unlimited loopback. The "
            "checkpoint measures on total and loopback.[/yellow]"
        )
    specs = [links.LINKS[name] for name in dict.fromkeys(options.links) if name not in skipped]
    if not specs:
        console.print("[red]no link to measure a checkpoint on (--links total loopback)[/red]")
        return 1
    for tool in TOOLS:
        if shutil.which(tool) is None:
            console.print(f"[red]{tool} is not installed (make bench installs it as root)[/red]")
            return 1
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    runs = workdir / "checkpoint-runs"
    restore.unmount_leftovers(runs)
    shutil.rmtree(runs, ignore_errors=True)
    os.environ.update(restore.FAKE_AWS)
    disks = restore.Disks()
    try:
        inputs = [
            restore.build_input(restore.size_of(megabytes), workdir, console)
            for megabytes in options.sizes
        ]
        with Store() as store, links.cpu_shapes(options.cpus) as shapes:
            bench = Bench(
                workdir=workdir,
                store=store,
                disks=disks,
                # As the restore benchmark's task runs: none of a developer's SEEDKEEPER_,
                # AWS_ or GIT_ settings, fake credentials; the table's name for the
                # supervisor's client.
                environment=restore._environment(workdir) | {"SEEDKEEPER_TABLE": BUCKET},
            )
            setting = {
                "links": {spec.name: asdict(spec) for spec in specs},
                "skipped_links": skipped,
                "cpu_shapes": [shape.description for shape in shapes],
                "rounds": options.rounds,
                "seed": options.seed,
                "methods": list(METHODS),
            }
            cells = measure_all(
                console,
                bench,
                inputs,
                specs=specs,
                shapes=shapes,
                rounds=options.rounds,
                rng=random.Random(options.seed),  # noqa: S311 - orders, not secrets
            )
            report(console, cells, bench, setting, workdir)
    except links.BenchError as broken:
        console.print(f"[red]the benchmark could not measure:[/red] {broken}")
        return 1
    finally:
        restore.unmount_leftovers(runs)
        shutil.rmtree(runs, ignore_errors=True)
    return 0  # a report, not a gate


def measure_all(
    console: Console,
    bench: Bench,
    inputs: list[restore.Input],
    *,
    specs: list[links.LinkSpec],
    shapes: list[links.CpuShape],
    rounds: int,
    rng: random.Random,
) -> list[Cell]:
    """Per link, CPU shape and size (a cell), `rounds` rounds of every method, each round in
    an order of its own."""
    console.print(f"store: nginx dav on {bench.store.description}; disk: {bench.disks.description}")
    cells: list[Cell] = []
    smallest = min(inputs, key=lambda case: case.size)
    for spec in specs:
        home = f"checkpoint-nginx-{spec.name}"
        with links.served(
            spec,
            bench.store.root,
            bench.workdir,
            home=home,
            accepts_puts=True,
            temp=bench.store.temp,
        ) as server:
            wire = Wire.of(spec, server)
            console.print(
                f"{spec.label} ({server.endpoint}): warming up (one untimed run of each, "
                f"{smallest.label}, {shapes[-1].label})"
            )
            for method in METHODS:
                bench.run(method, smallest, wire, shapes[-1])
            for shape in shapes:
                console.print(f"[dim]{shape.description}[/dim]")
                for case in inputs:
                    cells.append(
                        measure_cell(
                            console,
                            bench,
                            wire=wire,
                            shape=shape,
                            case=case,
                            rounds=rounds,
                            rng=rng,
                        )
                    )
    return cells


def measure_cell(
    console: Console,
    bench: Bench,
    *,
    wire: Wire,
    shape: links.CpuShape,
    case: restore.Input,
    rounds: int,
    rng: random.Random,
) -> Cell:
    cell = Cell(wire.spec, shape.count, case)
    for index in range(rounds):
        order = links.shuffled(METHODS, rng)
        cell.orders.append(order)
        for position, method in enumerate(order):
            run = bench.run(method, case, wire, shape)
            run.round, run.position = index, position
            cell.runs[method].append(run)
        ours = cell.runs[OURS][-1]
        console.print(
            f"  {cell.where} #{index + 1} ({', '.join(order)}): ours {ours.seconds:.2f} s "
            f"(process {ours.details['process_s']:.2f} s, peak RSS "
            f"{ours.details['peak_rss_kb'] * 1024 / MB:.1f} MB), {FILE} "
            f"{cell.runs[FILE][-1].seconds:.2f} s, {STREAMING} "
            f"{cell.runs[STREAMING][-1].seconds:.2f} s"
        )
    cell.checkout_bytes = bench.checkout_bytes[case.label]
    return cell


if __name__ == "__main__":
    sys.exit(main())
