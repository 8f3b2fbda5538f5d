"""What the slot task and the checkpoint function say to each other about the task's record
(`seedkeeper.services.task_records` answers; the task's `seedkeeper_task.task_api` asks):
plain models, light to import for the task."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from seedkeeper.domain.models import Incarnation, Model, ResourceName, SlotId
from seedkeeper.domain.opwindow import Actor, Operation, OpRef
from seedkeeper.domain.outcomes import RestoreGrant
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import Detail, SeedResult, SlotRecord, Token
from seedkeeper.domain.standby import StandbyId


class TaskOp(Model):
    """One of the slot task's operations, by its ordinal and generation (the actor is
    always the slot task): its restore, or its checkpoint."""

    ordinal: Annotated[int, Field(ge=1)]
    generation: Annotated[int, Field(ge=1)]

    @property
    def ref(self) -> OpRef:
        return OpRef(ordinal=self.ordinal, actor=Actor.SLOT_TASK, generation=self.generation)


class TaskCall(Model):
    """Which slot, and which task of it the caller says it is (its incarnation)."""

    slot: SlotId
    incarnation: Incarnation


class RecordRead(TaskCall):
    # An eventually consistent read costs half: a watch only looks for a change.
    consistent: bool = True


class AttemptCall(TaskCall):
    attempt: Annotated[int, Field(ge=1)]


class SettleSeed(AttemptCall):
    restore: TaskOp
    result: SeedResult


class Freeze(AttemptCall):
    op: TaskOp


class Thaw(AttemptCall):
    op: TaskOp | None = None


class Lose(TaskCall):
    reason: Token
    detail: Detail = ""


class TaskRecord(Model):
    """The caller's record as read."""

    record: SlotRecord


class TaskWrite(Model):
    """How a transition went: written, already true (acknowledged), refused (`reason`), or
    the record kept moving (conflict); the record as it is after it, when known."""

    outcome: Literal["written", "acknowledged", "refused", "conflict"]
    reason: str | None = None
    record: SlotRecord | None = None
    entry: Operation | None = None

    @property
    def done(self) -> bool:
        """Written, or already true."""
        return self.outcome in {"written", "acknowledged"}


class StandbyCall(Model):
    """A standby's task asking what it is to do."""

    standby: StandbyId
    resource: ResourceName | None = None  # a pre-seeded one's pool
    incarnation: Incarnation
    prepared: bool = False  # a pre-seeded one: its generation restored and verified
    leaving: bool = False  # it is past its age: retired unless a seed took it meanwhile


class StandbyAnswer(Model):
    state: Literal["preparing", "free", "assigned", "retired"]
    plan: SlotPlan | None = None  # assigned: the attempt it now runs
    grant: RestoreGrant | None = None  # preparing: its generation's archives
