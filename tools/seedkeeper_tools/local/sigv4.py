"""Checking AWS SigV4 signatures the way AWS does, for the local stack: the function-URL
gateway (service `lambda`) and the store standing in for DynamoDB and R2 (S3, presigned
URLs included). The canonical request is rebuilt from what arrived (only the headers the
client said it signed, the path and query as sent, and the body as received), signed again
with the configured local credentials by botocore's own signer, and compared in constant
time. A signature scoped to another region or service, or a request that carries a
credential header, a signed header or a query credential twice, is refused: which copy
counts is exactly what a forger would choose."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote, urlsplit, urlunsplit

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

SERVICE = "lambda"
S3 = "s3"
SKEW = timedelta(minutes=5)  # what AWS accepts between the signature's time and its own
MAX_PRESIGNED_EXPIRY = 7 * 24 * 3600  # what S3 and R2 accept
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}
)
QUERY_CREDENTIALS = frozenset(
    {
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
        "X-Amz-Security-Token",
    }
)
# S3 lets the signature cover one of these in place of the body's digest (the body is then
# covered by TLS and checksums, as in S3). Signed chunks (STREAMING-AWS4-HMAC-SHA256-PAYLOAD)
# would need each chunk's signature checked: botocore does not send them, so they are refused.
UNHASHED_PAYLOADS = frozenset({"UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"})

_SCOPE = (
    r"(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/(?P<service>[a-z0-9-]+)/aws4_request"
)
_AUTHORIZATION = re.compile(
    rf"^AWS4-HMAC-SHA256 Credential={_SCOPE}, ?SignedHeaders=(?P<signed>[a-z0-9;-]+), ?"
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)
_QUERY_SCOPE = re.compile(rf"^{_SCOPE}$")
_SIGNED_HEADERS = re.compile(r"^[a-z0-9-]+(;[a-z0-9-]+)*$")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")
_SECONDS = re.compile(r"^[0-9]{1,7}$")


def signing_key_id(authorization: str) -> str | None:
    """The access key an Authorization header says signed it, if it is a SigV4 header at
    all; says nothing about whether the signature holds."""
    match = _AUTHORIZATION.match(authorization)
    return None if match is None else match["key"]


def signed_scope(authorization: str) -> tuple[str, str] | None:
    """The (service, region) an Authorization header's credential is scoped to, if it is
    a SigV4 header at all; says nothing about whether the signature holds."""
    match = _AUTHORIZATION.match(authorization)
    return None if match is None else (match["service"], match["region"])


def verify(
    *,
    method: str,
    url: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    access_key: str,
    secret_key: str,
    region: str,
    now: datetime,
    service: str = SERVICE,
) -> str | None:
    """None when the request's Authorization header is a signature by the configured
    credentials for `service` in `region`; otherwise why not. `headers` are as they
    arrived, repeated names included; `url` carries the path and query as sent."""
    lowered = {name.lower(): value for name, value in headers}
    match = _AUTHORIZATION.match(lowered.get("authorization", ""))
    if match is None:
        return "unsigned"
    if match["key"] != access_key:
        return "wrong-credential"
    if match["region"] != region or match["service"] != service:
        return "wrong-scope"
    signed = match["signed"].split(";")
    refused = _header_refusal(headers, signed)
    if refused is not None:
        return refused
    stamp = lowered.get("x-amz-date", "")
    signed_at = _parse_stamp(stamp)
    if signed_at is None:
        return "no-date"
    if abs(now - signed_at) > SKEW or match["date"] != stamp[:8]:
        return "stale"
    declared = lowered.get("x-amz-content-sha256")
    unhashed = service == S3 and "x-amz-content-sha256" in signed and declared in UNHASHED_PAYLOADS
    if not unhashed and declared not in (None, hashlib.sha256(body).hexdigest()):
        return "body-changed"
    request = AWSRequest(
        method=method,
        url=url,
        data=body,
        headers={name: lowered[name] for name in signed if name in lowered},
    )
    request.context["timestamp"] = stamp
    # S3 signs the path as sent; other services sign it normalised.
    signer_class = S3SigV4Auth if service == S3 else SigV4Auth
    signer = signer_class(Credentials(access_key, secret_key), service, region)
    return _compare(signer, request, match["signature"])


def verify_presigned(
    *,
    method: str,
    url: str,
    headers: Sequence[tuple[str, str]],
    access_key: str,
    secret_key: str,
    region: str,
    now: datetime,
) -> str | None:
    """None when `url` is an S3 presigned URL (query authentication) by the configured
    credentials in `region`, used for the method it was signed for before it expires;
    otherwise why not."""
    split = urlsplit(url)
    pairs = [
        (name, value)
        for name, _, value in (pair.partition("=") for pair in split.query.split("&") if pair)
    ]
    arrivals = Counter(unquote(name) for name, _ in pairs)
    if any(arrivals[name] > 1 for name in QUERY_CREDENTIALS):
        return "duplicate-parameter"
    query = {unquote(name): unquote(value) for name, value in pairs}
    scope = _QUERY_SCOPE.match(query.get("X-Amz-Credential", ""))
    if query.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" or scope is None:
        return "unsigned"
    if scope["key"] != access_key:
        return "wrong-credential"
    if scope["region"] != region or scope["service"] != S3:
        return "wrong-scope"
    signature = query.get("X-Amz-Signature", "")
    signed_headers = query.get("X-Amz-SignedHeaders", "")
    expires = query.get("X-Amz-Expires", "")
    if not (
        _SIGNATURE.match(signature)
        and _SIGNED_HEADERS.match(signed_headers)
        and _SECONDS.match(expires)
    ):
        return "malformed"
    signed = signed_headers.split(";")
    refused = _header_refusal(headers, signed)
    if refused is not None:
        return refused
    stamp = query.get("X-Amz-Date", "")
    signed_at = _parse_stamp(stamp)
    if signed_at is None:
        return "no-date"
    if scope["date"] != stamp[:8] or signed_at - now > SKEW:
        return "stale"
    if not 1 <= int(expires) <= MAX_PRESIGNED_EXPIRY or now > signed_at + timedelta(
        seconds=int(expires)
    ):
        return "expired"
    # The canonical query is every parameter as sent but the signature itself.
    unsigned_query = "&".join(
        f"{name}={value}" for name, value in pairs if unquote(name) != "X-Amz-Signature"
    )
    lowered = {name.lower(): value for name, value in headers}
    request = AWSRequest(
        method=method,
        url=urlunsplit(split._replace(query=unsigned_query)),
        headers={name: lowered[name] for name in signed if name in lowered},
    )
    request.context["timestamp"] = stamp
    signer = S3SigV4QueryAuth(Credentials(access_key, secret_key), S3, region, int(expires))
    return _compare(signer, request, signature)


def _header_refusal(headers: Sequence[tuple[str, str]], signed: list[str]) -> str | None:
    arrivals = Counter(name.lower() for name, _ in headers)
    if any(arrivals[name] > 1 for name in CREDENTIAL_HEADERS.union(signed)):
        return "duplicate-header"
    if "host" not in signed:
        return "host-not-signed"
    return None


def _parse_stamp(stamp: str) -> datetime | None:
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _compare(signer: SigV4Auth, request: AWSRequest, signature: str) -> str | None:
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, signature):
        return "bad-signature"
    return None
