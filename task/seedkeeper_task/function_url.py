"""A call to a Lambda function URL with `AWS_IAM` auth: JSON in, the status and body out,
signed with SigV4 (service `lambda`). Both the executor's client and the slot task (its task
role, to the checkpoint function: `post`) call through here. The URL is never in an error."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials

from seedkeeper.adapters import aws


class Unreachable(ConnectionError):
    """No answer (refused, reset, timed out): the message names the cause, never the URL."""


def call(
    method: str,
    url: str,
    body: Any,
    *,
    credentials: Credentials | ReadOnlyCredentials,
    region: str,
    timeout: float,
) -> tuple[int, bytes]:
    """The answer's status and body, a 4xx or 5xx included."""
    data = json.dumps(body).encode() if body is not None else b""
    request = AWSRequest(
        method=method,
        url=url,
        data=data,
        headers={"Content-Type": "application/json"} if body is not None else {},
    )
    SigV4Auth(credentials, "lambda", region).add_auth(request)
    prepared = urllib.request.Request(  # noqa: S310 - a configured function URL
        url, data=data or None, method=method, headers=dict(request.headers.items())
    )
    try:
        with urllib.request.urlopen(prepared, timeout=timeout) as response:  # noqa: S310
            answer: bytes = response.read()
            return response.status, answer
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()
    except (urllib.error.URLError, OSError) as failed:
        reason = getattr(failed, "reason", failed)
        raise Unreachable(type(reason).__name__) from None


def post(
    url: str, body: Any, *, timeout: float, credentials: Credentials | None = None
) -> tuple[int, dict[str, Any]]:
    """POST `body`, signed with `credentials`, else this process's (a slot task's: its
    session of the task role, read anew each time: they are refreshed): the status and the
    JSON object answered ({} for anything else)."""
    session = aws.session()
    signing = credentials or session.get_credentials()
    if signing is None:
        raise Unreachable("NoCredentials")
    status, payload = call(
        "POST",
        url,
        body,
        credentials=signing,
        region=session.region_name or "us-east-1",
        timeout=timeout,
    )
    try:
        answer = json.loads(payload or b"{}")
    except ValueError:
        answer = {}
    return status, answer if isinstance(answer, dict) else {}
