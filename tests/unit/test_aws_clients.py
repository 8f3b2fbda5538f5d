"""Every AWS client Seedkeeper builds has explicit timeouts and botocore's standard retry
mode, and its worst case (every attempt timing out connecting and reading, the longest
waits between) fits in the time of whoever waits for it, as template.yaml declares it.

The clients are the ones the code builds, observed through a session of the test's own:
each call is answered by a `before-call` handler, which also records the client's
configuration, so nothing is sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.config import Config
from botocore.endpoint import DEFAULT_TIMEOUT
from botocore.retries.standard import ExponentialBackoff

from iam.deployed import deploy
from seedkeeper import config
from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.adapters.runtime import RuntimeSettings, runtime_from
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import Absent
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper_task import task_api
from seedkeeper_task.settings import STOP_MARGIN
from seedkeeper_tools.infra import load_template
from sessions import Answer, answer_calls, answered, injected_session

Template = dict[str, Any]

ACCOUNT = "0123456789abcdef0123456789abcdef"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:r2-keys-AbCdEf"  # noqa: S105 - a name
TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task/slots/0123456789abcdef"
KEY = "backups/snap-1.sqsh"
ACCESS_KEY = "AKIDEXAMPLE"
SECRET_KEY = "secret-access-key-example"  # noqa: S105 - a fake
# Keys and a region of the session's own: nothing is looked up, and nothing is sent.
OFFLINE = {
    "region_name": "us-east-1",
    "aws_access_key_id": ACCESS_KEY,
    "aws_secret_access_key": SECRET_KEY,
}

# What each function calls, by botocore's service name: every function reads the table and
# R2 (its keys from Secrets Manager when a secret holds them); the seed function, the sweep
# and the checkpoint function (what a task was launched for) reach ECS (checked against their
# IAM policies below).
CALLS: dict[str, set[str]] = {
    "seed": {"dynamodb", "ecs", "s3", "secretsmanager"},
    "receipt": {"dynamodb", "s3", "secretsmanager"},
    "slot_evidence": {"dynamodb", "s3", "secretsmanager"},
    "rotation": {"dynamodb", "s3", "secretsmanager"},
    "checkpoint": {"dynamodb", "ecs", "s3", "secretsmanager"},
    "idle_sweep": {"dynamodb", "ecs", "s3", "secretsmanager"},
}

# The answers the calls below get, by operation.
ANSWERS: dict[str, dict[str, Any]] = {
    "GetItem": {},
    "DescribeTasks": {"tasks": [], "failures": []},
    "HeadObject": {"ContentLength": 1, "ETag": '"etag"'},
    "GetSecretValue": {
        "Name": "r2-keys",
        "SecretString": json.dumps({"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}),
    },
}


@pytest.fixture(scope="module")
def template() -> Template:
    return load_template()


@pytest.fixture
def seen() -> Iterator[dict[str, Config]]:
    """The configuration of each service's client that made a call, by service name."""
    configs: dict[str, Config] = {}

    def answer(model: Any, context: dict[str, Any], **_: Any) -> Answer:
        configs[model.service_model.service_name] = context["client_config"]
        return answered(ANSWERS[model.name])

    with injected_session(**OFFLINE) as session:
        answer_calls(session, "before-call", answer)
        yield configs


def worst_case(client_config: Config) -> float:
    """Seconds one call can take, computed from botocore's own standard-mode backoff: every
    attempt times out connecting and reading; before retry i botocore waits up to
    min(scale * 2**i, cap) (the throttling scale, the larger), plus the most an
    x-amz-retry-after header adds."""
    backoff: Any = ExponentialBackoff  # its constants are not in the stubs
    scale = backoff._DEFAULT_BACKOFF_CONFIG["throttling_base_scale"]
    cap, extra = backoff._MAX_BACKOFF, backoff._RETRY_AFTER_MAX_ADDITIONAL
    options: Any = client_config
    attempts: int = options.retries["total_max_attempts"]
    waits = sum(min(scale * 2**i, cap) + extra for i in range(attempts - 1))
    return float(attempts * (options.connect_timeout + options.read_timeout) + waits)


def assert_bounded(client_config: Config) -> None:
    options: Any = client_config
    assert options.retries["mode"] == "standard"
    assert options.connect_timeout < DEFAULT_TIMEOUT
    assert options.read_timeout < DEFAULT_TIMEOUT


def function_timeouts(template: Template) -> dict[str, int]:
    """Each function's Timeout, Globals applied, keyed by its folder under functions/."""
    default = template["Globals"]["Function"]["Timeout"]
    return {
        resource["Properties"]["CodeUri"].removeprefix("functions/").rstrip("/"): resource[
            "Properties"
        ].get("Timeout", default)
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Serverless::Function"
    }


