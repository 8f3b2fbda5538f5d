"""`seedkeeper local`: all of Seedkeeper on one machine, no AWS account.

A moto server, in a process of its own, stands in for DynamoDB and for R2 (S3) and, like
them, answers only requests signed with the store's keys (random for each start) and expires
items by their TTL; the table and bucket are created from `template.yaml`; a function-URL
gateway on 127.0.0.1 checks SigV4 and serves the same handlers as AWS, in this process;
slot tasks run as local processes, or as containers of the slot image (`task_runtime`
docker); a timer runs the idle sweep, beside the functions as in AWS, its log lines its own.
Only configuration differs from a deployment: the environment this class sets.

A stack holds its data directory (an exclusive lock) from its start to the end of its stop:
another on the same directory would stop this one's tasks and launch into its slots, so it
refuses to start.

Each slot task signs with keys of its own, its session of the slot task role
(`principals.TaskKeys`), which the gateway takes on the checkpoint route alone (the task role
may invoke only the checkpoint function, and that function acts only for the task that
signed); a task never holds the store's keys. The executor's `credentials` sign everything
else.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import secrets
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Literal, TypeVar

import boto3
from aws_lambda_powertools.logging.lambda_context import build_lambda_context_model

from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.config import StoreSettings, sweeper_from_env
from seedkeeper.domain.record import Supported
from seedkeeper.domain.standby import PoolSettings
from seedkeeper.errors import SeedkeeperError
from seedkeeper.observability import logger
from seedkeeper.services.standbys import PoolReport
from seedkeeper.services.sweep import Report
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.docker import DEFAULT_IMAGE, DockerRuntime
from seedkeeper_tools.local.gateway import FunctionUrlGateway, LocalContext
from seedkeeper_tools.local.principals import (
    TASK_ROLE_ARN,
    LocalCredentials,
    TaskKeys,
    acting_as,
)
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.store import StoreProcess

T = TypeVar("T")
# The stack's one region: its AWS_DEFAULT_REGION, and the only scope the gateway accepts.
REGION = "us-east-1"
# Seconds between sweeps, at least: less would sweep back to back, holding the functions up.
MIN_SWEEP_INTERVAL = 1.0
# The idle sweep's function name, as the functions' are named (`seedkeeper-<folder>`).
IDLE_SWEEP = "seedkeeper-idle_sweep"
# Seconds between two looks at the standby pools (AWS: a schedule of every minute).
STANDBY_INTERVAL = 2.0
# In the data directory, locked for as long as a stack uses it.
LOCK_FILE = ".stack.lock"


class LocalStackRefused(SeedkeeperError):
    """The stack will not start as asked; the message says why (the CLI prints it)."""


class LocalStack:
    def __init__(
        self,
        *,
        data_dir: Path,
        port: int = 8787,
        credentials: LocalCredentials,
        sweep_interval: float = 30.0,
        idle_window: int = 1800,
        task_runtime: Literal["process", "docker"] = "process",
        slot_image: str = DEFAULT_IMAGE,
        park_retention: int | None = None,
        watch_interval: float | None = None,
        standbys: int = 0,
        preseeded: Mapping[str, int] | None = None,
        standby_interval: float = STANDBY_INTERVAL,
    ) -> None:
        """`park_retention` (seconds) and `watch_interval` (a slot task's, seconds): None
        leaves what the environment says (`SEEDKEEPER_PARK_RETENTION`, else the template's
        default; `SEEDKEEPER_WATCH_INTERVAL`, else the task's own default). `standbys`
        blank standby slots are kept, and `preseeded[resource]` holding each resource's
        current generation, tended every `standby_interval` seconds (DESIGN §12)."""
        if not (math.isfinite(sweep_interval) and sweep_interval >= MIN_SWEEP_INTERVAL):
            raise LocalStackRefused(
                f"--sweep-interval must be at least {MIN_SWEEP_INTERVAL:g} second "
                f"(got {sweep_interval:g})"
            )
        self.data_dir = data_dir.resolve()
        self.task_runtime = task_runtime
        self.slot_image = slot_image
        self.port = port
        self.credentials = credentials
        self.sweep_interval = sweep_interval
        self.idle_window = idle_window
        self.park_retention = park_retention
        self.watch_interval = watch_interval
        self.pools = PoolSettings(pool=standbys, preseeded=dict(preseeded or {}))
        self.standby_interval = standby_interval
        self._store: StoreProcess | None = None
        self._gateway: FunctionUrlGateway | None = None
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._tender: threading.Thread | None = None
        self._saved: dict[str, str | None] = {}
        self._lock: IO[str] | None = None
        # The table's and the bucket's name: fresh for each stack, so that nothing one
        # stack wrote is ever read as another's.
        self.name = f"seedkeeper-local-{secrets.token_hex(4)}"
        # The store's keys, for DynamoDB and R2 alike: new for each stack, so that a slot's
        # sandbox, which finds the store's port but holds no key, cannot guess them.
        self.store_credentials = LocalCredentials(
            f"seedkeeper-store-{secrets.token_hex(4)}", secrets.token_urlsafe(32)
        )
        # A read-only R2 token, as a deployment gives the functions that only read (the
        # store takes it for object reads alone, as R2 takes an Object Read token).
        self.r2_read_credentials = LocalCredentials(
            f"seedkeeper-r2-read-{secrets.token_hex(4)}", secrets.token_urlsafe(32)
        )

    @property
    def url(self) -> str:
        assert self._gateway is not None
        return self._gateway.url

    @property
    def runtime(self) -> LocalRuntime | DockerRuntime:
        """Where this stack's slot tasks run: the one place its runtime is built."""
        if self.task_runtime == "docker":
            return DockerRuntime(self.data_dir, self.slot_image)
        return LocalRuntime(self.data_dir)

    def workspace(self, slot: str) -> Path:
        """A slot task's workspace on this machine: the process runtime's (a container's
        is inside the container, as a Fargate task's is), of the task the slot's record
        names (a standby that took the slot runs in its own)."""
        runtime = self._processes()
        incarnation = self._incarnation(slot)
        return runtime.workspace_of(incarnation) if incarnation else runtime.workspace(slot)

    def slot_uid(self, slot: str) -> int | None:
        """The uid the slot's sandbox runs as (its task's, a standby's included)."""
        runtime = self._processes()
        incarnation = self._incarnation(slot)
        return runtime.slot_uid_of(incarnation) if incarnation else runtime.slot_uid(slot)

    def _processes(self) -> LocalRuntime:
        runtime = self.runtime
        if not isinstance(runtime, LocalRuntime):
            raise TypeError("a container's workspace is inside the container")
        return runtime

    @staticmethod
    def _incarnation(slot: str) -> str | None:
        classified = StoreSettings().lifecycle().read(slot)
        if not isinstance(classified, Supported):
            return None
        incarnation = classified.record.incarnation
        return incarnation if incarnation and incarnation.startswith("local:") else None

    def start(self) -> LocalStack:
        if isinstance(self.runtime, DockerRuntime):
            self.runtime.check()  # no engine, no image: say so now, not at the first seed
        self._hold_data_dir()
        try:
            self._start()
        except BaseException:
            self.stop()  # what did start is stopped, and the data directory let go
            raise
        logger.info("local stack started", url=self.url)
        return self

    def _start(self) -> None:
        self._store = StoreProcess(
            self.store_credentials, region=REGION, read_only=self.r2_read_credentials
        ).start()
        self._configure(self._store.endpoint)
        store = StoreSettings()
        create_table(
            aws.client(
                aws.session(), "dynamodb", budget=aws.TOOLS, endpoint_url=store.dynamodb_endpoint
            ),
            store.table,
            load_template(),
        )
        R2.from_settings(R2Settings(), budget=aws.TOOLS).create_bucket()
        self._gateway = FunctionUrlGateway(
            "127.0.0.1",
            self.port,
            self.credentials,
            task_keys=TaskKeys(self.data_dir),
            region=REGION,
        )
        # Bound, not yet serving: no task can launch before it is told where to checkpoint.
        self._set({"SEEDKEEPER_CHECKPOINT_URL": self._gateway.url})
        self._gateway.start()
        self._sweeper = threading.Thread(target=self._sweep_on_a_timer, daemon=True)
        self._sweeper.start()
        if self.pools.any:
            self._tender = threading.Thread(target=self._tend_on_a_timer, daemon=True)
            self._tender.start()

    def _hold_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lock = (self.data_dir / LOCK_FILE).open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise LocalStackRefused(
                f"another local stack uses {self.data_dir}: stop it, or give this one "
                "another --data-dir"
            ) from None
        self._lock = lock

    def sweep(self) -> Report:
        """A sweep now, as the timer runs one: beside the functions' invocations, as the
        scheduled function runs in AWS (in execution environments of its own)."""
        return self._as_sweep(lambda: sweeper_from_env().sweep())

    def tend_standbys(self) -> PoolReport:
        """The standby pools tended now, as their schedule tends them."""
        return self._as_sweep(lambda: sweeper_from_env().tend_standbys())

    def _as_sweep(self, run: Callable[[], T]) -> T:
        """`run` as the idle sweep function. Its log lines name it: Powertools' logger keys
        are process-wide and each invocation sets them, so the sweep's Lambda context keys
        are its thread's own, which outrank those."""
        context = LocalContext(function_name=IDLE_SWEEP, aws_request_id=str(uuid.uuid4()))
        keys = {"cold_start": False, **vars(build_lambda_context_model(context))}
        logger.thread_safe_append_keys(**keys)
        try:
            with acting_as("idle_sweep"):
                return run()
        finally:
            logger.thread_safe_remove_keys(keys)

    def store_environment(self) -> dict[str, str]:
        """What a tool needs to reach this stack's table and bucket (`seedkeeper publish`,
        `status`, `snapshots`): the store's endpoint and keys, as the stack set them."""
        names = (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "SEEDKEEPER_TABLE",
            "SEEDKEEPER_DYNAMODB_ENDPOINT",
            "SEEDKEEPER_R2_BUCKET",
            "SEEDKEEPER_R2_ENDPOINT",
            "SEEDKEEPER_R2_ACCESS_KEY_ID",
            "SEEDKEEPER_R2_SECRET_ACCESS_KEY",
        )
        return {name: os.environ[name] for name in names}

    def stop(self) -> None:
        """Stops everything it started: the gateway (once the invocation under way is done:
        it may be launching a task), every slot task at once, the timer (a sweep under way
        then finds its slots stopped; its writes still reach the store), the store; then
        lets the data directory go. A stack that never held it (refused at start) has
        nothing to stop: the tasks there are another stack's."""
        if self._lock is None:
            return
        self._stopping.set()
        if self._gateway is not None:
            self._gateway.stop()
        self.runtime.stop_all()
        TaskKeys(self.data_dir).revoke_all()  # what a task that outlived its stop still held
        for timer in (self._sweeper, self._tender):
            if timer is not None:
                timer.join()
        if self._store is not None:
            self._store.stop()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        # Forgets the stack's keys: Seedkeeper's session and boto3's default one.
        aws.use_session(None)
        boto3.setup_default_session()
        self._lock.close()
        self._lock = None

    def _configure(self, endpoint: str) -> None:
        """The environment every handler, the sweep and every slot task reads."""
        store = self.store_credentials
        settings = {
            "AWS_ACCESS_KEY_ID": store.access_key,
            "AWS_SECRET_ACCESS_KEY": store.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "SEEDKEEPER_TABLE": self.name,
            "SEEDKEEPER_DYNAMODB_ENDPOINT": endpoint,
            "SEEDKEEPER_R2_BUCKET": self.name,
            "SEEDKEEPER_R2_ENDPOINT": endpoint,
            "SEEDKEEPER_R2_ACCESS_KEY_ID": store.access_key,
            "SEEDKEEPER_R2_SECRET_ACCESS_KEY": store.secret_key,
            "SEEDKEEPER_R2_READ_ACCESS_KEY_ID": self.r2_read_credentials.access_key,
            "SEEDKEEPER_R2_READ_SECRET_ACCESS_KEY": self.r2_read_credentials.secret_key,
            "SEEDKEEPER_RUNTIME": "docker" if self.task_runtime == "docker" else "local",
            "SEEDKEEPER_SLOT_IMAGE": self.slot_image,
            "SEEDKEEPER_DATA_DIR": str(self.data_dir),
            "SEEDKEEPER_IDLE_WINDOW": str(self.idle_window),
            # The role whose sessions (the tasks' own keys) the checkpoint function serves.
            "SEEDKEEPER_TASK_ROLE_ARN": TASK_ROLE_ARN,
            # The standby pools, read by the seed function and the sweep alike.
            "SEEDKEEPER_STANDBY_POOL": str(self.pools.pool),
            "SEEDKEEPER_STANDBY_PRESEEDED": json.dumps(self.pools.preseeded),
        }
        # The retention the handlers and the sweep share: as told, else as the environment
        # says, else the deployment's default.
        if self.park_retention is not None:
            settings["SEEDKEEPER_PARK_RETENTION"] = str(self.park_retention)
        elif not os.environ.get("SEEDKEEPER_PARK_RETENTION"):
            settings["SEEDKEEPER_PARK_RETENTION"] = str(_template_default("ParkRetentionSeconds"))
        # A task's watch interval, when told (else the environment's passes on, if any).
        if self.watch_interval is not None:
            settings["SEEDKEEPER_WATCH_INTERVAL"] = f"{self.watch_interval:g}"  # 30, not 30.0
        self._set(settings)
        os.environ.pop("AWS_SESSION_TOKEN", None)
        # A session keeps the keys it first read: new ones read these. Seedkeeper's clients
        # come from its own session (seedkeeper.adapters.aws), anything else in this
        # process from boto3's default one.
        aws.use_session(None)
        boto3.setup_default_session()

    def _set(self, settings: dict[str, str]) -> None:
        """Sets each variable, remembering what it was for `stop` to put back."""
        for name, value in settings.items():
            self._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def _sweep_on_a_timer(self) -> None:
        while not self._stopping.wait(self.sweep_interval):
            try:
                self.sweep()
            except Exception:
                logger.exception("local sweep failed")

    def _tend_on_a_timer(self) -> None:
        """At once (a stack's standbys start with it), then every standby interval."""
        while True:
            try:
                self.tend_standbys()
            except Exception:
                logger.exception("local standby pools not tended")
            if self._stopping.wait(self.standby_interval):
                return


def _template_default(parameter: str) -> object:
    """A template parameter's default: what a deployment that does not set it gets."""
    default: object = load_template()["Parameters"][parameter]["Default"]
    return default
