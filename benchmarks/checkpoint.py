"""The checkpoint benchmark (`make bench`): our checkpoint against tar+openssl+curl and a
streaming multipart upload, per link and CPU shape.

The trees are the benchmarks' snapshots (`workload.py`: generated once, cached archives of a
repository with history and a node_modules-like deps tree, about 120,000 files at 300 MB
and three times as many at 1 GB; other sizes scale the 300 MB one's file counts).

Cells: every link of `--links` at every CPU shape of `--cpus` (1 and 2 vCPU by default),
every size. The links are the harness's (`harness/links.py`):

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
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console

import harness
import workload
from checkpoint_report import FILE, METHODS, OURS, STREAMING, Cell, Run, report
from checkpoint_scripts import DRIVER, PART_BYTES, PART_STREAMS, STREAM_PIPELINE, UPLOADER
from checkpoint_store import (
    BUCKET,
    TCP_COUNTERS,
    Store,
    Wire,
    check_parts,
    tcp_counters,
    tree_bytes,
)

EXPIRES = 900
DEFAULT_SIZES = (300, 1000)  # MB of archive, as the restore benchmark labels its sizes
DEFAULT_LINKS = ("total", "loopback")
CAPTURE_TIMEOUT = 900.0
UPLOAD_TIMEOUT = 60.0
MB = harness.MB
# The commands its runs need besides the harness's, and the Debian packages holding them.
TOOLS = {
    "git": "git",
    "mksquashfs": "squashfs-tools",
    "unsquashfs": "squashfs-tools",
    "tar": "tar",
    "zstd": "zstd",
    "openssl": "openssl",
    "curl": "curl",
    "bash": "bash",
}


# -- one run of each ------------------------------------------------------------------------


@dataclass
class Bench:
    workdir: Path
    store: Store
    disks: harness.Disks
    environment: dict[str, str]
    checkout_bytes: dict[str, int] = field(default_factory=dict)
    counter: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @contextlib.contextmanager
    def prepared(self, case: workload.Input, name: str) -> Iterator[tuple[Path, Path]]:
        """A fresh filesystem holding the checkout as the restore leaves it (the archives
        extracted, settled): (the filesystem's root, the run's own folder)."""
        folder = self.workdir / "checkpoint-runs" / name
        with self.disks.run(folder, workload.capacity(case)) as root:
            workload.unpack(case, root / "checkout")
            (root / "state").mkdir(mode=0o711)  # the supervisor's state folder
            if case.label not in self.checkout_bytes:
                self.checkout_bytes[case.label] = tree_bytes(root / "checkout")
            harness.settle_disk()
            yield root, folder

    def run(self, method: str, case: workload.Input, wire: Wire, shape: harness.CpuShape) -> Run:
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

    def ours(self, case: workload.Input, wire: Wire, shape: harness.CpuShape) -> Run:
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
                raise harness.BenchError(f"our checkpoint exited {timed.code}:\n{tail}")
        arrived = self.store.stored(key)
        self.store.remove_prefix(key)
        if arrived != (captured["size"], captured["sha256"]):
            raise harness.BenchError(f"our upload arrived as {arrived}, not {captured}")
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
        shape: harness.CpuShape,
        arguments: list[str],
        environment: dict[str, str],
        wire: Wire,
        key: str,
        log: IO[bytes],
    ) -> tuple[harness.Timed, dict[str, Any] | None, dict[str, Any] | None]:
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
        captured = result = None
        with harness.deadline(process):
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
                timed = harness.reaped(process, started)
        return timed, captured, result

    # tar+openssl+curl

    def file_baseline(self, case: workload.Input, wire: Wire, shape: harness.CpuShape) -> Run:
        name = f"file-{next(self.counter)}"
        key = f"baselines/{name}/checkout.tar.zst"
        with self.prepared(case, name) as (root, folder):
            archive, digest = root / "state" / "checkout.tar.zst", folder / "sha256"
            steps: dict[str, harness.Timed] = {}

            def step(label: str, argv: list[str]) -> None:
                steps[label] = harness.timed_step(
                    label, argv, folder, shape=shape, env=self.environment
                )

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
            raise harness.BenchError(
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

    def streaming(self, case: workload.Input, wire: Wire, shape: harness.CpuShape) -> Run:
        name = f"stream-{next(self.counter)}"
        key = f"baselines/{name}/checkout.tar.zst"
        with self.prepared(case, name) as (root, folder):
            record = folder / "uploader.json"
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
            timed = harness.timed_step(STREAMING, argv, folder, shape=shape, env=environment)
            if not record.exists():
                raise harness.BenchError(f"{STREAMING}: the uploader wrote no record")
            uploaded = json.loads(record.read_text())
        try:
            check_parts(self.store, key, uploaded)
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
    harness.add_cell_options(parser, links=DEFAULT_LINKS)
    harness.add_workdir_option(
        parser,
        holds="cached inputs (shared with restore.py), scratch runs, checkpoint-results.json",
    )
    options = parser.parse_args(argv)
    harness.unwind_on_sigterm()
    if any(megabytes < 1 for megabytes in options.sizes):
        parser.error("--sizes must be positive")
    console = harness.console(200)
    skipped = [name for name in options.links if harness.LINKS[name].per_connection is not None]
    for name in skipped:
        console.print(
            f"[yellow]{name}: skipped. nginx's limit_rate paces only what nginx sends "
            "(responses), never a request body: an upload on it is unlimited loopback. The "
            "checkpoint measures on total and loopback.[/yellow]"
        )
    specs = [harness.LINKS[name] for name in dict.fromkeys(options.links) if name not in skipped]
    if not specs:
        console.print("[red]no link to measure a checkpoint on (--links total loopback)[/red]")
        return 1
    if harness.missing_tool(console, TOOLS):
        return 1
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    os.environ.update(harness.FAKE_AWS)
    disks = harness.Disks()
    try:
        with harness.scratch(workdir / "checkpoint-runs"):
            inputs = [
                workload.build_input(workload.size_of(megabytes), workdir, console)
                for megabytes in options.sizes
            ]
            with Store() as store, harness.cpu_shapes(options.cpus) as shapes:
                bench = Bench(
                    workdir=workdir,
                    store=store,
                    disks=disks,
                    # As the restore benchmark's task runs: none of a developer's SEEDKEEPER_,
                    # AWS_ or GIT_ settings, fake credentials; the table's name for the
                    # supervisor's client.
                    environment=harness.environment(workdir) | {"SEEDKEEPER_TABLE": BUCKET},
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
                report(
                    console,
                    cells,
                    setting,
                    workdir,
                    store=store.description,
                    disk=disks.description,
                )
    except harness.BenchError as broken:
        harness.could_not_measure(console, broken)
        return 1
    return 0  # a report, not a gate


def measure_all(
    console: Console,
    bench: Bench,
    inputs: list[workload.Input],
    *,
    specs: list[harness.LinkSpec],
    shapes: list[harness.CpuShape],
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
        with harness.served(
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
    shape: harness.CpuShape,
    case: workload.Input,
    rounds: int,
    rng: random.Random,
) -> Cell:
    cell = Cell(wire.spec, shape.count, case)
    for index, order in harness.rounds(rounds, METHODS, rng, cell.orders):
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
