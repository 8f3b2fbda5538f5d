"""A working day on the local stack (`make bench`), as many executors would use it.

The stack runs in a process of its own, as `seedkeeper local` does (an idle window of 5 s,
the sweep every 5 s); this process is the executors, signing each request as an executor
does, each call with an executor's patience (30 s, never retried). Phases:

1. seeding: `--slots` claimed slots (50) are seeded from one published snapshot;
2. polls: `--pollers` threads (20) poll them for `--poll-seconds` (60): polls/s, latency;
3. storm: `--storm` (100) new cold slots are asked for at once: latency of each first call;
4. soak: `--minutes` (10) of polls as in 2 while new cold slots arrive (`--arrivals`, 1 a
   second: each is a Python process that costs a start, and 3 a second take all of two
   cores) and the sweep reclaims the idle ones; every `--sample-seconds` it records the
   stack's RSS (every process of the stack, not its slot tasks), open files, processes,
   slot tasks, zombies and poll latency;
5. reclaim: every cold slot's task must be stopped (within RECLAIM_WAIT) and every seeded
   slot's still running;
6. shutdown: more cold slots until `--shutdown-slots` (200) tasks run, then the stack is
   stopped and timed; no slot task may be left running.

`--minutes 1` is the short mode. It never fails on a figure: exit 1 only when the benchmark
itself breaks, or when a protocol check above fails (an error, a seeded slot stopped, a cold
slot not reclaimed, a task left running).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path

from botocore.credentials import Credentials
from rich.console import Console
from rich.table import Table

import harness
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.observability import logger
from seedkeeper_client import Cold, OwnerClaim, Seeded, SeedIdentity, SeedkeeperClient
from seedkeeper_tools.demo import published_snapshot, sample_repository
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.stack import LocalStack

RESOURCE = "soak-widgets"
ORIGIN = "https://git.example.com/soak/widgets.git"
IDLE_WINDOW = 5  # seconds: a cold slot is reclaimed by the first sweep after it
SWEEP_INTERVAL = 5.0
RECLAIM_WAIT = 120.0  # a sweep that has not stopped every idle slot by then is broken
ARRIVING = 16  # arrivals whose first call may be under way at once
CLIENT_TIMEOUT = 30.0  # an executor's patience; a timeout counts as an error, never retried
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Plan:
    slots: int
    pollers: int
    poll_seconds: float
    storm: int
    minutes: float
    arrivals: float
    sample_seconds: float
    shutdown_slots: int


# -- the stack's process --------------------------------------------------------------


def serve_stack(root: Path, credentials: LocalCredentials, parent: Connection) -> None:
    """Runs in the stack's own process: start, publish one snapshot, answer its url and
    seed; on "stop", stop the stack and answer how long that took."""
    logger.setLevel("WARNING")
    # The sweep's metrics go to stdout, as in Lambda: not between the benchmark's lines.
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        stack = LocalStack(
            data_dir=root / "data",
            port=0,
            credentials=credentials,
            sweep_interval=SWEEP_INTERVAL,
            idle_window=IDLE_WINDOW,
        ).start()
        client = SeedkeeperClient(stack.url, credentials=signing(credentials))
        repo = sample_repository(root / "widgets")
        snapshot = published_snapshot(
            repo, RESOURCE, root / "scratch", R2.from_settings(R2Settings())
        )
        client.publish(snapshot)
        seed = SeedIdentity(
            resource=RESOURCE,
            ref=snapshot.ref,
            sha=snapshot.sha,
            checkout_backup_id=snapshot.checkout.backup_id,
        )
        parent.send((stack.url, seed.model_dump_json()))
        parent.recv()  # "stop"
        started = time.monotonic()
        stack.stop()
        parent.send(time.monotonic() - started)


# -- what the executors measure ---------------------------------------------------------


def signing(credentials: LocalCredentials) -> Credentials:
    return Credentials(credentials.access_key, credentials.secret_key)


@dataclass
class Calls:
    """Latencies (seconds) and errors of the calls of one phase or interval."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def timed(self, call: Callable[[], object], ok: Callable[[object], bool]) -> None:
        started = time.monotonic()
        try:
            answer = call()
        except Exception as error:  # every failure is counted, by kind
            with self.lock:
                self.errors[type(error).__name__] += 1
            return
        with self.lock:
            self.latencies.append(time.monotonic() - started)
            if not ok(answer):
                self.errors[type(answer).__name__] += 1

    def take(self) -> Calls:
        """What was counted so far; counting starts afresh."""
        with self.lock:
            taken = Calls(self.latencies, self.errors)
            self.latencies, self.errors = [], Counter()
        return taken

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


