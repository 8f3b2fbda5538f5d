"""Time to the first command (`make bench`): from the executor's first seed call to the run's
sandbox command running, the figure the executor waits for (DESIGN §12).

Each run is the whole local stack (`seedkeeper local`: its real functions behind the SigV4
gateway, its store, its runtime) on a fresh journaled ext4 (loop-mounted, made per run; the
stack's data directory, so a process task's workspace is on it); the snapshot's archives
(the restore benchmark's 300 MB repository with history and a node_modules-like deps tree)
are served by nginx on loopback at a per-connection rate standing in for R2 (50 MiB/s: our
assumption for one stream, as in the restore benchmark); the task's grants point there. The
sandbox command is `date +%s.%N`: the time it prints, relayed to the task's log, is when the
first command ran. Timed from just before the signed `POST /seed`:

- standby: a blank standby waits (free), the seed takes it; it restores the seed.
- pre-seeded: a standby that restored the resource's current generation while it waited;
  the seed binds its claim and nothing else.
- cold, image present: no standby; the seed function launches the task (a container of
  the slot image, as RunTask starts one).
- cold, image loaded: the same with the image absent: `docker load` of the saved image is
  timed first, standing in for Fargate's pull of the whole image (a local uncompressed
  tar: a floor for a pull; Fargate's is modelled below).

Each container cell runs on a Docker engine of its own, started per run with its data on
the run's fresh ext4 (as a Fargate task's image and writable layer are on storage of its
own), the image loaded into it before the stack starts (and removed again where the load
is timed: the engine then holds no layer of it).

Standbys run with both runtimes (processes, containers); the cold paths in containers only.
Shapes: the task's default, 1 vCPU (`--cpus 1` for a container, one core's affinity for a
process), and 2 vCPU. Rounds run every cell once, each in an order drawn from
`random.Random(--seed)` and recorded in the JSON (the untimed warm-up round's first).
Reported per cell: the median (min-max) of the first command and of the restore's share of
it (the task's own `ms`; a pre-seeded one's is its bind), and the physical floor of the
download (`LinkSpec.floor_s`).
Fargate's own start is not reproducible here: it is modelled from the image's size with
published rates (see MODEL) and stated as an assumption.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from botocore.credentials import Credentials
from rich.console import Console
from rich.table import Table

import harness
import image as image_bench
import slot_task
import workload
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import SeedSucceeded, Supported
from seedkeeper.domain.standby import BLANK_POOL, StandbyState
from seedkeeper.observability import logger
from seedkeeper.store.standbys import StandbyStore
from seedkeeper_client import (
    Archive,
    NewSnapshot,
    OwnerClaim,
    SeedIdentity,
    Seeding,
    SeedkeeperClient,
)
from seedkeeper_tools.local.docker import DEFAULT_IMAGE
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.stack import LocalStack

Path_ = Literal["standby", "pre-seeded", "cold, image present", "cold, image loaded"]
Runtime = Literal["process", "docker"]
RESOURCE = "bench"
SANDBOX = ["sh", "-c", "date +%s.%N"]
FIRST_COMMAND_TIMEOUT = 600.0
# Fargate's start, modelled (an assumption, not a measurement of ours): a fixed part for
# placement, the task's ENI and the container's start, then the image pulled whole (Fargate
# caches none) at an effective rate of compressed bytes. AWS publishes no size-to-time
# table; the constants are central values fitted to published third-party points (413 MB at
# 53-62 s through a NAT; 258 MB at about 35 s; 2.4 GB at about 90 s), each good to about
# +-50 % (RELIABILITY.md, "Time to the first command", names them). zstd layers: up to 27 %
# off the start (AWS); SOCI: a few seconds of pull instead of the whole, recommended by AWS
# above 250 MiB compressed only, and not for zstd layers.
MODEL_FIXED_S = 25.0
MODEL_RATE_MB_S = 30.0


ENGINE_BYTES = 2 << 30


@dataclass(frozen=True)
class Cell:
    path: Path_
    runtime: Runtime
    vcpus: int

    @property
    def label(self) -> str:
        return f"{self.path}, {self.runtime}, {self.vcpus} vCPU"


@dataclass
class Run:
    first_command_s: float
    restore_s: float  # the task's own `ms` (a pre-seeded one's: binding its claim)
    steps_ms: dict[str, int]


def cells(docker: bool) -> list[Cell]:
    found: list[Cell] = []
    for vcpus in (1, 2):
        for runtime in ("process", "docker") if docker else ("process",):
            found += [Cell("standby", runtime, vcpus), Cell("pre-seeded", runtime, vcpus)]
        if docker:
            found += [
                Cell("cold, image present", "docker", vcpus),
                Cell("cold, image loaded", "docker", vcpus),
            ]
    return found


@contextmanager
def stack_for(cell: Cell, root: Path, image: str) -> Iterator[LocalStack]:
    os.environ["SEEDKEEPER_SLOT_CPU"] = str(1024 * cell.vcpus)
    os.environ["SEEDKEEPER_SANDBOX_COMMAND"] = json.dumps(SANDBOX)
    local = LocalStack(
        data_dir=root / "data",
        port=0,
        credentials=LocalCredentials("bench", secrets.token_hex(16)),
        sweep_interval=3600,
        task_runtime=cell.runtime,
        slot_image=image,
        standbys=1 if cell.path == "standby" else 0,
        preseeded={RESOURCE: 1} if cell.path == "pre-seeded" else None,
        # Tended by the run (`one_run`), never refilled during it: on Fargate the refill is
        # another task, on CPU of its own; here it would take the run's cores.
        standby_interval=3600,
    ).start()
    try:
        yield local
    finally:
        local.stop()


def published(
    client: SeedkeeperClient, case: workload.Input, nginx: harness.Nginx, bucket: str
) -> SeedIdentity:
    """The snapshot recorded (its archives served by nginx, where the grants now point)."""
    for archived in case.archives:
        key = backup_key(archived.backup_id)
        harness.serve_object(nginx.root, key, archived.path, bucket=bucket)
    client.publish(
        NewSnapshot(
            resource=RESOURCE,
            ref=workload.REF,
            sha=case.commit,
            created_at=int(time.time()),
            checkout=Archive.model_validate(case.checkout.archive.model_dump()),
            deps=Archive.model_validate(case.deps.archive.model_dump()),
            lockfile_hash=case.lockfile_hash,
        )
    )
    # Every grant from here on: nginx's, at the R2 rate (the handlers read it when called).
    os.environ["SEEDKEEPER_R2_ENDPOINT"] = nginx.endpoint
    return SeedIdentity(
        resource=RESOURCE,
        ref=workload.REF,
        sha=case.commit,
        checkout_backup_id=case.checkout.backup_id,
        deps_backup_id=case.deps.backup_id,
    )


def wait_free(pool: str, timeout: float = FIRST_COMMAND_TIMEOUT) -> str:
    """The incarnation of the pool's free standby, once one is free."""
    standbys = StandbyStore(StoreSettings().table_resource())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for standby in standbys.pool(pool):
            if standby.state is StandbyState.FREE and standby.incarnation is not None:
                return standby.incarnation
        time.sleep(0.05)
    raise harness.BenchError(f"no standby of {pool} was free in {timeout:.0f} s")


