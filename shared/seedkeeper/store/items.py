"""DynamoDB items: validated as models, strictly; conditions for transaction items."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, TypeVar

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def validate_item(model: type[M], fields: dict[str, Any]) -> M:
    """Validate as JSON in strict mode: a number is never taken from a string, nor an
    integer from a fraction (DynamoDB hands every number back as a Decimal)."""
    return model.model_validate_json(json.dumps(fields, default=_json_number))


def _json_number(value: object) -> int | float:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not an item value")


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
