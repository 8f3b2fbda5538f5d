"""What the seed function hands the slot task: everything it needs, in one validated model
carried in one environment variable. It holds presigned URLs: never log it."""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field, SecretStr

from seedkeeper.domain.models import Binding, Model, Origin, OwnerClaim, SeedIdentity, SlotId
from seedkeeper.domain.opwindow import OpRef

PLAN_VARIABLE = "SEEDKEEPER_PLAN"


class SlotPlan(Model):
    slot: SlotId
    attempt: Annotated[int, Field(ge=1)]
    op: OpRef  # the restore (or, for a cold slot, the launch) this task's work settles
    # The slot's binding, flat on the wire as the record keeps it: a task image and the
    # functions of another release still read each other's plans.
    seed: SeedIdentity | None = None
    owner: OwnerClaim | None = None
    origin: Origin | None = None
    # Presigned GET URLs of the seed's archives (credentials until they expire). The task
    # reads the size and sha256 to verify against from the snapshot records themselves.
    checkout: SecretStr | None = None
    deps: SecretStr | None = None
    # A resume: the presigned GET of the slot's parked checkpoint, restored instead of the
    # snapshot (verified against the size and sha256 the record names).
    resume: SecretStr | None = None
    deps_path: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")] = (
        "node_modules"
    )

    @property
    def binding(self) -> Binding:
        return Binding(owner=self.owner, seed=self.seed, origin=self.origin)

    def to_env(self) -> str:
        """The JSON for PLAN_VARIABLE, URLs revealed (SecretStr hides them everywhere else)."""
        body = self.model_dump(mode="json", exclude_none=True)
        for name, url in (
            ("checkout", self.checkout),
            ("deps", self.deps),
            ("resume", self.resume),
        ):
            if url is not None:
                body[name] = url.get_secret_value()
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_env(cls, value: str) -> SlotPlan:
        return cls.model_validate_json(value)
