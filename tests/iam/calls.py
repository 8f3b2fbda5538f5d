"""What IAM authorizes for one AWS call, as the deployed stack would see it.

A call is what botocore sends (the service, the operation, the serialized JSON body), made
while a function acts (`seedkeeper_tools.local.principals.ACTING`, its role the principal).
The test world's names (a fresh table per test, the moto cluster) stand for the one table,
cluster and task definition the template deploys, so each call becomes the authorizations
AWS makes for it: its action, the resource's ARN, and the condition keys AWS sets
(`dynamodb:LeadingKeys` from each item's partition key, `ecs:cluster`, ...). DynamoDB
transactions and batches have no IAM action of their own: each item is authorized for the
action it performs. ECS's RunTask also passes the task definition's roles (`iam:PassRole`).
An invocation through a function URL is two authorizations, `lambda:InvokeFunctionUrl` and
`lambda:InvokeFunction` (October 2025 on).

R2 is not AWS (its tokens are not IAM): S3 calls are not authorized here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from iam.deployed import ACCOUNT, PARTITION, REGION, Deployed
from iam.evaluator import Request

# The table's key schema and its one index's (template.yaml): the partition key of each.
TABLE_HASH_KEY = "PK"
INDEX_HASH_KEYS = {"by-deadline": "sweep"}
_ITEM_ACTIONS = {
    "Put": ("dynamodb:PutItem", "Item"),
    "Update": ("dynamodb:UpdateItem", "Key"),
    "Delete": ("dynamodb:DeleteItem", "Key"),
    "ConditionCheck": ("dynamodb:ConditionCheckItem", "Key"),
}
_EQUALITY = re.compile(r"(#?[A-Za-z0-9_]+)\s*=\s*(:[A-Za-z0-9_]+)")
# The secrets the functions are told (their environment) and which parameter each stands for.
_SECRETS = {
    "SEEDKEEPER_R2_SECRET_ARN": "R2SecretArn",
    "SEEDKEEPER_R2_READ_SECRET_ARN": "R2ReadSecretArn",
}


def authorizations(
    deployed: Deployed, principal: str, service: str, operation: str, body: Mapping[str, Any]
) -> Iterator[Request]:
    if service == "dynamodb":
        yield from _dynamodb(deployed, principal, operation, body)
    elif service == "ecs":
        yield from _ecs(deployed, principal, operation, body)
    elif service == "secretsmanager":
        secret = _secret(deployed, str(body.get("SecretId", "")))
        yield Request(principal, f"secretsmanager:{operation}", secret)
    elif service not in {"s3"}:
        yield Request(principal, f"{service}:{operation}", "*")


def invocation(deployed: Deployed, principal: str, function: str) -> Iterator[Request]:
    """A signed call to `function`'s URL (`function`: its folder under functions/)."""
    arn = deployed.url_target(function)
    yield Request(
        principal, "lambda:InvokeFunctionUrl", arn, {"lambda:FunctionUrlAuthType": "AWS_IAM"}
    )
    yield Request(principal, "lambda:InvokeFunction", arn, {"lambda:InvokedViaFunctionUrl": "true"})


def _dynamodb(
    deployed: Deployed, principal: str, operation: str, body: Mapping[str, Any]
) -> Iterator[Request]:
    table = deployed.arn("LifecycleTable")
    if operation in {"TransactWriteItems", "TransactGetItems"}:
        for item in body.get("TransactItems", []):
            ((kind, detail),) = item.items()
            action, field = _ITEM_ACTIONS.get(kind, ("dynamodb:GetItem", "Key"))
            yield _item(principal, action, table, detail.get(field, {}))
    elif operation == "BatchWriteItem":
        for requests in body.get("RequestItems", {}).values():
            for request in requests:
                ((kind, detail),) = request.items()
                action = "dynamodb:PutItem" if kind == "PutRequest" else "dynamodb:DeleteItem"
                yield _item(principal, action, table, detail.get("Item") or detail.get("Key", {}))
    elif operation == "BatchGetItem":
        for asked in body.get("RequestItems", {}).values():
            for key in asked.get("Keys", []):
                yield _item(principal, "dynamodb:GetItem", table, key)
    elif operation == "Query":
        index = body.get("IndexName")
        resource = f"{table}/index/{index}" if index else table
        hash_key = INDEX_HASH_KEYS.get(index, TABLE_HASH_KEY) if index else TABLE_HASH_KEY
        yield Request(
            principal, "dynamodb:Query", resource, _leading_keys([_queried(body, hash_key)])
        )
    elif "Key" in body or "Item" in body:
        yield _item(principal, f"dynamodb:{operation}", table, body.get("Key") or body["Item"])
    else:  # Scan, DescribeTable, CreateTable...: the table itself, no key
        yield Request(principal, f"dynamodb:{operation}", table)


def _item(principal: str, action: str, table: str, item: Mapping[str, Any]) -> Request:
    return Request(principal, action, table, _leading_keys([_string(item.get(TABLE_HASH_KEY))]))


def _leading_keys(values: list[str | None]) -> dict[str, list[str]]:
    """`dynamodb:LeadingKeys`, set by AWS on every request that names a partition key."""
    found = [value for value in values if value is not None]
    return {"dynamodb:LeadingKeys": found} if found else {}


def _queried(body: Mapping[str, Any], hash_key: str) -> str | None:
    """The partition key value a Query's KeyConditionExpression pins."""
    names: Mapping[str, str] = body.get("ExpressionAttributeNames", {})
    values: Mapping[str, Any] = body.get("ExpressionAttributeValues", {})
    for name, value in _EQUALITY.findall(body.get("KeyConditionExpression", "")):
        if names.get(name, name) == hash_key:
            return _string(values.get(value))
    return None


def _string(value: Any) -> str | None:
    """A key attribute's value as DynamoDB's JSON types it: {"S": ...} (or {"N": ...})."""
    if isinstance(value, Mapping):
        typed = value.get("S", value.get("N"))
        return None if typed is None else str(typed)
    return None


def _ecs(
    deployed: Deployed, principal: str, operation: str, body: Mapping[str, Any]
) -> Iterator[Request]:
    cluster = {"ecs:cluster": deployed.arn("SlotCluster")}
    if operation == "RunTask":
        yield Request(principal, "ecs:RunTask", deployed.ref("SlotTaskDefinition"), cluster)
        for role in ("SlotTaskRole", "SlotTaskExecutionRole"):  # the definition names both
            passed = {"iam:PassedToService": "ecs-tasks.amazonaws.com"}
            yield Request(principal, "iam:PassRole", deployed.arn(role), passed)
        return
    tasks = body.get("tasks") or ([body["task"]] if "task" in body else [])
    name = deployed.ref("SlotCluster")
    for task in tasks:
        task_id = str(task).rsplit("/", 1)[-1]
        arn = f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:task/{name}/{task_id}"
        yield Request(principal, f"ecs:{operation}", arn, cluster)
    if not tasks:
        yield Request(principal, f"ecs:{operation}", "*", cluster)


def _secret(deployed: Deployed, secret_id: str) -> str:
    """The deployed secret a function's setting names (a test's own ARN stands for it)."""
    for variable, parameter in _SECRETS.items():
        if secret_id and os.environ.get(variable) == secret_id:
            return str(deployed.parameter(parameter))
    return secret_id


def parsed_body(body: bytes | str | Any) -> Mapping[str, Any]:
    """A JSON protocol's request body as botocore serialized it ({} for anything else)."""
    if isinstance(body, bytes | str):
        try:
            parsed = json.loads(body or b"{}")
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}
