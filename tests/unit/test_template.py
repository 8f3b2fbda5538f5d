"""template.yaml: the table DESIGN §3 describes, and the rest of the deployment held to
what the code reads and to least privilege, so the template cannot drift from either."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cfnlint.api import lint_all
from pydantic_settings import BaseSettings

from builders import EXPIRED, stored_in
from iam.deployed import PARAMETERS, Deployed, deploy, translated
from seedkeeper.adapters.r2 import R2Settings, transfer_mode
from seedkeeper.adapters.runtime import RuntimeSettings
from seedkeeper.config import StoreSettings, TaskRoleSettings
from seedkeeper.domain.caller import Caller, task_id
from seedkeeper.domain.checkpoints import RetentionSettings, retry_after
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.outcomes import CheckpointNotTaken
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import State, Supported
from seedkeeper.domain.runtime import UNKNOWN, TaskState, TaskStatus
from seedkeeper.domain.standby import PoolSettings
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper.observability import METRICS_NAMESPACE
from seedkeeper.services.checkpoints import CheckpointOp, CheckpointService, NotTaken
from seedkeeper.services.seed import SeedRequest, SeedService, SeedSettings
from seedkeeper.services.standbys import StandbyPool
from seedkeeper.services.sweep import Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper.store.standbys import StandbyStore
from seedkeeper.store.sweep_index import SweepIndex
from seedkeeper_task.settings import CheckpointSettings, TaskSettings
from seedkeeper_tools.infra import TABLE_RESOURCE, TEMPLATE, load_template, table_properties
from seedkeeper_tools.local import docker

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

Template = dict[str, Any]
Statement = Mapping[str, Any]

ROOT = TEMPLATE.parent
LAYER = "SeedkeeperLayer"
TASK_DEFINITION = "SlotTaskDefinition"
INDEX = "by-deadline"

# The settings each function reads, as its `*_from_env` in seedkeeper.config builds them,
# keyed by the function's folder under functions/.
READS: dict[str, tuple[type[BaseSettings], ...]] = {
    "seed": (StoreSettings, R2Settings, RuntimeSettings, SeedSettings, PoolSettings),
    "receipt": (StoreSettings, R2Settings),
    "slot_evidence": (StoreSettings, R2Settings),
    "rotation": (StoreSettings, R2Settings),
    "checkpoint": (StoreSettings, R2Settings, RetentionSettings, TaskRoleSettings, RuntimeSettings),
    "idle_sweep": (
        StoreSettings,
        R2Settings,
        RuntimeSettings,
        SweepSettings,
        PoolSettings,
        RetentionSettings,
    ),
}
# The slot task reads no table setting: its record is its API's (the checkpoint function).
SLOT_TASK_READS: tuple[type[BaseSettings], ...] = (TaskSettings, CheckpointSettings)
WITH_URL = {"seed", "receipt", "slot_evidence", "rotation", "checkpoint"}
# The one function a slot task may call (through its URL), and the one principal that may.
CHECKPOINT = "CheckpointFunction"
TASK_ROLE = "SlotTaskRole"


@pytest.fixture(scope="module")
def template() -> Template:
    return load_template()


# -- reading the template ------------------------------------------------------------------


def functions(template: Template) -> dict[str, dict[str, Any]]:
    """Every function's properties, Globals applied, keyed by its folder under functions/."""
    defaults: dict[str, Any] = template.get("Globals", {}).get("Function", {})
    found: dict[str, dict[str, Any]] = {}
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        properties: dict[str, Any] = {**defaults, **resource["Properties"]}
        # SAM merges Globals' environment variables with the function's own.
        properties["Environment"] = {
            "Variables": {
                **defaults.get("Environment", {}).get("Variables", {}),
                **resource["Properties"].get("Environment", {}).get("Variables", {}),
            }
        }
        folder = properties["CodeUri"].removeprefix("functions/").rstrip("/")
        found[folder] = properties
    return found


def function_ids(template: Template) -> dict[str, str]:
    """Folder under functions/ -> the function's logical id."""
    return {
        resource["Properties"]["CodeUri"].removeprefix("functions/").rstrip("/"): name
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Serverless::Function"
    }


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _branches(value: Any) -> Iterator[Any]:
    """A value, or both branches of an `Fn::If`; `AWS::NoValue` is nothing."""
    if isinstance(value, Mapping) and "Fn::If" in value:
        _, then, otherwise = value["Fn::If"]
        yield from _branches(then)
        yield from _branches(otherwise)
    elif value != {"Ref": "AWS::NoValue"}:
        yield value


@pytest.fixture(scope="module")
def deployed() -> Deployed:
    """template.yaml as SAM deploys it with a deployment's parameters (tests/iam)."""
    return deploy()


def env_names(*classes: type[BaseSettings]) -> set[str]:
    """The environment variables these settings read (case-insensitive, so upper-cased)."""
    names = set()
    for settings in classes:
        prefix = settings.model_config.get("env_prefix") or ""
        for name, field in settings.model_fields.items():
            assert field.validation_alias is None, "aliases would need reading here"
            names.add(f"{prefix}{name}".upper())
    return names


# -- the table ---------------------------------------------------------------------------


