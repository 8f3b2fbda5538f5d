"""The idle sweep: stops positively-unseeded idle slots, and reclaims a seeded one only
after its work is verified in R2 (DESIGN §10); records the loss of one whose task stopped
first; retains everything else.

It reads the sparse index's expired slots (`SweepIndex`), so its cost follows the expired
slots, never the table, in bounded pages with a cursor kept in the table so a long backlog
is resumed, not restarted. For each slot the decision is pure (`domain.sweep.decide`); the
tasks a page's decisions wait on are asked in one batch (`SlotRuntime.statuses`).
The only roads to a stop are the two fences (`unseeded`, or `checkpointed` with a counted
checkpoint; still expired, nothing in flight, same `rev`), then the runtime's stop, then
retirement or park. An idle seeded slot is only asked to checkpoint (one write). An idle
seeded or checkpointing slot whose task stopped is recorded `lost` with the runtime's cause
(one write). A touch in the same tick makes any of these writes fail. Every other slot is
retained with its reason recorded once and counted in a metric. It also pays what the debt
partition owes: the rotation ledgers' pending deletions and the checkpoints resumed slots
superseded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters.r2 import R2
from seedkeeper.adapters.runtime import SlotRuntime
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.record import (
    Classified,
    Malformed,
    SlotRecord,
    State,
    Supported,
    Unsupported,
)
from seedkeeper.domain.runtime import UNKNOWN, TaskState
from seedkeeper.domain.sweep import (
    Finish,
    Leave,
    Lose,
    Park,
    RequestCheckpoint,
    Retain,
    asks,
    decide,
)
from seedkeeper.domain.transitions import (
    FENCE,
    FENCE_PARK,
    LOSE,
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
from seedkeeper.store.sweep_index import OwedCheckpoint, SweepIndex


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
    lost: list[str] = field(default_factory=list)
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
            "lost": self.lost,
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
        r2: R2 | None,
        settings: SweepSettings,
        retention: RetentionSettings,
        clock: Callable[[], int],
    ) -> None:
        self._index = index
        self._lifecycle = lifecycle
        self._runtime = runtime
        self._snapshots = snapshots
        self._r2 = r2
        self._settings = settings
        self._retention = retention.park_retention  # a lost record's, as a parked one's
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
            states = self._task_states(page.slots, now)
            for classified in page.slots:
                self._one(classified, now, states, report)
            cursor = page.cursor
            if cursor is None:
                report.finished = True
                break
        self._index.keep_cursor(cursor)
        report.debts_paid = self._pay_debts(now)
        self._emit(report)
        return report

    def _one(
        self, classified: Classified, now: int, states: dict[str, TaskState], report: Report
    ) -> None:
        disposition = decide(
            classified, now=now, retention=self._retention, task_status=states.__getitem__
        )
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
        if isinstance(disposition, Lose):
            self._lose(disposition, report)
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

    def _lose(self, lose: Lose, report: Report) -> None:
        """Its task stopped with the work: recorded, with why, never hidden. Touched or moved
        since the read: decided again when it next expires."""
        lost = self._lifecycle.write(LOSE, lose.record, lose.lost)
        if not isinstance(lost, Written):
            report.retained["touched"] += 1
            return
        report.lost.append(lose.record.slot)
        loss = lose.lost.loss
        logger.warning("slot lost", slot=lose.record.slot, reason=loss.reason, detail=loss.detail)

    def _task_states(self, slots: Sequence[Classified], now: int) -> dict[str, TaskState]:
        """The tasks this page's decisions wait on, asked in one batch. A task the runtime
        does not answer for is unknown."""
        wanted = [
            incarnation
            for classified in slots
            if (incarnation := asks(classified, now=now, retention=self._retention)) is not None
        ]
        if not wanted:
            return {}
        unknown = dict.fromkeys(wanted, UNKNOWN)
        try:
            runtime = self._runtime()
        except RuntimeUnavailable:  # misconfigured, or not installed here: it knows nothing
            logger.warning("slot runtime unavailable; task status unknown")
            return unknown
        return unknown | runtime.statuses(wanted)

    def _pay_debts(self, now: int) -> int:
        owed = self._index.owing(now, limit=self._settings.page_size)
        paid = 0
        if self._snapshots is not None:
            paid += sum(
                len(self._snapshots.pay_debts(resource).deleted) for resource in owed.resources
            )
        if self._r2 is not None:
            paid += self._pay_checkpoints(self._r2, owed.checkpoints)
        return paid

    def _pay_checkpoints(self, r2: R2, owed: Sequence[OwedCheckpoint]) -> int:
        """Delete the superseded checkpoints, then forget their debts; a failed deletion
        stays owed. Only a slot's own objects (`checkpoints/<slot>/`), and never the one its
        record names now: a debt naming another is cleared unpaid (not its to delete). A
        slot whose record this code cannot read keeps its debts owed."""
        read: dict[str, Classified] = {}
        payable: dict[str, OwedCheckpoint] = {}
        for debt in owed:
            if debt.slot not in read:
                read[debt.slot] = self._lifecycle.read(debt.slot)
            classified = read[debt.slot]
            if isinstance(classified, Unsupported | Malformed):
                continue  # what it names cannot be told: still owed
            current = classified.record.checkpoint if isinstance(classified, Supported) else None
            own = debt.key.startswith(f"checkpoints/{debt.slot}/")
            if own and (current is None or current.key != debt.key):
                payable[debt.key] = debt
            else:
                logger.warning("checkpoint debt cleared unpaid", slot=debt.slot, key=debt.key)
                self._lifecycle.clear_debt(debt.slot, debt.key)
        deleted = r2.delete(list(payable)).deleted if payable else ()
        for key in deleted:
            self._lifecycle.clear_debt(payable[key].slot, key)
        return len(deleted)

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
            ("SlotsLost", report.lost),
        ):
            if slots:
                with single_metric(
                    name=name, unit=MetricUnit.Count, value=len(slots), namespace=METRICS_NAMESPACE
                ):
                    pass
        logger.info("sweep done", **report.summary())
