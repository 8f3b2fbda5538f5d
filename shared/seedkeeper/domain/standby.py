"""Standby slots (DESIGN §12): slot tasks started ahead, unseeded, each waiting for one
assignment, so a seed waits for a restore (or, pre-seeded, for nothing but its claim) rather
than for a Fargate start.

A standby is an item of the lifecycle table, `STANDBY#<pool>`/`<standby id>`, where the pool
is `*` for blank standbys and a resource's name for those that hold its current generation
already restored. Its states:

    starting ──(its task reports in)──▶ free ──(a seed takes it)──▶ assigned
        │        └─▶ preparing ─(restored, verified)─┘
        └──────────────▶ retired ◀──(surplus, over age, superseded, its task gone)──┘

Only `free` is ever taken, in one transaction with the slot's record naming the standby's
task as the attempt's (one slot per standby; at most one task per attempt). Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, PositiveInt
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.domain.models import (
    BackupId,
    BranchRef,
    GitSha,
    Incarnation,
    Model,
    ResourceName,
    SeedIdentity,
    validate_item,
)
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import EpochSeconds
from seedkeeper.domain.snapshots import Snapshot

STANDBY_VARIABLE = "SEEDKEEPER_STANDBY"
STANDBY_PREFIX = "STANDBY#"
BLANK_POOL = "*"  # never a resource's name (IDENTIFIER_PATTERN starts with a letter or digit)
# What a local runtime names a standby's task: a slot name no executor can give.
LOCAL_STANDBY_PREFIX = "_standby-"

StandbyId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class StandbyState(StrEnum):
    STARTING = "starting"  # launched (or being); its task has not reported in
    PREPARING = "preparing"  # a pre-seeded one's task is restoring its generation
    FREE = "free"  # waiting: the only state a seed takes
    ASSIGNED = "assigned"  # bound to one slot's attempt: that slot's task now
    RETIRED = "retired"  # to be stopped: never taken again


LIVE = frozenset({StandbyState.STARTING, StandbyState.PREPARING, StandbyState.FREE})


class Generation(Model):
    """The generation a pre-seeded standby holds, as a seed names it."""

    resource: ResourceName
    generation: PositiveInt
    ref: BranchRef
    sha: GitSha
    checkout_backup_id: BackupId
    deps_backup_id: BackupId | None = None

    @classmethod
    def of(cls, snapshot: Snapshot) -> Generation:
        return cls(
            resource=snapshot.resource,
            generation=snapshot.generation,
            ref=snapshot.ref,
            sha=snapshot.sha,
            checkout_backup_id=snapshot.checkout.backup_id,
            deps_backup_id=snapshot.deps.backup_id if snapshot.deps else None,
        )

    def holds(self, seed: SeedIdentity) -> bool:
        """Whether a seed is served by this generation as restored: its archives, at its
        ref and sha, with nothing to fetch (a fetch takes a blank standby)."""
        named = (seed.resource, seed.ref, seed.sha, seed.checkout_backup_id, seed.deps_backup_id)
        ours = (self.resource, self.ref, self.sha, self.checkout_backup_id, self.deps_backup_id)
        return named == ours and seed.fetch_ref is None


class StandbyPlan(Model):
    """What a standby's task is launched with (STANDBY_VARIABLE): which standby it is, and
    the generation it restores ahead when pre-seeded. No URL, no credential."""

    standby: StandbyId
    preseed: Generation | None = None

    @property
    def pool(self) -> str:
        return pool_of(self.preseed)

    def to_env(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_env(cls, value: str) -> StandbyPlan:
        return cls.model_validate_json(value)


def pool_of(preseed: Generation | None) -> str:
    return BLANK_POOL if preseed is None else preseed.resource


class Standby(Model):
    """A standby as recorded. `plan`: the slot plan it was assigned (assigned only)."""

    standby: StandbyId
    preseed: Generation | None = None
    state: StandbyState
    incarnation: Incarnation | None = None
    launched_at: EpochSeconds
    # When it stops waiting whatever the sweep does (its pool may no longer be tended):
    # launched_at + max_age, as the pool was kept then.
    retire_at: EpochSeconds
    plan: SlotPlan | None = None
    expires_at: EpochSeconds | None = None  # an assigned or retired one's item expires

    @property
    def pool(self) -> str:
        return pool_of(self.preseed)

    @property
    def launch(self) -> StandbyPlan:
        return StandbyPlan(standby=self.standby, preseed=self.preseed)

    def to_item(self) -> dict[str, Any]:
        body = self.model_dump(mode="json", exclude_none=True, exclude={"plan"})
        if self.plan is not None:
            body["plan"] = self.plan.to_env()
        return body

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Standby:
        fields = {k: v for k, v in item.items() if k not in {"PK", "SK", "schema"}}
        if isinstance(fields.get("plan"), str):
            fields["plan"] = json.loads(fields["plan"])
        return validate_item(cls, fields)


class PoolSettings(BaseSettings):
    """How many standbys to keep (`SEEDKEEPER_STANDBY_POOL` blank ones, and
    `SEEDKEEPER_STANDBY_PRESEEDED`, a JSON object, that many holding each resource's current
    generation), and for how long one may wait. None by default: every seed launches."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_STANDBY_", extra="ignore", frozen=True)

    pool: Annotated[int, Field(ge=0, le=1000)] = 0
    preseeded: Annotated[
        dict[ResourceName, Annotated[int, Field(ge=0, le=100)]], Field(max_length=100)
    ] = Field(default_factory=dict)
    max_age: Annotated[int, Field(ge=60, le=7 * 86_400)] = 4 * 3600
    # A starting one whose task has not reported in by then is given up (Fargate's start
    # takes about a minute; an image pull that stalls, much longer).
    start_timeout: Annotated[int, Field(ge=10, le=3600)] = 600

    @property
    def any(self) -> bool:
        return self.pool > 0 or any(self.preseeded.values())

    def __hash__(self) -> int:  # cached builders key on settings: the dict is not hashable
        return hash(self.model_dump_json())


