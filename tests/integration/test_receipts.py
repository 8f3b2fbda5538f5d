"""Receipts and slot evidence through their functions, with real checkpoint objects in
moto-as-R2, and records from a newer deployment or malformed ones written straight in."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from conftest import R2_SECRET_ARN, Stack
from functions import event, invoke, load_function
from seedkeeper import config
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings, new_checkpoint
from seedkeeper.domain.models import Binding, OwnerClaim, SeedIdentity
from seedkeeper.domain.record import Loss, SeedSucceeded, SlotRecord, Supported, slot_key
from seedkeeper.store.lifecycle import Lifecycle, Written

receipt_function = load_function("receipt")
evidence_function = load_function("slot_evidence")
seed_function = load_function("seed")

REQUEST: dict[str, Any] = json.loads(event("receipt")["body"])
SLOT = REQUEST["slot"]
NOW = 1_800_000_000


def written(outcome: object) -> SlotRecord:
    assert isinstance(outcome, Written), outcome
    return outcome.record


@dataclass
class Checkpointed:
    stack: Stack
    lifecycle: Lifecycle
    key: str

    def s3(self) -> Any:
        return boto3.client("s3", endpoint_url=self.stack.endpoint, region_name="auto")


@pytest.fixture
def runtime_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts every slot runtime these functions would build: there must be none."""
    calls: list[str] = []

    def counting(settings: object) -> object:
        calls.append("runtime_from")
        raise AssertionError("a receipt or evidence read built a slot runtime")

    monkeypatch.setattr(config, "runtime_from", counting)
    monkeypatch.setenv("SEEDKEEPER_RUNTIME", "local")
    return calls


def seeded_slot(stack: Stack) -> tuple[Lifecycle, SlotRecord]:
    lifecycle = stack.store.lifecycle()
    claim = OwnerClaim.model_validate(REQUEST["claim"])
    seed = SeedIdentity.model_validate(REQUEST["seed"])
    birth = written(
        lifecycle.birth(
            SLOT,
            Binding(owner=claim, seed=seed, origin=json.loads(event("seed-new")["body"])["origin"]),
            now=NOW,
            idle_deadline=NOW + 600,
        )
    )
    restore = birth.window.entries[0].ref
    record = written(
        lifecycle.write(
            transitions.RECORD_INCARNATION,
            birth,
            transitions.Launched(incarnation=REQUEST["incarnation"], launch=restore, now=NOW),
        )
    )
    verdict = SeedSucceeded(
        ref=seed.ref, head=seed.sha, from_backup=seed.checkout_backup_id, steps={}, ms=1
    )
    record = written(
        lifecycle.write(
            transitions.SETTLE_SEED,
            record,
            transitions.Verdict(attempt=1, restore=restore, result=verdict, now=NOW),
        )
    )
    return lifecycle, record


@pytest.fixture
def checkpointed(stack: Stack) -> Checkpointed:
    """A seeded slot whose checkout was checkpointed to R2 and recorded."""
    lifecycle, record = seeded_slot(stack)
    upload = written(
        lifecycle.write(
            transitions.REQUEST_CHECKPOINT, record, transitions.At(now=record.idle_deadline + 1)
        )
    )
    body = b"checkpoint of the run's work"
    key = f"checkpoints/{SLOT}/1.sqsh"
    boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto").put_object(
        Bucket=stack.r2_settings.bucket or "", Key=key, Body=body
    )
    facts = stack.r2.head(key)
    assert facts is not None
    checkpoint = new_checkpoint(
        RetentionSettings(),
        key=facts.key,
        size=facts.size,
        etag=facts.etag,
        sha256=hashlib.sha256(body).hexdigest(),
        owner=record.owner,
        incarnation=REQUEST["incarnation"],
        now=NOW,
    )
    assert checkpoint.expires_at == NOW + RetentionSettings().park_retention
    written(
        lifecycle.write(
            transitions.RECORD_CHECKPOINT,
            upload,
            transitions.Uploaded(
                checkpoint=checkpoint, upload=upload.window.entries[-1].ref, now=NOW
            ),
        )
    )
    return Checkpointed(stack, lifecycle, key)


