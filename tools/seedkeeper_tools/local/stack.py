"""`seedkeeper local`: all of Seedkeeper on one machine, no AWS account.

An embedded moto server stands in for DynamoDB and for R2 (S3) and, like them, answers only
requests signed with the store's keys (random for each start); the table and bucket are
created from `template.yaml`; a function-URL gateway on 127.0.0.1 checks SigV4 and serves
the same handlers as AWS; slot tasks run as local processes; a timer runs the idle sweep.
Only configuration differs from a deployment: the environment this class sets.
"""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

import boto3

from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.config import StoreSettings, sweeper_from_env
from seedkeeper.observability import logger
from seedkeeper.services.sweep import Report
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.gateway import FunctionUrlGateway, LocalCredentials
from seedkeeper_tools.local.motoserver import AtomicMotoServer
from seedkeeper_tools.local.runtime import LocalRuntime

# The stack's one region: its AWS_DEFAULT_REGION, and the only scope the gateway accepts.
REGION = "us-east-1"


class LocalStack:
    def __init__(
        self,
        *,
        data_dir: Path,
        port: int = 8787,
        credentials: LocalCredentials,
        sweep_interval: float = 30.0,
        idle_window: int = 1800,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self.credentials = credentials
        self.sweep_interval = sweep_interval
        self.idle_window = idle_window
        self._moto: AtomicMotoServer | None = None
        self._gateway: FunctionUrlGateway | None = None
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._saved: dict[str, str | None] = {}
        # moto's state is per process: a fresh name keeps two stacks in one process apart.
        self.name = f"seedkeeper-local-{secrets.token_hex(4)}"
        # The store's keys, for DynamoDB and R2 alike: new for each stack, so that a slot's
        # sandbox, which finds the store's port but holds no key, cannot guess them.
        self.store_credentials = LocalCredentials(
            f"seedkeeper-store-{secrets.token_hex(4)}", secrets.token_urlsafe(32)
        )

    @property
    def url(self) -> str:
        assert self._gateway is not None
        return self._gateway.url

    @property
    def runtime(self) -> LocalRuntime:
        return LocalRuntime(self.data_dir)

    def start(self) -> LocalStack:
        self._moto = AtomicMotoServer(credentials=self.store_credentials, region=REGION).start()
        self._configure(self._moto.endpoint)
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
            "127.0.0.1", self.port, self.credentials, region=REGION
        ).start()
        self._sweeper = threading.Thread(target=self._sweep_on_a_timer, daemon=True)
        self._sweeper.start()
        logger.info("local stack started", url=self.url)
        return self

    def sweep(self) -> Report:
        return sweeper_from_env().sweep()

    def stop(self) -> None:
        """Stops everything it started: the timer, the gateway, every slot process, moto."""
        self._stopping.set()
        if self._sweeper is not None:
            self._sweeper.join()
        if self._gateway is not None:
            self._gateway.stop()
        self.runtime.stop_all()
        if self._moto is not None:
            self._moto.stop()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        # Forgets the stack's keys: Seedkeeper's session and boto3's default one.
        aws.use_session(None)
        boto3.setup_default_session()

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
            "SEEDKEEPER_RUNTIME": "local",
            "SEEDKEEPER_DATA_DIR": str(self.data_dir),
            "SEEDKEEPER_IDLE_WINDOW": str(self.idle_window),
        }
        for name, value in settings.items():
            self._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value
        os.environ.pop("AWS_SESSION_TOKEN", None)
        # A session keeps the keys it first read: new ones read these. Seedkeeper's clients
        # come from its own session (seedkeeper.adapters.aws), anything else in this
        # process from boto3's default one.
        aws.use_session(None)
        boto3.setup_default_session()

    def _sweep_on_a_timer(self) -> None:
        while not self._stopping.wait(self.sweep_interval):
            try:
                self.sweep()
            except Exception:
                logger.exception("local sweep failed")
