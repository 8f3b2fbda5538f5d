"""A call to a Lambda function URL with `AWS_IAM` auth: JSON in, the status and body out,
signed with SigV4 (service `lambda`). The executor's client calls through here, and so does
the slot task (its task role, to the checkpoint function). The URL is never in an error."""

from __future__ import annotations

import http.client
import json
import unicodedata
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
    check_url(url, "the function URL")
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
    except Unreachable:
        raise  # _bounded's own (an Unreachable is an OSError too), not the one below
    except (urllib.error.URLError, OSError, http.client.HTTPException) as failed:
        # HTTPException: a broken answer (a bad status line, an endless header, a body cut
        # short) is no answer either, from Seedkeeper or from a proxy in between.
        reason = getattr(failed, "reason", failed)
        raise Unreachable(type(reason).__name__) from None


def check_url(url: str, what: str) -> None:
    """A URL a signed request may go to: http(s), a host, no user name or password, no query
    or fragment (a route appended to it must stay the path). ValueError names `what`, never
    the URL."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise ValueError(f"{what} is not a URL") from None
    if parts.scheme not in ("https", "http"):
        raise ValueError(f"{what} is not https:// (http:// for a local stack)")
    if not parts.hostname:
        raise ValueError(f"{what} names no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{what} has a user name or password")
    if "?" in url or "#" in url:
        raise ValueError(f"{what} has a query or a fragment")
    if any(ord(character) < 0x21 or ord(character) == 0x7F for character in url):
        raise ValueError(f"{what} has a space or a control character")


def refusal_reason(refusal: dict[str, Any], otherwise: str) -> str:
    """A refusal's token, as far as an error message may carry it (a refusal may be a
    proxy's, saying anything): the first of `error` and `message` that is a string with
    something left once control characters are dropped, cut to 64 characters; else
    `otherwise`."""
    tokens = (refusal.get(field) for field in ("error", "message"))
    kept = (
        "".join(c for c in token if unicodedata.category(c) != "Cc")[:64]
        for token in tokens
        if isinstance(token, str)
    )
    return next(filter(None, kept), otherwise)


def _bounded(response: Any) -> bytes:
    answer: bytes = response.read(MAX_ANSWER_BYTES + 1)
    if len(answer) > MAX_ANSWER_BYTES:
        raise AnswerTooLarge(f"the answer is longer than {MAX_ANSWER_BYTES} bytes")
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) != len(answer):
        raise Unreachable("IncompleteRead")  # the connection ended inside the body
    return answer
