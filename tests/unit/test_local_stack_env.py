"""What `seedkeeper local` tells its handlers and slot tasks about checkpoints: the gateway's
URL as the checkpoint function's, set before the gateway serves (so before any task can
launch); the store's keys as the task role's, for the checkpoint route; one park retention;
and a watch interval when asked. The store, table and bucket are stubbed: no socket opens."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import pytest

from seedkeeper.adapters.r2 import R2
from seedkeeper_tools.local import stack as stack_module
from seedkeeper_tools.local.principals import TASK_ROLE_ARN, LocalCredentials, TaskKeys
from seedkeeper_tools.local.stack import LocalStack

GATEWAY_URL = "http://127.0.0.1:48787"
NEW_VARIABLES = (
    "SEEDKEEPER_CHECKPOINT_URL",
    "SEEDKEEPER_PARK_RETENTION",
    "SEEDKEEPER_WATCH_INTERVAL",
    "SEEDKEEPER_TASK_ROLE_ARN",
)


class FakeStore:
    endpoint = "http://127.0.0.1:48788"

    def __init__(
        self, credentials: LocalCredentials, *, region: str, read_only: LocalCredentials
    ) -> None:
        pass

    def start(self) -> FakeStore:
        return self

    def stop(self) -> None:
        pass


class FakeGateway:
    """Records how it was built, and the environment when it began to serve."""

    built: ClassVar[list[FakeGateway]] = []

    def __init__(self, host: str, port: int, credentials: LocalCredentials, **options: Any):
        self.credentials = credentials
        self.options = options
        self.url = GATEWAY_URL
        self.serving_with: dict[str, str | None] = {}
        FakeGateway.built.append(self)

    def start(self) -> FakeGateway:
        self.serving_with = {name: os.environ.get(name) for name in NEW_VARIABLES}
        return self

    def stop(self) -> None:
        pass


class FakeBucket:
    def create_bucket(self) -> None:
        pass


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> type[FakeGateway]:
    FakeGateway.built = []
    monkeypatch.setattr(stack_module, "StoreProcess", FakeStore)
    monkeypatch.setattr(stack_module, "FunctionUrlGateway", FakeGateway)
    monkeypatch.setattr(stack_module, "create_table", lambda *args, **kwargs: None)
    monkeypatch.setattr(R2, "from_settings", lambda *args, **kwargs: FakeBucket())
    for name in NEW_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return FakeGateway


def local_stack(tmp_path: Path, **settings: Any) -> LocalStack:
    return LocalStack(
        data_dir=tmp_path / "data",
        port=0,
        credentials=LocalCredentials("executor", "executor-secret"),
        sweep_interval=3600,
        **settings,
    )


def test_the_gateway_is_the_checkpoint_function_before_it_serves(
    tmp_path: Path, stubbed: type[FakeGateway]
) -> None:
    stack = local_stack(tmp_path).start()
    try:
        (gateway,) = stubbed.built
        assert gateway.serving_with["SEEDKEEPER_CHECKPOINT_URL"] == GATEWAY_URL
        # Each task's own keys are its session of the task role: the gateway takes them, for
        # the checkpoint route, beside the executor's; the function serves that role.
        assert gateway.credentials == stack.credentials
        assert isinstance(gateway.options["task_keys"], TaskKeys)
        assert gateway.serving_with["SEEDKEEPER_TASK_ROLE_ARN"] == TASK_ROLE_ARN
        assert os.environ["AWS_ACCESS_KEY_ID"] == stack.store_credentials.access_key
        # The deployment's default retention, for the handlers and the sweep alike.
        assert gateway.serving_with["SEEDKEEPER_PARK_RETENTION"] == "2592000"
        assert gateway.serving_with["SEEDKEEPER_WATCH_INTERVAL"] is None
    finally:
        stack.stop()
    assert not {name for name in NEW_VARIABLES if name in os.environ}


def test_a_retention_and_watch_interval_asked_for_are_set_and_put_back(
    tmp_path: Path, stubbed: type[FakeGateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_PARK_RETENTION", "86400")
    stack = local_stack(tmp_path, park_retention=172_800, watch_interval=1.0).start()
    try:
        assert os.environ["SEEDKEEPER_PARK_RETENTION"] == "172800"
        assert os.environ["SEEDKEEPER_WATCH_INTERVAL"] == "1"  # an int reads it too
    finally:
        stack.stop()
    assert os.environ["SEEDKEEPER_PARK_RETENTION"] == "86400"
    assert "SEEDKEEPER_WATCH_INTERVAL" not in os.environ


def test_the_environments_retention_and_watch_interval_are_left_as_they_are(
    tmp_path: Path, stubbed: type[FakeGateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_PARK_RETENTION", "86400")
    monkeypatch.setenv("SEEDKEEPER_WATCH_INTERVAL", "5")
    stack = local_stack(tmp_path).start()
    try:
        assert os.environ["SEEDKEEPER_PARK_RETENTION"] == "86400"
        assert os.environ["SEEDKEEPER_WATCH_INTERVAL"] == "5"
    finally:
        stack.stop()
