"""Validated configuration, read from the environment when asked for, never at import;
and the adapters it chooses, built once per distinct configuration and boto3 session.

Every AWS client comes from `seedkeeper.adapters.aws`, built from the process's session
(`aws.session()`). A test that means to observe or fault AWS calls gives the process a
session of its own with `aws.use_session`, its event handlers registered first: what is
built here is cached per session too, so the next call builds anew from that session.
"""

from __future__ import annotations

from functools import cache, partial
from typing import TYPE_CHECKING, Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters import aws
from seedkeeper.adapters.clock import epoch_seconds
from seedkeeper.adapters.r2 import R2, R2Settings, transfer_mode
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.record import MAX_SWEEP_SHARDS, SWEEP_SHARDS

# Each factory imports the service and the store it builds when it is called: a function
# imports only those it serves (the lifecycle's writes only where it writes), which keeps
# every handler's cold start short.
if TYPE_CHECKING:
    from boto3.session import Session
    from mypy_boto3_dynamodb.service_resource import Table

    from seedkeeper.adapters.runtime import RuntimeSettings, SlotRuntime
    from seedkeeper.domain.caller import Caller
    from seedkeeper.domain.standby import PoolSettings
    from seedkeeper.services.checkpoints import CheckpointService
    from seedkeeper.services.receipts import Witness
    from seedkeeper.services.rotation import Snapshots
    from seedkeeper.services.seed import SeedService, SeedSettings
    from seedkeeper.services.standbys import StandbyDesk
    from seedkeeper.services.sweep import RetainedAlertSettings, Sweeper, SweepSettings
    from seedkeeper.services.task_records import TaskRecords
    from seedkeeper.services.task_start import TaskStarts
    from seedkeeper.store.lifecycle import Lifecycle


