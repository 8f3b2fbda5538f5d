"""Conditions for transaction items."""

from __future__ import annotations

from typing import Any

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder

# Ledger entries (a resource's owed deletions, a slot's superseded checkpoints) sit in the
# sweep's sparse index under their own partition, keyed by when they became owed, so the
# sweep finds every debt without scanning.
DEBT_PARTITION = "debt"


def owed_since(since: int) -> dict[str, str | int]:
    """A ledger entry's index attributes: the debt partition, sorted by when it was owed."""
    return {"sweep": DEBT_PARTITION, "sweep_at": since}


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
