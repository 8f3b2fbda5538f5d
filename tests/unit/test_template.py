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
from seedkeeper.adapters.r2 import R2Settings, transfer_mode
from seedkeeper.adapters.runtime import RuntimeSettings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.checkpoints import RetentionSettings, retry_after
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.outcomes import CheckpointNotTaken
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import State, Supported
from seedkeeper.domain.runtime import UNKNOWN, TaskState, TaskStatus
from seedkeeper.observability import METRICS_NAMESPACE
from seedkeeper.services.checkpoints import CheckpointOp, CheckpointService, NotTaken
from seedkeeper.services.seed import SeedSettings
from seedkeeper.services.sweep import Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper.store.sweep_index import SweepIndex
from seedkeeper_task.settings import CheckpointSettings, TaskSettings
from seedkeeper_tools.infra import TABLE_RESOURCE, TEMPLATE, load_template, table_properties

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
    "seed": (StoreSettings, R2Settings, RuntimeSettings, SeedSettings),
    "receipt": (StoreSettings, R2Settings),
    "slot_evidence": (StoreSettings, R2Settings),
    "rotation": (StoreSettings, R2Settings),
    "checkpoint": (StoreSettings, R2Settings, RetentionSettings),
    "idle_sweep": (StoreSettings, R2Settings, RuntimeSettings, SweepSettings),
}
SLOT_TASK_READS: tuple[type[BaseSettings], ...] = (
    StoreSettings,
    TaskSettings,
    CheckpointSettings,
    RetentionSettings,  # a lost slot's record is kept as long as a park would be
)
WITH_URL = {"seed", "receipt", "slot_evidence", "rotation", "checkpoint"}
NEVER_TOUCH_THE_RUNTIME = {"receipt", "slot_evidence", "checkpoint"}
# The one function a slot task may call (through its URL), and the one principal that may.
CHECKPOINT = "CheckpointFunction"
TASK_ROLE = "SlotTaskRole"

# Least privilege on the table, pinned: which actions each principal has, on the table
# itself or on the sweep's index. (Transactions have no IAM action of their own: each
# item needs PutItem, DeleteItem, UpdateItem or ConditionCheckItem.)
TABLE_ACCESS: dict[str, set[tuple[str, str]]] = {
    "SeedFunction": {
        ("dynamodb:GetItem", "table"),
        ("dynamodb:PutItem", "table"),
        ("dynamodb:UpdateItem", "table"),
        ("dynamodb:ConditionCheckItem", "table"),
        ("dynamodb:Query", "table"),
    },
    "ReceiptFunction": {("dynamodb:GetItem", "table")},
    "SlotEvidenceFunction": {("dynamodb:GetItem", "table")},
    # Reads the record, then records the checkpoint or its failure (conditional updates).
    "CheckpointFunction": {("dynamodb:GetItem", "table"), ("dynamodb:UpdateItem", "table")},
    "RotationFunction": {
        ("dynamodb:Query", "table"),
        ("dynamodb:PutItem", "table"),
        ("dynamodb:DeleteItem", "table"),
        ("dynamodb:ConditionCheckItem", "table"),
    },
    "IdleSweepFunction": {
        ("dynamodb:Query", "index"),
        ("dynamodb:GetItem", "table"),
        ("dynamodb:PutItem", "table"),
        ("dynamodb:UpdateItem", "table"),
        ("dynamodb:DeleteItem", "table"),
        ("dynamodb:Query", "table"),
    },
    "SlotTaskRole": {
        ("dynamodb:GetItem", "table"),
        ("dynamodb:PutItem", "table"),  # a resumed settle's debt, slot items only
        ("dynamodb:UpdateItem", "table"),
        ("dynamodb:Query", "table"),
    },
    "SlotTaskExecutionRole": set(),
}
TABLE_ARN = {"Fn::GetAtt": [TABLE_RESOURCE, "Arn"]}
INDEX_ARN = {"Fn::Sub": f"${{{TABLE_RESOURCE}.Arn}}/index/{INDEX}"}

