"""One run: a command timed from its spawn to its reap, inside the cell's CPU shape.

A timed run is a process group of its own, killed whole when it outlives RUN_TIMEOUT or
the benchmark is interrupted; its wall time is measured around spawn and reap, its CPU
seconds and peak RSS are wait4's (the process and its waited-for descendants). Every run
gets the same environment (`environment`): nothing of a developer's SEEDKEEPER_*, AWS_* or
GIT_* settings, nor their git configuration (a slot container has none), fake credentials.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from .cpu import CpuShape

RUN_TIMEOUT = 900.0
REGION = "us-east-1"
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
# No developer's git configuration: the same inputs give the same commit, every run the same git.
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


class BenchError(Exception):
    """The benchmark could not measure (a set-up failed, a run did not do its work)."""


def run_checked(
    argv: Sequence[str], *, timeout: float = 60.0, env: Mapping[str, str] | None = None
) -> str:
    """Run an untimed set-up command to completion: its output, or BenchError with the end
    of what it said."""
    done = subprocess.run(
        list(argv), check=False, capture_output=True, text=True, timeout=timeout, env=env
    )
    if done.returncode != 0:
        raise BenchError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr[-800:]}")
    return done.stdout


def version(argv: list[str]) -> str:
    """A tool's version line, as the JSON records it ("" when it says nothing)."""
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    return (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def stop_process(process: subprocess.Popen[bytes] | None, *, grace: float) -> None:
    """SIGTERM to a process this benchmark started, SIGKILL after `grace` seconds."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def environment(workdir: Path) -> dict[str, str]:
    """What the task and the baselines all run with: nothing from a developer's
    SEEDKEEPER_*, AWS_* or GIT_* settings nor their git configuration (a slot container has
    none), fake credentials, temporary files under the work dir."""
    keep = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SEEDKEEPER_", "AWS_", "GIT_"))
    }
    return keep | FAKE_AWS | GIT_ENV | {"TMPDIR": str(workdir / "tmp")}


@dataclass
class Timed:
    seconds: float
    max_rss_kb: int  # the process and its waited-for descendants (wait4)
    code: int
    started_at: float = 0.0  # time.time() just before the spawn
    cpu_s: float = 0.0  # user + system, the process and its waited-for descendants


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def deadline(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """The run's process group killed should it outlive RUN_TIMEOUT within the block."""
    killer = threading.Timer(RUN_TIMEOUT, kill_group, (process.pid,))
    killer.start()
    try:
        yield
    finally:
        killer.cancel()


def reaped(process: subprocess.Popen[bytes], started: float, started_at: float = 0.0) -> Timed:
    """Wait for `process` (spawned at perf_counter() `started`, time() `started_at`): its
    wall time to the reap, wait4's CPU and RSS. Interrupted, its group is killed first:
    nothing of the run outlives the benchmark."""
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        kill_group(process.pid)
        os.waitpid(process.pid, 0)
        raise
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return Timed(seconds, usage.ru_maxrss, process.returncode, started_at, cpu)


def timed_run(argv: Sequence[str], *, env: dict[str, str], log: IO[bytes]) -> Timed:
    """Run argv to completion, its wall time measured around spawn and reap."""
    started_at = time.time()
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with deadline(process):
        return reaped(process, started, started_at)


def timed_step(
    name: str, argv: Sequence[str], folder: Path, *, shape: CpuShape, env: dict[str, str]
) -> Timed:
    """One timed command inside `shape`; its output in `folder`/<name>.log (`name` may be a
    command line: in the file's name each run of characters other than letters, digits, dots
    and dashes is a dash), a failure raised with its tail."""
    stem = re.sub(r"[^\w.-]+", "-", name).strip("-")
    log = folder / f"{stem}.log"
    with log.open("wb") as output:
        timed = timed_run(shape.wrap(argv), env=env, log=output)
    if timed.code != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise BenchError(f"{name} exited {timed.code}:\n{tail}")
    return timed
