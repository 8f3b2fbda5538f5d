"""What each principal of the deployed stack may and must never do, evaluated as AWS
evaluates it (tests/iam: template.yaml translated by SAM's translator, its policies decided by
IAM's evaluation logic, conditions included).

The rest of the suite proves that every call the code makes is allowed (tests/iam/plugin.py):
these rows are what no test's code does, either because it is the deployment's own part
(logs, the image pull, a schedule) or because it must never happen."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

from iam.deployed import ACCOUNT, PARTITION, REGION, Deployed, Principal, deploy
from iam.evaluator import Evaluator, Request

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FUNCTIONS = ("seed", "receipt", "slot_evidence", "rotation", "checkpoint", "idle_sweep")
EXECUTORS = ("seed", "receipt", "slot_evidence", "rotation")
READ_ONLY = ("receipt", "slot_evidence")
ITEM_WRITES = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
ITEM_ACTIONS = ("dynamodb:GetItem", *ITEM_WRITES, "dynamodb:ConditionCheckItem", "dynamodb:Query")
# A partition of each kind the table holds (DESIGN §3).
RESIDENT, BACKUP, SLOT, CURSOR, STANDBY = (
    "RESIDENT#acme-widgets",
    "BACKUP#checkout-0001",
    "SLOT#slot-1",
    "SWEEP",
    "STANDBY#*",
)


@pytest.fixture(scope="module")
def deployed() -> Deployed:
    return deploy()


@pytest.fixture(scope="module")
def evaluator(deployed: Deployed) -> Iterator[Evaluator]:
    evaluating = Evaluator(deployed)
    yield evaluating
    evaluating.close()


def keys(*values: str) -> dict[str, list[str]]:
    return {"dynamodb:LeadingKeys": list(values)}


def log_stream(deployed: Deployed, group: str) -> str:
    name = deployed.ref(group)
    return f"arn:{PARTITION}:logs:{REGION}:{ACCOUNT}:log-group:{name}:log-stream:2026/12/04/abc"


def via_url(deployed: Deployed, principal: str, function: str) -> list[Request]:
    arn = deployed.url_target(function)
    return [
        Request(
            principal, "lambda:InvokeFunctionUrl", arn, {"lambda:FunctionUrlAuthType": "AWS_IAM"}
        ),
        Request(principal, "lambda:InvokeFunction", arn, {"lambda:InvokedViaFunctionUrl": "true"}),
    ]


LOG_GROUPS = {
    "seed": "SeedLogGroup",
    "receipt": "ReceiptLogGroup",
    "slot_evidence": "SlotEvidenceLogGroup",
    "rotation": "RotationLogGroup",
    "checkpoint": "CheckpointLogGroup",
    "idle_sweep": "IdleSweepLogGroup",
}


def must(deployed: Deployed) -> list[Request]:
    """What the deployment itself needs, which no test's code does."""
    rows: list[Request] = []
    for function in FUNCTIONS:
        stream = log_stream(deployed, LOG_GROUPS[function])
        role = deployed.roles[function]
        rows += [
            Request(role, f"logs:{action}", stream)
            for action in ("CreateLogStream", "PutLogEvents")
        ]
    for function in EXECUTORS:
        rows += via_url(deployed, "ExecutorPolicy", function)
    rows += via_url(deployed, "SlotTaskRole", "checkpoint")
    repository = (
        f"arn:{PARTITION}:ecr:{REGION}:{ACCOUNT}:repository/{deployed.parameter('SlotRepository')}"
    )
    execution = "SlotTaskExecutionRole"
    rows += [
        Request(execution, "ecr:GetAuthorizationToken", "*"),
        *(
            Request(execution, f"ecr:{action}", repository)
            for action in ("BatchGetImage", "GetDownloadUrlForLayer", "BatchCheckLayerAvailability")
        ),
        Request(execution, "logs:CreateLogStream", log_stream(deployed, "SlotLogGroup")),
        Request(execution, "logs:PutLogEvents", log_stream(deployed, "SlotLogGroup")),
        Request(
            "IdleSweepFunctionSweepRole", "lambda:InvokeFunction", deployed.arn("IdleSweepFunction")
        ),
        Request(
            "IdleSweepFunctionSweepRole", "sqs:SendMessage", deployed.arn("SweepDeadLetterQueue")
        ),
        # The standby pools' own schedule.
        Request(
            "IdleSweepFunctionStandbysRole",
            "lambda:InvokeFunction",
            deployed.arn("IdleSweepFunction"),
        ),
        Request(
            "IdleSweepFunctionStandbysRole",
            "sqs:SendMessage",
            deployed.arn("SweepDeadLetterQueue"),
        ),
    ]
    return rows


