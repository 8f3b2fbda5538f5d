"""The links and the CPU shapes the restore, resume and checkpoint benchmarks measure on.

Links (`LINKS`), each an nginx serving (and, for the checkpoint, storing) objects from this
machine's page cache; traffic never leaves the machine:

- "per-connection": plain HTTP on loopback, each connection's responses paced to 50 MiB/s
  (nginx's `limit_rate`) and nothing capping their sum: what one TCP stream across the
  internet gets (held to its window over the round trip), multiplied by ranges in
  parallel. 50 MiB/s per connection is our assumption for one stream from R2 to a task
  in an AWS region, not a measurement.
- "total": HTTPS (TLS 1.3, a self-signed ECDSA certificate made per run that both sides
  trust: the clients through `--cacert`/`SSL_CERT_FILE`, as R2's own certificate is
  trusted through the system's bundle), from nginx in a network namespace the benchmark
  makes and removes, through a pair of TUN devices: a token bucket (`tc ... tbf`) caps
  each direction's sum at TOTAL_RATE (1 Gbit/s, our assumption for a Fargate task's
  network interface, whose bandwidth AWS does not publish), and RTT_MS (30 ms, within the
  20-50 ms from an AWS region to R2's nearest location) of round trip. This kernel has no
  `sch_netem`, so the delay is `delayline.c`'s, compiled at the first use: it forwards
  every packet between the two devices half the round trip later (whole GSO packets of up
  to 64 KiB; TCP still runs 1,500-byte segments, so slow start and windows behave as on
  a wire).
- "loopback": plain HTTP, unlimited: where a stream is nearly free.

Each link prints its floor (`LinkSpec.floor_s`): the least time it can deliver a set of
objects, whatever the client does.

CPU shapes (`CpuShape`): an ECS task's CPU is a CFS quota on its cgroup (Docker's
`--cpus`; a Fargate task at 1 vCPU may see more cores than it may use). A shape makes a
cgroup of its own with `cpu.cfs_quota_us` (v1) or `cpu.max` (v2) of that many cores, and
`wrap`s a command so that it and all it starts run inside; nginx, moto and the benchmark's
own process (the checkpoint function) stay outside, as R2 and AWS's side are not the
task's. Without a writable cgroup (not root), `taskset` pins the command to that many
cores instead, and `description` says so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

PER_CONNECTION_RATE = "50m"  # nginx's syntax: MiB/s
TOTAL_RATE = 125_000_000  # bytes/s each way: 1 Gbit/s
RTT_MS = 30.0
# The round trips before the first byte of an object: TCP's handshake, TLS 1.3's, the GET.
HTTPS_ROUND_TRIPS = 3
# What of a capped wire's bytes is payload: a full segment's 1,448 bytes (MSS with TCP
# timestamps) of its 1,500-byte IP packet, which tbf counts.
GOODPUT = 1448 / 1500
DELAYLINE_SOURCE = Path(__file__).with_name("delayline.c")
NAMESPACE_PREFIX = "skbench"


class BenchError(Exception):
    """The benchmark could not measure (a set-up failed, a run did not do its work)."""


@dataclass(frozen=True)
class LinkSpec:
    name: str
    label: str
    per_connection: str | None = None  # nginx limit_rate, per connection
    total: int | None = None  # bytes/s, each direction's sum
    rtt_ms: float = 0.0
    tls: bool = False

    def floor_s(self, sizes: Sequence[int], streams_each: int) -> float:
        """The least time this link delivers objects of `sizes` (bytes), all at once, each
        over `streams_each` connections: the slowest object at its connections' caps, or
        all of them through the total cap (its payload share), after the round trips before a
        first byte."""
        seconds = 0.0
        if self.per_connection is not None:
            per_stream = rate_bytes(self.per_connection) * streams_each
            seconds = max(size / per_stream for size in sizes)
        if self.total is not None:
            seconds = max(seconds, sum(sizes) / (self.total * GOODPUT))
        return seconds + (HTTPS_ROUND_TRIPS if self.tls else 2) * self.rtt_ms / 1000


LINKS = {
    spec.name: spec
    for spec in (
        LinkSpec(
            "per-connection",
            "50 MiB/s per connection, HTTP, loopback",
            per_connection=PER_CONNECTION_RATE,
        ),
        LinkSpec(
            "total",
            f"{TOTAL_RATE * 8 / 1e9:g} Gbit/s in all, {RTT_MS:g} ms RTT, HTTPS",
            total=TOTAL_RATE,
            rtt_ms=RTT_MS,
            tls=True,
        ),
        LinkSpec("loopback", "unlimited loopback, HTTP"),
    )
}


def rate_bytes(rate: str) -> int:
    """An nginx rate ("50m") in bytes per second (its units are binary)."""
    return int(rate.rstrip("km")) * {"k": 1024, "m": 1024**2}.get(rate[-1], 1)


def run_checked(argv: Sequence[str], *, timeout: float = 60.0) -> None:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise BenchError(f"{argv[0]} exited {done.returncode}: {done.stderr[-500:]}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# -- the server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificate:
    """A self-signed certificate for `address`, which both sides trust: the server's key and
    certificate, and the certificate as the clients' CA bundle."""

    certificate: Path
    key: Path

    @classmethod
    def make(cls, folder: Path, address: str) -> Certificate:
        folder.mkdir(parents=True, exist_ok=True)
        made = cls(folder / "server.pem", folder / "server.key")
        run_checked(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                f"/CN={address}",
                "-addext",
                f"subjectAltName=IP:{address}",
                "-keyout",
                str(made.key),
                "-out",
                str(made.certificate),
            ]
        )
        return made


