from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import boto3
import pytest
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError
from hypothesis import settings
from moto import mock_aws
from pydantic import SecretStr

from repos import make_repository
from seedkeeper.adapters import r2 as r2_module
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.adapters.runtime import SLOT_UIDS_FROM
from seedkeeper.config import StoreSettings, snapshots
from seedkeeper.domain.record import slot_key
from seedkeeper.services.rotation import Snapshots
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.gateway import FunctionUrlGateway
from seedkeeper_tools.local.motoserver import AtomicMotoServer, make_moto_cheaper
from seedkeeper_tools.local.principals import TASK_ROLE_ARN, LocalCredentials, TaskKeys
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.stack import LocalStack
from slots import Slots

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

# Every AWS call a function makes is authorized against the deployed policies (tests/iam).
pytest_plugins = ["iam.plugin"]

TABLE_NAME = "seedkeeper-test"
FAKE_KEY = "testing"  # moto accepts any keys
# The slot task role the events (events/*.json) name their task sessions of.
EVENTS_TASK_ROLE_ARN = "arn:aws:iam::123456789012:role/seedkeeper-slot-task"
R2_SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:seedkeeper/r2-AbCdEf"  # noqa: S105

# No test asserts how long something takes, Hypothesis's 200 ms per example included: on a
# loaded machine (the suite runs in parallel) a slow example is not a failing one.
settings.register_profile("seedkeeper", deadline=None)
settings.load_profile("seedkeeper")

# The suite's moto is the local stack's: a transaction copies only the items it names, not
# the whole table (a test that writes a thousand slots was quadratic in them, 190 s).
make_moto_cheaper()

# A root local runtime gives each slot a uid of its own, counted per data directory from a
# base, and a stop ends every process of that uid on the machine. Tests run in several
# processes at once (pytest-xdist workers, or another session), each with data directories
# of its own: each process counts from a base of its own, from its pid (unique among live
# processes), so no two of them ever give a slot the same uid. 500 uids for each pid.
SLOT_UIDS_FROM_HERE = SLOT_UIDS_FROM + 500 * os.getpid()


def cannot_run(what: str, why: str) -> NoReturn:
    """Skips the test: `what` needs `why`. Under CI=true it fails instead: CI provides
    everything a test needs, so a skip there would hide that nothing was tested."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} cannot run under CI: {why}")
    pytest.skip(f"{what} need {why}")


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the environment: a developer's SEEDKEEPER_* never leaks into a test.
    Slot users are counted from this process's own base (SLOT_UIDS_FROM_HERE)."""
    for name in os.environ:
        if name.startswith("SEEDKEEPER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SEEDKEEPER_LOCAL_SLOT_UIDS_FROM", str(SLOT_UIDS_FROM_HERE))


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials, so nothing can ever reach a real account."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": FAKE_KEY,
        "AWS_SECRET_ACCESS_KEY": FAKE_KEY,
        "AWS_SESSION_TOKEN": FAKE_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def table(aws_credentials: None) -> Iterator[Table]:
    """The lifecycle table in moto, built from template.yaml's own definition."""
    with mock_aws():
        create_table(boto3.client("dynamodb"), TABLE_NAME, load_template())
        yield boto3.resource("dynamodb").Table(TABLE_NAME)


@pytest.fixture
def lifecycle(table: Table) -> Lifecycle:
    return Lifecycle(table)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """One moto server over HTTP for the session, standing in for DynamoDB and R2."""
    server = AtomicMotoServer().start()
    yield server.endpoint
    server.stop()


@dataclass(frozen=True)
class Stack:
    """A fresh table and bucket on the moto server, and the settings that name them."""

    endpoint: str
    store: StoreSettings
    r2_settings: R2Settings

    @property
    def table(self) -> Table:
        return self.store.table_resource()

    @property
    def r2(self) -> R2:
        return R2.from_settings(self.r2_settings)

    @property
    def snapshots(self) -> Snapshots:
        return snapshots(self.store, self.r2_settings)

    def wire_item(self, slot: str) -> dict[str, Any]:
        """A slot's record as DynamoDB holds it, every attribute with its type: what a
        test compares to show that nothing was written."""
        client = boto3.client("dynamodb", endpoint_url=self.endpoint)
        item: dict[str, Any] = client.get_item(
            TableName=self.store.table, Key=_typed(slot_key(slot)), ConsistentRead=True
        )["Item"]
        return item

    def environment(self) -> dict[str, str]:
        return {
            "SEEDKEEPER_TABLE": self.store.table,
            "SEEDKEEPER_DYNAMODB_ENDPOINT": self.endpoint,
            "SEEDKEEPER_R2_BUCKET": self.r2_settings.bucket or "",
            "SEEDKEEPER_R2_ENDPOINT": self.endpoint,
            "SEEDKEEPER_R2_ACCESS_KEY_ID": FAKE_KEY,
            "SEEDKEEPER_R2_SECRET_ACCESS_KEY": FAKE_KEY,
            "SEEDKEEPER_TASK_ROLE_ARN": EVENTS_TASK_ROLE_ARN,
        }


