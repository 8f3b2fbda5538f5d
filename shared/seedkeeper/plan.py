"""What the seed function hands the slot task: everything it needs, in one validated model
carried in one environment variable. It holds presigned URLs: never log it."""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field, SecretStr

from seedkeeper.models import Model, Origin, OwnerClaim, SeedIdentity, SlotId
from seedkeeper.opwindow import OpRef

PLAN_VARIABLE = "SEEDKEEPER_PLAN"


class Transfer(Model):
    """One archive to fetch: a presigned GET URL (a credential until it expires) and the
    size and sha256 the snapshot recorded for it."""

    url: SecretStr
    size: Annotated[int, Field(ge=1)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class SlotPlan(Model):
    slot: SlotId
    attempt: Annotated[int, Field(ge=1)]
    op: OpRef  # the restore (or, for a cold slot, the launch) this task's work settles
    seed: SeedIdentity | None = None
    owner: OwnerClaim | None = None
    origin: Origin | None = None
    checkout: Transfer | None = None
    deps: Transfer | None = None
    deps_path: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")] = (
        "node_modules"
    )

    def to_env(self) -> str:
        """The JSON for PLAN_VARIABLE, URLs revealed (SecretStr hides them everywhere else)."""
        body = self.model_dump(mode="json", exclude_none=True)
        for name, transfer in (("checkout", self.checkout), ("deps", self.deps)):
            if transfer is not None:
                body[name]["url"] = transfer.url.get_secret_value()
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_env(cls, value: str) -> SlotPlan:
        return cls.model_validate_json(value)