SANDBOX_LINE = re.compile(r'"message":"sandbox output".*?"line":"([0-9]+\.[0-9]+)"')


def first_command_at(stack: LocalStack, incarnation: str, timeout: float) -> float:
    """The time the sandbox command printed, read from its task's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if incarnation.startswith("docker:"):
            name = incarnation.removeprefix("docker:")
            text = subprocess.run(
                ["docker", "logs", name], capture_output=True, text=True, check=False
            ).stdout
        else:
            _, slot, attempt = incarnation.split(":")
            log = stack.data_dir / "slots" / slot / f"attempt-{attempt}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
        found = SANDBOX_LINE.search(text)
        if found:
            return float(found.group(1))
        time.sleep(0.02)
    raise harness.BenchError(f"{incarnation}: no sandbox output in {timeout:.0f} s")


@contextmanager
def engine_on(root: Path, cell: Cell, saved: Path) -> Iterator[None]:
    """A container cell's own Docker engine, its data on the run's fresh ext4 (as a Fargate
    task's image and writable layer are on storage of its own): the machine engine's data
    root is on this machine's unjournaled root disk, where creating files after many were
    deleted is quadratic, and a restore there took 30 to 80 s. The image is loaded first
    (the stack checks it is there); where its load is timed, it is removed again."""
    if cell.runtime != "docker":
        yield
        return
    engine = image_bench.Engine(root / "engine")
    engine.root.mkdir()
    before = os.environ.get("DOCKER_HOST")
    engine.start()
    os.environ["DOCKER_HOST"] = engine.host
    try:
        docker("load", "--quiet", "--input", str(saved))
        yield
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before
        engine.stop()


def one_run(
    cell: Cell, case: workload.Input, nginx: harness.Nginx, root: Path, *, image: str, saved: Path
) -> Run:
    with engine_on(root, cell, saved), stack_for(cell, root, image) as stack:
        client = SeedkeeperClient(
            stack.url,
            credentials=Credentials(stack.credentials.access_key, stack.credentials.secret_key),
        )
        seed = published(client, case, nginx, stack.name)
        stack.tend_standbys()  # a pre-seeded pool has a generation to hold from now on
        waiting = None
        if cell.path == "standby":
            waiting = wait_free(BLANK_POOL)
        elif cell.path == "pre-seeded":
            waiting = wait_free(RESOURCE)
        elif cell.path == "cold, image loaded":  # the engine's only image: nothing left
            docker("image", "rm", "--force", image)
        claim = OwnerClaim(
            run="bench", requester="bench", thread="bench", repository="bench/synthetic",
            ref=workload.REF, head=case.commit,
        )  # fmt: skip
        started = time.time()
        if cell.path == "cold, image loaded":  # Fargate pulls the whole image first
            docker("load", "--quiet", "--input", str(saved))
        answer = client.seed("slot-1", seed, claim=claim, origin=workload.ORIGIN)
        incarnation = answer.incarnation if isinstance(answer, Seeding) else None
        if incarnation is None or (waiting is not None and incarnation != waiting):
            raise harness.BenchError(f"{cell.label}: not the path measured: {answer}")
        ran = first_command_at(stack, incarnation, FIRST_COMMAND_TIMEOUT)
        classified = StoreSettings().lifecycle().read("slot-1")
        result = classified.record.result if isinstance(classified, Supported) else None
        if not isinstance(result, SeedSucceeded):
            raise harness.BenchError(f"{cell.label}: not seeded: {classified}")
        if cell.path == "pre-seeded" and "bind" not in result.steps:
            raise harness.BenchError(f"{cell.label}: restored, not bound: {result.steps}")
        return Run(ran - started, result.ms / 1000, dict(result.steps))


def docker(*args: str) -> None:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise harness.BenchError(f"docker {args[0]}: {done.stderr.strip()[-300:]}")


def measure(
    console: Console,
    case: workload.Input,
    link: harness.LinkSpec,
    rounds: int,
    image: str,
    *,
    rng: random.Random,
    orders: list[tuple[Cell, ...]],
    disks: harness.Disks,
    with_docker: bool,
) -> dict[Cell, list[Run]]:
    """`rounds` rounds of every cell after an untimed warm-up round, each round's order drawn
    from `rng` and recorded in `orders` (the warm-up's first)."""
    workdir = harness.default_workdir()
    nginx = harness.Nginx(
        workdir / "archives", workdir, limit_rate=link.per_connection, home="nginx-first"
    )
    saved = workdir / "slot-image.tar"
    if with_docker:
        docker("save", "--output", str(saved), image)
    results: dict[Cell, list[Run]] = {cell: [] for cell in cells(with_docker)}
    nginx.start()
    try:
        # The first: untimed, a warm-up of every cell.
        for number, order in harness.rounds(rounds + 1, list(results), rng, orders):
            for cell in order:
                folder = workdir / "runs" / f"first-{secrets.token_hex(4)}"
                # A container cell's engine keeps the image (twice: layers and snapshot).
                capacity = workload.capacity(case) + (
                    ENGINE_BYTES if cell.runtime == "docker" else 0
                )
                with disks.run(folder, capacity) as root:
                    os.chmod(root, 0o711)  # noqa: S103 - slot users reach their workspaces
                    run = one_run(cell, case, nginx, root, image=image, saved=saved)
                if number:
                    results[cell].append(run)
                console.print(
                    f"  {'round ' + str(number) if number else 'warm-up'}: {cell.label}: "
                    f"first command {run.first_command_s:.2f} s, restore {run.restore_s:.2f} s"
                )
    finally:
        nginx.stop()
    return results


# -- the report -------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return harness.spread(values, unit=" s")


def image_megabytes(image: str) -> tuple[float, float] | None:
    """The image's size, uncompressed and as a push compresses it (gzip -6), in MB."""
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    if inspected.returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as scratch:
        saved = Path(scratch) / "image.tar"
        subprocess.run(["docker", "save", "-o", str(saved), image], check=True)
        sizes = image_bench.compressed_sizes(image, saved, Path(scratch))
    return int(inspected.stdout) / 1e6, sizes.gzip / 1e6


def report(
    console: Console,
    results: dict[Cell, list[Run]],
    case: workload.Input,
    link: harness.LinkSpec,
    *,
    image: str,
    disks: harness.Disks,
) -> dict[str, object]:
    table = Table(title=f"first seed call to the sandbox command running ({case.label})")
    for column in ("path", "runtime", "shape", "first command", "restore (its share)", "target"):
        table.add_column(column, justify="left" if column in {"path", "runtime"} else "right")
    summary: dict[str, object] = {"size": case.label, "rate": link.label}
    for cell, runs in results.items():
        firsts = [run.first_command_s for run in runs]
        restores = [run.restore_s for run in runs]
        share = statistics.median(harness.ratios(restores, firsts))
        over = [run.first_command_s - run.restore_s for run in runs]
        if cell.path == "standby":
            met = statistics.median(over) <= 0.5
            target = (
                f"restore + {statistics.median(over):.2f} s (<= 0.5): {'met' if met else 'NOT met'}"
            )
        elif cell.path == "pre-seeded":
            met = statistics.median(firsts) <= 1.0
            target = f"<= 1 s: {'met' if met else 'NOT met'}"
        else:
            target = "-"
        table.add_row(
            cell.path,
            cell.runtime,
            f"{cell.vcpus} vCPU",
            spread(firsts),
            f"{spread(restores)} ({share:.0%})",
            target,
        )
        summary[cell.label] = [asdict(run) for run in runs]
    console.print(table)
    parts = slot_task.TASK_PARTS  # the task's download_parts: ranges of each archive at once
    if link.per_connection is not None:
        floor = link.floor_s([archived.size for archived in case.archives], parts)
        console.print(
            f"physical floor of the download: the larger archive in {parts} ranges at "
            f"{link.label}: {floor:.2f} s (both archives come at once)"
        )
    sizes = image_megabytes(image)
    if sizes is not None:
        unpacked, packed = sizes
        start = MODEL_FIXED_S + packed / MODEL_RATE_MB_S
        console.print(
            f"Fargate's start, modelled (an assumption, +-50 %): {MODEL_FIXED_S:.0f} s + the "
            f"image ({unpacked:.0f} MB, {packed:.0f} MB gzip) at {MODEL_RATE_MB_S:.0f} MB/s = "
            f"{start:.0f} s; with zstd layers at most 27 % less ({0.73 * start:.0f} s); SOCI "
            "is for images above 250 MiB. A cold seed on Fargate waits that, then what the "
            "cold rows above wait once their image is there; a standby waits none of it."
        )
        summary["image_mb"] = {"uncompressed": unpacked, "gzip": packed, "fargate_start_s": start}
    console.print(
        f"[dim]disk: {disks.description}; archives from nginx on loopback, "
        f"{link.label}; each container cell on a Docker engine of its own, its "
        "data on that ext4[/dim]"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=workload.size_for, default=workload.size_for("300 MB"))
    parser.add_argument(
        "--rate",
        type=harness.parse_rate,
        default="50m",
        help="nginx limit_rate per connection, or none",
    )
    parser.add_argument("--rounds", type=int, default=3)
    harness.add_seed_option(parser)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    options = parser.parse_args(argv)
    console = harness.console(160)
    rate = options.rate  # None: unlimited
    link = harness.LinkSpec("first-command", harness.rate_label(rate), per_connection=rate)
    logger.setLevel("WARNING")
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
    with_docker = (
        shutil.which("docker") is not None
        and subprocess.run(
            ["docker", "image", "inspect", options.image], capture_output=True, check=False
        ).returncode
        == 0
    )
    if not with_docker:
        console.print(f"no Docker engine or no image {options.image}: processes only")
    workdir = harness.default_workdir()
    case = workload.build_input(options.size, workdir, console)
    disks = harness.Disks()
    orders: list[tuple[Cell, ...]] = []
    try:
        results = measure(
            console,
            case,
            link,
            options.rounds,
            options.image,
            rng=random.Random(options.seed),  # noqa: S311 - orders, not secrets
            orders=orders,
            disks=disks,
            with_docker=with_docker,
        )
    except harness.BenchError as broken:
        harness.could_not_measure(console, broken)
        return 1
    summary = report(console, results, case, link, image=options.image, disks=disks)
    summary["seed"] = options.seed
    summary["orders"] = [[cell.label for cell in order] for order in orders]  # warm-up first
    harness.write_results(console, workdir / "first-command-results.json", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
