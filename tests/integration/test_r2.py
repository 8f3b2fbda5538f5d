"""The R2 adapter over HTTP against a moto server standing in for R2: multipart upload,
HEAD, presigned reads with ranges, deletion, the lifecycle backstop and keys from Secrets
Manager. moto does not check presigned signatures: the unit tests do."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from aws_lambda_powertools.utilities import parameters
from pydantic import SecretStr

from seedkeeper.adapters import r2 as r2_module
from seedkeeper.adapters.r2 import R2, DeleteReport, R2Settings, backup_key

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import LifecycleRuleTypeDef

MIB = 1024 * 1024
FAKE_KEY = "testing"  # moto accepts any keys


@pytest.fixture
def endpoint(moto_endpoint: str) -> str:
    return moto_endpoint


@pytest.fixture
def s3(endpoint: str) -> S3Client:
    return r2_module._s3_client(endpoint, SecretStr(FAKE_KEY), SecretStr(FAKE_KEY))


@pytest.fixture
def bucket(s3: S3Client) -> str:
    name = f"r2-{uuid.uuid4().hex[:12]}"
    # A client in region "auto" must name it as the bucket's location; AWS's stubs do not know it.
    s3.create_bucket(
        Bucket=name,
        CreateBucketConfiguration={"LocationConstraint": "auto"},  # type: ignore[typeddict-item]
    )
    return name


@pytest.fixture
def r2(endpoint: str, bucket: str) -> R2:
    return R2.from_settings(
        R2Settings(
            bucket=bucket, endpoint=endpoint, access_key_id=FAKE_KEY, secret_access_key=FAKE_KEY
        )
    )


def stored(s3: S3Client, bucket: str, key: str, content: bytes) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=content)


def fetch(url: str, method: str = "GET", **headers: str) -> tuple[int, bytes, dict[str, str]]:
    assert url.startswith("http://127.0.0.1:")
    request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return response.status, response.read(), dict(response.headers)


def test_a_large_file_goes_up_in_equal_parts_reporting_progress(
    s3: S3Client, bucket: str, tmp_path: Path
) -> None:
    archive = tmp_path / "snap.sqsh"
    with archive.open("wb") as out:
        for _ in range(40):
            out.write(os.urandom(MIB))
    content = archive.read_bytes()
    r2 = R2(s3, bucket, chunk_size=8 * MIB)
    progress: list[int] = []

    facts = r2.upload(backup_key("snap-1"), archive, progress.append)

    assert facts.key == "backups/snap-1.sqsh"
    assert facts.size == 40 * MIB
    assert facts.etag.endswith("-5")  # a multipart etag: five parts of 8 MiB
    assert sum(progress) == 40 * MIB
    assert len(progress) > 5
    assert r2.head(facts.key) == facts
    # Bytes across a part boundary come back as they went up.
    start, end = 8 * MIB - 10, 8 * MIB + 9
    status, body, _ = fetch(r2.presign_get(facts.key, 60), Range=f"bytes={start}-{end}")
    assert (status, body) == (206, content[start : end + 1])


def test_upload_without_progress_returns_the_head_facts(r2: R2, tmp_path: Path) -> None:
    small = tmp_path / "small.sqsh"
    small.write_bytes(b"squashfs")
    facts = r2.upload("backups/small.sqsh", small)
    assert (facts.size, facts.etag) == (8, hashlib.md5(b"squashfs").hexdigest())  # noqa: S324


def test_head_answers_size_and_etag_and_none_for_a_missing_object(
    r2: R2, s3: S3Client, bucket: str
) -> None:
    stored(s3, bucket, "backups/a.sqsh", b"0123456789")

    facts = r2.head("backups/a.sqsh")

    assert facts is not None
    assert (facts.size, facts.etag) == (10, hashlib.md5(b"0123456789").hexdigest())  # noqa: S324
    assert r2.head("backups/missing.sqsh") is None


def test_presigned_urls_read_the_object_and_honour_a_range(
    r2: R2, s3: S3Client, bucket: str
) -> None:
    stored(s3, bucket, "backups/a.sqsh", b"0123456789")

    assert fetch(r2.presign_get("backups/a.sqsh", 60))[:2] == (200, b"0123456789")
    assert fetch(r2.presign_get("backups/a.sqsh", 60), Range="bytes=2-4")[:2] == (206, b"234")
    status, body, headers = fetch(r2.presign_head("backups/a.sqsh", 60), method="HEAD")
    assert (status, body, headers["Content-Length"]) == (200, b"", "10")


def test_delete_counts_a_missing_key_as_deleted(r2: R2, s3: S3Client, bucket: str) -> None:
    stored(s3, bucket, "backups/a.sqsh", b"a")
    stored(s3, bucket, "backups/keep.sqsh", b"k")

    report = r2.delete(["backups/a.sqsh", "backups/missing.sqsh"])

    assert report == DeleteReport(deleted=("backups/a.sqsh", "backups/missing.sqsh"), failed=())
    assert r2.head("backups/a.sqsh") is None
    assert r2.head("backups/keep.sqsh") is not None


def test_a_bare_bucket_lacks_our_lifecycle_rules(r2: R2) -> None:
    assert r2.lifecycle_problems(31) == [
        "lifecycle rule seedkeeper-backups-expire is missing",
        "lifecycle rule seedkeeper-checkpoints-expire is missing",
        "lifecycle rule seedkeeper-abort-incomplete-multipart is missing",
    ]


def test_apply_lifecycle_keeps_a_foreign_rule_and_is_idempotent(
    r2: R2, s3: S3Client, bucket: str
) -> None:
    foreign: LifecycleRuleTypeDef = {
        "ID": "logs-expire",
        "Filter": {"Prefix": "logs/"},
        "Status": "Enabled",
        "Expiration": {"Days": 7},
    }
    s3.put_bucket_lifecycle_configuration(
        Bucket=bucket,
        LifecycleConfiguration={
            "Rules": [
                foreign,
                {
                    "ID": "seedkeeper-backups-expire",
                    "Filter": {"Prefix": "backups/"},
                    "Status": "Enabled",
                    "Expiration": {"Days": 30},
                },
            ]
        },
    )
    assert r2.lifecycle_problems(31) == [
        "lifecycle rule seedkeeper-backups-expire: expiration days is 30, expected 365",
        "lifecycle rule seedkeeper-checkpoints-expire is missing",
        "lifecycle rule seedkeeper-abort-incomplete-multipart is missing",
    ]

    r2.apply_lifecycle(31)
    r2.apply_lifecycle(31)

    assert r2.lifecycle_problems(31) == []
    rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert sorted(rule.get("ID", "") for rule in rules) == [
        "logs-expire",
        "seedkeeper-abort-incomplete-multipart",
        "seedkeeper-backups-expire",
        "seedkeeper-checkpoints-expire",
    ]
    assert [rule for rule in rules if rule.get("ID") == "logs-expire"] == [foreign]


@pytest.fixture
def secrets_manager(
    endpoint: str, aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Secrets Manager in the moto server, for Powertools' own client too."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", endpoint)
    # Powertools keeps its client, and the values it read, between calls.
    parameters.clear_caches()  # type: ignore[no-untyped-call]
    yield endpoint
    parameters.clear_caches()  # type: ignore[no-untyped-call]


def test_from_settings_reads_the_keys_from_secrets_manager(
    secrets_manager: str, bucket: str, tmp_path: Path
) -> None:
    arn = boto3.client("secretsmanager", endpoint_url=secrets_manager).create_secret(
        Name=f"r2-keys-{uuid.uuid4().hex[:8]}",
        SecretString=json.dumps(
            {"access_key_id": "AKIDFROMSECRET", "secret_access_key": "secret-from-secret"}
        ),
    )["ARN"]
    settings = R2Settings(bucket=bucket, endpoint=secrets_manager, secret_arn=arn)
    small = tmp_path / "small.sqsh"
    small.write_bytes(b"squashfs")

    r2 = R2.from_settings(settings)

    url = r2.presign_get("backups/small.sqsh", 60)
    assert "X-Amz-Credential=AKIDFROMSECRET%2F" in url
    assert r2.upload("backups/small.sqsh", small).size == 8
    assert fetch(url)[:2] == (200, b"squashfs")


def test_create_bucket_is_idempotent(endpoint: str, r2: R2, s3: S3Client) -> None:
    assert r2.create_bucket() is False  # the fixture's bucket exists already
    fresh = R2(s3, f"r2-{uuid.uuid4().hex[:12]}")
    assert fresh.create_bucket() is True
    assert fresh.create_bucket() is False
    assert fresh.head(backup_key("absent")) is None
