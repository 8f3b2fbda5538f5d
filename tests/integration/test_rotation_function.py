"""The rotation function invoked with the events in events/, as Lambda would."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import boto3
import pytest

from conftest import Stack
from functions import event, invoke, load_function
from seedkeeper.adapters.r2 import backup_key

rotation = load_function("rotation")


def posted() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(event("rotation-post")["body"])
    return body


def put_archives(stack: Stack, snapshot: dict[str, Any]) -> None:
    s3 = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
    for part in ("checkout", "deps"):
        s3.put_object(
            Bucket=stack.r2_settings.bucket or "",
            Key=backup_key(snapshot[part]["backup_id"]),
            Body=b"x" * snapshot[part]["size"],
        )


def with_ids(snapshot: dict[str, Any], suffix: str) -> dict[str, Any]:
    changed: dict[str, Any] = json.loads(json.dumps(snapshot))
    for part in ("checkout", "deps"):
        changed[part]["backup_id"] += suffix
    changed["sha"] = hashlib.sha1(suffix.encode()).hexdigest()  # noqa: S324 - a fake commit id
    return changed


def test_healthz_reports_presigned_transfer(stack: Stack) -> None:
    status, body = invoke(rotation, event("rotation-healthz"))
    assert status == 200
    assert body == {"ok": True, "build": "0.1.0", "backupTransfer": "presigned"}


def test_healthz_reports_unconfigured_transfer(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEEDKEEPER_R2_BUCKET")
    status, body = invoke(rotation, event("rotation-healthz"))
    assert (status, body["backupTransfer"]) == (200, "unconfigured")


def test_post_get_rotate_and_delete(stack: Stack) -> None:
    snapshot = posted()
    put_archives(stack, snapshot)
    status, body = invoke(rotation, event("rotation-post"))
    assert status == 201
    assert body["rotated"] is True
    assert body["current"]["generation"] == 1

    status, again = invoke(rotation, event("rotation-post"))
    assert (status, again["rotated"]) == (200, False)

    status, body = invoke(rotation, event("rotation-get"))
    assert status == 200
    assert body["seed_handle"] == {
        "ref": snapshot["ref"],
        "sha": snapshot["sha"],
        "checkout_backup_id": snapshot["checkout"]["backup_id"],
        "deps_backup_id": snapshot["deps"]["backup_id"],
    }
    assert body["objects"] == {"recorded": 2, "present": 2}
    assert body["deps"][0]["lockfile_hash"] == snapshot["lockfile_hash"]

    for suffix in ("-b", "-c"):
        newer = with_ids(snapshot, suffix)
        put_archives(stack, newer)
        status, body = invoke(rotation, event("rotation-post", body=newer))
        assert status == 201
    assert body["current"]["generation"] == 3
    assert sorted(body["payment"]["deleted"]) == sorted(
        [snapshot["checkout"]["backup_id"], snapshot["deps"]["backup_id"]]
    )

    status, body = invoke(rotation, event("rotation-delete"))
    assert status == 200
    assert len(body["deleted"]) == 4
    assert body["pending"] == []
    status, body = invoke(rotation, event("rotation-get"))
    assert (status, body) == (404, {"error": "resource-not-found", "detail": None, "fields": []})
    status, _ = invoke(rotation, event("rotation-delete"))
    assert status == 404


def test_bad_input_is_refused_naming_the_fields(stack: Stack) -> None:
    status, body = invoke(rotation, event("rotation-post-bad-input"))
    assert status == 400
    assert body["error"] == "invalid-request"
    fields = {problem["field"] for problem in body["fields"]}
    assert fields == {"body.checkout.backup_id", "body.checkout.size"}
    status, _ = invoke(rotation, event("rotation-get"))
    assert status == 404  # nothing was written


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{not json", "body"),
        ({**posted(), "surprise": 1}, "body.surprise"),
        ({**posted(), "sha": "HEAD"}, "body.sha"),
        ({**posted(), "ref": "refs/../../x"}, "body.ref"),
        ({k: v for k, v in posted().items() if k != "lockfile_hash"}, "body"),
    ],
)
def test_every_kind_of_bad_body_gets_400(stack: Stack, body: Any, field: str) -> None:
    status, answer = invoke(rotation, event("rotation-post", body=body))
    assert status == 400
    assert any(problem["field"].startswith(field) for problem in answer["fields"])


def test_a_bad_resource_in_the_path_is_400(stack: Stack) -> None:
    request = event("rotation-get", rawPath="/snapshots/..%2F..%2Fetc")
    request["requestContext"]["http"]["path"] = request["rawPath"]
    status, answer = invoke(rotation, request)
    assert status == 400
    assert answer["fields"][0]["field"] == "path.resource"


def test_a_backup_id_reused_for_other_bytes_is_a_409(stack: Stack) -> None:
    snapshot = posted()
    assert invoke(rotation, event("rotation-post"))[0] == 201
    impostor = with_ids(snapshot, "-z")
    impostor["checkout"] = dict(snapshot["checkout"], size=7)
    status, answer = invoke(rotation, event("rotation-post", body=impostor))
    assert (status, answer["error"]) == (409, "backup-id-reused")


def test_a_misconfigured_table_is_a_500_that_discloses_nothing(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_TABLE", "no-such-table")
    status, answer = invoke(rotation, event("rotation-get"))
    assert status == 500
    assert answer["error"] == "internal-error"


def test_a_backup_id_another_resource_recorded_is_a_409_that_writes_nothing(stack: Stack) -> None:
    snapshot = posted()
    put_archives(stack, snapshot)
    assert invoke(rotation, event("rotation-post"))[0] == 201
    other = dict(snapshot, resource="other-widgets")  # the same objects, sizes and sha256
    status, answer = invoke(rotation, event("rotation-post", body=other))
    named = ", ".join(sorted(other[part]["backup_id"] for part in ("checkout", "deps")))
    refusal = {"error": "backup-id-owned", "detail": named, "fields": []}
    assert (status, answer) == (409, refusal)  # the caller's own ids; not the owner
    request = event("rotation-get", rawPath="/snapshots/other-widgets")
    request["requestContext"]["http"]["path"] = request["rawPath"]
    assert invoke(rotation, request)[0] == 404
    status, body = invoke(rotation, event("rotation-get"))
    assert (status, body["objects"]) == (200, {"recorded": 2, "present": 2})
