"""Invoking the Lambda handlers as Lambda does: the handler the local gateway loads, an
event from events/, a context."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from seedkeeper.domain.caller import task_id
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


# The slot task role the events name (conftest's EVENTS_TASK_ROLE_ARN, the functions' setting).
EVENTS_ACCOUNT = "123456789012"
EVENTS_TASK_ROLE = "seedkeeper-slot-task"


def signed_by(request: dict[str, Any], user_arn: str) -> dict[str, Any]:
    """`request` as a function URL delivers it when `user_arn` signed it."""
    session = user_arn.rsplit("/", 1)[-1]
    iam = request["requestContext"]["authorizer"]["iam"] | {
        "userArn": user_arn,
        "userId": f"AROAEXAMPLE:{session}",
        "callerId": f"AROAEXAMPLE:{session}",
    }
    context = request["requestContext"] | {"authorizer": {"iam": iam}}
    return request | {"requestContext": context}


def as_task(request: dict[str, Any], incarnation: str) -> dict[str, Any]:
    """`request` signed by the slot task `incarnation`: its session of the task role, named
    after its task id, as ECS names it."""
    session = (
        f"arn:aws:sts::{EVENTS_ACCOUNT}:assumed-role/{EVENTS_TASK_ROLE}/{task_id(incarnation)}"
    )
    return signed_by(request, session)


def invoke(handler: Handler, request: dict[str, Any]) -> tuple[int, Any]:
    response = handler(request, Context())
    body = response.get("body")
    return response["statusCode"], json.loads(body) if body else None