# Values for the stack's parameters and resources, to resolve what the template sets.
SAMPLE_VALUES: dict[str, Any] = {
    "R2AccountId": "0123456789abcdef0123456789abcdef",
    "R2Bucket": "seedkeeper-backups",
    "R2SecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:seedkeeper/r2-AbCdEf",
    "SlotImage": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/seedkeeper-slot:1",
    "SubnetIds": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"],
    "SecurityGroupIds": ["sg-0123456789abcdef0"],
    "AWS::StackName": "seedkeeper",
    "AWS::Region": "eu-west-1",
    TABLE_RESOURCE: "seedkeeper-LifecycleTable-1A2B3C",
    "SlotCluster": "seedkeeper-SlotCluster-1A2B3C",
    TASK_DEFINITION: "arn:aws:ecs:eu-west-1:123456789012:task-definition/seedkeeper-slot:1",
    "SlotLogGroup": "seedkeeper-SlotLogGroup-1A2B3C",
    "CheckpointFunctionUrl.FunctionUrl": "https://abcdefghij.lambda-url.eu-west-1.on.aws/",
}


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


def _documents(template: Template, policies: list[Any]) -> Iterator[Mapping[str, Any]]:
    """A function's policy documents: inline documents or managed policies of this template,
    nothing else (no AWS managed policy, no SAM policy template with its broad grants)."""
    for policy in (branch for entry in policies for branch in _branches(entry)):
        if isinstance(policy, Mapping) and set(policy) == {"Ref"}:
            managed = template["Resources"][policy["Ref"]]
            assert managed["Type"] == "AWS::IAM::ManagedPolicy"
            yield managed["Properties"]["PolicyDocument"]
        else:
            assert isinstance(policy, Mapping), f"not an inline policy: {policy!r}"
            assert "Statement" in policy, f"not an inline policy: {policy!r}"
            yield policy


def statements(template: Template) -> dict[str, list[Statement]]:
    """Every principal's statements: the functions' roles and the template's own roles."""
    found: dict[str, list[Statement]] = {}
    for name, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::Serverless::Function":
            documents = list(_documents(template, properties.get("Policies", [])))
        elif resource["Type"] == "AWS::IAM::Role":
            assert "ManagedPolicyArns" not in properties, name
            documents = [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
        else:
            continue
        found[name] = [
            statement
            for document in documents
            for entry in document["Statement"]
            for statement in _branches(entry)
        ]
    return found


def table_access(statement: Statement) -> set[tuple[str, str]]:
    """What a statement grants on the table: (action, "table" or "index")."""
    places = {json.dumps(TABLE_ARN): "table", json.dumps(INDEX_ARN): "index"}
    granted = set()
    for resource in as_list(statement["Resource"]):
        place = places.get(json.dumps(resource))
        if place is not None:
            granted |= {(action, place) for action in as_list(statement["Action"])}
    return granted


def resolve(value: Any, values: Mapping[str, Any]) -> Any:
    """Evaluate the intrinsics the template uses in environments, with `values` for
    parameters, pseudo parameters and resources."""
    if isinstance(value, Mapping) and len(value) == 1:
        ((intrinsic, argument),) = value.items()
        if intrinsic == "Ref":
            return values[argument]
        if intrinsic == "Fn::GetAtt":
            return values[".".join(argument)]
        if intrinsic == "Fn::Join":
            separator, items = argument
            return separator.join(str(resolve(item, values)) for item in resolve(items, values))
        if intrinsic == "Fn::Sub":
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(values[m.group(1)]), argument)
    if isinstance(value, list):
        return [resolve(item, values) for item in value]
    return value


def sample_values(template: Template) -> dict[str, Any]:
    defaults = {
        name: parameter["Default"]
        for name, parameter in template["Parameters"].items()
        if "Default" in parameter
    }
    return defaults | SAMPLE_VALUES


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


def test_the_outputs_give_each_url_the_table_and_the_cluster(template: Template) -> None:
    values = [output["Value"] for output in template["Outputs"].values()]
    ids = function_ids(template)
    for name in WITH_URL:
        assert {"Fn::GetAtt": [f"{ids[name]}Url", "FunctionUrl"]} in values, name
    assert {"Ref": TABLE_RESOURCE} in values
    assert {"Ref": "SlotCluster"} in values