@dataclass(frozen=True)
class Sample:
    at: float  # seconds into the soak
    rss_mb: float  # every process of the stack, slot tasks excluded
    largest_mb: float  # the largest of them
    open_files: int
    stack_processes: int
    slot_processes: int
    zombies: int
    polls_per_second: float
    p50_ms: float
    p99_ms: float
    arrived: int
    errors: int


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    group: int  # the process group
    state: str
    rss: int  # bytes


def processes() -> dict[int, Proc]:
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        found[pid] = Proc(
            pid, int(fields[1]), int(fields[2]), fields[0], int(fields[21]) * PAGE_SIZE
        )
    return found


def descendants(root: int, table: dict[int, Proc]) -> list[Proc]:
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        if pid in table:
            found.append(table[pid])
        queue.extend(child.pid for child in children.get(pid, []))
    return found


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def sample(stack_pid: int, at: float, taken: Calls, interval: float, arrived: int) -> Sample:
    """The stack's processes are its process and those of its process group (its store);
    each slot task leads a group of its own. `taken`: the calls of the interval."""
    table = processes()
    family = descendants(stack_pid, table)
    group = table[stack_pid].group
    own = [proc for proc in family if proc.group == group and proc.state != "Z"]
    slots = [proc for proc in family if proc.group != group and proc.state != "Z"]
    return Sample(
        at=at,
        rss_mb=sum(proc.rss for proc in own) / 2**20,
        largest_mb=max(proc.rss for proc in own) / 2**20,
        open_files=sum(open_files(proc.pid) for proc in own),
        stack_processes=len(own),
        slot_processes=len(slots),
        zombies=sum(proc.state == "Z" for proc in family),
        polls_per_second=len(taken.latencies) / interval,
        p50_ms=taken.percentile(50) * 1000,
        p99_ms=taken.percentile(99) * 1000,
        arrived=arrived,
        errors=sum(taken.errors.values()),
    )


class Executors:
    def __init__(self, url: str, credentials: LocalCredentials, seed: SeedIdentity) -> None:
        self.client = SeedkeeperClient(
            url, credentials=signing(credentials), timeout=CLIENT_TIMEOUT
        )
        self.seed = seed

    def claim(self, slot: str) -> OwnerClaim:
        return OwnerClaim(
            run=f"run-{slot}",
            requester="soak",
            thread=f"thread-{slot}",
            repository="soak/widgets",
            ref=self.seed.ref,
            head=self.seed.sha,
        )

    def seed_slot(self, slot: str, *, wait: bool = False) -> object:
        claim = self.claim(slot)
        return self.client.seed(slot, self.seed, claim=claim, origin=ORIGIN, wait=wait, timeout=120)

    def cold_slot(self, slot: str) -> object:
        return self.client.seed(slot, None)

    def poll(self, slots: list[str], calls: Calls, until: threading.Event, first: int) -> None:
        index = first
        while not until.is_set():
            slot = slots[index % len(slots)]
            calls.timed(partial(self.seed_slot, slot), is_seeded)
            index += 1


