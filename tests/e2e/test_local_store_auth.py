"""The local stack's store (one moto server, standing in for DynamoDB and for R2) answers
only requests signed with the stack's own keys, which are random per start. A sandbox can
find the store's loopback port (it is in /proc/net/tcp) but holds no key: whatever it sends,
unsigned, signed with the old documented keys, tampered or replayed from a presigned URL,
is refused with 403 and writes nothing. Requests go out on raw connections with bounded
reads, so a hanging store fails the test instead of hanging it."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from builders import stored_in
from seedkeeper.adapters.r2 import R2, R2Settings, backup_key
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import State, slot_key
from seedkeeper.errors import R2Unconfigured
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper_task.capture import upload
from seedkeeper_tools.local.motoserver import MAX_BODY
from seedkeeper_tools.local.stack import REGION, LocalStack

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table
    from mypy_boto3_s3 import S3Client

READ_TIMEOUT = 10.0
OLD_DOCUMENTED_KEY = "seedkeeper-local"  # the constant id and secret the stack used to take
R2_REGION = "auto"
VICTIM = "slot-victim"
ARCHIVE = backup_key("widgets-checkout-victim")
ARCHIVE_BODY = secrets.token_bytes(64 * 1024)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Store:
    endpoint: str
    table: Table
    r2: R2
    s3: S3Client
    bucket: str
    access_key: str
    secret_key: str

    def contents(self) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        """Every item and every object, read with the genuine keys."""
        items = self.table.scan(ConsistentRead=True)["Items"]
        listing = self.s3.list_objects_v2(Bucket=self.bucket).get("Contents", [])
        objects = {
            entry["Key"]: self.s3.get_object(Bucket=self.bucket, Key=entry["Key"])["Body"].read()
            for entry in listing
        }
        return sorted(items, key=lambda item: (str(item["PK"]), str(item["SK"]))), objects


@pytest.fixture
def store(stack: LocalStack) -> Store:
    """A victim's lifecycle record and archive, written by the stack's own signed clients."""
    settings = R2Settings()
    endpoint = os.environ["SEEDKEEPER_DYNAMODB_ENDPOINT"]
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=R2_REGION,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    table = StoreSettings().table_resource()
    stored_in(Lifecycle(table), VICTIM, State.SEEDED)
    s3.put_object(Bucket=settings.bucket or "", Key=ARCHIVE, Body=ARCHIVE_BODY)
    return Store(
        endpoint=endpoint,
        table=table,
        r2=R2.from_settings(settings),
        s3=s3,
        bucket=settings.bucket or "",
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    )


def send(url: str, method: str, headers: dict[str, str], body: bytes = b"") -> Answer:
    split = urlsplit(url)
    connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=READ_TIMEOUT)
    try:
        target = split.path + (f"?{split.query}" if split.query else "")
        connection.request(method, target, body=body or None, headers=headers)
        response = connection.getresponse()
        return Answer(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


def signed(
    method: str,
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    key: str,
    secret: str,
    service: str,
    region: str,
) -> dict[str, str]:
    """The headers botocore's own signer gives the request."""
    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    signer = S3SigV4Auth if service == "s3" else SigV4Auth
    signer(Credentials(key, secret), service, region).add_auth(request)
    return dict(request.headers.items())


def dynamodb_call(
    store: Store, operation: str, payload: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"TableName": store.table.name} | payload).encode()
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": f"DynamoDB_20120810.{operation}",
    }
    return body, headers


def unseed_the_victim(store: Store) -> tuple[bytes, dict[str, str]]:
    """What lets the sweep stop another owner's slot: `unseeded`, deadline long past."""
    key = {name: {"S": value} for name, value in slot_key(VICTIM).items()}
    return dynamodb_call(
        store,
        "UpdateItem",
        {
            "Key": key,
            "UpdateExpression": "SET #state = :unseeded, idle_deadline = :past",
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": {":unseeded": {"S": "unseeded"}, ":past": {"N": "1"}},
        },
    )


def test_the_store_keys_are_random_for_each_start(stack: LocalStack) -> None:
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret != OLD_DOCUMENTED_KEY
    assert len(secret) >= 32
    assert os.environ["SEEDKEEPER_R2_SECRET_ACCESS_KEY"] == secret


