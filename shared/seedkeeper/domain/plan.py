"""What the seed function hands the slot task: which attempt of which slot it is, and the
binding it restores, in one validated model carried in one environment variable (RunTask's
container overrides).

It carries no credential and no URL: RunTask's overrides are visible to anyone allowed
DescribeTasks and in CloudTrail. The task asks the checkpoint function for the presigned
URLs it restores from when it starts (`POST /tasks/start`, signed with its task role), and
only the task the record names for this attempt is answered."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from seedkeeper.domain.models import Binding, Model, Origin, OwnerClaim, SeedIdentity, SlotId
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.record import SlotRecord

PLAN_VARIABLE = "SEEDKEEPER_PLAN"
DEPS_PATH = "node_modules"  # where the deps tree lands in the checkout, unless configured


class SlotPlan(Model):
    slot: SlotId
    attempt: Annotated[int, Field(ge=1)]
    op: OpRef  # the restore (or, for a cold slot, the launch) this task's work settles
    # The slot's binding, flat on the wire as the record keeps it: a task image and the
    # functions of another release still read each other's plans.
    seed: SeedIdentity | None = None
    owner: OwnerClaim | None = None
    origin: Origin | None = None
    deps_path: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")] = DEPS_PATH

    @classmethod
    def of(cls, record: SlotRecord, op: OpRef, *, deps_path: str = DEPS_PATH) -> SlotPlan:
        """The plan of `record`'s attempt, whose restore (or a cold slot's launch) is `op`."""
        return cls(
            slot=record.slot,
            attempt=record.attempt,
            op=op,
            seed=record.seed,
            owner=record.owner,
            origin=record.origin,
            deps_path=deps_path,
        )

    @property
    def binding(self) -> Binding:
        return Binding(owner=self.owner, seed=self.seed, origin=self.origin)

    def to_env(self) -> str:
        """The JSON for PLAN_VARIABLE."""
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_env(cls, value: str) -> SlotPlan:
        return cls.model_validate_json(value)
