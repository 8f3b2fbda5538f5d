"""The idle sweep: stops only positively-unseeded idle slots; retains everything else.

It Queries the sparse `by-deadline` index for slots whose idle deadline has passed, so its
cost follows the expired slots, never the table, and works in bounded pages with a cursor
kept in the table so a long backlog is resumed, not restarted. For each slot the decision
is pure (`decide`); the only road to a stop is the fence write (`unseeded`, still expired,
nothing in flight, same `rev`), then the runtime's stop, then retirement. A touch in the
same tick makes the fence fail. Every other slot is retained with its reason recorded once
and counted in a metric. It also pays the rotation ledger's pending deletions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters.runtime import SlotRuntime, TaskStatus
from seedkeeper.domain.record import (
    SWEEP_PARTITION,
    Absent,
    Classified,
    Malformed,
    SlotRecord,
    State,
    Unsupported,
    classify,
)
from seedkeeper.errors import RuntimeUnavailable, translate_client_error
from seedkeeper.observability import METRICS_NAMESPACE, logger
from seedkeeper.services.rotation import Snapshots
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.snapshots import DEBT_PARTITION, RESIDENT_PREFIX

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

INDEX = "by-deadline"
CURSOR_KEY = {"PK": "SWEEP", "SK": "CURSOR"}


class SweepSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_SWEEP_", extra="ignore", frozen=True)

    page_size: Annotated[int, Field(ge=1, le=1000)] = 100
    max_items: Annotated[int, Field(ge=1, le=100_000)] = 1000  # per invocation
    tombstone: Annotated[int, Field(ge=3600)] = 7 * 86_400  # how long a retired record stays


@dataclass(frozen=True)
class Stop:
    """Positively unseeded, idle, nothing in flight, task running: fence, stop, retire."""

    record: SlotRecord


@dataclass(frozen=True)
class Retain:
    reason: str
    record: SlotRecord | None  # None: a record this code may not write (unsupported...)


@dataclass(frozen=True)
class Leave:
    """Nothing to do, nothing to record (an already stopped task stays untouched)."""

    reason: str


Decision = Stop | Retain | Leave


def decide(
    classified: Classified, *, now: int, task_status: Callable[[str], TaskStatus]
) -> Decision:
    """What the sweep does with one expired index entry. `task_status` is asked only for a
    slot that would otherwise be stopped."""
    if isinstance(classified, Absent):
        return Leave("no-record")
    if isinstance(classified, Unsupported):
        return Retain("record-unsupported", None)
    if isinstance(classified, Malformed):
        return Retain("record-malformed", None)
    record = classified.record
    if record.state is State.RETIRED:
        return Leave("retired")
    if record.idle_deadline >= now:
        return Leave("not-idle")
    if record.state is not State.UNSEEDED:
        return Retain(record.state.value.replace("_", "-"), record)
    if record.window.unsettled:
        return Retain("unsettled-operations", record)
    if record.incarnation is None:
        return Retain("task-unknown", record)
    status = task_status(record.incarnation)
    if status is TaskStatus.STOPPED:
        return Leave("task-stopped")
    if status is TaskStatus.UNKNOWN:
        return Retain("task-unknown", record)
    return Stop(record)


@dataclass
class Report:
    read: int = 0  # index entries read (plus the cursor item)
    stopped: list[str] = field(default_factory=list)
    retained: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)
    resumed_from_cursor: bool = False
    finished: bool = False
    debts_paid: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "stopped": self.stopped,
            "retained": dict(self.retained),
            "left": dict(self.left),
            "finished": self.finished,
            "debts_paid": self.debts_paid,
        }


class Sweeper:
    def __init__(
        self,
        *,
        table: Table,
        lifecycle: Lifecycle,
        runtime: Callable[[], SlotRuntime],
        snapshots: Snapshots | None,
        settings: SweepSettings,
        clock: Callable[[], int],
    ) -> None:
        self._table = table
        self._lifecycle = lifecycle
        self._runtime = runtime
        self._snapshots = snapshots
        self._settings = settings
        self._clock = clock

    def sweep(self) -> Report:
        report = Report()
        now = self._clock()
        cursor = self._cursor(report)
        report.resumed_from_cursor = cursor is not None
        while report.read < self._settings.max_items:
            page = self._page(now, cursor)
            items = page.get("Items", [])
            report.read += len(items)
            for item in items:
                self._one(item, now, report)
            cursor = page.get("LastEvaluatedKey")
            if cursor is None:
                report.finished = True
                break
        self._keep_cursor(cursor)
        report.debts_paid = self._pay_debts(now)
        self._emit(report)
        return report

    # -- one slot ---------------------------------------------------------------------

    def _one(self, item: dict[str, Any], now: int, report: Report) -> None:
        slot = str(item["PK"]).removeprefix("SLOT#")
        decision = decide(classify(slot, item), now=now, task_status=self._status)
        if isinstance(decision, Leave):
            report.left[decision.reason] += 1
            return
        if isinstance(decision, Retain):
            report.retained[decision.reason] += 1
            if decision.record is not None:
                self._lifecycle.note_retained(decision.record, reason=decision.reason, now=now)
            return
        if self._stop(decision, now):
            report.stopped.append(slot)
        else:
            report.retained["touched"] += 1

    def _stop(self, decision: Stop, now: int) -> bool:
        fenced = self._lifecycle.fence(decision.record, now=now)
        if not isinstance(fenced, Written):
            return False  # touched, seeded or moved in the meantime: retained
        record, stop = fenced.record, fenced.entry
        assert stop is not None
        assert record.incarnation is not None
        try:
            self._runtime().stop(record.incarnation)
        except RuntimeUnavailable:
            logger.warning("stop failed; the slot stays closing", slot=record.slot)
            return False
        expires_at = now + self._settings.tombstone
        retired = self._lifecycle.retire(record, stop=stop.ref, now=now, expires_at=expires_at)
        return isinstance(retired, Written)

    def _status(self, incarnation: str) -> TaskStatus:
        return self._runtime().status(incarnation)

    # -- paging -----------------------------------------------------------------------

    def _page(self, now: int, cursor: dict[str, Any] | None) -> dict[str, Any]:
        query: dict[str, Any] = {
            "IndexName": INDEX,
            "KeyConditionExpression": Key("sweep").eq(SWEEP_PARTITION)
            & Key("idle_deadline").lt(now),
            "Limit": min(self._settings.page_size, self._settings.max_items),
        }
        if cursor is not None:
            query["ExclusiveStartKey"] = cursor
        try:
            return dict(self._table.query(**query))
        except ClientError as error:
            raise translate_client_error(error) from error

    def _cursor(self, report: Report) -> dict[str, Any] | None:
        try:
            item = self._table.get_item(Key=CURSOR_KEY, ConsistentRead=True).get("Item")
        except ClientError as error:
            raise translate_client_error(error) from error
        report.read += 1
        cursor = item.get("cursor") if item else None
        return dict(cursor) if isinstance(cursor, dict) else None

    def _keep_cursor(self, cursor: dict[str, Any] | None) -> None:
        """Where the next invocation resumes; removed once a pass reaches the end. Two
        sweeps at once only redo each other's work: every decision is fenced."""
        only_a_cursor = Attr("SK").not_exists() | Attr("cursor").exists()
        try:
            if cursor is None:
                self._table.delete_item(Key=CURSOR_KEY, ConditionExpression=only_a_cursor)
            else:
                self._table.put_item(
                    Item={**CURSOR_KEY, "cursor": cursor}, ConditionExpression=only_a_cursor
                )
        except ClientError as error:
            raise translate_client_error(error) from error

    # -- the ledger -------------------------------------------------------------------

    def _pay_debts(self, now: int) -> int:
        if self._snapshots is None:
            return 0
        try:
            page = self._table.query(
                IndexName=INDEX,
                KeyConditionExpression=Key("sweep").eq(DEBT_PARTITION)
                & Key("idle_deadline").lte(now),
                Limit=self._settings.page_size,
            )
        except ClientError as error:
            raise translate_client_error(error) from error
        resources = sorted({str(i["PK"]).removeprefix(RESIDENT_PREFIX) for i in page["Items"]})
        return sum(len(self._snapshots.pay_debts(resource).deleted) for resource in resources)

    @staticmethod
    def _emit(report: Report) -> None:
        for reason, count in report.retained.items():
            with single_metric(
                name="SlotsRetained",
                unit=MetricUnit.Count,
                value=count,
                namespace=METRICS_NAMESPACE,
            ) as metric:
                metric.add_dimension(name="reason", value=reason)
        if report.stopped:
            with single_metric(
                name="SlotsStopped",
                unit=MetricUnit.Count,
                value=len(report.stopped),
                namespace=METRICS_NAMESPACE,
            ):
                pass
        logger.info("sweep done", **report.summary())
