"""The idle sweep on a sharded index, run after run: items read against the slots that
need a decision, and a Scan baseline measured in the same run.

Of `--slots` (20,000; 100,000 takes moto about 9 minutes: each of its index queries sorts
the whole table), run 1 finds 1 % idle cold slots (their tasks run: stopped) and 5 % whose
task status is unknown (retained: a backoff sets their next look). Between consecutive
runs, one sweep period (300 s) apart, 0.5 % more go idle. A slot needs a decision in a run
when it went idle since the last one, or when it is retained and its next look has
passed; the sweep should read those and nothing else (target: at most 1.05x of them).
Without the backoff it would read every retained slot again in every run: that count is
shown beside.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from collections.abc import Iterable
from contextlib import redirect_stdout
from dataclasses import dataclass

import boto3
from boto3.dynamodb.conditions import Attr
from moto import mock_aws
from rich.table import Table

import harness
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.models import Binding
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import LIVE_PREFIX, SWEEP_SHARDS, encode
from seedkeeper.domain.runtime import RUNNING, UNKNOWN, TaskState, TaskStatus
from seedkeeper.domain.standby import StandbyPlan
from seedkeeper.observability import logger
from seedkeeper.services.sweep import Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper.store.sweep_index import SweepIndex
from seedkeeper_tools.infra import create_table, load_template

PERIOD = 300  # seconds between two runs: the template's default rate
NOW = 1_800_000_000  # run 1


@dataclass(frozen=True)
class Population:
    slots: int

    @property
    def stuck(self) -> int:  # idle before run 1, task unknown: retained, looked at later
        return self.slots // 20

    @property
    def idle_at_first(self) -> int:  # idle cold slots before run 1, tasks running: stopped
        return self.slots // 100

    @property
    def idle_per_run(self) -> int:  # more cold slots idle between two runs
        return self.slots // 200


def stuck(slot: str) -> bool:
    return slot.startswith("stuck-")


class Tasks:
    """The stuck slots' tasks unknown (the runtime does not answer for them), every other
    task running; a stop is only counted."""

    def __init__(self) -> None:
        self.stopped = 0

    def launch(self, plan: SlotPlan) -> str:
        raise AssertionError("the sweep never launches")

    def launch_standby(self, standby: StandbyPlan) -> str:
        raise AssertionError("no standby pool is kept here")

    def status(self, incarnation: str) -> TaskStatus:
        raise AssertionError("the sweep asks a page's tasks in one batch")

    def statuses(self, incarnations: Iterable[str]) -> dict[str, TaskState]:
        return {i: UNKNOWN if stuck(i.split(":")[1]) else RUNNING for i in incarnations}

    def launched_for(self, incarnation: str) -> None:
        raise AssertionError("the sweep never asks what a task was launched for")

    def stop(self, incarnation: str) -> None:
        self.stopped += 1


def deadlines(population: Population, runs: int) -> dict[str, int]:
    """Each slot's idle deadline: the stuck ones and the first idle ones before run 1; more
    between each two runs; the rest far later."""
    slots = {f"stuck-{n}": NOW - 600 for n in range(population.stuck)}
    slots |= {f"idle-{n}": NOW - 60 for n in range(population.idle_at_first)}
    per_run = population.idle_per_run
    for run in range(1, runs):
        start = NOW + (run - 1) * PERIOD
        slots |= {
            f"idle-{run}-{n}": start + 1 + n * (PERIOD - 1) // per_run for n in range(per_run)
        }
    busy = population.slots - len(slots)
    return slots | {f"busy-{n}": NOW + 10**6 for n in range(busy)}


def load(table: object, idle: dict[str, int]) -> None:
    with table.batch_writer() as batch:  # type: ignore[attr-defined]
        for slot, deadline in idle.items():
            birth = transitions.born(
                slot,
                Binding(owner=None, seed=None, origin=None),
                now=NOW - 3600,
                idle_deadline=deadline,
            )
            assert birth.entry is not None
            launched = transitions.RECORD_INCARNATION.decide(
                birth.record,
                transitions.Launched(
                    incarnation=f"local:{slot}:1", launch=birth.entry.ref, now=NOW - 3600
                ),
            )
            assert isinstance(launched, transitions.Change)
            batch.put_item(Item=encode(launched.record, shards=SWEEP_SHARDS))


@dataclass
class Run:
    at: int
    newly_idle: int  # went idle since the run before
    due_again: int  # retained, their next look passed
    read: int  # index entries, and the progress item
    queries: int
    without_backoff: int  # every live slot past its idle deadline
    seconds: float

    @property
    def needing(self) -> int:
        return self.newly_idle + self.due_again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=20_000, help="slots in the table")
    parser.add_argument("--runs", type=int, default=6, help="consecutive sweep runs")
    arguments = parser.parse_args()
    population, runs = Population(arguments.slots), arguments.runs
    logger.setLevel("WARNING")  # each run's summary names every slot it stopped
    os.environ.update(
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",  # noqa: S106 - moto's fake credentials
        AWS_DEFAULT_REGION="us-east-1",
    )
    idle = deadlines(population, runs)
    tasks = Tasks()
    with mock_aws():
        create_table(boto3.client("dynamodb"), "bench", load_template())
        table = boto3.resource("dynamodb").Table("bench")
        started = time.monotonic()
        load(table, idle)
        loaded = time.monotonic() - started
        sweeper = Sweeper(
            index=SweepIndex(table, shards=SWEEP_SHARDS),
            lifecycle=Lifecycle(table, shards=SWEEP_SHARDS),
            runtime=lambda: tasks,
            snapshots=None,
            r2=None,
            settings=SweepSettings(max_items=100_000),
            retention=RetentionSettings(),
            clock=lambda: at,
        )
        # The stuck slots are retained together, so they share one next look (0: now).
        backoff, retains, next_look = SweepSettings().backoff, 0, 0
        measured: list[Run] = []
        for run in range(runs):
            at = NOW + run * PERIOD
            since = at - PERIOD if run else 0
            newly = sum(1 for s, d in idle.items() if not stuck(s) and since <= d < at)
            due = population.stuck if next_look < at else 0
            started = time.monotonic()
            with redirect_stdout(io.StringIO()):  # its metrics, one line each
                report = sweeper.sweep()
            seconds = time.monotonic() - started
            # What it decided is what they needed: the idle stopped, the due retained.
            assert report.finished
            assert (len(report.stopped), sum(report.retained.values())) == (newly, due)
            measured.append(
                Run(at, newly, due, report.read, report.queries, newly + population.stuck, seconds)
            )
            if due:
                retains += 1
                next_look = at + backoff.after(retains)
        live_and_idle = Attr("sweep").begins_with(LIVE_PREFIX) & Attr("idle_deadline").lt(at)
        scanned, query = 0, {"FilterExpression": live_and_idle}
        started = time.monotonic()
        while True:
            page = table.scan(**query)  # type: ignore[arg-type]
            scanned += page["ScannedCount"]
            if "LastEvaluatedKey" not in page:
                break
            query["ExclusiveStartKey"] = page["LastEvaluatedKey"]  # type: ignore[assignment]
        scan_s = time.monotonic() - started
    show(population, measured, scanned, scan_s, loaded)


def show(
    population: Population, measured: list[Run], scanned: int, scan_s: float, loaded: float
) -> None:
    title = (
        f"Idle sweep over {population.slots:,} slots on {SWEEP_SHARDS} shards, a run every"
        f" {PERIOD} s ({population.stuck:,} retained, task unknown; loaded in {loaded:.0f} s)"
    )
    view = Table(title=title)
    for column in (
        "run",
        "newly idle",
        "retained, due again",
        "need a decision",
        "items read",
        "x needing",
        "queries",
        "read without backoff",
        "seconds",
    ):
        view.add_column(column, justify="right")
    for number, run in enumerate(measured, 1):
        view.add_row(
            str(number),
            f"{run.newly_idle:,}",
            f"{run.due_again:,}",
            f"{run.needing:,}",
            f"{run.read:,}",
            f"{run.read / run.needing:.3f}",
            str(run.queries),
            f"{run.without_backoff:,}",
            f"{run.seconds:.1f}",
        )
    last = measured[-1]
    view.add_row(
        f"Scan ({len(measured)})", "", "", f"{last.needing:,}", f"{scanned:,}",
        f"{scanned / last.needing:.1f}", "", "", f"{scan_s:.1f}",
    )  # fmt: skip
    console = harness.console(120)
    console.print(view)
    met = all(run.read <= 1.05 * run.needing for run in measured)
    console.print(
        ("met" if met else "NOT met")
        + ": each run reads at most 1.05 x the slots that need a decision"
    )
    assert all(run.read >= run.needing for run in measured), "a slot needing a decision unread"


if __name__ == "__main__":
    main()