def reaches_ecs() -> set[str]:
    """The functions whose roles, as deployed, grant an ECS action."""
    deployed = deploy()
    return {
        function
        for function, role in deployed.roles.items()
        for _, document in deployed.principals[role].policies
        for statement in document["Statement"]
        for action in (
            [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        )
        if action.startswith("ecs:")
    }


def call_as_the_functions_do() -> None:
    """One call on each client the composition root builds for the functions."""
    assert isinstance(StoreSettings(table="lifecycle").lifecycle().read("slot-1"), Absent)
    runtime = runtime_from(
        RuntimeSettings(
            runtime="ecs", cluster="slots", task_definition="slot:1", subnets=("subnet-1",)
        )
    )
    assert runtime.status(TASK_ARN) is TaskStatus.UNKNOWN
    r2 = config.r2_if_configured(
        R2Settings(bucket="seedkeeper-backups", account_id=ACCOUNT, secret_arn=SECRET_ARN)
    )
    assert r2 is not None
    assert r2.head(KEY) is not None


def test_the_functions_clients_are_bounded_within_each_functions_timeout(
    template: Template, seen: dict[str, Config]
) -> None:
    call_as_the_functions_do()
    timeouts = function_timeouts(template)
    assert set(timeouts) == set(CALLS)
    assert reaches_ecs() == {name for name, services in CALLS.items() if "ecs" in services}
    assert set(seen) == set().union(*CALLS.values())
    for function, services in CALLS.items():
        for service in services:
            assert_bounded(seen[service])
            assert worst_case(seen[service]) < timeouts[function], (function, service)


def test_a_slot_tasks_call_fits_its_stop_timeout(template: Template) -> None:
    """A stopped task's last calls to its API (its record, then its verdict or its loss)
    fit in the container's StopTimeout, less the margin kept for the last one: every try
    timing out, the longest waits between."""
    (slot,) = [
        container
        for container in template["Resources"]["SlotTaskDefinition"]["Properties"][
            "ContainerDefinitions"
        ]
        if container["Name"] == "slot"
    ]
    tries = task_api._TRIES
    waits = sum(2.0**attempt for attempt in range(tries - 1))
    one_call = tries * task_api.CALL_TIMEOUT + waits
    assert 2 * one_call < slot["StopTimeout"] - STOP_MARGIN


def test_the_tools_clients_use_the_standard_retry_mode_with_explicit_timeouts(
    seen: dict[str, Config],
) -> None:
    """The tools (the CLI, the local stack, the demo) wait longer: a person waits for them,
    and an upload's part for its answer. Still standard retries, still bounded."""
    r2 = R2.from_settings(
        R2Settings(
            bucket="seedkeeper-backups",
            account_id=ACCOUNT,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
        ),
        budget=aws.TOOLS,
    )
    assert r2.head(KEY) is not None
    options: Any = seen["s3"]
    assert options.retries == {"mode": "standard", "total_max_attempts": aws.TOOLS.attempts}
    assert (options.connect_timeout, options.read_timeout) == (aws.TOOLS.connect, aws.TOOLS.read)
    # R2's dialect rides along with the budget.
    assert options.signature_version == "s3v4"
    assert options.s3 == {"addressing_style": "path"}


@pytest.mark.parametrize(
    "budget",
    [
        aws.DYNAMODB,
        aws.ECS,
        aws.R2,
        aws.SECRETS_MANAGER,
        aws.TOOLS,
    ],
    ids=["dynamodb", "ecs", "r2", "secrets-manager", "tools"],
)
def test_each_budgets_arithmetic_is_botocores(budget: aws.Budget) -> None:
    """The worst case each budget's comment states is the one botocore's backoff allows."""
    assert budget.worst_case == pytest.approx(worst_case(budget.config()))


def test_a_sessions_handlers_see_r2s_presigning(seen: dict[str, Config]) -> None:
    """Presigning sends nothing (no before-call), but it signs: a test that asserts nothing
    was presigned listens for `before-sign` on its session, and this is what it hears."""
    signed: list[str] = []
    aws.session().events.register(
        "before-sign.s3", lambda **kwargs: signed.append(kwargs["operation_name"])
    )
    r2 = config.r2_if_configured(
        R2Settings(
            bucket="seedkeeper-backups",
            account_id=ACCOUNT,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
        )
    )
    assert r2 is not None
    r2.presign_get(KEY, 60)
    assert signed == ["GetObject"]


def test_a_new_session_builds_the_services_anew() -> None:
    """The composition root caches what it builds per session: a test's session is the one
    the next call uses, and the process's own comes back after."""
    store = StoreSettings(table="lifecycle")
    with injected_session(**OFFLINE):
        before = config.snapshots(store, R2Settings())
        assert config.snapshots(store, R2Settings()) is before
    with injected_session(**OFFLINE) as session:
        assert aws.session() is session
        assert config.snapshots(store, R2Settings()) is not before
    assert aws.session() is not session