@contextmanager
def polling(executors: Executors, slots: list[str], threads: int, calls: Calls) -> Iterator[None]:
    until = threading.Event()
    pollers = [
        threading.Thread(target=executors.poll, args=(slots, calls, until, index))
        for index in range(threads)
    ]
    for poller in pollers:
        poller.start()
    try:
        yield
    finally:
        until.set()
        for poller in pollers:
            poller.join()


def all_at_once(count: int, work: Callable[[int], None]) -> None:
    barrier = threading.Barrier(count)

    def released(index: int) -> None:
        barrier.wait()
        work(index)

    with ThreadPoolExecutor(count) as pool:
        list(pool.map(released, range(count)))


def is_cold(answer: object) -> bool:
    return isinstance(answer, Cold)


def is_seeded(answer: object) -> bool:
    return isinstance(answer, Seeded)


def running(runtime: LocalRuntime, slots: list[str]) -> list[str]:
    return [slot for slot in slots if runtime.status(f"local:{slot}:1") is TaskStatus.RUNNING]


@dataclass
class Report:
    plan: Plan
    polls: Calls = field(default_factory=Calls)
    poll_seconds: float = 0.0
    storm: Calls = field(default_factory=Calls)
    samples: list[Sample] = field(default_factory=list)
    soak: Calls = field(default_factory=Calls)
    cold_slots: int = 0
    reclaim_seconds: float = 0.0  # after the soak, until the last cold slot was stopped
    cold_still_running: list[str] = field(default_factory=list)
    seeded_stopped: list[str] = field(default_factory=list)
    shutdown_slots: int = 0
    shutdown_seconds: float = 0.0
    left_running: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = [
            f"{name}: {sum(calls.errors.values())} errors {dict(calls.errors)}"
            for name, calls in (("polls", self.polls), ("storm", self.storm), ("soak", self.soak))
            if calls.errors
        ]
        if self.seeded_stopped:
            found.append(f"seeded slots stopped: {self.seeded_stopped}")
        if self.cold_still_running:
            found.append(f"cold slots not reclaimed: {self.cold_still_running}")
        if self.left_running:
            found.append(f"slot tasks left running after the shutdown: {self.left_running}")
        return found


def run(plan: Plan, root: Path, console: Console) -> Report:
    report = Report(plan)
    credentials = LocalCredentials("soak-access-key", secrets.token_hex(16))
    spawn = multiprocessing.get_context("spawn")  # never fork a process that has threads
    ours, theirs = spawn.Pipe()
    stack = spawn.Process(target=serve_stack, args=(root, credentials, theirs))
    stack.start()
    stack_pid = stack.pid
    assert stack_pid is not None
    url, seed = ours.recv()
    executors = Executors(url, credentials, SeedIdentity.model_validate_json(seed))
    runtime = LocalRuntime(root / "data")
    seeded = [f"seeded-{index}" for index in range(plan.slots)]
    everything = list(seeded)  # every slot asked for: none may run after the shutdown
    try:
        console.print(f"seeding {len(seeded)} slots")
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda slot: executors.seed_slot(slot, wait=True), seeded))
        if not all(isinstance(answer, Seeded) for answer in answers):
            raise RuntimeError(f"not every slot seeded: {Counter(map(type, answers))}")

        console.print(f"{plan.pollers} threads poll them for {plan.poll_seconds:.0f} s")
        started = time.monotonic()
        with polling(executors, seeded, plan.pollers, report.polls):
            time.sleep(plan.poll_seconds)
        report.poll_seconds = time.monotonic() - started

        console.print(f"a storm of {plan.storm} new slots")
        storm = [f"storm-{index}" for index in range(plan.storm)]
        all_at_once(
            plan.storm,
            lambda index: report.storm.timed(partial(executors.cold_slot, storm[index]), is_cold),
        )

        console.print(f"the soak: {plan.minutes:g} minutes")
        arrived = soak(
            plan,
            executors=executors,
            seeded=seeded,
            stack_pid=stack_pid,
            report=report,
            console=console,
        )

        console.print("waiting for the sweep to reclaim the idle slots")
        cold = storm + arrived
        report.cold_slots = len(cold)
        started = time.monotonic()
        while (left := running(runtime, cold)) and time.monotonic() - started < RECLAIM_WAIT:
            time.sleep(1)
        report.reclaim_seconds = time.monotonic() - started
        report.cold_still_running = left
        report.seeded_stopped = sorted(set(seeded) - set(running(runtime, seeded)))

        console.print(f"more slots, until {plan.shutdown_slots} tasks run; then the stack stops")
        everything += cold
        fill_up(plan.shutdown_slots, executors, runtime, everything)
        report.shutdown_slots = len(running(runtime, everything))
    finally:
        ours.send("stop")
        report.shutdown_seconds = ours.recv()
        stack.join()
    report.left_running = running(runtime, everything)
    return report