def test_the_sweep_runs_on_its_schedule(template: Template) -> None:
    sweep = functions(template)["idle_sweep"]
    (event,) = sweep["Events"].values()
    assert event["Type"] == "ScheduleV2"
    values = sample_values(template)
    expression = resolve(event["Properties"]["ScheduleExpression"], values)
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


# -- least privilege --------------------------------------------------------------------


def test_no_statement_grants_a_wildcard_action(template: Template) -> None:
    for name, granted in statements(template).items():
        for statement in granted:
            for action in as_list(statement["Action"]):
                assert "*" not in action, f"{name}: {action}"


def test_table_statements_name_only_the_table_and_its_index(template: Template) -> None:
    for name, granted in statements(template).items():
        for statement in granted:
            actions = as_list(statement["Action"])
            resources = [json.dumps(resource) for resource in as_list(statement["Resource"])]
            on_table = any(TABLE_RESOURCE in resource for resource in resources)
            if on_table or any(action.startswith("dynamodb:") for action in actions):
                assert set(resources) <= {json.dumps(TABLE_ARN), json.dumps(INDEX_ARN)}, name
                assert all(action.startswith("dynamodb:") for action in actions), name


def test_each_principal_has_exactly_its_table_actions(template: Template) -> None:
    granted = {
        name: set().union(*(table_access(statement) for statement in principal))
        for name, principal in statements(template).items()
    }
    # Every principal the template declares is pinned here.
    assert granted == TABLE_ACCESS


def test_receipt_and_evidence_never_touch_the_runtime(template: Template) -> None:
    ids = function_ids(template)
    granted = statements(template)
    for name in NEVER_TOUCH_THE_RUNTIME:
        actions = {a for s in granted[ids[name]] for a in as_list(s["Action"])}
        assert not {a for a in actions if a.startswith("ecs:") or a == "iam:PassRole"}, name
        variables = functions(template)[name]["Environment"]["Variables"]
        assert not env_names(RuntimeSettings) & set(variables), name


def test_ecs_permissions_are_scoped_to_the_task_definition_cluster_and_roles(
    template: Template,
) -> None:
    ids = function_ids(template)
    granted = statements(template)
    account = "arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}"
    cluster_tasks = {"Fn::Sub": account + ":task/${SlotCluster}/*"}
    ecs_or_pass = {
        name: {
            action: as_list(statement["Resource"])
            for statement in granted[ids[name]]
            for action in as_list(statement["Action"])
            if action.startswith("ecs:") or action == "iam:PassRole"
        }
        for name in ("seed", "idle_sweep")
    }
    assert ecs_or_pass["seed"] == {
        "ecs:RunTask": [{"Ref": TASK_DEFINITION}],
        "ecs:DescribeTasks": [cluster_tasks],
        "iam:PassRole": [
            {"Fn::GetAtt": ["SlotTaskExecutionRole", "Arn"]},
            {"Fn::GetAtt": ["SlotTaskRole", "Arn"]},
        ],
    }
    assert ecs_or_pass["idle_sweep"] == {
        "ecs:DescribeTasks": [cluster_tasks],
        "ecs:StopTask": [cluster_tasks],
    }
    for statement in granted[ids["seed"]]:
        if statement["Action"] == "iam:PassRole":
            assert statement["Condition"] == {
                "StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}
            }
        if statement["Action"] == "ecs:RunTask":
            assert statement["Condition"] == {
                "ArnEquals": {"ecs:cluster": {"Fn::GetAtt": ["SlotCluster", "Arn"]}}
            }


def test_the_r2_secret_is_the_only_secret_read_and_only_when_configured(
    template: Template,
) -> None:
    for name, granted in statements(template).items():
        for statement in granted:
            actions = as_list(statement["Action"])
            if any(action.startswith("secretsmanager:") for action in actions):
                assert actions == ["secretsmanager:GetSecretValue"], name
                assert statement["Resource"] == {"Ref": "R2SecretArn"}, name
    policy = template["Resources"]["R2SecretRead"]
    assert policy["Condition"] == "HasR2Secret"
    assert template["Conditions"]["HasR2Secret"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "R2SecretArn"}, ""]}]
    }
    for properties in functions(template).values():
        assert {"Fn::If": ["HasR2Secret", {"Ref": "R2SecretRead"}, {"Ref": "AWS::NoValue"}]} in (
            properties["Policies"]
        )


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