def seed_outside_its_alias(deployed: Deployed) -> list[Request]:
    """The seed function's URL is its alias's (SAM's AutoPublishAlias, for SnapStart): the
    executor may never call its unpublished code, nor a version by number."""
    seed = deployed.arn(deployed.functions["seed"])
    return [
        Request("ExecutorPolicy", action, qualified, condition)
        for qualified in (seed, f"{seed}:1", f"{seed}:$LATEST")
        for action, condition in (
            ("lambda:InvokeFunctionUrl", {"lambda:FunctionUrlAuthType": "AWS_IAM"}),
            ("lambda:InvokeFunction", {"lambda:InvokedViaFunctionUrl": "true"}),
        )
    ]


def never(deployed: Deployed) -> list[Request]:
    """What each principal must never be allowed."""
    table = deployed.arn("LifecycleTable")
    index = f"{table}/index/by-deadline"
    write_token, read_token = (
        deployed.parameter("R2SecretArn"),
        deployed.parameter("R2ReadSecretArn"),
    )
    task_definition, task = (
        deployed.ref("SlotTaskDefinition"),
        (
            f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:task/{deployed.ref('SlotCluster')}/0123456789abcdef0123456789abcdef"
        ),
    )
    cluster = {"ecs:cluster": deployed.arn("SlotCluster")}
    rows: list[Request] = []

    # The slot task role: nothing of the table (its API writes for it), no secret, no task.
    task_role = "SlotTaskRole"
    for action in (*ITEM_ACTIONS, "dynamodb:BatchWriteItem"):
        for partition in (RESIDENT, BACKUP, SLOT, CURSOR, STANDBY):
            rows.append(Request(task_role, action, table, keys(partition)))
        rows.append(Request(task_role, action, table))  # naming no key at all
    rows.append(Request(task_role, "dynamodb:Scan", table))
    rows += [
        Request(task_role, "dynamodb:Query", index, keys("live#00")),
        Request(task_role, "secretsmanager:GetSecretValue", write_token),
        Request(task_role, "secretsmanager:GetSecretValue", read_token),
        Request(task_role, "ecs:RunTask", task_definition, cluster),
        Request(task_role, "ecs:StopTask", task, cluster),
    ]
    for function in (f for f in FUNCTIONS if f != "checkpoint"):  # only its own API
        rows += via_url(deployed, task_role, function)
    checkpoint = deployed.arn("CheckpointFunction")
    rows.append(Request(task_role, "lambda:InvokeFunction", checkpoint))  # not through its URL

    # The executor: only the four URLs it calls, only through them.
    for function in ("checkpoint", "idle_sweep"):
        rows += via_url(deployed, "ExecutorPolicy", function)
    for function in FUNCTIONS:
        rows.append(
            Request(
                "ExecutorPolicy",
                "lambda:InvokeFunction",
                deployed.arn(deployed.functions[function]),
            )
        )
    rows += seed_outside_its_alias(deployed)
    rows.append(Request("ExecutorPolicy", "dynamodb:GetItem", table, keys(SLOT)))

    # The execution role pulls one repository only.
    other = f"arn:{PARTITION}:ecr:{REGION}:{ACCOUNT}:repository/someone-else"
    rows += [Request("SlotTaskExecutionRole", "ecr:BatchGetImage", other)]
    rows += [
        Request("SlotTaskExecutionRole", "logs:PutLogEvents", log_stream(deployed, "SeedLogGroup"))
    ]

    for function in FUNCTIONS:
        role = deployed.roles[function]
        # Never another function's logs, never a log group of its own making, never a scan,
        # never an item with no partition key named.
        others = [group for name, group in LOG_GROUPS.items() if name != function]
        rows += [
            Request(role, "logs:PutLogEvents", log_stream(deployed, group)) for group in others
        ]
        rows += [
            Request(
                role, "logs:CreateLogGroup", f"arn:{PARTITION}:logs:{REGION}:{ACCOUNT}:log-group:x"
            ),
            Request(role, "dynamodb:Scan", table),
            Request(role, "dynamodb:DeleteTable", table),
            *(Request(role, action, table) for action in ITEM_ACTIONS),
        ]
    # Functions that only read write nothing, and never hold the token that may write.
    for function in READ_ONLY:
        role = deployed.roles[function]
        rows += [Request(role, action, table, keys(SLOT)) for action in ITEM_WRITES]
        rows += [Request(role, "secretsmanager:GetSecretValue", write_token)]
        rows += [Request(role, "ecs:DescribeTasks", task, cluster)]
    rows.append(Request(deployed.roles["seed"], "secretsmanager:GetSecretValue", write_token))
    # Nobody writes a resident's generations, an archive's owner or a debt but rotation.
    for function in ("seed", "checkpoint", "idle_sweep"):
        role = deployed.roles[function]
        rows += [
            Request(role, "dynamodb:PutItem", table, keys(partition))
            for partition in (RESIDENT, BACKUP)
        ]
        rows += [
            Request(role, "dynamodb:UpdateItem", table, keys(partition))
            for partition in (RESIDENT, BACKUP)
        ]
    # Rotation touches no slot; only the seed function starts a slot's task and the sweep a
    # standby's; only the sweep stops them.
    rows += [Request(deployed.roles["rotation"], a, table, keys(SLOT)) for a in ITEM_ACTIONS]
    for function in ("receipt", "slot_evidence", "rotation", "checkpoint"):
        rows.append(Request(deployed.roles[function], "ecs:RunTask", task_definition, cluster))
    # Standbys: only the sweep registers (PutItem) and forgets (DeleteItem) them; the seed
    # function takes, the checkpoint function moves its caller's, the rotation retires;
    # the read-only functions never see them.
    for function in ("seed", "rotation", "checkpoint"):
        rows += [
            Request(deployed.roles[function], action, table, keys(STANDBY))
            for action in ("dynamodb:PutItem", "dynamodb:DeleteItem")
        ]
    for function in READ_ONLY:
        rows += [Request(deployed.roles[function], a, table, keys(STANDBY)) for a in ITEM_ACTIONS]
    for function in ("seed", "receipt", "slot_evidence", "rotation", "checkpoint"):
        rows.append(Request(deployed.roles[function], "ecs:StopTask", task, cluster))
    # The checkpoint function deletes nothing of the table and may not read the index.
    rows += [Request(deployed.roles["checkpoint"], "dynamodb:DeleteItem", table, keys(SLOT))]
    rows += [Request(deployed.roles["checkpoint"], "dynamodb:Query", index, keys("live#00"))]
    # Tasks run only in the stack's cluster.
    elsewhere = {"ecs:cluster": f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:cluster/another"}
    rows.append(Request(deployed.roles["seed"], "ecs:RunTask", task_definition, elsewhere))
    return rows


def test_every_principal_may_do_what_its_deployment_needs(
    deployed: Deployed, evaluator: Evaluator
) -> None:
    refused = [request for request in must(deployed) if not evaluator.decide(request).allowed]
    assert refused == []


def test_no_principal_may_do_what_it_must_never_do(
    deployed: Deployed, evaluator: Evaluator
) -> None:
    allowed = [str(request) for request in never(deployed) if evaluator.decide(request).allowed]
    assert allowed == []


def test_every_row_is_one_the_evaluator_understands(
    deployed: Deployed, evaluator: Evaluator
) -> None:
    """A misspelt action or a condition key the action does not take would make a row
    trivially denied: none is."""
    for request in [*must(deployed), *never(deployed)]:
        decision = evaluator.decide(request)
        assert decision.error is None, (str(request), decision)
        assert decision.result != "Error", (str(request), decision)
        assert decision.ignored == (), (str(request), decision.ignored)


def test_the_check_refuses_what_the_old_template_granted_too_widely(evaluator: Evaluator) -> None:
    """The evaluator is not a yes-man: a policy that grants too much is caught by the rows
    (the slot task role of the template before the task API: UpdateItem on the whole
    table), and a condition is honoured (a PutItem limited to slot items)."""
    wide = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "dynamodb:UpdateItem", "Resource": "*"},
            {
                "Effect": "Allow",
                "Action": "dynamodb:PutItem",
                "Resource": "*",
                "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["SLOT#*"]}},
            },
        ],
    }
    probe = Evaluator(_with_principal(deploy(), "Wide", wide))
    try:
        table = "arn:aws:dynamodb:eu-west-1:123456789012:table/t"
        assert probe.decide(Request("Wide", "dynamodb:UpdateItem", table, keys(RESIDENT))).allowed
        assert probe.decide(Request("Wide", "dynamodb:PutItem", table, keys(SLOT))).allowed
        assert not probe.decide(Request("Wide", "dynamodb:PutItem", table, keys(RESIDENT))).allowed
        # ForAllValues with no key at all is true, as in AWS: why every grant adds a Null check.
        assert probe.decide(Request("Wide", "dynamodb:PutItem", table)).allowed
    finally:
        probe.close()


def _with_principal(deployed: Deployed, name: str, document: Mapping[str, Any]) -> Deployed:
    principal = Principal(f"arn:aws:iam::{ACCOUNT}:role/{name}", (("wide", document),))
    return replace(deployed, principals={**deployed.principals, name: principal})
