"""Reading a partition whole; conditions for transaction items."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder, Key
from botocore.exceptions import ClientError

from seedkeeper.errors import translate_client_error

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

# Ledger entries (a resource's owed deletions, a slot's superseded checkpoints) sit in the
# sweep's sparse index under their own partition, keyed by when they became owed, so the
# sweep finds every debt without scanning.
DEBT_PARTITION = "debt"


def owed_since(since: int) -> dict[str, str | int]:
    """A ledger entry's index attributes: the debt partition, sorted by when it was owed."""
    return {"sweep": DEBT_PARTITION, "sweep_at": since}


def partition(table: Table, pk: str, *, consistent: bool) -> list[dict[str, Any]]:
    """Every item of the partition `pk`, in as many pages as a Query takes."""
    query: dict[str, Any] = {
        "KeyConditionExpression": Key("PK").eq(pk),
        "ConsistentRead": consistent,
    }
    items: list[dict[str, Any]] = []
    try:
        while True:
            page = table.query(**query)
            items.extend(page["Items"])
            if "LastEvaluatedKey" not in page:
                return items
            query["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    except ClientError as error:
        raise translate_client_error(error) from error


def transaction_condition(condition: ConditionBase) -> dict[str, Any]:
    """Transactions take each item's condition as its own expression: boto3 only builds
    them for single-item calls."""
    built = ConditionExpressionBuilder().build_expression(condition)
    expression: dict[str, Any] = {
        "ConditionExpression": built.condition_expression,
        "ExpressionAttributeNames": built.attribute_name_placeholders,
    }
    if built.attribute_value_placeholders:
        expression["ExpressionAttributeValues"] = built.attribute_value_placeholders
    return expression