def fill_up(target: int, executors: Executors, runtime: LocalRuntime, slots: list[str]) -> None:
    """New cold slots until `target` slot tasks run (the sweep stops idle ones meanwhile);
    each slot asked for is added to `slots`."""
    births_left = 2 * target  # a bound, should tasks not stay up
    with ThreadPoolExecutor(20) as pool:
        while (live := len(running(runtime, slots))) < target:
            if births_left <= 0:
                raise RuntimeError(f"only {live} slot tasks stay up")
            count = min(20, target - live)
            more = [f"last-{len(slots) + index}" for index in range(count)]
            list(pool.map(executors.cold_slot, more))
            slots += more
            births_left -= count


def soak(
    plan: Plan,
    *,
    executors: Executors,
    seeded: list[str],
    stack_pid: int,
    report: Report,
    console: Console,
) -> list[str]:
    """Polls and arrivals for `plan.minutes`, sampled every `plan.sample_seconds`; answers
    the cold slots that arrived."""
    arrived: list[str] = []
    births = Calls()
    stopping = threading.Event()

    def arrive() -> None:
        """A new cold slot every 1/arrivals s, each asked for on its own, as independent
        executors arrive: a slow answer delays no other arrival."""
        with ThreadPoolExecutor(ARRIVING) as pool:
            while not stopping.wait(1 / plan.arrivals):
                slot = f"cold-{len(arrived)}"
                arrived.append(slot)
                pool.submit(births.timed, partial(executors.cold_slot, slot), is_cold)

    interval = Calls()
    arrivals = threading.Thread(target=arrive)
    started = time.monotonic()
    with polling(executors, seeded, plan.pollers, interval):
        arrivals.start()
        try:
            report.samples.append(sample(stack_pid, 0.0, Calls(), 1.0, 0))
            end = started + plan.minutes * 60
            while (now := time.monotonic()) < end:
                time.sleep(min(plan.sample_seconds, end - now))
                taken = interval.take()
                report.soak.latencies += taken.latencies
                report.soak.errors += taken.errors
                new_births = births.take()
                report.soak.errors += new_births.errors
                taken.errors += new_births.errors
                at = time.monotonic() - started
                figures = sample(stack_pid, at, taken, plan.sample_seconds, len(arrived))
                report.samples.append(figures)
                console.print(
                    f"  {at:5.0f} s  RSS {figures.rss_mb:6.1f} MB  "
                    f"{figures.polls_per_second:5.1f} polls/s  p99 {figures.p99_ms:6.0f} ms"
                )
        finally:
            stopping.set()
            arrivals.join()
    report.soak.errors += births.take().errors  # of the births answered since the last sample
    return arrived


def milliseconds(calls: Calls, p: float) -> str:
    return f"{calls.percentile(p) * 1000:.0f}"


