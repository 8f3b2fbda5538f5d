"""The slot image before and after a change of its Dockerfile: sizes and cold starts.

Both images are built from this working tree's sources: "after" by images/slot-task (as
`make image` builds it), "before" from the Dockerfile at a git revision (`--before-ref`,
default HEAD) with the same base, wheels and sources.

Sizes: uncompressed (`docker image inspect`: what the engine stores), and what a registry
stores and a task pulls: each layer of `docker save`'s tarball compressed as a push
compresses it, with gzip -6 (docker push's default) and zstd -3 (BuildKit's and skopeo's
default), summed; and how long one core takes to decompress them (median of three).

Cold starts, on a Docker engine of the benchmark's own (a private dockerd with its own
data root, so removing an image there touches nothing of the machine's engine): before
each start the image is absent from it (every image removed); then it is acquired,
either (a) `docker load` of the saved tarball or (b) `docker pull` from a local registry
(Debian's docker-registry on 127.0.0.1, a temporary directory; the images pushed by that
engine, so with gzip layers; zstd layers too where the engine can pull them: Docker 23.0
and later), and run until the task is ready: `docker run --init` of the image's Python
importing `seedkeeper_task.launch` (the task's entry point: its imports are most of what a
task does before its first request), timed until the container exits. Then the same run
again, the image now present ("warm run"). Each with no CPU limit and with `--cpus 1`
(a 1-vCPU task). Files come from the page cache: this measures the engine's unpacking and
the start, not a network; on Fargate the transfer of the compressed size comes on top.

Each round runs, for each way of acquiring and each CPU limit, both images in a random
order (the seed is printed). Reported: medians with their spread (min to max) over the
rounds, and the paired ratio after / before of the cold start within each round.

Needs root (a dockerd of its own), a running Docker engine (the builds), gzip and zstd;
docker-registry for (b) (`make bench-packages` installs them). Without an engine it says so
and exits 0: nothing to compare. The figures, with the command that produced them, are
also written as Markdown (`--figures`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

import harness

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = "functions/seed_task/Dockerfile"
DEFAULT_IMAGE = "seedkeeper-slot-task:local"
READY = ["--entrypoint", "/opt/seedkeeper/bin/python"]
READY_ARGS = ["-c", "import seedkeeper_task.launch"]
SIDES = ("before", "after")
# The benchmark's dockerd puts its containers' cgroups under this one of its own.
CGROUP_PARENT = "seedkeeper-image-bench"
MB = 1e6


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> str:
    """A command of the builds, the engine or a run, to completion: its output."""
    return harness.run_checked(argv, timeout=900, env=env)


def timed(argv: Sequence[str]) -> float:
    started = time.monotonic()
    run(argv)
    return time.monotonic() - started


# --- the images -------------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    before: str
    after: str
    base: str

    def tag(self, side: str) -> str:
        return self.before if side == "before" else self.after


def build(image: str, before: str, ref: str, workdir: Path) -> Images:
    """After: images/slot-task (it picks the base and downloads the wheels). Before: the
    Dockerfile at `ref`, on the same base, wheels and sources."""
    built = run([str(ROOT / "images" / "slot-task")], env=os.environ | {"SLOT_IMAGE": image})
    base = built.strip().splitlines()[-1].rsplit("base ", 1)[-1].strip()
    dockerfile = workdir / "before.Dockerfile"
    dockerfile.write_text(run(["git", "-C", str(ROOT), "show", f"{ref}:{DOCKERFILE}"]))
    run(
        [
            *["docker", "build", "--quiet", "--build-arg", f"BASE={base}"],
            *["--file", str(dockerfile), "--tag", before, str(ROOT)],
        ]
    )
    return Images(before=before, after=image, base=base)


@dataclass
class Sizes:
    uncompressed: int = 0
    layers: int = 0
    gzip: int = 0
    zstd: int = 0
    gunzip_s: float = 0.0
    unzstd_s: float = 0.0


def layer_members(saved: Path) -> list[str]:
    with tarfile.open(saved) as archive:
        manifest = archive.extractfile("manifest.json")
        assert manifest is not None
        layers: list[str] = json.load(manifest)[0]["Layers"]
    return layers


def compressed_sizes(image: str, saved: Path, scratch: Path) -> Sizes:
    """Each layer of the saved image compressed as a push does (gzip -6, zstd -3), and one
    core's time to decompress all of them (median of three)."""
    sizes = Sizes(
        uncompressed=int(run(["docker", "image", "inspect", "--format", "{{.Size}}", image]))
    )
    members = layer_members(saved)
    sizes.layers = len(members)
    packed: dict[str, list[Path]] = {"gzip": [], "zstd": []}
    with tarfile.open(saved) as archive:
        for number, member in enumerate(members):
            layer = scratch / f"layer-{number}.tar"
            source = archive.extractfile(member)
            assert source is not None
            with layer.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            for name, argv in (
                ("gzip", ["gzip", "-6", "-c"]),
                ("zstd", ["zstd", "-3", "-q", "-c"]),
            ):
                target = scratch / f"layer-{number}.{name}"
                with layer.open("rb") as given, target.open("wb") as out:
                    subprocess.run(argv, stdin=given, stdout=out, check=True)
                packed[name].append(target)
            layer.unlink()
    sizes.gzip = sum(path.stat().st_size for path in packed["gzip"])
    sizes.zstd = sum(path.stat().st_size for path in packed["zstd"])

    def decompress(argv: list[str], paths: list[Path]) -> float:
        times = []
        for _ in range(3):
            started = time.monotonic()
            for path in paths:
                subprocess.run([*argv, str(path)], stdout=subprocess.DEVNULL, check=True)
            times.append(time.monotonic() - started)
        return statistics.median(times)

    sizes.gunzip_s = decompress(["gzip", "-d", "-c"], packed["gzip"])
    sizes.unzstd_s = decompress(["zstd", "-d", "-q", "-c"], packed["zstd"])
    for path in packed["gzip"] + packed["zstd"]:
        path.unlink()
    return sizes