class Nginx:
    """nginx from the distribution, with its own minimal configuration, in the foreground.
    With `accepts_puts`, its dav module also stores PUT bodies under `root` (written to
    `temp` as they arrive, renamed into place when complete: keep both on one filesystem).
    With `limit_rate` (nginx's syntax, bytes per second: "50m"), each connection's
    responses are paced to that rate; `home` names its folder (default: `nginx`). It listens
    on `host` (loopback by default), inside network namespace `netns` when given, over
    HTTPS with `certificate`."""

    def __init__(
        self,
        root: Path,
        workdir: Path,
        *,
        temp: Path | None = None,
        accepts_puts: bool = False,
        limit_rate: str | None = None,
        home: str = "nginx",
        host: str = "127.0.0.1",
        netns: str | None = None,
        certificate: Certificate | None = None,
    ) -> None:
        self.root = root
        self.home = workdir / home
        self.temp = temp or self.home / "tmp"
        self.accepts_puts = accepts_puts
        self.limit_rate = limit_rate
        self.host = host
        self.netns = netns
        self.certificate = certificate
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.certificate is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path | None:
        """The CA bundle a client trusts this server with (None: plain HTTP)."""
        return None if self.certificate is None else self.certificate.certificate

    def url(self, archive: Path) -> str:
        return f"{self.endpoint}/{archive.name}"

    def client_environment(self) -> dict[str, str]:
        """What a client process needs to trust this server: Python's ssl (the task),
        botocore and curl read these."""
        if self.ca_file is None:
            return {}
        bundle = str(self.ca_file)
        return {"SSL_CERT_FILE": bundle, "AWS_CA_BUNDLE": bundle, "CURL_CA_BUNDLE": bundle}

    def curl_options(self) -> list[str]:
        return [] if self.ca_file is None else ["--cacert", str(self.ca_file)]

    def aria2c_options(self) -> list[str]:
        return [] if self.ca_file is None else [f"--ca-certificate={self.ca_file}"]

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
        listen = f"{self.host}:{self.port}"
        if self.certificate is not None:
            listen += " ssl"
            directives += (
                f' ssl_certificate "{self.certificate.certificate}";'
                f' ssl_certificate_key "{self.certificate.key}";'
                " ssl_protocols TLSv1.3;"
            )
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
        listen {listen};
        root "{self.root}";
        {directives}
    }}
}}
"""
        )
        inside = [] if self.netns is None else ["ip", "netns", "exec", self.netns]
        self._process = subprocess.Popen(
            [*inside, binary, "-e", str(log), "-p", str(self.home), "-c", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        context = None if self.ca_file is None else ssl.create_default_context(cafile=self.ca_file)
        deadline = time.monotonic() + 15
        while True:
            if self._process.poll() is not None:
                raise BenchError(f"nginx exited: {log.read_text()[-500:] if log.exists() else ''}")
            request = urllib.request.Request(self.endpoint + "/", method="HEAD")  # noqa: S310
            try:
                with urllib.request.urlopen(request, timeout=2, context=context):  # noqa: S310
                    return
            except urllib.error.HTTPError:
                return  # an answer, whatever it says: nginx serves
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise BenchError(f"nginx did not answer at {self.endpoint}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


class Namespace:
    """A network namespace joined to this one by two TUN devices and the delay line between
    them, each direction capped by tbf: the "total" link's wire. Addresses: HOST (here) and
    INSIDE (there), /32 routes only, so nothing else is reachable either way."""

    HOST = "10.231.0.1"
    INSIDE = "10.231.0.2"

    def __init__(self, workdir: Path, *, rate: int, rtt_ms: float) -> None:
        suffix = str(os.getpid() % 100_000)
        self.name = f"{NAMESPACE_PREFIX}{suffix}"
        self.devices = (f"skh{suffix}", f"skn{suffix}")
        self.workdir = workdir
        self.rate = rate
        self.rtt_ms = rtt_ms
        self._line: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if os.geteuid() != 0 or not Path("/dev/net/tun").exists():
            raise BenchError("the capped HTTPS link needs root and /dev/net/tun (make bench)")
        line = self._compiled()
        self.stop()  # a namespace left by a run killed outright
        run_checked(["ip", "netns", "add", self.name])
        self._line = subprocess.Popen(
            [
                str(line),
                f"/var/run/netns/{self.name}",
                *self.devices,
                str(round(self.rtt_ms * 1000 / 2)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self._line.stdout is not None
        if self._line.stdout.readline().strip() != b"ready":
            raise BenchError(f"the delay line did not start: {self._line.communicate()[1]!r}")
        host, inside = self.devices
        there = ["ip", "-n", self.name]
        # A token bucket's burst: at least one GSO packet, and the rate for 8 ms.
        burst = max(128 * 1024, self.rate // 125)
        shaped = ["tbf", "rate", f"{self.rate * 8}bit", "burst", str(burst), "latency", "50ms"]
        for argv in (
            ["ip", "addr", "add", f"{self.HOST}/32", "dev", host],
            ["ip", "link", "set", host, "up"],
            ["ip", "route", "add", f"{self.INSIDE}/32", "dev", host],
            [*there, "link", "set", "lo", "up"],
            [*there, "addr", "add", f"{self.INSIDE}/32", "dev", inside],
            [*there, "link", "set", inside, "up"],
            [*there, "route", "add", f"{self.HOST}/32", "dev", inside],
            ["tc", "qdisc", "add", "dev", host, "root", *shaped],
            ["tc", "-n", self.name, "qdisc", "add", "dev", inside, "root", *shaped],
        ):
            run_checked(argv)

    def _compiled(self) -> Path:
        binary = self.workdir / "bin" / "delayline"
        if not binary.exists() or binary.stat().st_mtime < DELAYLINE_SOURCE.stat().st_mtime:
            binary.parent.mkdir(parents=True, exist_ok=True)
            compiler = shutil.which("cc") or shutil.which("gcc")
            if compiler is None:
                raise BenchError("no C compiler for the delay line (apt-get install gcc)")
            run_checked([compiler, "-O2", "-o", str(binary), str(DELAYLINE_SOURCE)])
        return binary

    def stop(self) -> None:
        if self._line is not None and self._line.poll() is None:
            self._line.kill()  # its devices go with it
            self._line.wait()
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)


@contextlib.contextmanager
def served(
    spec: LinkSpec,
    root: Path,
    workdir: Path,
    *,
    home: str,
    accepts_puts: bool = False,
    temp: Path | None = None,
) -> Iterator[Nginx]:
    """nginx serving `root` over the link `spec` until the block ends (its namespace,
    delay line and certificate removed then)."""
    namespace = None
    if spec.total is not None or spec.rtt_ms:
        namespace = Namespace(workdir, rate=spec.total or 10 * 1024**3, rtt_ms=spec.rtt_ms)
    host = Namespace.INSIDE if namespace is not None else "127.0.0.1"
    certificate = Certificate.make(workdir / home / "tls", host) if spec.tls else None
    server = Nginx(
        root,
        workdir,
        temp=temp,
        accepts_puts=accepts_puts,
        limit_rate=spec.per_connection,
        home=home,
        host=host,
        netns=None if namespace is None else namespace.name,
        certificate=certificate,
    )
    try:
        if namespace is not None:
            namespace.start()
        server.start()
        yield server
    finally:
        server.stop()
        if namespace is not None:
            namespace.stop()


# -- the task's CPU --------------------------------------------------------------------------

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
QUOTA_PERIOD_US = 100_000


class CpuShape:
    """`count` vCPUs as ECS gives a task them: a CFS quota of `count` cores on a cgroup of
    its own (or, without one, `taskset` to `count` cores)."""

    def __init__(self, count: int) -> None:
        if not 1 <= count <= (os.cpu_count() or 1):
            raise BenchError(f"{count} vCPU: this machine has {os.cpu_count()} cores")
        self.count = count
        self.cgroup: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.count} vCPU"

    @property
    def task_environment(self) -> dict[str, str]:
        """What the template tells a task of this CPU (its SlotCpu, 1024 units a vCPU)."""
        return {"SEEDKEEPER_CPU_UNITS": str(self.count * 1024)}

    @property
    def description(self) -> str:
        if self.cgroup is not None:
            return f"{self.label}: CFS quota {self.count} x {QUOTA_PERIOD_US} us per period"
        return f"{self.label}: taskset to {self.count} cores (no writable cgroup)"

    def start(self) -> None:
        name = f"seedkeeper-bench-{self.count}cpu-{os.getpid()}"
        quota = str(self.count * QUOTA_PERIOD_US)
        with contextlib.suppress(OSError):
            if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
                group = CGROUP_V1 / name
                group.mkdir(exist_ok=True)
                (group / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(quota)
                self.cgroup = group
            elif "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
                group = CGROUP_V2 / name
                group.mkdir(exist_ok=True)
                (group / "cpu.max").write_text(f"{quota} {QUOTA_PERIOD_US}")
                self.cgroup = group

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this shape: it moves itself into the cgroup, then execs."""
        if self.cgroup is None:
            return ["taskset", "-c", f"0-{self.count - 1}", *argv]
        procs = str(self.cgroup / "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def stop(self) -> None:
        if self.cgroup is not None:
            for _ in range(50):  # its last processes may still be leaving
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            self.cgroup = None


@contextlib.contextmanager
def cpu_shapes(counts: Sequence[int]) -> Iterator[list[CpuShape]]:
    shapes = [CpuShape(count) for count in counts]
    try:
        for shape in shapes:
            shape.start()
        yield shapes
    finally:
        for shape in shapes:
            shape.stop()


def unwind_on_sigterm() -> None:
    """A benchmark stopped by SIGTERM unwinds as on Ctrl-C: the finally blocks remove the
    namespace, cgroups, mounts and servers it made."""

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)


