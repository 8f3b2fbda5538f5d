"""The slot task's record, read and written for it by the checkpoint function (DESIGN §11).

The slot task role holds no table grant at all: every task shares that role, so IAM could not
keep one task off another slot's record, and a read alone would disclose another owner's
claim. The task reads its record and makes its own transitions here, and each call acts only
for the task that signed it: the call names the task's incarnation, which must be the
signer's (`Caller`), and the record must name it too, checked again each time the record is
read (the write is conditional on the record as read). Anything else is `not-this-task`
(403), and nothing is written.

The function's clock stamps every write, and the function's retention dates a loss: a task
says what happened, never when, nor how long it is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

from seedkeeper.domain import transitions
from seedkeeper.domain.caller import NOT_THIS_TASK, Caller
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.record import Loss, SlotRecord, Supported
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.task_api import (
    AttemptCall,
    Freeze,
    Lose,
    RecordRead,
    SettleSeed,
    TaskCall,
    TaskRecord,
    TaskWrite,
    Thaw,
)
from seedkeeper.observability import count
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Outcome, Written

P = TypeVar("P")
REFUSALS = (NOT_THIS_TASK,)


class TaskRecords:
    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        retention: RetentionSettings,
        clock: Callable[[], int],
    ) -> None:
        self._lifecycle = lifecycle
        self._retention = retention
        self._clock = clock

    def read(self, call: RecordRead, caller: Caller) -> TaskRecord | Refused:
        if not caller.is_task(call.incarnation):
            return Refused(NOT_THIS_TASK)
        classified = self._lifecycle.read(call.slot, consistent=call.consistent)
        if not isinstance(classified, Supported) or _not_its(classified.record, call):
            return Refused(NOT_THIS_TASK)
        return TaskRecord(record=classified.record)

    def settle_seed(self, call: SettleSeed, caller: Caller) -> TaskWrite | Refused:
        verdict = transitions.Verdict(
            attempt=call.attempt, restore=call.restore.ref, result=call.result, now=self._clock()
        )
        return self._apply(call, caller, transitions.SETTLE_SEED, verdict)

    def freeze(self, call: Freeze, caller: Caller) -> TaskWrite | Refused:
        freezing = transitions.Freezing(attempt=call.attempt, op=call.op.ref, now=self._clock())
        return self._apply(call, caller, transitions.FREEZE, freezing)

    def thaw(self, call: Thaw, caller: Caller) -> TaskWrite | Refused:
        op = call.op.ref if call.op is not None else None
        thawed = transitions.Thawed(attempt=call.attempt, op=op, now=self._clock())
        return self._apply(call, caller, transitions.THAWED, thawed)

    def checkpoint_on_stop(self, call: AttemptCall, caller: Caller) -> TaskWrite | Refused:
        return self._apply(call, caller, transitions.CHECKPOINT_ON_STOP, self._stopping(call))

    def park_on_stop(self, call: AttemptCall, caller: Caller) -> TaskWrite | Refused:
        return self._apply(call, caller, transitions.PARK_ON_STOP, self._stopping(call))

    def lose(self, call: Lose, caller: Caller) -> TaskWrite | Refused:
        now = self._clock()
        lost = transitions.Lost(
            incarnation=call.incarnation,
            loss=Loss(reason=call.reason, detail=call.detail, at=now),
            expires_at=now + self._retention.park_retention,
        )
        written = self._apply(call, caller, transitions.LOSE, lost)
        # Counted once: a retry is acknowledged. A write that landed but whose answer was
        # lost (the SDK's resend then fails its condition) is acknowledged too, and goes
        # uncounted (the sweep's the same); taking an identical record for one's own write
        # could take another caller's for it, which is worse than one alarm missed.
        if isinstance(written, TaskWrite) and written.outcome == "written":
            count("SlotsLost")
        return written

    def _stopping(self, call: AttemptCall) -> transitions.Stopping:
        return transitions.Stopping(
            attempt=call.attempt, incarnation=call.incarnation, now=self._clock()
        )

    def _apply(
        self, call: TaskCall, caller: Caller, transition: transitions.Transition[P], params: P
    ) -> TaskWrite | Refused:
        if not caller.is_task(call.incarnation):
            return Refused(NOT_THIS_TASK)
        outcome = self._lifecycle.apply(
            call.slot,
            transition,
            params,
            guard=lambda record: Refused(NOT_THIS_TASK) if _not_its(record, call) else None,
        )
        if isinstance(outcome, Refused) and outcome.reason == NOT_THIS_TASK:
            return outcome
        if isinstance(outcome, Conflict) and not _names(outcome, call):
            return Refused(NOT_THIS_TASK)
        return task_write(outcome)


def _not_its(record: SlotRecord, call: TaskCall) -> bool:
    return record.incarnation != call.incarnation


def _names(conflict: Conflict, call: TaskCall) -> bool:
    """Whether the record a conflict ended on is still the caller's (absent, unsupported or
    another task's: it is told nothing of it)."""
    current = conflict.current
    return isinstance(current, Supported) and not _not_its(current.record, call)


def task_write(outcome: Outcome) -> TaskWrite:
    if isinstance(outcome, Refused):
        return TaskWrite(outcome="refused", reason=outcome.reason)
    if isinstance(outcome, Conflict):
        current = outcome.current
        record = current.record if isinstance(current, Supported) else None
        return TaskWrite(outcome="conflict", record=record)
    kind: Literal["written", "acknowledged"] = (
        "written" if isinstance(outcome, Written) else "acknowledged"
    )
    return TaskWrite(outcome=kind, record=outcome.record, entry=outcome.entry)