# --- an engine and a registry of the benchmark's own --------------------------------------


@dataclass
class Engine:
    """A dockerd with its own data root, exec root and socket (short paths: a socket's
    path holds at most 107 bytes), and a bridge of its own (its runs use no network).
    Never `--bridge none`: a dockerd started so deletes docker0, the machine engine's
    bridge."""

    root: Path
    bridge: str = field(default_factory=lambda: f"skimg{os.getpid() % 100000}")
    process: subprocess.Popen[bytes] | None = None
    made_bridge: bool = False

    @property
    def host(self) -> str:
        return f"unix://{self.root / 'docker.sock'}"

    def docker(self, *args: str) -> list[str]:
        return ["docker", "-H", self.host, *args]

    def start(self) -> None:
        # 198.18.0.0/15 is set aside for benchmarks (RFC 2544): no route of the machine's.
        run(["ip", "link", "add", "name", self.bridge, "type", "bridge"])
        self.made_bridge = True
        run(["ip", "address", "add", "198.18.231.1/24", "dev", self.bridge])
        log = (self.root / "dockerd.log").open("wb")
        self.process = subprocess.Popen(
            [
                "dockerd",
                "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"),
                "--pidfile", str(self.root / "dockerd.pid"),
                "--host", self.host,
                "--bridge", self.bridge,
                "--iptables=false",
                "--ip-masq=false",
                "--ip-forward=false",
                "--cgroup-parent", CGROUP_PARENT,
                "--log-level", "error",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log_text = (self.root / "dockerd.log").read_text()[-500:]
                raise harness.BenchError(f"dockerd exited: {log_text}")
            probe = subprocess.run(self.docker("info"), capture_output=True, check=False)
            if probe.returncode == 0:
                return
            time.sleep(0.5)
        raise harness.BenchError("the benchmark's dockerd did not answer within 60 s")

    def version(self) -> str:
        return run(self.docker("version", "--format", "{{.Server.Version}}")).strip()

    def empty(self) -> None:
        """No container, no image: the next acquire starts cold."""
        containers = run(self.docker("ps", "--all", "--quiet")).split()
        if containers:
            run(self.docker("rm", "--force", *containers))
        images = sorted(set(run(self.docker("images", "--all", "--quiet")).split()))
        if images:
            run(self.docker("rmi", "--force", *images))

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(harness.BenchError):
                self.empty()  # its containers' and images' mounts go with them
            harness.stop_process(self.process, grace=60)
            # dockerd removes its containers' cgroups, never the parent it made for them
            cgroups = Path("/sys/fs/cgroup")  # v2's root, or v1's controllers under it
            for parent in [cgroups / CGROUP_PARENT, *cgroups.glob(f"*/{CGROUP_PARENT}")]:
                with contextlib.suppress(OSError):
                    parent.rmdir()
        if self.made_bridge:
            run(["ip", "link", "delete", self.bridge])


@dataclass
class Registry:
    root: Path
    port: int = field(default_factory=harness.free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        config = self.root / "registry.yml"
        config.write_text(
            "version: 0.1\n"
            "log: {level: error, accesslog: {disabled: true}}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.root / 'blobs'}}}}}\n"
            f"http: {{addr: '{self.address}'}}\n"
        )
        log = (self.root / "registry.log").open("wb")
        self.process = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2).close()
                return
            time.sleep(0.2)
        raise harness.BenchError("docker-registry did not answer within 30 s")

    def stop(self) -> None:
        harness.stop_process(self.process, grace=30)


# --- the cold starts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    acquire: float  # load or pull, the image absent before
    first: float  # docker run until the task is ready (the container exits)
    warm: float  # the same run again, the image present

    @property
    def cold(self) -> float:
        return self.acquire + self.first


@dataclass(frozen=True)
class Way:
    """How the image reaches the engine, and the CPU limit of its runs."""

    acquire: str  # "load", "pull gzip", "pull zstd"
    cpus: str | None  # None: no limit

    @property
    def label(self) -> str:
        return f"{self.acquire}, {'--cpus ' + self.cpus if self.cpus else 'no CPU limit'}"


class Bench:
    def __init__(self, engine: Engine, images: Images, saved: dict[str, Path]) -> None:
        self.engine = engine
        self.images = images
        self.saved = saved
        self.remote: dict[tuple[str, str], str] = {}  # (side, compression) -> reference

    def publish(self, registry: Registry, zstd: bool) -> None:
        """Each image into the registry, pushed by the benchmark's engine (gzip layers), and
        with zstd layers by skopeo where asked."""
        for side in SIDES:
            self.engine.empty()
            run(self.engine.docker("load", "--quiet", "--input", str(self.saved[side])))
            reference = f"{registry.address}/bench/{side}:gzip"
            run(self.engine.docker("tag", self.images.tag(side), reference))
            run(self.engine.docker("push", "--quiet", reference))
            self.remote[(side, "gzip")] = reference
            if zstd:
                reference = f"{registry.address}/bench/{side}-zstd:zstd"
                run(
                    [
                        *["skopeo", "copy", "--quiet", "--dest-tls-verify=false"],
                        *["--format", "oci", "--dest-compress-format", "zstd"],
                        *["--dest-compress-level", "3", f"docker-archive:{self.saved[side]}"],
                        f"docker://{reference}",
                    ]
                )
                self.remote[(side, "zstd")] = reference
        self.engine.empty()

    def once(self, side: str, way: Way) -> Start:
        self.engine.empty()
        started = time.monotonic()
        if way.acquire == "load":
            run(self.engine.docker("load", "--quiet", "--input", str(self.saved[side])))
            reference = self.images.tag(side)
        else:
            reference = self.remote[(side, way.acquire.removeprefix("pull "))]
            run(self.engine.docker("pull", "--quiet", reference))
        acquired = time.monotonic()
        limit = ["--cpus", way.cpus] if way.cpus else []
        argv = self.engine.docker("run", "--init", "--network", "none", *limit, *READY)
        first = timed([*argv, reference, *READY_ARGS])
        warm = timed([*argv, reference, *READY_ARGS])
        return Start(acquire=acquired - started, first=first, warm=warm)


def measure(
    bench: Bench, ways: list[Way], rounds: int, rng: random.Random, console: Console
) -> dict[Way, dict[str, list[Start]]]:
    results: dict[Way, dict[str, list[Start]]] = {way: {side: [] for side in SIDES} for way in ways}
    for number in range(rounds):
        for way in ways:
            for side in harness.shuffled(SIDES, rng):
                results[way][side].append(bench.once(side, way))
        console.print(f"round {number + 1}/{rounds} done")
    bench.engine.empty()
    return results


# --- the report --------------------------------------------------------------------------


def spread(values: Sequence[float]) -> str:
    return harness.spread(values, unit=" s", to=" to ")


@dataclass
class Report:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def rich(self, console: Console) -> None:
        table = Table(title=self.title)
        for number, column in enumerate(self.columns):
            table.add_column(column, justify="left" if number == 0 else "right")
        for row in self.rows:
            table.add_row(*row)
        console.print(table)
        for note in self.notes:
            console.print(note)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(self.columns) - 1)) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join([*lines, "", *self.notes, ""])


