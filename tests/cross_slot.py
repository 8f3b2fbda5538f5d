"""One slot task acting for another, on a running local stack (either runtime): every slot
task holds the one task role, so IAM cannot tell them apart; the checkpoint function must.
Task A, with its own keys (its session of the role), asks for slot B's start, for a
presigned PUT over B's checkpoint, and to write B's record (a verdict, a loss, a freeze),
naming B's task or itself; it also tries B's record in the store directly. Every call is
refused, nothing is handed out, and B's record is unchanged."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from executor import ORIGIN, claim_for
from seedkeeper.config import StoreSettings
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.record import SlotRecord, Supported, slot_key
from seedkeeper_client import Seeded, SeedIdentity, SeedkeeperClient
from seedkeeper_task import function_url
from seedkeeper_tools.local.principals import LocalCredentials, TaskKeys
from seedkeeper_tools.local.stack import REGION, LocalStack

NOT_THIS_TASK: dict[str, Any] = {"error": "not-this-task", "detail": None, "fields": []}


@dataclass(frozen=True)
class Seeded2:
    a: SlotRecord
    b: SlotRecord
    a_keys: LocalCredentials


def seed_two(stack: LocalStack, client: SeedkeeperClient, seed: SeedIdentity) -> Seeded2:
    """Slots `slot-a` and `slot-b`, of two owners, seeded; then both idle past their window
    and swept, so each has an open checkpoint (their tasks look at their records rarely:
    the request stays open while A acts)."""
    for slot, run in (("slot-a", "run-a"), ("slot-b", "run-b")):
        answer = client.seed(
            slot, seed, claim=claim_for(seed, run=run), origin=ORIGIN, wait=True, timeout=120
        )
        assert isinstance(answer, Seeded), answer
    time.sleep(stack.idle_window + 1)
    report = stack.sweep()
    assert sorted(report.checkpoints_requested) == ["slot-a", "slot-b"], report
    a, b = record("slot-a"), record("slot-b")
    assert a.incarnation is not None
    return Seeded2(a, b, TaskKeys(stack.data_dir).issue(a.incarnation))


def record(slot: str) -> SlotRecord:
    classified = StoreSettings().lifecycle().read(slot)
    assert isinstance(classified, Supported), classified
    return classified.record


def wire_item(slot: str) -> dict[str, Any]:
    """The record exactly as the store holds it."""
    item: dict[str, Any] = (
        StoreSettings().table_resource().get_item(Key=slot_key(slot), ConsistentRead=True)["Item"]
    )
    return item


def as_task(stack: LocalStack, keys: LocalCredentials, path: str, body: Any) -> tuple[int, Any]:
    """A call to the stack's checkpoint function, signed with a task's keys."""
    return function_url.post(
        stack.url + path,
        body,
        timeout=30,
        credentials=Credentials(keys.access_key, keys.secret_key),
    )


def assert_a_task_cannot_act_for_another(stack: LocalStack, seeded: Seeded2) -> None:
    a, b, keys = seeded.a, seeded.b, seeded.a_keys
    before = wire_item(b.slot)
    (restore,) = [e for e in b.window.entries if e.kind is OpKind.RESTORE]
    (checkpoint,) = [e for e in b.window.entries if e.kind is OpKind.CHECKPOINT]
    data = b"not b's work"
    for incarnation in (b.incarnation, a.incarnation):  # naming B's task, then itself
        named = {"slot": b.slot, "incarnation": incarnation}
        op = {"ordinal": checkpoint.ordinal, "generation": checkpoint.generation}
        calls = {
            "/tasks/start": named
            | {"attempt": b.attempt, "op": {"ordinal": restore.ordinal, "generation": 1}},
            "/tasks/record": named,
            "/checkpoints/upload": named
            | {
                "op": op,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "md5": hashlib.md5(data, usedforsecurity=False).hexdigest(),
            },
            "/checkpoints/failed": named | {"op": op, "reason": "capture-failed"},
            "/tasks/freeze": named | {"attempt": b.attempt, "op": op},
            "/tasks/settle": named
            | {
                "attempt": b.attempt,
                "restore": {"ordinal": restore.ordinal, "generation": restore.generation},
                "result": {"outcome": "failed", "reason": "seed-failed", "step": "x", "detail": ""},
            },
            "/tasks/lose": named | {"reason": "task-stopped", "detail": "forged"},
            "/tasks/checkpoint-on-stop": named | {"attempt": b.attempt},
            "/tasks/park-on-stop": named | {"attempt": b.attempt},
        }
        for path, body in calls.items():
            assert as_task(stack, keys, path, body) == (403, NOT_THIS_TASK), (path, incarnation)
    # The store takes no task's keys at all (only the functions hold the store's).
    with pytest.raises(ClientError) as refused:
        StoreSettings().table_resource(_session(keys)).update_item(
            Key=slot_key(b.slot),
            UpdateExpression="SET #s = :s",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":s": "lost"},
        )
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert wire_item(b.slot) == before


def _session(keys: LocalCredentials) -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id=keys.access_key,
        aws_secret_access_key=keys.secret_key,
        region_name=REGION,
    )
