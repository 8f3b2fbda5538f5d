"""template.yaml: the table DESIGN §3 describes, and the rest of the deployment held to
what the code reads and to least privilege, so the template cannot drift from either."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from cfnlint.api import lint_all
from pydantic_settings import BaseSettings

from seedkeeper.adapters.r2 import R2Settings, transfer_mode
from seedkeeper.adapters.runtime import RuntimeSettings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.services.seed import SeedSettings
from seedkeeper.services.sweep import SweepSettings
from seedkeeper_task.supervisor import TaskSettings
from seedkeeper_task.watch import CheckpointSettings
from seedkeeper_tools.infra import TABLE_RESOURCE, TEMPLATE, load_template, table_properties

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
        {"AttributeName": "sweep", "KeyType": "HASH"},
        {"AttributeName": "idle_deadline", "KeyType": "RANGE"},
    ]
    types = {d["AttributeName"]: d["AttributeType"] for d in properties["AttributeDefinitions"]}
    assert types == {"PK": "S", "SK": "S", "sweep": "S", "idle_deadline": "N"}


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
    # pydantic-core is compiled: the layer must be built for the functions' architecture.
    assert layer["Metadata"] == {"BuildMethod": "python3.13", "BuildArchitecture": "arm64"}
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