def size_report(images: Images, sizes: dict[str, Sizes]) -> Report:
    report = Report(
        "image sizes (MB = 10^6 bytes)",
        [
            *["image", "uncompressed", "layers", "gzip -6", "zstd -3"],
            *["gunzip, 1 core", "unzstd, 1 core"],
        ],
    )
    for side in SIDES:
        size = sizes[side]
        report.rows.append(
            [
                f"{side} ({images.tag(side)})",
                f"{size.uncompressed / MB:.1f} MB",
                str(size.layers),
                f"{size.gzip / MB:.1f} MB",
                f"{size.zstd / MB:.1f} MB",
                f"{size.gunzip_s:.2f} s",
                f"{size.unzstd_s:.2f} s",
            ]
        )
    ratio = {
        name: getattr(sizes["after"], name) / getattr(sizes["before"], name)
        for name in ("uncompressed", "gzip", "zstd")
    }
    report.notes.append(
        "after / before: " + ", ".join(f"{name} {value:.2f}" for name, value in ratio.items())
    )
    return report


def start_report(way: Way, starts: dict[str, list[Start]]) -> Report:
    report = Report(
        f"cold start: {way.label}",
        ["image", "acquire (image absent)", "first run to ready", "cold start", "warm run"],
    )
    for side in SIDES:
        runs = starts[side]
        report.rows.append(
            [
                side,
                spread([start.acquire for start in runs]),
                spread([start.first for start in runs]),
                spread([start.cold for start in runs]),
                spread([start.warm for start in runs]),
            ]
        )
    ratios = harness.ratios(
        [start.cold for start in starts["after"]], [start.cold for start in starts["before"]]
    )
    report.notes.append(
        f"after / before, cold start, paired over {len(ratios)} rounds: "
        f"median {harness.spread(ratios, to=' to ')}"
    )
    return report


