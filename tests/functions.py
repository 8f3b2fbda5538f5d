"""Invoking the Lambda handlers as Lambda does: the function module loaded from its file,
an event from events/, a context."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Context:
    function_name: str = "seedkeeper-test"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:seedkeeper-test"
    memory_limit_in_mb: int = 512
    aws_request_id: str = "c6af9ac6-7b61-11e6-9a41-93e8deadbeef"
    log_group_name: str = "/aws/lambda/seedkeeper-test"
    log_stream_name: str = "2026/11/30/[$LATEST]test"


def load_function(name: str) -> ModuleType:
    """functions/<name>/app.py under its own module name (every function's file is app.py)."""
    spec = importlib.util.spec_from_file_location(
        f"functions.{name}.app", ROOT / "functions" / name / "app.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def event(name: str, **changes: Any) -> dict[str, Any]:
    """events/<name>.json, with top-level fields or the JSON body replaced."""
    loaded: dict[str, Any] = json.loads((ROOT / "events" / f"{name}.json").read_text())
    if "body" in changes and not isinstance(changes["body"], str | None):
        changes["body"] = json.dumps(changes["body"])
    return loaded | changes


def invoke(module: ModuleType, request: dict[str, Any]) -> tuple[int, Any]:
    response: dict[str, Any] = module.lambda_handler(request, Context())
    body = response.get("body")
    return response["statusCode"], json.loads(body) if body else None