def test_the_lifecycle_table_is_declared_as_designed() -> None:
    template = load_template()
    table = template["Resources"][TABLE_RESOURCE]
    properties = table_properties(template)
    assert table["Type"] == "AWS::DynamoDB::Table"
    assert table["DeletionPolicy"] == "Retain"
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    assert properties["KeySchema"] == [
        {"AttributeName": "PK", "KeyType": "HASH"},
        {"AttributeName": "SK", "KeyType": "RANGE"},
    ]
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert properties["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    (index,) = properties["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "by-deadline"
    assert index["KeySchema"] == [
        {"AttributeName": "sweep", "KeyType": "HASH"},  # a live slot's shard, or `debt`
        {"AttributeName": "sweep_at", "KeyType": "RANGE"},
    ]
    types = {d["AttributeName"]: d["AttributeType"] for d in properties["AttributeDefinitions"]}
    assert types == {"PK": "S", "SK": "S", "sweep": "S", "sweep_at": "N"}


def test_short_form_tags_are_understood() -> None:
    outputs = load_template()["Outputs"]
    assert outputs["LifecycleTableName"]["Value"] == {"Ref": "LifecycleTable"}


# -- functions and the layer ----------------------------------------------------------------


def test_every_function_is_declared_once_and_nothing_else(template: Template) -> None:
    assert set(functions(template)) == set(READS)
    assert len(function_ids(template)) == len(READS)


def test_every_function_is_python313_on_arm64_with_the_layer(template: Template) -> None:
    layer = template["Resources"][LAYER]
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"] == "shared/"
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.13"]
    # pydantic-core is compiled: the layer must be built for the functions' architecture;
    # shared/Makefile builds it, for arm64 unless told otherwise (SAM does not pass it)
    assert layer["Metadata"] == {"BuildMethod": "makefile", "BuildArchitecture": "arm64"}
    recipe = (ROOT / "shared" / "Makefile").read_text()
    assert f"\nLAYER_ARCHITECTURE ?= {layer['Metadata']['BuildArchitecture']}\n" in recipe
    assert "\nbuild-SeedkeeperLayer:\n" in recipe
    for name, properties in functions(template).items():
        assert properties["Runtime"] == "python3.13", name
        assert properties["Architectures"] == ["arm64"], name
        assert {"Ref": LAYER} in properties["Layers"], name


def test_the_layer_installs_what_the_functions_import() -> None:
    requirements = (ROOT / "shared" / "requirements.txt").read_text().splitlines()
    names = {
        re.split(r"[<>=\[ ]", line, maxsplit=1)[0].lower()
        for line in requirements
        if line.strip() and not line.startswith("#")
    }
    assert names == {"boto3", "aws-lambda-powertools", "pydantic", "pydantic-settings"}


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        ("LAYER_ARCHITECTURE=sparc", 'LAYER_ARCHITECTURE is arm64 or x86_64, not "sparc"'),
        # bytecode is for one interpreter version: this process's is not the runtime's
        (f"LAYER_PYTHON={sys.executable}", "the layer is bytecode for python3.13: LAYER_PYTHON"),
    ],
)
def test_the_layers_recipe_refuses_what_it_cannot_build_for(
    setting: str, refusal: str, tmp_path: Path
) -> None:
    if sys.version_info[:2] == (3, 13) and setting.startswith("LAYER_PYTHON"):
        pytest.skip("this interpreter is the runtime's version: no wrong one to name")
    done = subprocess.run(
        [
            "make",
            "-C",
            str(ROOT / "shared"),
            "build-SeedkeeperLayer",
            setting,
            f"ARTIFACTS_DIR={tmp_path / 'layer'}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert refusal in done.stderr
    assert not (tmp_path / "layer").exists()


def test_every_handler_exists(template: Template) -> None:
    for name, properties in functions(template).items():
        module, attribute = properties["Handler"].split(".")
        source = ROOT / properties["CodeUri"] / f"{module}.py"
        tree = ast.parse(source.read_text())
        defined = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        } | {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert attribute in defined, f"{name}: no {attribute} in {source}"


def test_every_function_url_uses_aws_iam(template: Template) -> None:
    declared = functions(template)
    with_url = {name for name, properties in declared.items() if "FunctionUrlConfig" in properties}
    assert with_url == WITH_URL
    for name in with_url:
        assert declared[name]["FunctionUrlConfig"]["AuthType"] == "AWS_IAM", name
    assert "FunctionUrlConfig" not in template.get("Globals", {}).get("Function", {})


@pytest.mark.parametrize(("snaps", "applied"), [("false", "None"), ("true", "PublishedVersions")])
def test_the_seed_functions_url_is_its_published_alias_with_snapstart_when_asked(
    snaps: str, applied: str
) -> None:
    stack = deploy(parameters=PARAMETERS | {"SeedSnapStart": snaps})
    seed = stack.functions["seed"]
    assert stack.resources[seed]["Properties"]["SnapStart"] == {"ApplyOn": applied}
    alias = stack.ref(f"{seed}Aliaslive")
    assert stack.url_target("seed") == alias == f"{stack.arn(seed)}:live"
    versions = [
        resource
        for resource in stack.resources.values()
        if resource["Type"] == "AWS::Lambda::Version"
    ]
    assert [version["DeletionPolicy"] for version in versions] == ["Delete"]
    executor = dict(stack.principals["ExecutorPolicy"].policies)
    assert alias in json.dumps(executor)
    assert f'"{stack.arn(seed)}"' not in json.dumps(executor)


def test_the_outputs_give_each_url_the_table_and_the_cluster(template: Template) -> None:
    values = [output["Value"] for output in template["Outputs"].values()]
    ids = function_ids(template)
    for name in WITH_URL:
        assert {"Fn::GetAtt": [f"{ids[name]}Url", "FunctionUrl"]} in values, name
    assert {"Ref": TABLE_RESOURCE} in values
    assert {"Ref": "SlotCluster"} in values


def test_the_sweep_runs_on_its_schedule(template: Template, deployed: Deployed) -> None:
    sweep = functions(template)["idle_sweep"]
    event = sweep["Events"]["Sweep"]
    assert event["Type"] == "ScheduleV2"
    schedules = {
        resource["Properties"]["Name"]: resource["Properties"]
        for resource in deployed.resources.values()
        if resource["Type"] == "AWS::Scheduler::Schedule"
    }
    assert len(schedules) == 2  # the sweep's, and the standby pools'
    schedule = next(s for name, s in schedules.items() if name.endswith("-idle-sweep"))
    assert schedule["Target"]["Arn"] == deployed.arn("IdleSweepFunction")
    assert "Input" not in schedule["Target"]  # the whole sweep
    expression = schedule["ScheduleExpression"]
    assert re.fullmatch(r"rate\([1-9][0-9]* minutes\)", expression)
    assert expression == "rate(5 minutes)"  # the default
    # "rate(1 minutes)" is not an expression: a rate of one takes the singular unit.
    assert template["Parameters"]["SweepRateMinutes"]["MinValue"] >= 2
    # The schedule is named per stack: two deployments in one account do not collide.
    assert "${AWS::StackName}" in event["Properties"]["Name"]["Fn::Sub"]
    scheduled = {
        name
        for name, properties in functions(template).items()
        for declared in properties.get("Events", {}).values()
        if declared["Type"] == "ScheduleV2"
    }
    assert scheduled == {"idle_sweep"}


def test_the_standby_pools_are_tended_every_minute_only_while_any_is_kept(
    template: Template, deployed: Deployed
) -> None:
    event = functions(template)["idle_sweep"]["Events"]["Standbys"]
    assert event["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    assert json.loads(event["Properties"]["Input"]) == {"standbys": True}
    assert "${AWS::StackName}" in event["Properties"]["Name"]["Fn::Sub"]
    (schedule,) = [
        resource["Properties"]
        for resource in deployed.resources.values()
        if resource["Type"] == "AWS::Scheduler::Schedule"
        and resource["Properties"]["Name"].endswith("-standbys")
    ]
    # The deployment's defaults keep no pool: the schedule is there, and off.
    assert schedule["State"] == "DISABLED"
    assert schedule["Target"]["Arn"] == deployed.arn("IdleSweepFunction")


# -- least privilege --------------------------------------------------------------------


# -- the environment the code reads ------------------------------------------------------


def test_every_variable_set_is_one_the_code_reads(template: Template) -> None:
    declared = functions(template)
    for name, properties in declared.items():
        variables = {
            v for v in properties["Environment"]["Variables"] if v.startswith("SEEDKEEPER_")
        }
        unread = variables - env_names(*READS[name])
        assert not unread, f"{name} sets {sorted(unread)}, which nothing it runs reads"
    container = slot_container(template)
    variables = {v["Name"] for v in container["Environment"] if v["Name"].startswith("SEEDKEEPER_")}
    assert not variables - env_names(*SLOT_TASK_READS)


# Which R2 token each function is given: the one that may write only where objects are
# written or deleted; the read-only one where objects are read (the checkpoint function:
# a start's GETs, its checkpoint's HEAD).
R2_TOKENS = {
    "seed": {"read"},
    "receipt": {"read"},
    "slot_evidence": {"read"},
    "rotation": {"write"},
    "checkpoint": {"read", "write"},
    "idle_sweep": {"write"},
}
TOKEN_VARIABLES = {"read": "SEEDKEEPER_R2_READ_SECRET_ARN", "write": "SEEDKEEPER_R2_SECRET_ARN"}
TOKEN_PARAMETERS = {"read": "R2ReadSecretArn", "write": "R2SecretArn"}


def test_the_environment_configures_each_function_as_deployed(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As deployed, each function's environment validates, names the table, presigns
    through R2 with the tokens it is given and no other, and gives the runtimes an ECS
    configuration: subnets and security groups (the stack's own) arrive as the JSON lists
    pydantic-settings parses."""
    for name, reads in READS.items():
        environment = deployed.environment(name)
        with monkeypatch.context() as scoped:
            for variable, value in environment.items():
                scoped.setenv(variable, value)
            assert StoreSettings().table == deployed.ref(TABLE_RESOURCE), name
            assert transfer_mode(R2Settings()).mode == "presigned", name
            given = {
                token for token, variable in TOKEN_VARIABLES.items() if variable in environment
            }
            assert given == R2_TOKENS[name], name
            for token in given:
                secret = environment[TOKEN_VARIABLES[token]]
                assert secret == deployed.parameter(TOKEN_PARAMETERS[token]), name
            if RuntimeSettings not in reads:
                continue
            runtime = RuntimeSettings()
            assert runtime.runtime == "ecs"
            assert runtime.cluster == deployed.ref("SlotCluster")
            if name == "checkpoint":  # it only asks what a task was launched for
                continue
            assert runtime.task_definition == deployed.ref(TASK_DEFINITION)
            assert runtime.subnets == tuple(deployed.parameter("SubnetIds"))
            assert runtime.security_groups == (deployed.ref("SlotSecurityGroup"),)
            assert runtime.assign_public_ip is False
            if name == "seed":
                seed = SeedSettings()
                assert seed.idle_window == 1800


def test_without_r2_parameters_the_functions_run_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    unconfigured = {name: value for name, value in PARAMETERS.items() if not name.startswith("R2")}
    cold = deploy(parameters=unconfigured)
    for function in READS:
        with monkeypatch.context() as scoped:
            for variable, value in cold.environment(function).items():
                scoped.setenv(variable, value)
            assert transfer_mode(R2Settings()).mode == "unconfigured", function
    # And no principal reads a secret: the policies that would are not made.
    assert not [
        name
        for name, principal in cold.principals.items()
        for _, document in principal.policies
        if "secretsmanager" in json.dumps(document)
    ]


@pytest.mark.parametrize(
    ("parameter", "settings", "field"),
    [
        ("IdleWindowSeconds", SeedSettings, "idle_window"),
        ("ParkRetentionSeconds", RetentionSettings, "park_retention"),
        ("WatchIntervalSeconds", CheckpointSettings, "watch_interval"),
    ],
)
def test_every_value_a_parameter_allows_the_code_accepts(
    template: Template, parameter: str, settings: type[BaseSettings], field: str
) -> None:
    declared = template["Parameters"][parameter]
    for value in (declared["MinValue"], declared["Default"], declared["MaxValue"]):
        assert getattr(settings.model_validate({field: value}), field) == value
    # The parameter's default is the code's: a deployment and a local stack agree.
    assert settings.model_fields[field].default == declared["Default"]


def preseeded(entries: int) -> str:
    """A StandbyPreseeded value naming that many resources."""
    return "{" + ", ".join(f'"r{n}": 1' for n in range(entries)) + "}"


# Strings a String parameter's AllowedPattern is held to: each it allows, the code must take
# (else the stack deploys and every task, or every seed, fails), and these must be refused.
STRING_PARAMETERS: list[tuple[str, type[BaseSettings], str, list[str], list[str]]] = [
    (
        "StandbyPollSeconds",
        TaskSettings,
        "standby_poll",
        ["0.25", "1", "0.001", "59.99", "60", "60.0", "7"],
        ["0", "0.0", "00", "60.5", "61", "100", "-1", "1e3", ".5", ""],
    ),
    (
        "StandbyPreseeded",
        PoolSettings,
        "preseeded",
        ["{}", '{"widgets": 2}', '{"a": 0, "b.c-d_e": 100}', '{ "widgets" : 1 }', preseeded(100)],
        [
            *("{x}", '{"widgets": 101}', '{"../x": 1}', '{"widgets": "2"}', '{"a": 1,}', "[]"),
            preseeded(101),  # the code takes at most 100 resources
        ],
    ),
]


@pytest.mark.parametrize("row", STRING_PARAMETERS, ids=[row[0] for row in STRING_PARAMETERS])
def test_every_string_a_parameter_allows_the_code_accepts(
    template: Template,
    monkeypatch: pytest.MonkeyPatch,
    row: tuple[str, type[BaseSettings], str, list[str], list[str]],
) -> None:
    parameter, settings, field, allowed, refused = row
    declared = template["Parameters"][parameter]
    pattern = re.compile(declared["AllowedPattern"])
    variable = f"{settings.model_config.get('env_prefix', '')}{field}".upper()
    for value in [*allowed, declared["Default"]]:
        assert pattern.fullmatch(value), value
        monkeypatch.setenv(variable, value)
        settings()  # the code takes it
    for value in refused:
        assert pattern.fullmatch(value) is None, value


def test_the_parameters_the_issue_lists_exist(template: Template) -> None:
    parameters = template["Parameters"]
    for name in (
        "R2AccountId",
        "R2Bucket",
        "R2SecretArn",
        "R2ReadSecretArn",
        "SubnetIds",
        "VpcId",
        "SecurityGroupIds",
        "AssignPublicIp",
        "CreateVpcEndpoints",
        "SeedConcurrency",
        "CheckpointConcurrency",
        "IdleWindowSeconds",
        "ParkRetentionSeconds",
        "WatchIntervalSeconds",
        "SweepRateMinutes",
        "EphemeralStorageGiB",
        "SlotRepository",
        "SlotImageTag",
    ):
        assert name in parameters, name
    assert parameters["EphemeralStorageGiB"]["MinValue"] == 21
    assert parameters["EphemeralStorageGiB"]["MaxValue"] == 200


# -- the slot task ------------------------------------------------------------------------


def slot_container(template: Template) -> dict[str, Any]:
    (container,) = template["Resources"][TASK_DEFINITION]["Properties"]["ContainerDefinitions"]
    return dict(container)


def test_the_slot_task_is_a_fargate_task_the_runtime_can_address(template: Template) -> None:
    definition = template["Resources"][TASK_DEFINITION]["Properties"]
    assert definition["RequiresCompatibilities"] == ["FARGATE"]
    assert definition["NetworkMode"] == "awsvpc"
    assert definition["EphemeralStorage"] == {"SizeInGiB": {"Ref": "EphemeralStorageGiB"}}
    assert definition["ExecutionRoleArn"] == {"Fn::GetAtt": ["SlotTaskExecutionRole", "Arn"]}
    assert definition["TaskRoleArn"] == {"Fn::GetAtt": ["SlotTaskRole", "Arn"]}
    container = slot_container(template)
    # RunTask's overrides name the container: it must be the one the runtime addresses.
    assert container["Name"] == RuntimeSettings().container
    # Its image is the one repository the execution role may pull from.
    image = "${AWS::AccountId}.dkr.ecr.${AWS::Region}.${AWS::URLSuffix}/${SlotRepository}"
    assert container["Image"] == {"Fn::Sub": image + ":${SlotImageTag}"}
    # No table: the task's record is its API's to read and write.
    assert not [v for v in container["Environment"] if v["Name"] == "SEEDKEEPER_TABLE"]
    logs = container["LogConfiguration"]
    assert logs["LogDriver"] == "awslogs"
    assert logs["Options"]["awslogs-group"] == {"Ref": "SlotLogGroup"}
    log_group = template["Resources"]["SlotLogGroup"]["Properties"]
    assert log_group["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_the_workspace_is_a_volume_of_the_task_where_the_image_and_the_runtime_put_it(
    template: Template,
) -> None:
    definition = template["Resources"][TASK_DEFINITION]["Properties"]
    assert definition["Volumes"] == [{"Name": "workspace"}]  # no host path: ephemeral storage
    assert slot_container(template)["MountPoints"] == [
        {"SourceVolume": "workspace", "ContainerPath": docker.WORKSPACE}
    ]
    dockerfile = (ROOT / "functions" / "seed_task" / "Dockerfile").read_text()
    assert f"SEEDKEEPER_WORKSPACE={docker.WORKSPACE}" in dockerfile


def test_cfn_lint_finds_nothing() -> None:
    """The template as CloudFormation's own linter reads it (no network: specs ship with it)."""
    findings = [m for m in lint_all(TEMPLATE.read_text()) if m.rule.id[0] in "EW"]
    assert findings == []  # errors and warnings; informational hints are not findings


def test_the_slot_task_is_told_where_to_checkpoint_and_how_often_to_look(
    template: Template, deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = {v["Name"]: v["Value"] for v in slot_container(template)["Environment"]}
    assert environment["SEEDKEEPER_CHECKPOINT_URL"] == {
        "Fn::GetAtt": [f"{CHECKPOINT}Url", "FunctionUrl"]
    }
    assert environment["SEEDKEEPER_WATCH_INTERVAL"] == {"Ref": "WatchIntervalSeconds"}
    # As deployed, the supervisor reads both.
    (deployed_container,) = deployed.resources[TASK_DEFINITION]["Properties"][
        "ContainerDefinitions"
    ]
    for variable in deployed_container["Environment"]:
        monkeypatch.setenv(variable["Name"], str(variable["Value"]))
    settings = CheckpointSettings()
    assert str(settings.checkpoint_url).startswith("https://")
    assert settings.watch_interval == 30


def test_the_slot_task_runs_as_many_threads_as_its_cpu(
    template: Template, deployed: Deployed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its extractions and capture size their threads by the task's CPU, not by the
    processors a Fargate task sees."""
    environment = {v["Name"]: v["Value"] for v in slot_container(template)["Environment"]}
    assert environment["SEEDKEEPER_CPU_UNITS"] == {"Ref": "SlotCpu"}
    (deployed_container,) = deployed.resources[TASK_DEFINITION]["Properties"][
        "ContainerDefinitions"
    ]
    for variable in deployed_container["Environment"]:
        monkeypatch.setenv(variable["Name"], str(variable["Value"]))
    assert TaskSettings().processors() == 2  # SlotCpu's default, 2048
    for units, processors in (("256", 1), ("1024", 1), ("1536", 2), ("4096", 4)):
        monkeypatch.setenv("SEEDKEEPER_CPU_UNITS", units)
        assert TaskSettings().processors() == processors
    monkeypatch.delenv("SEEDKEEPER_CPU_UNITS")
    assert TaskSettings().processors() is None  # a local stack: every processor


def test_every_reader_of_the_park_retention_is_given_the_parameter(template: Template) -> None:
    """The checkpoint function (a checkpoint's expiry, which a parked record's TTL follows,
    and a loss its task records) and the sweep (a loss it records) read the retention: each
    is given the parameter, never a default."""
    for name, properties in functions(template).items():
        if RetentionSettings not in READS[name]:
            continue
        variables = properties["Environment"]["Variables"]
        assert variables.get("SEEDKEEPER_PARK_RETENTION") == {"Ref": "ParkRetentionSeconds"}, name


# -- the checkpoint function and who may call it ---------------------------------------------


def test_the_checkpoint_function_has_an_aws_iam_url(template: Template) -> None:
    properties = template["Resources"][CHECKPOINT]["Properties"]
    assert properties["CodeUri"] == "functions/checkpoint/"
    assert properties["FunctionUrlConfig"] == {"AuthType": "AWS_IAM"}
    output = template["Outputs"]["CheckpointFunctionUrl"]
    assert output["Value"] == {"Fn::GetAtt": [f"{CHECKPOINT}Url", "FunctionUrl"]}


def references(value: Any) -> set[str]:
    """The logical ids a value refers to (Ref, GetAtt, Sub)."""
    if isinstance(value, Mapping):
        found: set[str] = set()
        for key, argument in value.items():
            if key == "Ref" and isinstance(argument, str):
                found.add(argument)
            elif key == "Fn::GetAtt":
                found.add(argument[0] if isinstance(argument, list) else argument.split(".")[0])
            elif key == "Fn::Sub" and isinstance(argument, str):
                found |= {name.split(".")[0] for name in re.findall(r"\$\{([^}!]+)\}", argument)}
            else:
                found |= references(argument)
        return found
    if isinstance(value, list):
        return set().union(*map(references, value)) if value else set()
    return set()


def test_no_resource_depends_on_itself_once_sam_has_translated_the_template() -> None:
    """CloudFormation refuses a stack whose references make a cycle (the task definition
    names the checkpoint function's URL, the function names the task role, the role's policy
    names the function...): none in what SAM makes of the template, which adds the URLs,
    the schedule and their permissions."""
    _, cloudformation, _ = translated()
    resources = cloudformation["Resources"]
    needs = {
        name: (references(resource) | set(as_list(resource.get("DependsOn", [])))) & set(resources)
        for name, resource in resources.items()
    }
    assert find_cycle(needs) is None


def find_cycle(needs: Mapping[str, set[str]]) -> list[str] | None:
    """A cycle of `needs` (each name → the names it needs), or None."""
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> list[str] | None:
        if state.get(name) == "done":
            return None
        if state.get(name) == "open":
            return [*path[path.index(name) :], name]
        state[name] = "open"
        for needed in sorted(needs.get(name, ())):
            cycle = visit(needed, [*path, name])
            if cycle is not None:
                return cycle
        state[name] = "done"
        return None

    for name in sorted(needs):
        cycle = visit(name, [])
        if cycle is not None:
            return cycle
    return None


def test_the_cycle_check_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_function_logs_to_a_log_group_of_its_own(template: Template) -> None:
    groups = []
    for name, properties in functions(template).items():
        reference = properties["LoggingConfig"]["LogGroup"]
        assert set(reference) == {"Ref"}, name
        group = template["Resources"][reference["Ref"]]
        assert group["Type"] == "AWS::Logs::LogGroup", name
        assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}, name
        assert group["DeletionPolicy"] == "Delete", name
        groups.append(reference["Ref"])
    assert len(set(groups)) == len(groups) == len(READS)
    assert functions(template)["checkpoint"]["LoggingConfig"] == {
        "LogGroup": {"Ref": "CheckpointLogGroup"}
    }


# -- operations: the sweep's dead letters, alarms, the dashboard ---------------------------

DEAD_LETTERS = "SweepDeadLetterQueue"
DASHBOARD = "OperationsDashboard"
ALARM_ACTIONS = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
# The reasons whose long retention raises an alarm.
LONG_RETAINED_REASONS = {"checkpoint-failed", "stop-failed", "task-unknown"}
# Clock of the sweep that renders the metrics: long after every test slot's idle deadline
# (beyond SEEDKEEPER_RETAINED_ALERT_AFTER's default hour).
LONG_AFTER = EXPIRED + 2 * 3600

Dimensions = dict[str, Any]


def alarms(template: Template) -> dict[str, dict[str, Any]]:
    """Every alarm's properties, by logical id."""
    return {
        name: resource["Properties"]
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
    }


def dimensions_of(alarm: Mapping[str, Any]) -> Dimensions:
    return {d["Name"]: d["Value"] for d in alarm.get("Dimensions", [])}


def alarms_on(template: Template, namespace: str, metric: str) -> list[dict[str, Any]]:
    return [
        alarm
        for alarm in alarms(template).values()
        if (alarm["Namespace"], alarm["MetricName"]) == (namespace, metric)
    ]


def test_the_sweep_schedule_retries_and_keeps_its_dead_letters(template: Template) -> None:
    events = functions(template)["idle_sweep"]["Events"]
    retry = events["Sweep"]["Properties"]["RetryPolicy"]
    assert retry["MaximumRetryAttempts"] >= 1  # every decision is fenced: a retry is safe
    # A delivery is given up before the next run is due, at the shortest rate allowed.
    shortest_rate = template["Parameters"]["SweepRateMinutes"]["MinValue"] * 60
    assert retry["MaximumEventAgeInSeconds"] < shortest_rate
    # The pools' runs are a minute apart: a missed one is the next one, never retried.
    assert events["Standbys"]["Properties"]["RetryPolicy"]["MaximumRetryAttempts"] == 0
    for event in events.values():
        schedule = event["Properties"]
        # The stack's own queue by its ARN, and no role of ours: SAM then generates the
        # schedule's role with sqs:SendMessage on exactly this queue.
        assert schedule["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [DEAD_LETTERS, "Arn"]}}
        assert "RoleArn" not in schedule
    queue = template["Resources"][DEAD_LETTERS]
    assert queue["Type"] == "AWS::SQS::Queue"
    assert queue["Properties"]["SqsManagedSseEnabled"] is True
    assert queue["Properties"]["MessageRetentionPeriod"] == 14 * 86_400
    (alarm,) = alarms_on(template, "AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert dimensions_of(alarm) == {"QueueName": {"Fn::GetAtt": [DEAD_LETTERS, "QueueName"]}}
    assert template["Outputs"]["SweepDeadLetterQueueUrl"]["Value"] == {"Ref": DEAD_LETTERS}


def test_every_alarm_fires_on_one_occurrence_and_notifies_the_topic_when_given(
    template: Template,
) -> None:
    """Each alarm watches for one occurrence (an error, a loss, a dead letter); no data is
    "nothing happened"; every one notifies AlarmTopicArn, or no one when it is empty."""
    assert template["Parameters"]["AlarmTopicArn"]["Default"] == ""
    assert template["Conditions"]["HasAlarmTopic"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]
    }
    assert alarms(template)
    for name, alarm in alarms(template).items():
        assert alarm["ComparisonOperator"] == "GreaterThanThreshold", name
        assert alarm["Threshold"] == 0, name
        assert alarm["TreatMissingData"] == "notBreaching", name
        assert alarm["AlarmActions"] == ALARM_ACTIONS, name
        assert "${AWS::StackName}" in alarm["AlarmName"]["Fn::Sub"], name


def test_every_function_has_an_errors_and_a_throttles_alarm(template: Template) -> None:
    """One alarm per function and metric, so its name says which function. The idle sweep's
    Errors alarm is the sweep's: a run that raised or timed out."""
    ids = sorted(function_ids(template).values())
    assert len(ids) == len(READS)
    for metric in ("Errors", "Throttles"):
        watching = alarms_on(template, "AWS/Lambda", metric)
        named = sorted(dimensions_of(alarm)["FunctionName"]["Ref"] for alarm in watching)
        assert named == ids, metric
        for alarm in watching:
            assert set(dimensions_of(alarm)) == {"FunctionName"}
            assert (alarm["Statistic"], alarm["EvaluationPeriods"]) == ("Sum", 1)


@dataclass
class TaskStates:
    """A runtime that answers each incarnation's state; the sweep's stops succeed but
    those of the `refused` incarnations."""

    states: dict[str, TaskState]
    refused: frozenset[str] = frozenset()

    def launch(self, plan: SlotPlan) -> str:
        return f"local:{plan.slot}:{plan.attempt}"  # a seed's: its slot's task

    def launch_standby(self, standby: Any) -> str:
        raise RuntimeUnavailable("RunTask started nothing (RESOURCE:ENI)")

    def status(self, incarnation: str) -> TaskStatus:
        raise AssertionError("the sweep asks a page's tasks in one batch")

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        return {incarnation: self.states.get(incarnation, UNKNOWN) for incarnation in incarnations}

    def launched_for(self, incarnation: str) -> Any:
        raise AssertionError("the sweep never asks what a task was launched for")

    def stop(self, incarnation: str) -> None:
        if incarnation in self.refused:
            raise RuntimeUnavailable("ThrottlingException", retryable=True)


@dataclass(frozen=True)
class Rendered:
    """What the code printed as EMF: each metric's (namespace, dimensions), every time."""

    metrics: dict[str, list[tuple[str, Dimensions]]]
    retained_reasons: set[str]  # as the code writes them (metric dimension, record)


@pytest.fixture
def rendered(
    template: Template,
    table: Table,
    lifecycle: Lifecycle,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Rendered:
    """The sweep and the checkpoint function run for real (moto's table) in their functions'
    environment as deployed: Powertools adds dimensions of its own from it (`service`).
    One slot for each thing the sweep counts; one checkpoint recorded failed."""
    for variable in [name for name in os.environ if name.startswith("POWERTOOLS_")]:
        monkeypatch.delenv(variable)
    for folder in ("idle_sweep", "checkpoint", "seed"):
        for variable, value in deploy().environment(folder).items():
            if variable.startswith("POWERTOOLS_"):
                monkeypatch.setenv(variable, value)
    running = TaskState(TaskStatus.RUNNING)
    rows = {
        "cold": (State.UNSEEDED, running),  # stopped
        "refused": (State.UNSEEDED, running),  # fenced, its stop refused (stop-failed)
        "asked": (State.SEEDED, running),  # asked to checkpoint
        "parked": (State.CHECKPOINTED, running),  # parked
        "gone": (State.SEEDED, TaskState.stopped("SpotInterruption", "interrupted")),  # lost
        "unknown": (State.SEEDED, UNKNOWN),  # retained (task-unknown), long past its deadline
        "failing": (State.CHECKPOINTING, running),  # its checkpoint fails first
    }
    incarnations = {slot: f"local:{slot}:1" for slot in rows}
    records = {slot: stored_in(lifecycle, slot, state) for slot, (state, _) in rows.items()}
    capsys.readouterr()
    failing = records["failing"]
    (op,) = [e.ref for e in failing.window.entries if e.kind is OpKind.CHECKPOINT]
    checkpoints = CheckpointService(
        lifecycle=lifecycle,
        r2=None,
        settings=RetentionSettings(),
        presign_expiry=600,
        clock=lambda: EXPIRED,
    )
    failed = NotTaken(
        slot=failing.slot,
        incarnation=incarnations["failing"],
        op=CheckpointOp(ordinal=op.ordinal, generation=op.generation),
        reason="capture-timeout",
    )
    caller = Caller(task_id(incarnations["failing"]))  # the failing slot's own task
    assert isinstance(checkpoints.not_taken(failed, caller), CheckpointNotTaken)
    after = lifecycle.read(failing.slot)
    assert isinstance(after, Supported)
    failed_reason = after.record.retained_reason
    assert failed_reason is not None
    runtime = TaskStates(
        {incarnations[slot]: task for slot, (_, task) in rows.items()},
        refused=frozenset({incarnations["refused"]}),
    )
    Sweeper(
        index=SweepIndex(table),
        lifecycle=lifecycle,
        runtime=lambda: runtime,
        snapshots=None,
        r2=None,
        settings=SweepSettings(),
        retention=RetentionSettings(),
        clock=lambda: LONG_AFTER,
        # One failed checkpoint's backoff (60 s) is as long as the failing slot must fail.
        retained_alert_after=retry_after(1),
    ).sweep()
    # A seed finding no free standby (it launches), and a standby that does not start.
    pools = PoolSettings(pool=1)
    SeedService(
        lifecycle=lifecycle,
        snapshots=SnapshotStore(table),
        r2=None,
        runtime=lambda: runtime,
        settings=SeedSettings(),
        clock=lambda: LONG_AFTER,
        standbys=StandbyStore(table),
        pools=pools,
    ).seed(SeedRequest(slot="cold-seed", seed=None))
    StandbyPool(
        standbys=StandbyStore(table),
        snapshots=SnapshotStore(table),
        runtime=lambda: runtime,
        settings=pools,
        clock=lambda: LONG_AFTER,
    ).tend()
    metrics: dict[str, list[tuple[str, Dimensions]]] = {}
    for line in capsys.readouterr().out.splitlines():
        if '"_aws"' not in line:
            continue  # a log line
        document = json.loads(line)
        (directive,) = document["_aws"]["CloudWatchMetrics"]
        (names,) = directive["Dimensions"]
        for metric in directive["Metrics"]:
            dimensions = {name: document[name] for name in names}
            metrics.setdefault(metric["Name"], []).append((directive["Namespace"], dimensions))
    retained = {dimensions["reason"] for _, dimensions in metrics.get("SlotsRetained", [])}
    return Rendered(metrics, retained | {failed_reason})


def same_shape(watched: Dimensions, emitted: Dimensions, reasons: set[str]) -> bool:
    """The same dimension names, the same values but for `reason`, a real reason token."""
    if set(watched) != set(emitted):
        return False
    fixed = {name for name in watched if name != "reason"}
    if any(watched[name] != emitted[name] for name in fixed):
        return False
    return "reason" not in watched or watched["reason"] in reasons


def test_the_alarms_watch_our_metrics_exactly_as_the_code_emits_them(
    template: Template, rendered: Rendered
) -> None:
    """An alarm on a namespace, a name or a dimension set never emitted never fires. Each
    alarm on our metrics names what the code prints (the `service` dimension Powertools
    adds included), and its reason is one the code writes."""
    assert rendered.retained_reasons >= LONG_RETAINED_REASONS
    ours = [a for a in alarms(template).values() if a["Namespace"] == METRICS_NAMESPACE]
    for alarm in ours:
        emitted = rendered.metrics[alarm["MetricName"]]
        assert {namespace for namespace, _ in emitted} == {METRICS_NAMESPACE}
        assert any(
            same_shape(dimensions_of(alarm), dimensions, rendered.retained_reasons)
            for _, dimensions in emitted
        ), alarm["MetricName"]
    watched = {(a["MetricName"], dimensions_of(a).get("reason")) for a in ours}
    assert watched == {
        ("SlotsLost", None),
        *(("SlotsRetainedLong", reason) for reason in LONG_RETAINED_REASONS),
        ("StandbyPoolEmpty", None),
        ("StandbyStartFailures", None),
    }
    # Each alarm's own series is emitted, its reason included: none waits for nothing.
    emitted_series = {
        (name, dimensions.get("reason"))
        for name, series in rendered.metrics.items()
        for _, dimensions in series
    }
    assert watched <= emitted_series


def test_the_comparison_catches_an_alarm_that_would_never_fire(rendered: Rendered) -> None:
    """The check above fails on the mistakes it exists for."""
    ((_, lost), *_) = rendered.metrics["SlotsLost"]
    assert not same_shape({}, lost, rendered.retained_reasons)  # `service` forgotten
    ((_, long), *_) = rendered.metrics["SlotsRetainedLong"]
    reasons = rendered.retained_reasons
    assert same_shape(long, long, reasons)
    assert not same_shape({"reason": long["reason"]}, long, reasons)
    assert not same_shape(long | {"service": "another"}, long, reasons)
    assert not same_shape(long | {"reason": "checkpoint_failed"}, long, reasons)


SEARCH = re.compile(r"SEARCH\('\{([^}]*)\} MetricName=\"(\w+)\"', '\w+', \d+\)")


def dashboard(template: Template) -> dict[str, Any]:
    """The dashboard's body, every `${...}` replaced by its name: valid JSON or not."""
    body = template["Resources"][DASHBOARD]["Properties"]["DashboardBody"]["Fn::Sub"]
    placeholders = set(re.findall(r"\$\{([^}]+)\}", body))
    declared = set(template["Resources"]) | set(template["Parameters"]) | {"AWS::Region"}
    assert {name.split(".")[0] for name in placeholders} <= declared
    shown: dict[str, Any] = json.loads(re.sub(r"\$\{([^}]+)\}", r"\1", body))
    return shown


def dashboard_metrics(template: Template) -> list[tuple[str, str, Dimensions | set[str]]]:
    """(namespace, metric, dimensions) of every line drawn: the dimensions themselves, or
    for a SEARCH the dimension names it draws one line per value of."""
    found: list[tuple[str, str, Dimensions | set[str]]] = []
    for widget in dashboard(template)["widgets"]:
        assert widget["properties"]["region"] == "AWS::Region"
        for line in widget["properties"]["metrics"]:
            if "expression" in line[0]:
                match = SEARCH.fullmatch(line[0]["expression"])
                assert match is not None, line
                namespace, *names = match.group(1).split(",")
                found.append((namespace, match.group(2), set(names)))
            else:
                namespace, metric, *pairs = [item for item in line if isinstance(item, str)]
                found.append((namespace, metric, dict(zip(pairs[::2], pairs[1::2], strict=True))))
    return found


def test_the_dashboard_draws_every_metric_we_emit_as_emitted(
    template: Template, rendered: Rendered
) -> None:
    """Every metric the code emits is on the dashboard, per reason where it has one (a
    SEARCH over the reason: a new reason appears by itself), with the dimensions emitted."""
    drawn = [
        (metric, dims)
        for ns, metric, dims in dashboard_metrics(template)
        if ns == METRICS_NAMESPACE
    ]
    assert {metric for metric, _ in drawn} == set(rendered.metrics)
    for metric, dimensions in drawn:
        emitted = [d for _, d in rendered.metrics[metric]]
        if isinstance(dimensions, set):
            assert "reason" in dimensions, metric
            assert all(set(d) == dimensions for d in emitted), metric
        else:
            assert all(d == dimensions for d in emitted), metric
    for metric in ("SlotsRetained", "SlotsRetainedLong", "CheckpointsFailed"):
        assert (metric, {"reason", "service"}) in drawn


def test_the_dashboard_draws_every_functions_errors_throttles_and_the_dead_letters(
    template: Template,
) -> None:
    drawn = dashboard_metrics(template)
    ids = sorted(function_ids(template).values())
    for metric in ("Errors", "Throttles"):
        named = sorted(
            dims["FunctionName"]
            for namespace, name, dims in drawn
            if (namespace, name) == ("AWS/Lambda", metric) and isinstance(dims, dict)
        )
        assert named == ids, metric
    assert (
        "AWS/SQS",
        "ApproximateNumberOfMessagesVisible",
        {"QueueName": f"{DEAD_LETTERS}.QueueName"},
    ) in drawn
    assert template["Outputs"]["OperationsDashboardName"]["Value"] == {"Ref": DASHBOARD}