def test_the_environment_configures_each_function_as_deployed(
    template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolved with sample parameters, each function's environment validates, names the
    table, presigns through R2, and gives the runtimes an ECS configuration: subnets and
    security groups arrive as the JSON lists pydantic-settings parses."""
    values = sample_values(template)
    for name, properties in functions(template).items():
        with monkeypatch.context() as scoped:
            for variable, value in properties["Environment"]["Variables"].items():
                scoped.setenv(variable, str(resolve(value, values)))
            assert StoreSettings().table == values[TABLE_RESOURCE], name
            assert transfer_mode(R2Settings()).mode == "presigned", name
            if RuntimeSettings not in READS[name]:
                continue
            runtime = RuntimeSettings()
            assert runtime.runtime == "ecs"
            assert runtime.cluster == values["SlotCluster"]
            assert runtime.task_definition == values[TASK_DEFINITION]
            assert runtime.subnets == tuple(values["SubnetIds"])
            assert runtime.security_groups == tuple(values["SecurityGroupIds"])
            assert runtime.assign_public_ip is False
            if name == "seed":
                seed = SeedSettings()
                assert seed.idle_window == 1800


def test_without_r2_parameters_the_functions_run_cold(
    template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = sample_values(template) | {"R2AccountId": "", "R2Bucket": "", "R2SecretArn": ""}
    for variable, value in functions(template)["receipt"]["Environment"]["Variables"].items():
        monkeypatch.setenv(variable, str(resolve(value, values)))
    assert transfer_mode(R2Settings()).mode == "unconfigured"


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


def test_the_parameters_the_issue_lists_exist(template: Template) -> None:
    parameters = template["Parameters"]
    for name in (
        "R2AccountId",
        "R2Bucket",
        "R2SecretArn",
        "SubnetIds",
        "SecurityGroupIds",
        "IdleWindowSeconds",
        "ParkRetentionSeconds",
        "WatchIntervalSeconds",
        "SweepRateMinutes",
        "EphemeralStorageGiB",
        "SlotImage",
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
    assert container["Image"] == {"Ref": "SlotImage"}
    assert {"Name": "SEEDKEEPER_TABLE", "Value": {"Ref": TABLE_RESOURCE}} in container[
        "Environment"
    ]
    logs = container["LogConfiguration"]
    assert logs["LogDriver"] == "awslogs"
    assert logs["Options"]["awslogs-group"] == {"Ref": "SlotLogGroup"}
    log_group = template["Resources"]["SlotLogGroup"]["Properties"]
    assert log_group["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_cfn_lint_finds_nothing() -> None:
    """The template as CloudFormation's own linter reads it (no network: specs ship with it)."""
    findings = [m for m in lint_all(TEMPLATE.read_text()) if m.rule.id[0] in "EW"]
    assert findings == []  # errors and warnings; informational hints are not findings


def test_the_slot_task_is_told_where_to_checkpoint_and_how_often_to_look(
    template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = {v["Name"]: v["Value"] for v in slot_container(template)["Environment"]}
    assert environment["SEEDKEEPER_CHECKPOINT_URL"] == {
        "Fn::GetAtt": [f"{CHECKPOINT}Url", "FunctionUrl"]
    }
    assert environment["SEEDKEEPER_WATCH_INTERVAL"] == {"Ref": "WatchIntervalSeconds"}
    # Resolved as deployed, the supervisor reads both.
    values = sample_values(template)
    for name, value in environment.items():
        monkeypatch.setenv(name, str(resolve(value, values)))
    settings = CheckpointSettings()
    assert str(settings.checkpoint_url).startswith("https://")
    assert settings.watch_interval == 30


def test_every_reader_of_the_park_retention_is_given_the_parameter(template: Template) -> None:
    """The checkpoint function (a checkpoint's expiry, which a parked record's TTL follows)
    reads the retention: it is given the parameter, never a default."""
    for name, properties in functions(template).items():
        if RetentionSettings not in READS[name]:
            continue
        variables = properties["Environment"]["Variables"]
        assert variables.get("SEEDKEEPER_PARK_RETENTION") == {"Ref": "ParkRetentionSeconds"}, name


# -- the checkpoint function and who may call it ---------------------------------------------


def lambda_statements(template: Template) -> dict[str, list[Statement]]:
    """Every principal's statements that grant a Lambda action."""
    return {
        name: [
            statement
            for statement in granted
            if any(action.startswith("lambda:") for action in as_list(statement["Action"]))
        ]
        for name, granted in statements(template).items()
    }


def test_the_checkpoint_function_has_an_aws_iam_url(template: Template) -> None:
    properties = template["Resources"][CHECKPOINT]["Properties"]
    assert properties["CodeUri"] == "functions/checkpoint/"
    assert properties["FunctionUrlConfig"] == {"AuthType": "AWS_IAM"}
    output = template["Outputs"]["CheckpointFunctionUrl"]
    assert output["Value"] == {"Fn::GetAtt": [f"{CHECKPOINT}Url", "FunctionUrl"]}


def test_the_slot_task_may_invoke_the_checkpoint_function_and_nothing_else(
    template: Template,
) -> None:
    function = {"Fn::GetAtt": [CHECKPOINT, "Arn"]}
    granted = lambda_statements(template)
    # Only the task role calls a function; the executor's principal lives outside the stack.
    assert {name for name, found in granted.items() if found} == {TASK_ROLE}
    by_action = {
        action: statement
        for statement in granted[TASK_ROLE]
        for action in as_list(statement["Action"])
    }
    # Function URLs created since October 2025 need both actions.
    assert set(by_action) == {"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"}
    for statement in by_action.values():
        assert statement["Effect"] == "Allow"
        assert as_list(statement["Resource"]) == [function]
    assert by_action["lambda:InvokeFunctionUrl"]["Condition"] == {
        "StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}
    }
    # Only through the URL: the role cannot invoke the function directly.
    assert by_action["lambda:InvokeFunction"]["Condition"] == {
        "Bool": {"lambda:InvokedViaFunctionUrl": "true"}
    }


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


def test_the_checkpoint_function_needs_nothing_of_the_slot_task(template: Template) -> None:
    """The task definition names the function's URL and the task role its ARN: the function
    naming either would be a cycle CloudFormation refuses."""
    resources = template["Resources"]
    named = references(resources[CHECKPOINT])
    named |= set().union(*(references(resources[name]) for name in named if name in resources))
    assert not named & {TASK_ROLE, TASK_DEFINITION, "SlotTaskExecutionRole", "SeedFunction"}


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


def test_the_slot_task_puts_only_slot_items(template: Template) -> None:
    """The task writes a resumed settle's debt beside its slot record, nothing else: a
    PutItem that could name a resident's key could forge a snapshot record."""
    puts = [
        statement
        for statement in statements(template)[TASK_ROLE]
        if "dynamodb:PutItem" in as_list(statement["Action"])
    ]
    assert [statement["Condition"] for statement in puts] == [
        {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["SLOT#*"]}}
    ]


EXECUTOR_FUNCTIONS = ("seed", "receipt", "slot_evidence", "rotation")


def test_the_executor_policy_grants_both_actions_on_the_executors_urls_only(
    template: Template,
) -> None:
    """Function URLs created since October 2025 take a call only from a principal with both
    `lambda:InvokeFunctionUrl` and `lambda:InvokeFunction`: the shipped policy has exactly
    those, on the executor's four functions, the second only through their URLs; never the
    checkpoint function (the slot task's)."""
    policy = template["Resources"]["ExecutorPolicy"]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy"
    ids = function_ids(template)
    functions_ = [{"Fn::GetAtt": [ids[name], "Arn"]} for name in EXECUTOR_FUNCTIONS]
    by_action = {
        action: statement
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        for action in as_list(statement["Action"])
    }
    assert set(by_action) == {"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"}
    for statement in by_action.values():
        assert statement["Effect"] == "Allow"
        assert as_list(statement["Resource"]) == functions_
    assert by_action["lambda:InvokeFunctionUrl"]["Condition"] == {
        "StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}
    }
    assert by_action["lambda:InvokeFunction"]["Condition"] == {
        "Bool": {"lambda:InvokedViaFunctionUrl": "true"}
    }
    outputs = template["Outputs"]
    assert outputs["ExecutorPolicyArn"]["Value"] == {"Ref": "ExecutorPolicy"}
    for name, function in zip(EXECUTOR_FUNCTIONS, functions_, strict=True):
        output = "".join(part.capitalize() for part in name.split("_")) + "FunctionArn"
        assert outputs[output]["Value"] == function, output


def test_nothing_else_lets_the_slot_task_invoke_a_function(template: Template) -> None:
    """Besides its own two statements, nothing widens what the task role may invoke: no
    function's resource policy, no policy attached to the role from elsewhere, and every
    Lambda grant in the stack names functions by their ARNs, never "*"."""
    resources = template["Resources"]
    # Function URLs are AWS_IAM: callers are granted by their identity policies, never by a
    # resource policy that could name the task role (or everyone).
    assert [r for r in resources.values() if r["Type"] == "AWS::Lambda::Permission"] == []
    for name, resource in resources.items():
        if resource["Type"] in {"AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"}:
            assert TASK_ROLE not in json.dumps(resource["Properties"].get("Roles", [])), name
    assert "ManagedPolicyArns" not in resources[TASK_ROLE]["Properties"]
    managed = [
        resource["Properties"]["PolicyDocument"]["Statement"]
        for resource in resources.values()
        if resource["Type"] == "AWS::IAM::ManagedPolicy"
    ]
    for statement in (s for granted in [*statements(template).values(), *managed] for s in granted):
        if any(action.startswith("lambda:") for action in as_list(statement["Action"])):
            for resource in as_list(statement["Resource"]):
                assert set(resource) == {"Fn::GetAtt"}, resource  # one function's ARN


# -- operations: the sweep's dead letters, alarms, the dashboard ---------------------------

DEAD_LETTERS = "SweepDeadLetterQueue"
DASHBOARD = "OperationsDashboard"
ALARM_ACTIONS = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
# The reasons whose long retention raises an alarm (the issue's two).
LONG_RETAINED_REASONS = {"checkpoint-failed", "task-unknown"}
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
    (event,) = functions(template)["idle_sweep"]["Events"].values()
    schedule = event["Properties"]
    retry = schedule["RetryPolicy"]
    assert retry["MaximumRetryAttempts"] >= 1  # every decision is fenced: a retry is safe
    # A delivery is given up before the next run is due, at the shortest rate allowed.
    shortest_rate = template["Parameters"]["SweepRateMinutes"]["MinValue"] * 60
    assert retry["MaximumEventAgeInSeconds"] < shortest_rate
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
    """A runtime that answers each incarnation's state; the sweep's stops succeed."""

    states: dict[str, TaskState]

    def launch(self, plan: SlotPlan) -> str:
        raise AssertionError("the sweep never launches")

    def status(self, incarnation: str) -> TaskStatus:
        raise AssertionError("the sweep asks a page's tasks in one batch")

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        return {incarnation: self.states[incarnation] for incarnation in incarnations}

    def stop(self, incarnation: str) -> None:
        pass


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
    values = sample_values(template)
    for variable in [name for name in os.environ if name.startswith("POWERTOOLS_")]:
        monkeypatch.delenv(variable)
    for folder in ("idle_sweep", "checkpoint"):
        for variable, value in functions(template)[folder]["Environment"]["Variables"].items():
            if variable.startswith("POWERTOOLS_"):
                monkeypatch.setenv(variable, str(resolve(value, values)))
    running = TaskState(TaskStatus.RUNNING)
    rows = {
        "cold": (State.UNSEEDED, running),  # stopped
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
    assert isinstance(checkpoints.not_taken(failed), CheckpointNotTaken)
    after = lifecycle.read(failing.slot)
    assert isinstance(after, Supported)
    failed_reason = after.record.retained_reason
    assert failed_reason is not None
    runtime = TaskStates({incarnations[slot]: task for slot, (_, task) in rows.items()})
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