@dataclass(frozen=True)
class PoolPlan:
    """What one look at a pool decides: how many to launch, which to retire (and stop)."""

    launch: int
    retire: tuple[Standby, ...]


def _dead(standby: Standby, gone: frozenset[str]) -> bool:
    """Its task stopped (`gone`: the stopped tasks; an unknown one is not)."""
    return standby.incarnation is not None and standby.incarnation in gone


def never_started(
    standby: Standby, *, settings: PoolSettings, gone: frozenset[str], now: int
) -> bool:
    """A standby that did not start: its task stopped before it was free, or it has not
    reported in within the start timeout (alive or not, it is given up)."""
    waiting = standby.state in {StandbyState.STARTING, StandbyState.PREPARING}
    silent = (
        standby.state is StandbyState.STARTING
        and now - standby.launched_at >= settings.start_timeout
    )
    return (waiting and _dead(standby, gone)) or silent


def tend(
    standbys: list[Standby],
    *,
    target: int,
    wanted: Generation | None,
    settings: PoolSettings,
    gone: frozenset[str],
    now: int,
) -> PoolPlan:
    """Keep `target` live standbys in one pool, each holding `wanted` (a pre-seeded pool's
    current generation; None: the blank pool). Retired: those over age, those holding
    another generation (superseded), those whose task is `gone` (stopped), those that never
    reported in, and beyond the target those least ready (starting), then the newest.
    Never an assigned one: its slot's record governs it."""
    retire: list[Standby] = []
    kept: list[Standby] = []
    for standby in (s for s in standbys if s.state in LIVE):
        aged = now - standby.launched_at >= settings.max_age
        given_up = aged or never_started(standby, settings=settings, gone=gone, now=now)
        dead = _dead(standby, gone)
        (retire if given_up or dead or standby.preseed != wanted else kept).append(standby)
    surplus = len(kept) - target
    if surplus > 0:
        # The warmest stay: the oldest ready ones (and they are the first to age out).
        readiness = {StandbyState.STARTING: 0, StandbyState.PREPARING: 1, StandbyState.FREE: 2}
        kept.sort(key=lambda s: (readiness[s.state], -s.launched_at))
        retire.extend(kept[:surplus])
    return PoolPlan(launch=max(0, target - len(kept)), retire=tuple(retire))
