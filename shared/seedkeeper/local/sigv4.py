"""Checking an AWS SigV4 signature the way a Lambda function URL with `AWS_IAM` auth does,
for the local gateway: the canonical request is rebuilt from what arrived (only the headers
the client said it signed, and the body as received), signed again with the configured
local credentials by botocore's own signer, and compared in constant time. A signature
scoped to another region or service, or a request that carries a credential header or a
signed header twice, is refused: which copy counts is exactly what a forger would choose."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

SERVICE = "lambda"
SKEW = timedelta(minutes=5)  # what AWS accepts between the signature's time and its own
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}
)

_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/"
    r"(?P<service>[a-z0-9-]+)/aws4_request, ?SignedHeaders=(?P<signed>[a-z0-9;-]+), ?"
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)


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
) -> str | None:
    """None when the request is signed by the configured credentials for `region`;
    otherwise why not. `headers` are as they arrived, repeated names included."""
    lowered = {name.lower(): value for name, value in headers}
    match = _AUTHORIZATION.match(lowered.get("authorization", ""))
    if match is None:
        return "unsigned"
    if match["key"] != access_key:
        return "wrong-credential"
    if match["region"] != region or match["service"] != SERVICE:
        return "wrong-scope"
    signed = match["signed"].split(";")
    arrivals = Counter(name.lower() for name, _ in headers)
    if any(arrivals[name] > 1 for name in CREDENTIAL_HEADERS.union(signed)):
        return "duplicate-header"
    stamp = lowered.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "no-date"
    if abs(now - signed_at) > SKEW or match["date"] != stamp[:8]:
        return "stale"
    if "host" not in signed:
        return "host-not-signed"
    digest = hashlib.sha256(body).hexdigest()
    if lowered.get("x-amz-content-sha256", digest) != digest:
        return "body-changed"
    request = AWSRequest(
        method=method,
        url=url,
        data=body,
        headers={name: lowered[name] for name in signed if name in lowered},
    )
    request.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(access_key, secret_key), SERVICE, region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, match["signature"]):
        return "bad-signature"
    return None
