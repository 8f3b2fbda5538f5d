"""Invoking the Lambda handlers as Lambda does: the handler the local gateway loads, an
event from events/, a context."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from seedkeeper_tools.infra import ROOT
from seedkeeper_tools.local.gateway import Handler, load_handler

load_function = load_handler


@dataclass(frozen=True)
class Context:
    function_name: str = "seedkeeper-test"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:seedkeeper-test"
    memory_limit_in_mb: int = 512
    aws_request_id: str = "c6af9ac6-7b61-11e6-9a41-93e8deadbeef"
    log_group_name: str = "/aws/lambda/seedkeeper-test"
    log_stream_name: str = "2026/11/30/[$LATEST]test"


def event(name: str, **changes: Any) -> dict[str, Any]:
    """events/<name>.json, with top-level fields or the JSON body replaced."""
    loaded: dict[str, Any] = json.loads((ROOT / "events" / f"{name}.json").read_text())
    if "body" in changes and not isinstance(changes["body"], str | None):
        changes["body"] = json.dumps(changes["body"])
    return loaded | changes


def invoke(handler: Handler, request: dict[str, Any]) -> tuple[int, Any]:
    response = handler(request, Context())
    body = response.get("body")
    return response["statusCode"], json.loads(body) if body else None