def test_a_present_checkpoint_is_proved_without_a_runtime(
    checkpointed: Checkpointed, runtime_calls: list[str]
) -> None:
    status, answer = invoke(receipt_function, event("receipt"))
    assert status == 200
    assert answer["checkpoint"] == "present"
    assert answer["size"] == len(b"checkpoint of the run's work")
    assert answer["expires_at"] > answer["created_at"]
    assert runtime_calls == []


def test_a_checkpoint_deleted_behind_its_back_is_lost(
    checkpointed: Checkpointed, runtime_calls: list[str]
) -> None:
    checkpointed.s3().delete_object(
        Bucket=checkpointed.stack.r2_settings.bucket or "", Key=checkpointed.key
    )
    status, answer = invoke(receipt_function, event("receipt"))
    assert (status, answer["checkpoint"]) == (200, "lost")
    assert runtime_calls == []


def test_a_changed_object_a_missing_bucket_or_no_r2_is_unknown(
    checkpointed: Checkpointed, monkeypatch: pytest.MonkeyPatch, runtime_calls: list[str]
) -> None:
    bucket = checkpointed.stack.r2_settings.bucket or ""
    checkpointed.s3().put_object(Bucket=bucket, Key=checkpointed.key, Body=b"other bytes")
    assert invoke(receipt_function, event("receipt"))[1]["why"] == "checkpoint-changed"
    monkeypatch.setenv("SEEDKEEPER_R2_BUCKET", "no-such-bucket")
    status, answer = invoke(receipt_function, event("receipt"))
    assert (status, answer["checkpoint"], answer["why"]) == (200, "unknown", "no-bucket")
    monkeypatch.delenv("SEEDKEEPER_R2_BUCKET")
    status, answer = invoke(receipt_function, event("receipt"))
    assert (answer["checkpoint"], answer["why"]) == ("unknown", "r2-unconfigured")
    assert runtime_calls == []


def test_a_receipt_with_no_checkpoint_to_look_at_reads_no_r2_secret(
    stack: Stack, unreadable_r2_secret: list[str], runtime_calls: list[str]
) -> None:
    seeded_slot(stack)
    status, answer = invoke(receipt_function, event("receipt"))
    assert (status, answer["checkpoint"], answer["why"]) == (200, "unknown", "no-checkpoint")
    assert unreadable_r2_secret == []


def test_a_checkpoint_behind_an_unreadable_r2_secret_is_unknown(
    checkpointed: Checkpointed, unreadable_r2_secret: list[str], runtime_calls: list[str]
) -> None:
    """As when R2 does not answer: nothing is claimed either way."""
    status, answer = invoke(receipt_function, event("receipt"))
    assert (status, answer["checkpoint"], answer["why"]) == (200, "unknown", "r2-unavailable")
    assert unreadable_r2_secret == [R2_SECRET_ARN]
    assert runtime_calls == []


def test_no_checkpoint_is_unknown(stack: Stack, runtime_calls: list[str]) -> None:
    seeded_slot(stack)
    status, answer = invoke(receipt_function, event("receipt"))
    assert (status, answer["checkpoint"], answer["why"]) == (200, "unknown", "no-checkpoint")


def variants() -> list[dict[str, Any]]:
    """Every field of the request made wrong, one at a time, and an absent slot."""
    wrong: list[dict[str, Any]] = [REQUEST | {"slot": "no-such-slot"}]
    for field in REQUEST["claim"]:
        value = "b" * 40 if field == "head" else "other"
        wrong.append(REQUEST | {"claim": REQUEST["claim"] | {field: value}})
    for field in ("ref", "sha", "checkout_backup_id", "deps_backup_id"):
        value = "c" * 40 if field == "sha" else "other"
        wrong.append(REQUEST | {"seed": REQUEST["seed"] | {field: value}})
    wrong.append(REQUEST | {"incarnation": "local:someone-else:1"})
    return wrong


def test_every_wrong_field_and_an_absent_slot_get_the_identical_refusal(
    checkpointed: Checkpointed, runtime_calls: list[str]
) -> None:
    answers = {
        json.dumps(invoke(receipt_function, event("receipt", body=body))) for body in variants()
    }
    assert answers == {json.dumps([404, {"error": "no-match", "detail": None, "fields": []}])}
    assert invoke(receipt_function, event("receipt-wrong-owner"))[0] == 404