def test_a_lifecycle_record_cannot_be_rewritten_without_the_stack_keys(store: Store) -> None:
    before = store.contents()
    url = store.endpoint + "/"
    body, headers = unseed_the_victim(store)

    def as_signed(key: str, secret: str) -> dict[str, str]:
        return headers | signed(
            "POST", url, body, headers, key=key, secret=secret, service="dynamodb", region=REGION
        )

    assert send(url, "POST", as_signed(OLD_DOCUMENTED_KEY, OLD_DOCUMENTED_KEY), body).status == 403
    assert send(url, "POST", headers, body).status == 403
    assert send(url, "POST", as_signed(store.access_key, OLD_DOCUMENTED_KEY), body).status == 403
    # A genuine signature on a harmless read, carried over to the rewrite.
    read, read_headers = dynamodb_call(
        store, "GetItem", {"Key": {"PK": {"S": "x"}, "SK": {"S": "y"}}}
    )
    genuine = read_headers | signed(
        "POST",
        url,
        read,
        read_headers,
        key=store.access_key,
        secret=store.secret_key,
        service="dynamodb",
        region=REGION,
    )
    assert send(url, "POST", genuine | headers, body).status == 403
    assert store.contents() == before
    assert send(url, "POST", genuine, read).status == 200  # the genuine request goes through


def test_archives_cannot_be_read_overwritten_or_deleted_without_the_stack_keys(
    store: Store,
) -> None:
    before = store.contents()
    url = f"{store.endpoint}/{store.bucket}/{ARCHIVE}"
    forged = b"planted archive"

    def as_signed(method: str, body: bytes, secret: str, target: str = url) -> dict[str, str]:
        return signed(
            method,
            target,
            body,
            {},
            key=store.access_key,
            secret=secret,
            service="s3",
            region=R2_REGION,
        )

    assert send(url, "GET", {}).status == 403
    assert send(url, "DELETE", {}).status == 403
    assert send(url, "PUT", {}, forged).status == 403
    assert send(url, "PUT", as_signed("PUT", forged, OLD_DOCUMENTED_KEY), forged).status == 403
    # Tampered: a genuinely signed upload whose body is swapped in flight.
    upload = as_signed("PUT", b"harmless", store.secret_key)
    assert send(url, "PUT", upload, forged).status == 403
    # Replayed: a genuinely signed delete of another key, sent for the archive.
    other = f"{store.endpoint}/{store.bucket}/backups/other.sqsh"
    assert send(url, "DELETE", as_signed("DELETE", b"", store.secret_key, other)).status == 403
    assert store.contents() == before
    assert send(url, "GET", as_signed("GET", b"", store.secret_key)).body == ARCHIVE_BODY


def test_a_presigned_url_reads_only_its_object_until_it_expires(store: Store) -> None:
    before = store.contents()
    url = store.r2.presign_get(ARCHIVE, 60)
    moved = url.replace(ARCHIVE, backup_key("widgets-checkout-other"))
    assert moved != url
    assert send(moved, "GET", {}).status == 403
    assert send(url, "DELETE", {}).status == 403
    assert send(url.replace("X-Amz-Expires=60", "X-Amz-Expires=61"), "GET", {}).status == 403
    short = store.r2.presign_get(ARCHIVE, 1)
    time.sleep(2.1)  # the URL's second of validity passes
    assert send(short, "GET", {}).status == 403
    assert store.contents() == before

    ranged = send(url, "GET", {"Range": "bytes=100-199"})
    assert (ranged.status, ranged.body) == (206, ARCHIVE_BODY[100:200])
    head = send(store.r2.presign_head(ARCHIVE, 60), "HEAD", {})
    assert (head.status, head.headers["Content-Length"]) == (200, str(len(ARCHIVE_BODY)))


def test_a_stalled_request_does_not_hold_up_the_store(store: Store) -> None:
    """A body that never arrives is waited for outside the lock that makes each request
    atomic: the stack's own calls go on meanwhile."""
    split = urlsplit(store.endpoint)
    scope = f"{store.access_key}/20260101/{REGION}/dynamodb/aws4_request"
    with socket.create_connection((split.hostname or "", split.port or 80), timeout=5) as stall:
        stall.sendall(
            b"POST / HTTP/1.1\r\nHost: " + split.netloc.encode() + b"\r\n"
            b"X-Amz-Target: DynamoDB_20120810.GetItem\r\nContent-Length: 1000\r\n"
            b"Authorization: AWS4-HMAC-SHA256 Credential=" + scope.encode() + b", "
            b"SignedHeaders=host, Signature=" + b"0" * 64 + b"\r\n\r\n{"
        )
        impatient = boto3.resource(
            "dynamodb",
            endpoint_url=store.endpoint,
            config=Config(read_timeout=5, connect_timeout=5, retries={"max_attempts": 1}),
        ).Table(store.table.name)
        record = impatient.get_item(Key=slot_key(VICTIM), ConsistentRead=True)["Item"]
        assert record["state"] == State.SEEDED.value


