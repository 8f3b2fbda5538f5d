"""The links the restore, resume, checkpoint and first-command benchmarks measure on.

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
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .runs import BenchError, free_port, run_checked, stop_process

PER_CONNECTION_RATE = "50m"  # nginx's syntax: MiB/s
TOTAL_RATE = 125_000_000  # bytes/s each way: 1 Gbit/s
RTT_MS = 30.0
# The round trips before the first byte of an object: TCP's handshake, TLS 1.3's, the GET.
HTTPS_ROUND_TRIPS = 3
# What of a capped wire's bytes is payload: a full segment's 1,448 bytes (MSS with TCP
# timestamps) of its 1,500-byte IP packet, which tbf counts.
GOODPUT = 1448 / 1500
DELAYLINE_SOURCE = Path(__file__).resolve().parents[1] / "delayline.c"  # benchmarks/
NAMESPACE_PREFIX = "skbench"
# The commands the links run (the command: its Debian package): the server, its
# certificate, the namespace and its caps, the delay line's compiler.
TOOLS = {"nginx": "nginx", "openssl": "openssl", "ip": "iproute2", "tc": "iproute2", "cc": "gcc"}


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
        self.port = free_port()
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
        stop_process(self._process, grace=10)


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


def serve_object(root: Path, key: str, source: Path, *, bucket: str) -> None:
    """Lay `source` where an nginx serving `root` answers a presigned GET of `bucket`'s
    `key`: R2's URLs are path-style, `{endpoint}/{bucket}/{key}?X-Amz-...`, and nginx
    ignores the query. A hard link (no copy), laid afresh: a rebuilt `source` is a new file."""
    folder = root
    for part in (bucket, *PurePosixPath(key).parent.parts):
        folder /= part
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)  # nginx's workers read it as an unprivileged user
    target = root / bucket / key
    target.unlink(missing_ok=True)
    os.link(source, target)


# -- a rate, for the first-command benchmark's per-connection link ---------------------------

UNLIMITED = "none"


def parse_rate(rate: str) -> str | None:
    """An nginx rate ("50m": 50 MiB/s per connection), UNLIMITED as None (argparse's type of
    --rate, which names the option in its error)."""
    if rate == UNLIMITED:
        return None
    if not re.fullmatch(r"[1-9][0-9]*[km]?", rate):
        raise argparse.ArgumentTypeError(f"an nginx rate like 50m or 800k, or {UNLIMITED!r}")
    return rate


def rate_label(rate: str | None) -> str:
    if rate is None:
        return "unlimited loopback"
    unit = {"k": " KiB", "m": " MiB"}.get(rate[-1], " B")  # nginx's units are binary
    return f"{rate.rstrip('km')}{unit}/s per connection"
