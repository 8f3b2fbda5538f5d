"""A call to a Lambda function URL with `AWS_IAM` auth: JSON in, the status and body out,
signed with SigV4 (service `lambda`). The executor's client calls through here, and so does
the slot task (its task role, to the checkpoint function). The URL is never in an error."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials


class SeedkeeperError(Exception):
    """Anything the client raises of its own."""


class Unreachable(SeedkeeperError, ConnectionError):
    """No answer (refused, reset, timed out): the message names the cause, never the URL."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it is, never followed: urllib would send the signed
    headers (the session token among them) on to wherever the Location points."""

    def redirect_request(self, *_: Any, **__: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)
# Lambda answers a function URL with at most 6 MB: anything longer is not Seedkeeper's
# answer, and is not read into memory.
MAX_ANSWER_BYTES = 6 * 1024 * 1024


class AnswerTooLarge(Unreachable):
    """More than a function URL can answer (MAX_ANSWER_BYTES): no answer of Seedkeeper's,
    so a caller handles it as one it did not get (the slot task tries again later)."""


def signed_call(
    method: str,
    url: str,
    body: Any,
    *,
    credentials: Credentials | ReadOnlyCredentials,
    region: str,
    timeout: float,
) -> tuple[int, bytes]:
    """The answer's status and body, a 3xx (never followed), 4xx or 5xx included."""
    if urllib.parse.urlsplit(url).scheme not in ("https", "http"):
        raise ValueError("a function URL is https:// (http:// for a local stack)")
    data = json.dumps(body).encode() if body is not None else b""
    request = AWSRequest(
        method=method,
        url=url,
        data=data,
        headers={"Content-Type": "application/json"} if body is not None else {},
    )
    SigV4Auth(credentials, "lambda", region).add_auth(request)
    prepared = urllib.request.Request(  # noqa: S310 - the caller's configured URL
        url, data=data or None, method=method, headers=dict(request.headers.items())
    )
    try:
        with _OPENER.open(prepared, timeout=timeout) as response:
            return response.status, _bounded(response)
    except urllib.error.HTTPError as refused:
        return refused.code, _bounded(refused)
    except AnswerTooLarge:
        raise  # an Unreachable of its own, not the one below
    except (urllib.error.URLError, OSError) as failed:
        reason = getattr(failed, "reason", failed)
        raise Unreachable(type(reason).__name__) from None


def _bounded(response: Any) -> bytes:
    answer: bytes = response.read(MAX_ANSWER_BYTES + 1)
    if len(answer) > MAX_ANSWER_BYTES:
        raise AnswerTooLarge(f"the answer is longer than {MAX_ANSWER_BYTES} bytes")
    return answer
