"""The idle sweep: stops positively-unseeded idle slots, and reclaims a seeded one only
after its work is verified in R2 (DESIGN §10); retains everything else.

It reads the sparse index's expired slots (`SweepIndex`), so its cost follows the expired
slots, never the table, in bounded pages with a cursor kept in the table so a long backlog
is resumed, not restarted. For each slot the decision is pure (`domain.sweep.decide`).
The only roads to a stop are the two fences (`unseeded`, or `checkpointed` with a counted
checkpoint; still expired, nothing in flight, same `rev`), then the runtime's stop, then
retirement or park. An idle seeded slot is only asked to checkpoint (one write). A touch in
the same tick makes any fence fail. Every other slot is retained with its reason recorded
once and counted in a metric. It also pays the rotation ledger's pending deletions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters.runtime import SlotRuntime
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.record import Classified, SlotRecord, State
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.sweep import Finish, Leave, Park, RequestCheckpoint, Retain, decide
from seedkeeper.domain.transitions import (
    FENCE,
    FENCE_PARK,
    NOTE_RETAINED,
    PARK,
    REQUEST_CHECKPOINT,
    RETIRE,
    At,
    Parked,
    Retained,
    Stopped,
)
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper.observability import METRICS_NAMESPACE, logger
from seedkeeper.services.rotation import Snapshots
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.sweep_index import SweepIndex


class SweepSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_SWEEP_", extra="ignore", frozen=True)

    page_size: Annotated[int, Field(ge=1, le=1000)] = 100
    max_items: Annotated[int, Field(ge=1, le=100_000)] = 1000  # per invocation
    tombstone: Annotated[int, Field(ge=3600)] = 7 * 86_400  # how long a retired record stays


@dataclass
class Report:
    read: int = 0  # index entries read (plus the cursor item)
    stopped: list[str] = field(default_factory=list)
    checkpoints_requested: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    retained: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)
    resumed_from_cursor: bool = False
    finished: bool = False
    debts_paid: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "stopped": self.stopped,
            "checkpoints_requested": self.checkpoints_requested,
            "parked": self.parked,
            "retained": dict(self.retained),
            "left": dict(self.left),
            "finished": self.finished,
            "debts_paid": self.debts_paid,
        }


class Sweeper:
    def __init__(
        self,
        *,
        index: SweepIndex,
        lifecycle: Lifecycle,
        runtime: Callable[[], SlotRuntime],
        snapshots: Snapshots | None,
        settings: SweepSettings,
        clock: Callable[[], int],
    ) -> None:
        self._index = index
        self._lifecycle = lifecycle
        self._runtime = runtime
        self._snapshots = snapshots
        self._settings = settings
        self._clock = clock

    def sweep(self) -> Report:
        report = Report()
        now = self._clock()
        cursor = self._index.cursor()
        report.read += 1  # the cursor item
        report.resumed_from_cursor = cursor is not None
        limit = min(self._settings.page_size, self._settings.max_items)
        while report.read < self._settings.max_items:
            page = self._index.expired(now, start=cursor, limit=limit)
            report.read += len(page.slots)
            for classified in page.slots:
                self._one(classified, now, report)
            cursor = page.cursor
            if cursor is None:
                report.finished = True
                break
        self._index.keep_cursor(cursor)
        report.debts_paid = self._pay_debts(now)
        self._emit(report)
        return report

    def _one(self, classified: Classified, now: int, report: Report) -> None:
        disposition = decide(classified, now=now, task_status=self._status)
        if isinstance(disposition, Leave):
            report.left[disposition.reason] += 1
            return
        if isinstance(disposition, Retain):
            report.retained[disposition.reason] += 1
            if disposition.record is not None:
                retained = Retained(disposition.reason, now=now)
                self._lifecycle.write(NOTE_RETAINED, disposition.record, retained)
            return
        if isinstance(disposition, RequestCheckpoint):
            asked = self._lifecycle.write(REQUEST_CHECKPOINT, disposition.record, At(now))
            if isinstance(asked, Written):
                report.checkpoints_requested.append(disposition.record.slot)
            else:
                report.retained["touched"] += 1
            return
        slot = disposition.record.slot
        if isinstance(disposition, Finish):
            done = self._close(disposition.record, disposition.park, now)
        else:
            fence = FENCE_PARK if isinstance(disposition, Park) else FENCE
            fenced = self._lifecycle.write(fence, disposition.record, At(now))
            # Touched, seeded or moved in the meantime: retained.
            parking = isinstance(disposition, Park)
            done = self._close(fenced.record, parking, now) if isinstance(fenced, Written) else None
        if not done:
            report.retained["touched"] += 1
        elif done.state is State.PARKED:
            report.parked.append(slot)
        else:
            report.stopped.append(slot)

    def _close(self, record: SlotRecord, park: bool, now: int) -> SlotRecord | None:
        """Stop the fenced slot's task, then retire it, or park it when its checkpoint
        counts (kept until the checkpoint expires, and a tombstone's time after)."""
        stop = next(e for e in record.window.entries if e.kind is OpKind.STOP and not e.settled)
        assert record.incarnation is not None
        try:
            self._runtime().stop(record.incarnation)
        except RuntimeUnavailable:
            logger.warning("stop failed; the slot stays closing", slot=record.slot)
            return None
        tombstone = self._settings.tombstone
        if park:
            assert record.checkpoint is not None
            expires_at = max(record.checkpoint.expires_at, now) + tombstone
            closed = self._lifecycle.write(PARK, record, Parked(stop.ref, now, expires_at))
        else:
            stopped = Stopped(stop.ref, now=now, expires_at=now + tombstone)
            closed = self._lifecycle.write(RETIRE, record, stopped)
        return closed.record if isinstance(closed, Written) else None

    def _status(self, incarnation: str) -> TaskStatus:
        try:
            runtime = self._runtime()
        except RuntimeUnavailable:  # misconfigured, or not installed here: it knows nothing
            logger.warning("slot runtime unavailable; task status unknown")
            return TaskStatus.UNKNOWN
        return runtime.status(incarnation)

    def _pay_debts(self, now: int) -> int:
        if self._snapshots is None:
            return 0
        resources = self._index.owing(now, limit=self._settings.page_size)
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
        for name, slots in (
            ("SlotsStopped", report.stopped),
            ("CheckpointsRequested", report.checkpoints_requested),
            ("SlotsParked", report.parked),
        ):
            if slots:
                with single_metric(
                    name=name, unit=MetricUnit.Count, value=len(slots), namespace=METRICS_NAMESPACE
                ):
                    pass
        logger.info("sweep done", **report.summary())