def test_the_stacks_own_calls_still_go_through(store: Store, tmp_path: Path) -> None:
    """Multipart upload, HEAD, the lifecycle rules, DeleteObjects: what publish, rotation
    and the sweep send, signed as boto3 signs them."""
    big = tmp_path / "big.sqsh"
    big.write_bytes(secrets.token_bytes(17 * 1024 * 1024))  # two parts of 16 MiB chunks
    key = backup_key("widgets-checkout-big")
    facts = store.r2.upload(key, big)
    assert facts.size == big.stat().st_size
    assert store.r2.head(key) == facts
    store.r2.apply_lifecycle(31)
    assert store.r2.lifecycle_problems(31) == []
    assert store.r2.delete([key, ARCHIVE]).failed == ()
    assert store.r2.head(key) is None
    record = store.table.get_item(Key=slot_key(VICTIM), ConsistentRead=True)["Item"]
    assert record["state"] == State.SEEDED.value


def test_a_presigned_put_larger_than_a_signed_body_is_spooled_and_stored(
    store: Store, tmp_path: Path
) -> None:
    """A checkpoint is one presigned PUT of up to S3's single-PUT limit: past the 64 MiB a
    signed body may have, the store spools it to a file and stores it whole."""
    body = tmp_path / "checkpoint.sqsh"
    body.write_bytes(secrets.token_bytes(MAX_BODY + 1024))
    content = body.read_bytes()
    sha256, md5 = (
        hashlib.sha256(content).hexdigest(),
        hashlib.md5(content, usedforsecurity=False).hexdigest(),
    )
    key = "checkpoints/slot-1/local-slot-1-1/2.sqsh"
    put = store.r2.presign_put(key, 60, size=len(content), sha256=sha256, md5=md5)
    headers = {k: v for k, v in put.headers.items() if k.lower() != "content-length"}
    upload(put.url, body, headers, size=len(content), timeout=30)
    facts = store.r2.head(key)
    assert facts is not None
    assert (facts.size, facts.etag) == (len(content), md5)


def test_the_read_only_r2_token_reads_objects_and_nothing_else(
    stack: LocalStack, store: Store
) -> None:
    """As R2 takes an Object Read token: a GET or HEAD of an object, signed or presigned;
    never a write, a delete, the bucket's configuration, a listing, nor DynamoDB."""
    before = store.contents()
    reader = stack.r2_read_credentials
    url = f"{store.endpoint}/{store.bucket}/{ARCHIVE}"

    def as_reader(method: str, target: str, body: bytes = b"") -> dict[str, str]:
        return signed(
            method,
            target,
            body,
            {},
            key=reader.access_key,
            secret=reader.secret_key,
            service="s3",
            region=R2_REGION,
        )

    assert send(url, "GET", as_reader("GET", url)).body == ARCHIVE_BODY
    assert send(url, "HEAD", as_reader("HEAD", url)).status == 200
    forged = b"planted archive"
    assert send(url, "PUT", as_reader("PUT", url, forged), forged).status == 403
    assert send(url, "DELETE", as_reader("DELETE", url)).status == 403
    listing = f"{store.endpoint}/{store.bucket}?list-type=2"
    assert send(listing, "GET", as_reader("GET", listing)).status == 403
    rules = f"{store.endpoint}/{store.bucket}?lifecycle"
    assert send(rules, "GET", as_reader("GET", rules)).status == 403
    body, headers = unseed_the_victim(store)
    dynamodb = headers | signed(
        "POST",
        store.endpoint + "/",
        body,
        headers,
        key=reader.access_key,
        secret=reader.secret_key,
        service="dynamodb",
        region=REGION,
    )
    assert send(store.endpoint + "/", "POST", dynamodb, body).status == 403
    # What the functions presign with it: a GET works, a PUT never (R2 would refuse it).
    read_only = R2.from_settings(
        R2Settings(
            bucket=store.bucket,
            endpoint=store.endpoint,
            read_access_key_id=reader.access_key,
            read_secret_access_key=reader.secret_key,
            access_key_id=None,  # the read-only token alone, as a reader function is given
            secret_access_key=None,
        )
    )
    assert send(read_only.presign_get(ARCHIVE, 60), "GET", {}).body == ARCHIVE_BODY
    with pytest.raises(R2Unconfigured):
        read_only.presign_put(ARCHIVE, 60, size=1, sha256="0" * 64, md5="0" * 32)
    assert store.contents() == before