# --- main --------------------------------------------------------------------------------


def cannot_measure() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command on PATH"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "no Docker engine answers (start dockerd)"
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        return "the cold starts need root and dockerd (an engine of the benchmark's own)"
    missing = [tool for tool in ("gzip", "zstd", "git") if shutil.which(tool) is None]
    return f"missing: {', '.join(missing)}" if missing else None


@dataclass
class Figures:
    images: Images
    sizes: dict[str, Sizes]
    version: str
    ways: list[Way]
    results: dict[Way, dict[str, list[Start]]]
    notes: list[str]


def measure_all(
    root: Path, options: argparse.Namespace, rng: random.Random, console: Console
) -> Figures:
    console.print("building both images...")
    images = build(options.image, options.before, options.before_ref, root)
    saved = {side: root / f"{side}.tar" for side in SIDES}
    sizes: dict[str, Sizes] = {}
    for side in SIDES:
        run(["docker", "save", "--output", str(saved[side]), images.tag(side)])
        sizes[side] = compressed_sizes(images.tag(side), saved[side], root)
    notes: list[str] = []
    engine = Engine(root / "engine")
    engine.root.mkdir()
    registry = Registry(root / "registry")
    registry.root.mkdir()
    try:
        engine.start()
        version = engine.version()
        bench = Bench(engine, images, saved)
        acquires = ["load"]
        if shutil.which("docker-registry") is None:
            notes.append("no pull measured: docker-registry is not installed")
        else:
            registry.start()
            pulls_zstd = int(version.split(".")[0]) >= 23
            zstd = pulls_zstd and shutil.which("skopeo") is not None
            bench.publish(registry, zstd)
            acquires += ["pull gzip", "pull zstd"] if zstd else ["pull gzip"]
            if not pulls_zstd:
                notes.append(
                    f"no zstd pull measured: Docker {version} cannot pull zstd layers "
                    "(Docker 23.0 added it: moby/moby#41759)"
                )
            elif not zstd:
                notes.append("no zstd pull measured: skopeo is not installed (it pushes them)")
        ways = [Way(acquire, cpus) for acquire in acquires for cpus in (None, "1")]
        console.print(f"cold starts: {options.rounds} rounds...")
        results = measure(bench, ways, options.rounds, rng, console)
    finally:
        registry.stop()
        engine.stop()
    return Figures(images, sizes, version, ways, results, notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the image as built now")
    parser.add_argument("--before", default="seedkeeper-slot-task:before", help="its tag")
    parser.add_argument("--before-ref", default="HEAD", help=f"the revision of {DOCKERFILE}")
    parser.add_argument("--rounds", type=int, default=5, help="cold starts per side and way")
    parser.add_argument("--seed", type=int, default=None, help="the order's seed")
    parser.add_argument(
        "--figures",
        type=Path,
        default=Path(tempfile.gettempdir()) / "slim-image-figures.md",
        help="Markdown",
    )
    options = parser.parse_args(argv)
    console = harness.console(150)
    why = cannot_measure()
    if why is not None:
        console.print(f"no image measured: {why}")
        return 0
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(10**6)
    # Short: the benchmark's engine keeps its sockets under it.
    root = Path(tempfile.mkdtemp(prefix="skimg-", dir="/tmp"))
    try:
        figures = measure_all(root, options, random.Random(seed), console)  # noqa: S311
    except harness.BenchError as broken:
        harness.could_not_measure(console, broken)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    reports = [size_report(figures.images, figures.sizes)]
    reports += [start_report(way, figures.results[way]) for way in figures.ways]
    for report in reports:
        report.rich(console)
    for note in figures.notes:
        console.print(note)
    header = [
        "# Slot image: before and after",
        "",
        f"Command: `{shlex.join([sys.executable, *sys.argv])}` (order seed {seed})",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs; the benchmark's "
        f"engine: Docker {figures.version}; base: {figures.images.base}; before: "
        f"{DOCKERFILE} at {options.before_ref}.",
        "",
    ]
    body = [report.markdown() for report in reports]
    options.figures.write_text("\n".join(header + body + figures.notes) + "\n")
    console.print(f"figures written to {options.figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