# -- cells and rounds ------------------------------------------------------------------------

MIN_ROUNDS = 5
DEFAULT_CPUS = (1, 2)


def add_cell_options(parser: argparse.ArgumentParser, *, rounds: int = MIN_ROUNDS) -> None:
    """--links, --cpus, --rounds and --seed, as the restore, resume and checkpoint
    benchmarks take them: every link at every CPU shape is a cell."""
    parser.add_argument(
        "--links",
        nargs="+",
        choices=list(LINKS),
        default=list(LINKS),
        metavar="LINK",
        help=f"the links to measure on, of {', '.join(LINKS)} (default: all)",
    )
    parser.add_argument(
        "--cpus",
        nargs="+",
        type=int,
        default=list(DEFAULT_CPUS),
        metavar="N",
        help="the task's vCPUs, one series each (a CFS quota; default: 1 2)",
    )
    parser.add_argument(
        "--rounds",
        type=_at_least(MIN_ROUNDS),
        default=rounds,
        help=f"rounds per cell, each in an order of its own (at least {MIN_ROUNDS})",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="the random orders' seed (recorded in the JSON)"
    )


def _at_least(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"at least {least}")
        return value

    return parse


M = TypeVar("M")


def shuffled(methods: Sequence[M], rng: random.Random) -> tuple[M, ...]:
    """One round's order: `methods` in a random order of `rng`'s."""
    order = list(methods)
    rng.shuffle(order)
    return tuple(order)