def test_evidence_of_a_running_checkpointed_slot_is_retained(
    checkpointed: Checkpointed, runtime_calls: list[str]
) -> None:
    status, answer = invoke(evidence_function, event("slot-evidence"))
    assert status == 200
    assert answer == {
        "slot": SLOT,
        "incarnation": REQUEST["incarnation"],
        "state": "checkpointed",
        "checkpoint": "present",
        "disposition": "retained",
    }
    refused = invoke(evidence_function, event("slot-evidence-wrong-claim"))
    assert refused == (404, {"error": "no-match", "detail": None, "fields": []})
    absent = json.loads(event("slot-evidence")["body"]) | {"slot": "nobody"}
    assert invoke(evidence_function, event("slot-evidence", body=absent)) == refused
    assert "alice" not in json.dumps(refused)
    assert runtime_calls == []


@pytest.mark.parametrize(
    "foreign",
    [
        {"schema": 99, "shape": "from a newer deployment"},
        {"schema": 1, "rev": "seven", "state": "seeded"},
    ],
)
def test_a_newer_or_malformed_record_is_refused_by_seed_unknown_to_receipts_and_untouched(
    stack: Stack, foreign: dict[str, Any], runtime_calls: list[str]
) -> None:
    item = {**slot_key(SLOT), **foreign}
    stack.table.put_item(Item=item)
    status, answer = invoke(seed_function, event("seed-new"))
    assert (status, answer) == (409, {"error": "record-unsupported", "detail": None, "fields": []})
    status, answer = invoke(receipt_function, event("receipt"))
    assert (status, answer["checkpoint"]) == (200, "unknown")
    assert invoke(evidence_function, event("slot-evidence"))[0] == 404
    assert stack.table.get_item(Key=slot_key(SLOT), ConsistentRead=True)["Item"] == item
    assert runtime_calls == []


def lose(lifecycle: Lifecycle, record: SlotRecord, *, at: int) -> SlotRecord:
    """The slot's task found stopped by the platform with nothing verified of its work."""
    loss = Loss(reason="spot-interruption", detail="SpotInterruption: capacity reclaimed", at=at)
    lost = transitions.Lost(
        incarnation=REQUEST["incarnation"],
        loss=loss,
        expires_at=at + RetentionSettings().park_retention,
    )
    return written(lifecycle.write(transitions.LOSE, record, lost))


LOST_RECEIPT = {
    "slot": SLOT,
    "checkpoint": "lost",
    "why": "spot-interruption",
    "size": None,
    "sha256": None,
    "created_at": None,
    "expires_at": None,
    "parked": False,
    "retention_expires_at": None,
}


def test_a_lost_slot_s_receipt_says_lost_and_why(stack: Stack, runtime_calls: list[str]) -> None:
    lifecycle, record = seeded_slot(stack)
    lose(lifecycle, record, at=NOW + 900)
    assert invoke(receipt_function, event("receipt")) == (200, LOST_RECEIPT)
    assert runtime_calls == []


def test_a_lost_slot_shows_no_facts_of_a_checkpoint_that_is_not_its_work(
    checkpointed: Checkpointed, runtime_calls: list[str]
) -> None:
    """Its checkpoint expired before the task stopped: still named, still in R2, but it
    is not the work that was lost, so no receipt vouches for it."""
    lifecycle = checkpointed.lifecycle
    classified = lifecycle.read(SLOT)
    assert isinstance(classified, Supported)
    checkpoint = classified.record.checkpoint
    assert checkpoint is not None
    lost = lose(lifecycle, classified.record, at=checkpoint.expires_at)
    assert lost.checkpoint == checkpoint
    assert checkpointed.stack.r2.head(checkpointed.key) is not None
    assert invoke(receipt_function, event("receipt")) == (200, LOST_RECEIPT)
    assert runtime_calls == []


def test_evidence_of_a_lost_slot_says_so(stack: Stack, runtime_calls: list[str]) -> None:
    lifecycle, record = seeded_slot(stack)
    lose(lifecycle, record, at=NOW + 900)
    status, answer = invoke(evidence_function, event("slot-evidence"))
    assert (status, answer) == (
        200,
        {
            "slot": SLOT,
            "incarnation": REQUEST["incarnation"],
            "state": "lost",
            "checkpoint": "lost",
            "disposition": "lost",
        },
    )
    assert invoke(evidence_function, event("slot-evidence-wrong-claim"))[0] == 404
    assert runtime_calls == []
