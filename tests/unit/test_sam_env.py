"""What `sam local invoke` runs the functions from against a local stack: the local template
`sam build` builds them from, and the environment file that points each at the stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from seedkeeper.adapters.r2 import R2Settings, transfer_mode
from seedkeeper.adapters.runtime import RuntimeSettings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.services.seed import SeedSettings
from seedkeeper.services.sweep import SweepSettings
from seedkeeper_tools.infra import ROOT, load_template
from seedkeeper_tools.sam_env import (
    LOCAL_VARIABLES,
    function_ids,
    lambda_architecture,
    local_template,
    sam_environment,
)

ENDPOINT = "http://127.0.0.1:40001"
RELAYED = {ENDPOINT: "http://172.17.0.1:40002"}
# What `seedkeeper local` sets (seedkeeper_tools.local.stack), and two of the caller's own.
STACK = {
    "AWS_ACCESS_KEY_ID": "seedkeeper-store-1a2b3c4d",
    "AWS_SECRET_ACCESS_KEY": "store-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "SEEDKEEPER_TABLE": "seedkeeper-local-1a2b3c4d",
    "SEEDKEEPER_DYNAMODB_ENDPOINT": ENDPOINT,
    "SEEDKEEPER_R2_BUCKET": "seedkeeper-local-1a2b3c4d",
    "SEEDKEEPER_R2_ENDPOINT": ENDPOINT,
    "SEEDKEEPER_R2_ACCESS_KEY_ID": "seedkeeper-store-1a2b3c4d",
    "SEEDKEEPER_R2_SECRET_ACCESS_KEY": "store-secret",
    "SEEDKEEPER_R2_READ_ACCESS_KEY_ID": "seedkeeper-r2-read-1a2b3c4d",
    "SEEDKEEPER_R2_READ_SECRET_ACCESS_KEY": "r2-read-secret",
    "SEEDKEEPER_RUNTIME": "local",
    "SEEDKEEPER_DATA_DIR": "/srv/seedkeeper",
    "SEEDKEEPER_IDLE_WINDOW": "1800",
    "SEEDKEEPER_PARK_RETENTION": "172800",
    "SEEDKEEPER_TASK_ROLE_ARN": "arn:aws:iam::000000000000:role/seedkeeper-slot-task",
    "SEEDKEEPER_SANDBOX_COMMAND": "make test",
    "HOME": "/root",
}
# The settings each function reads (as tests/unit/test_template.py lists them), by logical id.
READS: dict[str, tuple[type[BaseSettings], ...]] = {
    "SeedFunction": (StoreSettings, R2Settings, RuntimeSettings, SeedSettings),
    "ReceiptFunction": (StoreSettings, R2Settings),
    "SlotEvidenceFunction": (StoreSettings, R2Settings),
    "RotationFunction": (StoreSettings, R2Settings),
    "CheckpointFunction": (StoreSettings, R2Settings, RetentionSettings),
    "IdleSweepFunction": (StoreSettings, R2Settings, RuntimeSettings, SweepSettings),
}


def declared(template: dict[str, Any], function: str) -> set[str]:
    shared = template["Globals"]["Function"]["Environment"]["Variables"]
    own = template["Resources"][function]["Properties"].get("Environment", {})
    return {*shared, *own.get("Variables", {})}


@pytest.fixture
def local() -> dict[str, Any]:
    return local_template(load_template(), "x86_64")


def test_every_function_of_the_template_is_known_here() -> None:
    assert function_ids(load_template()) == list(READS)


@pytest.mark.parametrize("architecture", ["x86_64", "arm64"])
def test_the_local_template_builds_functions_and_layer_for_one_architecture(
    architecture: str,
) -> None:
    local = local_template(load_template(), architecture)
    layer = local["Resources"]["SeedkeeperLayer"]
    assert local["Globals"]["Function"]["Architectures"] == [architecture]
    assert layer["Properties"]["CompatibleArchitectures"] == [architecture]
    assert layer["Metadata"]["BuildArchitecture"] == architecture
    for function in function_ids(local):
        properties = local["Resources"][function]["Properties"]
        assert properties.get("Architectures", [architecture]) == [architecture]


def test_the_local_template_names_the_code_by_absolute_path(local: dict[str, Any]) -> None:
    resources = local["Resources"]
    paths = [resources[name]["Properties"]["CodeUri"] for name in function_ids(local)]
    paths.append(resources["SeedkeeperLayer"]["Properties"]["ContentUri"])
    assert all(Path(path).is_absolute() and Path(path).is_dir() for path in paths)
    assert Path(resources["SeedFunction"]["Properties"]["CodeUri"]) == ROOT / "functions" / "seed"


def test_every_function_declares_what_points_it_at_the_stack(local: dict[str, Any]) -> None:
    for function in function_ids(local):
        names = declared(local, function)
        assert set(LOCAL_VARIABLES) <= names
        # The data directory wherever a slot runtime is named, and only there.
        assert ("SEEDKEEPER_DATA_DIR" in names) == ("SEEDKEEPER_RUNTIME" in names)


def test_the_deployed_template_is_left_as_it_is() -> None:
    template = load_template()
    local_template(template, "x86_64")
    assert template == load_template()


def test_every_function_gets_a_value_for_each_variable_it_declares_and_no_other(
    local: dict[str, Any],
) -> None:
    environment = sam_environment(STACK, local, RELAYED)
    assert list(environment) == list(READS)
    for function, variables in environment.items():
        assert set(variables) == declared(local, function)
        assert all(isinstance(value, str) for value in variables.values())


def test_the_store_is_named_as_the_containers_reach_it(local: dict[str, Any]) -> None:
    for variables in sam_environment(STACK, local, RELAYED).values():
        assert variables["SEEDKEEPER_DYNAMODB_ENDPOINT"] == RELAYED[ENDPOINT]
        assert variables["SEEDKEEPER_R2_ENDPOINT"] == RELAYED[ENDPOINT]
        # The store's keys and region, never a session token of the caller's.
        assert variables["AWS_ACCESS_KEY_ID"] == STACK["AWS_ACCESS_KEY_ID"]
        assert variables["AWS_REGION"] == variables["AWS_DEFAULT_REGION"] == "us-east-1"
        assert variables["AWS_SESSION_TOKEN"] == ""


@pytest.mark.parametrize("function", list(READS))
def test_each_function_reads_the_stack_from_its_variables(
    function: str, local: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the variables SAM hands the function (all its environment has of Seedkeeper)
    for name, value in sam_environment(STACK, local, RELAYED)[function].items():
        monkeypatch.setenv(name, value)

    # When it reads its settings, as its handler does: every one of them parses
    settings = {kind: kind() for kind in READS[function]}

    # Then they name the stack's table, bucket and runtime
    store = settings[StoreSettings]
    assert isinstance(store, StoreSettings)
    assert (store.table, store.dynamodb_endpoint) == (STACK["SEEDKEEPER_TABLE"], RELAYED[ENDPOINT])
    r2 = settings[R2Settings]
    assert isinstance(r2, R2Settings)
    assert (r2.bucket, r2.endpoint) == (STACK["SEEDKEEPER_R2_BUCKET"], RELAYED[ENDPOINT])
    assert transfer_mode(r2).mode == "presigned"
    runtime = settings.get(RuntimeSettings)
    if runtime is not None:
        assert isinstance(runtime, RuntimeSettings)
        assert (runtime.runtime, runtime.data_dir) == ("local", Path("/srv/seedkeeper"))
    # The stack's park retention, not the template's default: checkpoints agree with the
    # stack's own handlers.
    retention = settings.get(RetentionSettings)
    if retention is not None:
        assert isinstance(retention, RetentionSettings)
        assert retention.park_retention == int(STACK["SEEDKEEPER_PARK_RETENTION"])


def test_without_a_stack_retention_the_template_default_is_given(local: dict[str, Any]) -> None:
    stack = {k: v for k, v in STACK.items() if k != "SEEDKEEPER_PARK_RETENTION"}
    environment = sam_environment(stack, local, RELAYED)
    assert environment["CheckpointFunction"]["SEEDKEEPER_PARK_RETENTION"] == "2592000"


def test_a_variable_no_local_stack_can_value_is_refused(local: dict[str, Any]) -> None:
    variables = local["Resources"]["ReceiptFunction"]["Properties"].setdefault(
        "Environment", {"Variables": {}}
    )["Variables"]
    variables["SEEDKEEPER_SLOT_IMAGE"] = {"Ref": "SlotImage"}  # a parameter without a default
    with pytest.raises(ValueError, match="ReceiptFunction declares SEEDKEEPER_SLOT_IMAGE"):
        sam_environment(STACK, local, RELAYED)


@pytest.mark.parametrize(
    ("machine", "architecture"),
    [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("aarch64", "arm64"), ("arm64", "arm64")],
)
def test_lambda_names_this_machines_architecture(machine: str, architecture: str) -> None:
    assert lambda_architecture(machine) == architecture


def test_an_architecture_lambda_has_not_is_refused() -> None:
    with pytest.raises(ValueError, match="riscv64"):
        lambda_architecture("riscv64")