class StoreSettings(BaseSettings):
    """Where the lifecycle table is. `SEEDKEEPER_TABLE` is required: no silent default."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    table: str = Field(min_length=3, max_length=255, pattern=r"^[A-Za-z0-9_.-]+$")
    dynamodb_endpoint: str | None = None  # a local stand-in (moto); None means AWS
    # Shards of the sweep's index a live record spreads over: every writer of a record and
    # the sweep read the same count. It may grow; the sweep keeps querying the most it ever
    # used, so lowering it saves nothing (docs/concepts/sweep.md, "The shard count").
    sweep_shards: Annotated[int, Field(ge=1, le=MAX_SWEEP_SHARDS)] = SWEEP_SHARDS

    def table_resource(
        self, session: Session | None = None, *, budget: aws.Budget = aws.DYNAMODB
    ) -> Table:
        """The table, from `session` (None: the process's), within a function's budget
        unless told another (the slot task's)."""
        return aws.dynamodb_table(
            session or aws.session(), self.table, self.dynamodb_endpoint, budget=budget
        )

    def lifecycle(self) -> Lifecycle:
        from seedkeeper.store.lifecycle import Lifecycle

        return Lifecycle(self.table_resource(), shards=self.sweep_shards)


class TaskRoleSettings(BaseSettings):
    """The slot task role, whose sessions alone may call the checkpoint function: each
    acts for its own task only (`seedkeeper.domain.caller`). Required: no silent default."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    task_role_arn: str = Field(
        pattern=r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9_+=,.@/-]{1,512}$"
    )


def caller_from_env(user_arn: str | None) -> Caller:
    """Who signed a checkpoint function call (its event's `authorizer.iam.userArn`)."""
    from seedkeeper.domain.caller import Caller, TaskRole

    return Caller(TaskRole(TaskRoleSettings().task_role_arn).session(user_arn))


def r2_if_configured(settings: R2Settings, session: Session | None = None) -> R2 | None:
    """R2 when presigning is configured; otherwise None, and callers say what is missing."""
    if transfer_mode(settings).mode != "presigned":
        return None
    return R2.from_settings(settings, session)


def runtime_from(settings: RuntimeSettings) -> SlotRuntime:
    """The slot runtime `settings` name. Its module is imported here, by the two functions
    that launch or look at tasks, when a task is first touched: the others never need it."""
    from seedkeeper.adapters import runtime

    return runtime.runtime_from(settings)


# Each builder below is cached per settings and session; the `*_from_env` ones name the
# process's session, so a replaced session builds anew. (A slot runtime, built lazily by
# `runtime_from(settings)`, takes the process's session when it is built.)


def snapshots(store: StoreSettings, r2: R2Settings) -> Snapshots:
    return _snapshots(store, r2, aws.session())


@cache
def _snapshots(store: StoreSettings, r2: R2Settings, session: Session) -> Snapshots:
    from seedkeeper.services.rotation import Snapshots
    from seedkeeper.store.snapshots import SnapshotStore
    from seedkeeper.store.standbys import StandbyStore

    table = store.table_resource(session)
    return Snapshots(
        SnapshotStore(table), r2_if_configured(r2, session), standbys=StandbyStore(table)
    )


def snapshots_from_env() -> Snapshots:
    return snapshots(StoreSettings(), R2Settings())


@cache
def seed_service(
    store: StoreSettings,
    r2: R2Settings,
    runtime: RuntimeSettings,
    seed: SeedSettings,
    session: Session,
    *,
    pools: PoolSettings,
) -> SeedService:
    from seedkeeper.services.seed import SeedService
    from seedkeeper.store.lifecycle import Lifecycle
    from seedkeeper.store.snapshots import SnapshotStore
    from seedkeeper.store.standbys import StandbyStore

    table = store.table_resource(session)
    return SeedService(
        lifecycle=Lifecycle(table, shards=store.sweep_shards),
        snapshots=SnapshotStore(table),
        r2=r2_if_configured(r2, session),
        runtime=cache(partial(runtime_from, runtime)),  # built when a task is first touched
        settings=seed,
        clock=epoch_seconds,
        standbys=StandbyStore(table) if pools.any else None,
        pools=pools,
    )


def seed_service_from_env() -> SeedService:
    from seedkeeper.adapters.runtime import RuntimeSettings
    from seedkeeper.domain.standby import PoolSettings
    from seedkeeper.services.seed import SeedSettings

    return seed_service(
        StoreSettings(),
        R2Settings(),
        RuntimeSettings(),
        SeedSettings(),
        aws.session(),
        pools=PoolSettings(),
    )


@cache
def witness(store: StoreSettings, r2: R2Settings, session: Session) -> Witness:
    from seedkeeper.services.receipts import Witness
    from seedkeeper.store.records import Records

    return Witness(
        Records(store.table_resource(session)),
        r2_if_configured(r2, session),
        epoch_seconds,
    )


def witness_from_env() -> Witness:
    return witness(StoreSettings(), R2Settings(), aws.session())


@cache
def checkpoint_service(
    store: StoreSettings, r2: R2Settings, retention: RetentionSettings, session: Session
) -> CheckpointService:
    from seedkeeper.services.checkpoints import CheckpointService
    from seedkeeper.store.lifecycle import Lifecycle

    return CheckpointService(
        lifecycle=Lifecycle(store.table_resource(session), shards=store.sweep_shards),
        r2=r2_if_configured(r2, session),
        settings=retention,
        presign_expiry=r2.presign_expiry,
        clock=epoch_seconds,
    )


def checkpoint_service_from_env() -> CheckpointService:
    return checkpoint_service(StoreSettings(), R2Settings(), RetentionSettings(), aws.session())


@cache
def task_starts(
    store: StoreSettings, r2: R2Settings, runtime: RuntimeSettings, session: Session
) -> TaskStarts:
    from seedkeeper.services.task_start import TaskStarts
    from seedkeeper.store.lifecycle import Lifecycle
    from seedkeeper.store.snapshots import SnapshotStore

    table = store.table_resource(session)
    # Asked only when the record names no task yet: built then.
    launching = cache(partial(runtime_from, runtime))
    return TaskStarts(
        lifecycle=Lifecycle(table, shards=store.sweep_shards),
        snapshots=SnapshotStore(table),
        r2=r2_if_configured(r2, session),
        launched_for=lambda incarnation: launching().launched_for(incarnation),
        presign_expiry=r2.presign_expiry,
        clock=epoch_seconds,
    )


@cache
def standby_desk(store: StoreSettings, r2: R2Settings, session: Session) -> StandbyDesk:
    from seedkeeper.services.standbys import StandbyDesk
    from seedkeeper.store.snapshots import SnapshotStore
    from seedkeeper.store.standbys import StandbyStore

    table = store.table_resource(session)
    return StandbyDesk(
        standbys=StandbyStore(table),
        snapshots=SnapshotStore(table),
        r2=r2_if_configured(r2, session),
        presign_expiry=r2.presign_expiry,
        clock=epoch_seconds,
    )


def standby_desk_from_env() -> StandbyDesk:
    return standby_desk(StoreSettings(), R2Settings(), aws.session())


def task_starts_from_env() -> TaskStarts:
    from seedkeeper.adapters.runtime import RuntimeSettings

    return task_starts(StoreSettings(), R2Settings(), RuntimeSettings(), aws.session())


@cache
def task_records(
    store: StoreSettings, retention: RetentionSettings, session: Session
) -> TaskRecords:
    from seedkeeper.services.task_records import TaskRecords
    from seedkeeper.store.lifecycle import Lifecycle

    return TaskRecords(
        lifecycle=Lifecycle(store.table_resource(session), shards=store.sweep_shards),
        retention=retention,
        clock=epoch_seconds,
    )


def task_records_from_env() -> TaskRecords:
    return task_records(StoreSettings(), RetentionSettings(), aws.session())


@cache
def sweeper(
    store: StoreSettings,
    r2: R2Settings,
    runtime: RuntimeSettings,
    sweep: SweepSettings,
    session: Session,
    *,
    retention: RetentionSettings,
    alert: RetainedAlertSettings,
    pools: PoolSettings,
) -> Sweeper:
    from seedkeeper.services.standbys import StandbyPool
    from seedkeeper.services.sweep import Sweeper
    from seedkeeper.store.lifecycle import Lifecycle
    from seedkeeper.store.snapshots import SnapshotStore
    from seedkeeper.store.standbys import StandbyStore
    from seedkeeper.store.sweep_index import SweepIndex

    table = store.table_resource(session)
    runtime_once = cache(partial(runtime_from, runtime))  # built when a task is first asked about
    return Sweeper(
        index=SweepIndex(table, shards=store.sweep_shards),
        lifecycle=Lifecycle(table, shards=store.sweep_shards),
        runtime=runtime_once,
        snapshots=_snapshots(store, r2, session),
        r2=r2_if_configured(r2, session),
        settings=sweep,
        retention=retention,
        clock=epoch_seconds,
        retained_alert_after=alert.retained_alert_after,
        # Tended at every sweep, those it once kept too (retired when the target is 0).
        pool=StandbyPool(
            standbys=StandbyStore(table),
            snapshots=SnapshotStore(table),
            runtime=runtime_once,
            settings=pools,
            clock=epoch_seconds,
        ),
    )


def sweeper_from_env() -> Sweeper:
    from seedkeeper.adapters.runtime import RuntimeSettings
    from seedkeeper.domain.standby import PoolSettings
    from seedkeeper.services.sweep import RetainedAlertSettings, SweepSettings

    return sweeper(
        StoreSettings(),
        R2Settings(),
        RuntimeSettings(),
        SweepSettings(),
        aws.session(),
        retention=RetentionSettings(),
        alert=RetainedAlertSettings(),
        pools=PoolSettings(),
    )
