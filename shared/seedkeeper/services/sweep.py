"""The idle sweep: stops positively-unseeded idle slots, and reclaims a seeded one only
after its work is verified in R2 (DESIGN §10); records the loss of one whose task stopped
first; retains everything else.

It reads the sparse index's due slots (`SweepIndex`: every shard of it), so its cost follows
the slots that need a decision, never the table: a slot is due once its idle deadline has
passed, and a retained one again only after a backoff (doubling with each retain in a row,
capped; any other write to the record ends it). It reads in bounded pages, with a cursor
kept in the table so a long backlog is resumed, not restarted. For each slot the decision
is pure (`domain.sweep.decide`); the tasks a page's decisions wait on are asked in one
batch (`SlotRuntime.statuses`).
The only roads to a stop are the two fences (`unseeded`, or `checkpointed` with a counted
checkpoint; still expired, nothing in flight, same `rev`), then the runtime's stop, then
retirement or park. An idle seeded slot is only asked to checkpoint (one write). An idle
seeded or checkpointing slot whose task stopped is recorded `lost` with the runtime's cause
(one write). A touch in the same tick makes any of these writes fail. Every other slot is
retained with its reason and its next look recorded, and counted in a metric (and in
another once its idle deadline is long past). It also pays what the debt
partition owes: the rotation ledgers' pending deletions and the checkpoints resumed slots
superseded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters.r2 import R2
from seedkeeper.adapters.runtime import SlotRuntime
from seedkeeper.domain.checkpoints import Backoff, RetentionSettings, failing_for
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
    Stop,
    asks,
    decide,
)
from seedkeeper.domain.transitions import (
    CHECKPOINT_FAILED_REASON,
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
from seedkeeper.observability import count, logger
from seedkeeper.services.rotation import Snapshots
from seedkeeper.services.standbys import PoolReport, StandbyPool
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.sweep_index import START, OwedCheckpoint, Position, SweepIndex


class SweepSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_SWEEP_", extra="ignore", frozen=True)

    page_size: Annotated[int, Field(ge=1, le=1000)] = 100
    max_items: Annotated[int, Field(ge=1, le=100_000)] = 1000  # per invocation
    tombstone: Annotated[int, Field(ge=3600)] = 7 * 86_400  # how long a retired record stays
    # A retained slot's next look: after one sweep period (the template's default rate),
    # doubling with each retain in a row, at most an hour.
    retain_backoff: Annotated[int, Field(ge=60, le=86_400)] = Backoff.first
    retain_backoff_most: Annotated[int, Field(ge=60, le=86_400)] = Backoff.most

    @model_validator(mode="after")
    def _backoff_grows(self) -> SweepSettings:
        if self.retain_backoff_most < self.retain_backoff:
            raise ValueError("retain_backoff_most is below retain_backoff")
        return self

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.retain_backoff, self.retain_backoff_most)


# Retained this long after its idle deadline, a slot is counted in `SlotsRetainedLong`.
RETAINED_ALERT_AFTER = 3600


class RetainedAlertSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    retained_alert_after: Annotated[int, Field(ge=60)] = RETAINED_ALERT_AFTER


@dataclass
class Report:
    read: int = 0  # index entries read (plus the progress item)
    queries: int = 0  # of the index (at least one per shard on a full pass)
    stopped: list[str] = field(default_factory=list)
    checkpoints_requested: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    retained: Counter[str] = field(default_factory=Counter)
    # Retained although idle for longer than the alert threshold, by reason.
    retained_long: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)
    resumed_from_cursor: bool = False
    finished: bool = False
    debts_paid: int = 0
    standbys: PoolReport = field(default_factory=PoolReport)

    def summary(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "queries": self.queries,
            "stopped": self.stopped,
            "checkpoints_requested": self.checkpoints_requested,
            "parked": self.parked,
            "lost": self.lost,
            "retained": dict(self.retained),
            "retained_long": dict(self.retained_long),
            "left": dict(self.left),
            "finished": self.finished,
            "debts_paid": self.debts_paid,
            "standbys": vars(self.standbys),
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
        retained_alert_after: int = RETAINED_ALERT_AFTER,
        pool: StandbyPool | None = None,
    ) -> None:
        """`pool`: the standby slots it keeps (DESIGN §12), at every sweep."""
        self._pool = pool
        self._index = index
        self._lifecycle = lifecycle
        self._runtime = runtime
        self._snapshots = snapshots
        self._r2 = r2
        self._settings = settings
        self._retention = retention.park_retention  # a lost record's, as a parked one's
        self._clock = clock
        self._retained_alert_after = retained_alert_after

    def sweep(self) -> Report:
        report = Report()
        now = self._clock()
        progress = self._index.progress()
        report.read += 1  # the progress item
        report.resumed_from_cursor = progress.resume is not None
        limit = min(self._settings.page_size, self._settings.max_items)
        position: Position | None = progress.resume or START
        while position is not None and report.read < self._settings.max_items:
            page = self._index.due(now, start=position, shards=progress.shards, limit=limit)
            report.read += len(page.slots)
            report.queries += page.queries
            states = self._task_states(page.slots, now)
            for classified in page.slots:
                self._one(classified, now, states, report)
            position = page.next
        report.finished = position is None
        self._index.keep_progress(progress.shards, position)
        report.debts_paid = self._pay_debts(now)
        if self._pool is not None:
            report.standbys = self._pool.tend()
        self._emit(report)
        return report

    def tend_standbys(self) -> PoolReport:
        """The standby pools alone, on a schedule of their own (every minute): a pool a
        burst of seeds emptied is refilled sooner than the next sweep."""
        return self._pool.tend() if self._pool is not None else PoolReport()

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
            self._retain(disposition, now, report)
            return
        if isinstance(disposition, RequestCheckpoint):
            record = disposition.record
            asked = self._lifecycle.write(REQUEST_CHECKPOINT, record, At(now))
            if not isinstance(asked, Written):
                report.retained["touched"] += 1
                return
            report.checkpoints_requested.append(record.slot)
            # Asked again after failures: its work has stayed unparked all that while.
            if failing_for(record.checkpoint_failures or 0) >= self._retained_alert_after:
                report.retained_long[CHECKPOINT_FAILED_REASON] += 1
            return
        if isinstance(disposition, Lose):
            self._lose(disposition, report)
            return
        self._end(disposition, now, report)

    def _end(self, disposition: Finish | Park | Stop, now: int, report: Report) -> None:
        """Fence the slot (unless a fence is already there to finish), stop its task, then
        retire or park it: counted as what it became, or as why it stayed."""
        slot = disposition.record.slot
        try:
            if isinstance(disposition, Finish):
                done = self._close(disposition.record, disposition.park, now)
            else:
                fence = FENCE_PARK if isinstance(disposition, Park) else FENCE
                fenced = self._lifecycle.write(fence, disposition.record, At(now))
                # Touched, seeded or moved in the meantime: retained.
                parking = isinstance(disposition, Park)
                done = (
                    self._close(fenced.record, parking, now)
                    if isinstance(fenced, Written)
                    else None
                )
        except RuntimeUnavailable:
            # Fenced, its task not stopped: it stays closing, and the next run stops it.
            logger.warning("stop failed; the slot stays closing", slot=slot)
            self._count_retained("stop-failed", disposition.record, now, report)
            return
        if not done:
            report.retained["touched"] += 1
        elif done.state is State.PARKED:
            report.parked.append(slot)
        else:
            report.stopped.append(slot)

    def _retain(self, retain: Retain, now: int, report: Report) -> None:
        """Counted, and on a record this code may write, its reason and its next look
        written (a failed write means someone else wrote: it is due again at once)."""
        record = retain.record
        self._count_retained(retain.reason, record, now, report)
        if record is None:
            return
        retained = Retained(retain.reason, now=now, backoff=self._settings.backoff)
        self._lifecycle.write(NOTE_RETAINED, record, retained)

    def _count_retained(
        self, reason: str, record: SlotRecord | None, now: int, report: Report
    ) -> None:
        """Counted by its reason, and again (its alarm) when long past its idle deadline."""
        report.retained[reason] += 1
        if record is not None and now - record.idle_deadline > self._retained_alert_after:
            report.retained_long[reason] += 1

    def _close(self, record: SlotRecord, park: bool, now: int) -> SlotRecord | None:
        """Stop the fenced slot's task, then retire it, or park it when its checkpoint
        counts (kept until the checkpoint expires, and a tombstone's time after); None when
        the record moved meanwhile."""
        stop = next(e for e in record.window.entries if e.kind is OpKind.STOP and not e.settled)
        assert record.incarnation is not None
        self._runtime().stop(record.incarnation)  # RuntimeUnavailable: the caller's to count
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
        for name, by_reason in (
            ("SlotsRetained", report.retained),
            ("SlotsRetainedLong", report.retained_long),
        ):
            for reason, retained in by_reason.items():
                count(name, retained, reason=reason)
        for name, slots in (
            ("SlotsStopped", report.stopped),
            ("CheckpointsRequested", report.checkpoints_requested),
            ("SlotsParked", report.parked),
            ("SlotsLost", report.lost),
        ):
            if slots:
                count(name, len(slots))
        logger.info("sweep done", **report.summary())
