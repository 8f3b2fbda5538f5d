"""The idle sweep over 100,000 slots with 1% expired: items read against the expired
count, and against a Scan baseline measured in the same run (target: at most 1.05x the
expired count)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import boto3
from boto3.dynamodb.conditions import Attr
from moto import mock_aws
from rich.console import Console
from rich.table import Table

from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.models import Binding
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import SWEEP_PARTITION, encode
from seedkeeper.domain.runtime import UNKNOWN, TaskState, TaskStatus
from seedkeeper.services.sweep import Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper.store.sweep_index import SweepIndex
from seedkeeper_tools.infra import create_table, load_template

SLOTS = 100_000
EXPIRED = 1_000
NOW = 1_800_000_000
SWEEP_AT = NOW + 601


class UnknownTasks:
    """Every task unknown: the sweep retains them all, so the run measures reading."""

    def launch(self, plan: SlotPlan) -> str:
        raise AssertionError("the sweep never launches")

    def status(self, incarnation: str) -> TaskStatus:
        return TaskStatus.UNKNOWN

    def statuses(self, incarnations: Iterable[str]) -> dict[str, TaskState]:
        return dict.fromkeys(incarnations, UNKNOWN)

    def stop(self, incarnation: str) -> None:
        raise AssertionError("nothing is stopped here")


def load(table: object) -> None:
    with table.batch_writer() as batch:  # type: ignore[attr-defined]
        for index in range(SLOTS):
            deadline = NOW + 600 if index < EXPIRED else NOW + 10**6
            birth = transitions.born(
                f"slot-{index}",
                Binding(owner=None, seed=None, origin=None),
                now=NOW,
                idle_deadline=deadline,
            )
            assert birth.entry is not None
            launched = transitions.RECORD_INCARNATION.decide(
                birth.record,
                transitions.Launched(
                    incarnation=f"local:slot-{index}:1", launch=birth.entry.ref, now=NOW
                ),
            )
            assert isinstance(launched, transitions.Change)
            batch.put_item(Item=encode(launched.record))


def main() -> None:
    os.environ.update(
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",  # noqa: S106 - moto's fake credentials
        AWS_DEFAULT_REGION="us-east-1",
    )
    with mock_aws():
        create_table(boto3.client("dynamodb"), "bench", load_template())
        table = boto3.resource("dynamodb").Table("bench")
        started = time.monotonic()
        load(table)
        loaded = time.monotonic() - started
        sweeper = Sweeper(
            index=SweepIndex(table),
            lifecycle=Lifecycle(table),
            runtime=UnknownTasks,
            snapshots=None,
            r2=None,
            settings=SweepSettings(max_items=100_000),
            retention=RetentionSettings(),
            clock=lambda: SWEEP_AT,
        )
        started = time.monotonic()
        report = sweeper.sweep()
        sweep_s = time.monotonic() - started
        expired = Attr("sweep").eq(SWEEP_PARTITION) & Attr("idle_deadline").lt(SWEEP_AT)
        scanned, query = 0, {"FilterExpression": expired}
        started = time.monotonic()
        while True:
            page = table.scan(**query)  # type: ignore[arg-type]
            scanned += page["ScannedCount"]
            if "LastEvaluatedKey" not in page:
                break
            query["ExclusiveStartKey"] = page["LastEvaluatedKey"]  # type: ignore[assignment]
        scan_s = time.monotonic() - started
    table_view = Table(
        title=f"Idle sweep over {SLOTS:,} slots, {EXPIRED:,} expired (loaded in {loaded:.0f} s)"
    )
    for column in ("method", "items read", "x expired", "seconds"):
        table_view.add_column(column, justify="right")
    table_view.add_row(
        "sweep (sparse index)", f"{report.read:,}", f"{report.read / EXPIRED:.3f}", f"{sweep_s:.1f}"
    )
    table_view.add_row("Scan baseline", f"{scanned:,}", f"{scanned / EXPIRED:.1f}", f"{scan_s:.1f}")
    console = Console()
    console.print(table_view)
    met = report.read <= 1.05 * EXPIRED
    console.print(("met" if met else "NOT met") + ": sweep reads at most 1.05 x the expired count")
    assert sum(report.retained.values()) == EXPIRED


if __name__ == "__main__":
    main()
