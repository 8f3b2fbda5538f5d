"""The slot task's calls to Seedkeeper's function URLs (its task role, to the checkpoint
function), through the executor's client's signed transport: `AWS_IAM` auth, SigV4 with
service `lambda`, the URL never in an error."""

from __future__ import annotations

import json
from typing import Any

from botocore.credentials import Credentials

from seedkeeper.adapters import aws
from seedkeeper_client.transport import Unreachable, signed_call

__all__ = ["Unreachable", "post"]


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
    status, payload = signed_call(
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