@pytest.fixture
def stack(moto_endpoint: str, aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """Everything a function needs, named in the environment as a deployment names it."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    store = StoreSettings(table=name, dynamodb_endpoint=moto_endpoint)
    create_table(boto3.client("dynamodb", endpoint_url=moto_endpoint), name, load_template())
    r2_settings = R2Settings(
        bucket=name,
        endpoint=moto_endpoint,
        access_key_id=SecretStr(FAKE_KEY),
        secret_access_key=SecretStr(FAKE_KEY),
    )
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="auto").create_bucket(
        Bucket=name,
        CreateBucketConfiguration={"LocationConstraint": "auto"},  # type: ignore[typeddict-item]
    )
    built = Stack(moto_endpoint, store, r2_settings)
    for variable, value in built.environment().items():
        monkeypatch.setenv(variable, value)
    return built


@pytest.fixture
def unreadable_r2_secret(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions' R2 keys named by a secret whose every read is refused (a throttle, a
    policy), as a deployment names them: the names asked for."""
    asked: list[str] = []

    def unreadable(name: str, transform: str) -> object:
        asked.append(name)
        raise GetParameterError("AccessDeniedException")

    monkeypatch.setattr(r2_module, "get_secret", unreadable)
    monkeypatch.setenv("SEEDKEEPER_R2_SECRET_ARN", R2_SECRET_ARN)
    return asked


@pytest.fixture
def checkpoint_function(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The checkpoint function behind the local function-URL gateway, taking the keys each
    slot task is given on `tmp_path / "data"` (its session of the task role): the URL tasks
    are told to call."""
    gateway = FunctionUrlGateway(
        "127.0.0.1",
        0,
        LocalCredentials("executor-" + secrets.token_hex(4), secrets.token_hex(16)),
        task_keys=TaskKeys(tmp_path / "data"),
        region="us-east-1",
    ).start()
    monkeypatch.setenv("SEEDKEEPER_CHECKPOINT_URL", gateway.url)
    monkeypatch.setenv("SEEDKEEPER_TASK_ROLE_ARN", TASK_ROLE_ARN)
    yield gateway.url
    gateway.stop()


@pytest.fixture
def slots(
    stack: Stack, checkpoint_function: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Slots]:
    data = tmp_path / "data"
    monkeypatch.setenv("SEEDKEEPER_RUNTIME", "local")
    monkeypatch.setenv("SEEDKEEPER_DATA_DIR", str(data))
    monkeypatch.setenv("SEEDKEEPER_RESTORE_TIMEOUT", "60")
    runtime = LocalRuntime(data, slot_uids_from=SLOT_UIDS_FROM_HERE)
    yield Slots(stack, runtime, tmp_path)
    for record in (data / "slots").glob("*/attempt-*.json"):
        slot, attempt = record.parent.name, record.stem.removeprefix("attempt-")
        runtime.stop(f"local:{slot}:{attempt}", grace=2)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repository(tmp_path)


@pytest.fixture
def deps(tmp_path: Path) -> Path:
    folder = tmp_path / "deps"
    (folder / "left-pad").mkdir(parents=True)
    (folder / "left-pad" / "index.js").write_text("module.exports = 1\n")
    return folder


@contextmanager
def running_local_stack(tmp_path: Path, **settings: Any) -> Iterator[LocalStack]:
    """`seedkeeper local` on a free port, with fresh gateway credentials; stopped after."""
    local = LocalStack(
        data_dir=tmp_path / "data",
        port=0,
        credentials=LocalCredentials("local-test", secrets.token_hex(16)),
        sweep_interval=3600,
        **settings,
    ).start()
    try:
        yield local
    finally:
        local.stop()


def _typed(key: dict[str, str]) -> dict[str, Any]:
    return {name: {"S": value} for name, value in key.items()}