def show(report: Report, console: Console) -> None:
    plan = report.plan
    calls = Table(title="Calls, as the executors saw them (latency in ms)")
    for column in ("phase", "calls", "calls/s", "p50", "p90", "p99", "max", "errors"):
        calls.add_column(column, justify="right")
    soak_seconds = plan.minutes * 60
    for name, phase, seconds in (
        (f"polls: {plan.slots} slots, {plan.pollers} threads", report.polls, report.poll_seconds),
        (f"storm: {plan.storm} new slots at once", report.storm, 0.0),
        (f"soak polls, {plan.minutes:g} min", report.soak, soak_seconds),
    ):
        calls.add_row(
            name,
            str(len(phase.latencies)),
            f"{len(phase.latencies) / seconds:.1f}" if seconds else "-",
            milliseconds(phase, 50),
            milliseconds(phase, 90),
            milliseconds(phase, 99),
            milliseconds(phase, 100),
            str(sum(phase.errors.values())),
        )
    console.print(calls)

    over_time = Table(title=f"The soak over time (the sweep every {SWEEP_INTERVAL:g} s)")
    columns = (
        "s",
        "RSS MB",
        "largest MB",
        "open files",
        "stack procs",
        "slot tasks",
        "zombies",
        "polls/s",
        "p50 ms",
        "p99 ms",
        "arrived",
        "errors",
    )
    for column in columns:
        over_time.add_column(column, justify="right")
    for row in report.samples:
        over_time.add_row(
            f"{row.at:.0f}",
            f"{row.rss_mb:.1f}",
            f"{row.largest_mb:.1f}",
            str(row.open_files),
            str(row.stack_processes),
            str(row.slot_processes),
            str(row.zombies),
            f"{row.polls_per_second:.1f}",
            f"{row.p50_ms:.0f}",
            f"{row.p99_ms:.0f}",
            str(row.arrived),
            str(row.errors),
        )
    console.print(over_time)
    if len(report.samples) > 2:
        second_half = report.samples[len(report.samples) // 2 :]
        slope = statistics.linear_regression(
            [row.at / 60 for row in second_half], [row.rss_mb for row in second_half]
        ).slope
        console.print(f"RSS over the soak's second half: {slope:+.1f} MB a minute")
    console.print(
        f"reclaim: {report.cold_slots - len(report.cold_still_running)} of {report.cold_slots} "
        f"cold slots stopped {report.reclaim_seconds:.0f} s after the soak, "
        f"{len(report.seeded_stopped)} of {plan.slots} seeded slots stopped"
    )
    console.print(
        f"shutdown: {report.shutdown_slots} slot tasks stopped in {report.shutdown_seconds:.1f} s, "
        f"{len(report.left_running)} left running"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="the mixed soak's length")
    parser.add_argument("--poll-seconds", type=float, default=60.0)
    parser.add_argument("--slots", type=int, default=50, help="seeded slots, polled")
    parser.add_argument("--pollers", type=int, default=20, help="polling threads")
    parser.add_argument("--storm", type=int, default=100, help="new slots asked for at once")
    parser.add_argument("--arrivals", type=float, default=1.0, help="new cold slots a second")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--shutdown-slots", type=int, default=200)
    args = parser.parse_args()
    plan = Plan(
        slots=args.slots,
        pollers=args.pollers,
        poll_seconds=args.poll_seconds,
        storm=args.storm,
        minutes=args.minutes,
        arrivals=args.arrivals,
        sample_seconds=args.sample_seconds,
        shutdown_slots=args.shutdown_slots,
    )
    console = harness.console(140)
    logger.setLevel("WARNING")
    with tempfile.TemporaryDirectory(prefix="seedkeeper-soak-") as root:
        # Searchable, not listable: the slot users reach their workspaces through it.
        os.chmod(root, 0o711)  # noqa: S103 - search only, for the slot users
        report = run(plan, Path(root), console)
    show(report, console)
    problems = report.problems()
    for problem in problems:
        console.print(f"[red]{problem}[/red]")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
