"""SnapStart's hooks (seedkeeper.snapstart): a snapshot holds nothing secret, and every
environment restored from it draws its own randomness and resolves its own credentials.

A snapshot is taken once and restored many times: here the state of `random` and the
process session are what a snapshot would hold, set back before each "restore". The
network is off in unit tests, so a hook that opened a connection would fail."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import snapshot_restore_py
from boto3.session import Session
from botocore.loaders import JSONFileLoader
from botocore.session import Session as BotocoreSession

from functions import load_function
from seedkeeper import snapstart
from seedkeeper.adapters import aws

SERVICES: tuple[aws.Service, ...] = ("dynamodb", "ecs", "secretsmanager", "s3")


@pytest.fixture(autouse=True)
def own_session(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDINIT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-at-init")
    aws.use_session(None)
    yield
    aws.use_session(None)


def access_key(session: Session) -> str:
    credentials = session.get_credentials()
    assert credentials is not None
    return credentials.access_key


def test_loading_the_seed_function_registers_both_hooks_with_lambdas_runtime() -> None:
    before, after = (
        len(snapshot_restore_py.get_before_snapshot()),
        len(snapshot_restore_py.get_after_restore()),
    )
    load_function("seed")
    assert snapshot_restore_py.get_before_snapshot()[before:] == [
        (snapstart.before_snapshot, (SERVICES,), {})
    ]
    assert snapshot_restore_py.get_after_restore()[after:] == [(snapstart.after_restore, (), {})]


def test_before_the_snapshot_models_are_read_and_no_credentials_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def resolved(self: BotocoreSession) -> Any:
        raise AssertionError("credentials resolved before the snapshot")

    with monkeypatch.context() as patched:
        patched.setattr(BotocoreSession, "get_credentials", resolved)
        snapstart.before_snapshot(SERVICES)

    read: list[str] = []
    loaded = JSONFileLoader.load_file

    def counted(self: JSONFileLoader, path: str) -> Any:
        read.append(path)
        return loaded(self, path)

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)
    snapstart.after_restore()
    for service in ("dynamodb", "ecs", "secretsmanager"):
        aws.client(aws.session(), service)
    aws.session().resource("dynamodb")
    aws.session().client("s3")
    assert read == []  # the restored session builds from the models the snapshot read


def test_each_restored_environment_draws_its_own_randomness() -> None:
    snapstart.before_snapshot(SERVICES)
    snapshot = random.getstate()
    draws = []
    for _ in range(3):
        random.setstate(snapshot)
        snapstart.after_restore()
        draws.append(random.random())  # noqa: S311 - the state under test
    assert len(set(draws)) == 3


def test_a_restored_environment_resolves_its_own_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at_init = aws.session()
    assert access_key(at_init) == "AKIDINIT"  # what a snapshot could hold
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDRESTORED")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-after-restore")
    snapstart.after_restore()
    assert aws.session() is not at_init
    assert access_key(aws.session()) == "AKIDRESTORED"
    signer: Any = aws.client(aws.session(), "dynamodb")._request_signer  # type: ignore[attr-defined]
    assert signer._credentials.access_key == "AKIDRESTORED"


def test_without_lambdas_runtime_nothing_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "snapshot_restore_py", None)
    assert snapstart.register(SERVICES) is False
