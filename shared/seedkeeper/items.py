"""Validating DynamoDB items as models, strictly."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, TypeVar

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
