"""The checkpoint function (POST /checkpoints/upload, /record, /failed) invoked as Lambda
does, over moto standing in for DynamoDB and R2: the presigned PUT goes over HTTP with the
slot task's own `capture.upload`, and every refusal is checked against the raw item.

What moto 5.2 does with a presigned PUT (checked here, see
`test_moto_stores_any_body_a_presigned_put_sends`): it verifies no signature, so neither
the signed Content-Length nor Content-MD5 nor x-amz-checksum-sha256 is enforced; it checks
no digest (R2 answers BadDigest); and without `x-amz-sdk-checksum-algorithm` it keeps no
checksum, so HEAD with ChecksumMode answers none. Here only the record's HEAD (size and
ETag) stands between a wrong body and a recorded checkpoint, which is what these tests
hold it to.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from builders import EXPIRED, NOW, ORIGIN, owner, seed, stored_in
from conftest import Stack
from functions import as_task, event, invoke, load_function
from seedkeeper import config
from seedkeeper.adapters.r2 import ObjectFacts
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RETRY_FIRST
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import Actor, OpKind, OpRef, OpStatus
from seedkeeper.domain.record import Checkpoint, SlotRecord, State, Supported, slot_key
from seedkeeper.store.lifecycle import Written
from seedkeeper_task.capture import upload

checkpoint_function = load_function("checkpoint")
receipt_function = load_function("receipt")
seed_function = load_function("seed")

SLOT = "slot-1"
INCARNATION = f"local:{SLOT}:1"  # what `stored_in` records
OTHER_SLOT = "slot-2"
DAY = 86_400
RETENTION = 30 * DAY  # SEEDKEEPER_PARK_RETENTION unless set
DATA = b"a squashfs of the slot's checkout\n" * 300

# The events' own slot and incarnation; their captured body is 4096 zero bytes.
EVENT_SLOT = "thread-42-slot"
EVENT_INCARNATION = (
    "arn:aws:ecs:us-east-1:123456789012:task/seedkeeper/0123456789abcdef0123456789abcdef"
)
EVENT_DATA = bytes(4096)


@dataclass
class Clock:
    """The functions' clock, on the builders' timeline (records are written at NOW)."""

    now: int

    def __call__(self) -> int:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Every service these functions build reads this clock: `config` looks `epoch_seconds`
    up when it builds one, and each test's stack (a new table) builds its own."""
    ticking = Clock(EXPIRED + 10)
    monkeypatch.setattr(config, "epoch_seconds", ticking)
    return ticking


# -- helpers -----------------------------------------------------------------------------


def call(route: str, body: Any, signer: str | None = None) -> tuple[int, Any]:
    """POST /checkpoints/<route> with `body`, through events/checkpoint-<route>.json, signed
    by the task it names (or by the task `signer`)."""
    request = event(f"checkpoint-{route}", body=body)
    named = body.get("incarnation") if isinstance(body, dict) else None
    incarnation = signer or (named if isinstance(named, str) else EVENT_INCARNATION)
    return invoke(checkpoint_function, as_task(request, incarnation))


def raw_item(stack: Stack, slot: str = SLOT) -> dict[str, Any] | None:
    """The item exactly as the table holds it."""
    item: dict[str, Any] | None = stack.table.get_item(Key=slot_key(slot), ConsistentRead=True).get(
        "Item"
    )
    return item


def current(stack: Stack, slot: str = SLOT) -> SlotRecord:
    classified = stack.store.lifecycle().read(slot)
    assert isinstance(classified, Supported), classified
    return classified.record


def checkpointing(stack: Stack, slot: str = SLOT, incarnation: str | None = None) -> SlotRecord:
    return stored_in(stack.store.lifecycle(), slot, State.CHECKPOINTING, incarnation)


def frozen(stack: Stack, record: SlotRecord, now: int) -> SlotRecord:
    """`frozen_at` written as the slot task writes it before it stops the sandbox."""
    freezing = transitions.Freezing(attempt=record.attempt, op=open_op(record), now=now)
    marked = stack.store.lifecycle().write(transitions.FREEZE, record, freezing)
    assert isinstance(marked, Written), marked
    return marked.record


def open_op(record: SlotRecord) -> OpRef:
    """The checkpoint op the sweep reserved for the slot task."""
    (entry,) = [e for e in record.window.entries if e.kind is OpKind.CHECKPOINT and not e.settled]
    return entry.ref


def op_named(record: SlotRecord) -> dict[str, int]:
    """The op as a call names it: its ordinal and generation (the actor is the slot task)."""
    op = open_op(record)
    return {"ordinal": op.ordinal, "generation": op.generation}


def captured(record: SlotRecord, data: bytes = DATA, **changes: Any) -> dict[str, Any]:
    """The body the slot task sends to /checkpoints/upload and /checkpoints/record."""
    body = {
        "slot": record.slot,
        "incarnation": record.incarnation,
        "op": op_named(record),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "md5": hashlib.md5(data, usedforsecurity=False).hexdigest(),
    }
    return body | changes


def not_taken(record: SlotRecord, reason: str = "capture-failed") -> dict[str, Any]:
    return {
        "slot": record.slot,
        "incarnation": record.incarnation,
        "op": op_named(record),
        "reason": reason,
        "detail": "mksquashfs exited 1",
    }


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def put(
    grant: dict[str, Any], data: bytes, folder: Path, extra: dict[str, str] | None = None
) -> None:
    """The slot task's PUT: the grant's headers as given (Content-Length, which the upload
    sends itself, left out), plus `extra`."""
    path = folder / "capture.sqsh"
    path.write_bytes(data)
    headers = {k: v for k, v in grant["headers"].items() if k.lower() != "content-length"}
    upload(grant["url"], path, headers | (extra or {}), size=len(data), timeout=30)


def granted(record: SlotRecord, data: bytes = DATA) -> dict[str, Any]:
    status, grant = call("upload", captured(record, data))
    assert status == 200, grant
    answer: dict[str, Any] = grant
    return answer


def receipt_body(slot: str = SLOT, incarnation: str = INCARNATION) -> dict[str, Any]:
    """events/receipt.json's request, naming a `stored_in` record exactly."""
    return {
        "slot": slot,
        "claim": owner().model_dump(mode="json"),
        "seed": seed().model_dump(mode="json"),
        "incarnation": incarnation,
    }


def s3(stack: Stack) -> Any:
    return boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")


def refusal(reason: str, detail: str | None = None) -> dict[str, Any]:
    return {"error": reason, "detail": detail, "fields": []}


NOT_THIS_TASK = refusal("not-this-task")
NOT_OPEN = refusal("checkpoint-not-open", "no such open checkpoint")


# -- 1. the whole path -------------------------------------------------------------------


def test_upload_put_and_record_checkpoint_the_slot(
    stack: Stack, clock: Clock, tmp_path: Path
) -> None:
    record = frozen(stack, checkpointing(stack), clock.now)
    op = open_op(record)
    sha256, md5 = (
        hashlib.sha256(DATA).hexdigest(),
        hashlib.md5(DATA, usedforsecurity=False).hexdigest(),
    )
    before = raw_item(stack)

    status, grant = call("upload", captured(record))

    key = f"checkpoints/{SLOT}/local-{SLOT}-1/{op.ordinal}.sqsh"  # the incarnation sanitised
    assert status == 200
    assert grant["key"] == key
    assert grant["expires_in"] == 900
    assert grant["headers"] == {
        "Content-Length": str(len(DATA)),
        "Content-MD5": b64(hashlib.md5(DATA, usedforsecurity=False).digest()),
        "x-amz-checksum-sha256": b64(hashlib.sha256(DATA).digest()),
    }
    url = urlsplit(grant["url"])
    assert url.path == f"/{stack.r2_settings.bucket}/{key}"
    signed = set(parse_qs(url.query)["X-Amz-SignedHeaders"][0].split(";"))
    assert {"content-length", "content-md5", "x-amz-checksum-sha256"} <= signed
    assert raw_item(stack) == before  # a grant writes nothing

    put(grant, DATA, tmp_path)
    status, recorded = call("record", captured(record))

    assert status == 200
    assert recorded == {
        "slot": SLOT,
        "state": "checkpointed",
        "key": key,
        "size": len(DATA),
        "sha256": sha256,
        "created_at": clock.now,
        "expires_at": clock.now + RETENTION,
    }
    after = current(stack)
    assert after.state is State.CHECKPOINTED
    assert after.rev == record.rev + 1
    assert after.frozen_at == record.frozen_at == clock.now  # the sandbox stays frozen
    assert after.checkpoint == Checkpoint(
        key=key,
        size=len(DATA),
        etag=md5,  # a single PUT's ETag is its MD5
        sha256=sha256,
        created_at=clock.now,
        expires_at=clock.now + RETENTION,
        owner=owner(),
        incarnation=INCARNATION,
    )
    entry = after.window.entry(op.ordinal)
    assert entry is not None
    assert (entry.status, entry.outcome) == (OpStatus.SETTLED, "uploaded")
    assert after.window.unsettled == 0
    assert stack.r2.head(key) == ObjectFacts(key=key, size=len(DATA), etag=md5)

    status, receipt = invoke(receipt_function, event("receipt", body=receipt_body()))
    assert status == 200
    assert receipt == {
        "slot": SLOT,
        "checkpoint": "present",
        "why": None,
        "size": len(DATA),
        "sha256": sha256,
        "created_at": clock.now,
        "expires_at": clock.now + RETENTION,
        "parked": False,
        "retention_expires_at": None,
    }


def test_the_event_files_round_trip_against_the_record_they_name(
    stack: Stack, tmp_path: Path
) -> None:
    """events/checkpoint-upload.json and -record.json, sent unchanged, checkpoint a record
    that is what they name: an ECS task's incarnation, its second op."""
    record = checkpointing(stack, EVENT_SLOT, EVENT_INCARNATION)
    assert json.loads(event("checkpoint-upload")["body"]) == captured(record, EVENT_DATA)
    assert event("checkpoint-record")["body"] == event("checkpoint-upload")["body"]

    status, grant = invoke(checkpoint_function, event("checkpoint-upload"))
    assert status == 200
    assert grant["key"] == (
        f"checkpoints/{EVENT_SLOT}/arn-aws-ecs-us-east-1-123456789012-task-seedkeeper-"
        "0123456789abcdef0123456789abcdef/2.sqsh"
    )
    put(grant, EVENT_DATA, tmp_path)
    status, recorded = invoke(checkpoint_function, event("checkpoint-record"))
    assert (status, recorded["state"], recorded["size"]) == (200, "checkpointed", 4096)


def test_the_failed_event_file_round_trips_against_the_record_it_names(stack: Stack) -> None:
    record = checkpointing(stack, EVENT_SLOT, EVENT_INCARNATION)
    sent = json.loads(event("checkpoint-failed")["body"])
    assert sent["op"] == op_named(record)
    status, answer = invoke(checkpoint_function, event("checkpoint-failed"))
    assert (status, answer["state"]) == (200, "seeded")
    assert current(stack, EVENT_SLOT).retained_reason == "checkpoint-failed"


# -- 2. forged calls ---------------------------------------------------------------------


@dataclass
class Forgery:
    stack: Stack
    record: SlotRecord
    items: dict[str, Any]


@pytest.fixture
def forgery(stack: Stack, tmp_path: Path) -> Forgery:
    """Two slots being checkpointed; the first one's object already uploaded as declared,
    so only the identity checks can stand between a forged record and the table."""
    record = checkpointing(stack)
    checkpointing(stack, OTHER_SLOT)
    put(granted(record), DATA, tmp_path)
    # An open op of another kind and actor beside the checkpoint (ordinal 3).
    launch = transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW)
    reserved = stack.store.lifecycle().write(transitions.RESERVE, record, launch)
    assert isinstance(reserved, Written), reserved
    items = {slot: raw_item(stack, slot) for slot in (SLOT, OTHER_SLOT)}
    return Forgery(stack, record, items)


def forged(record: SlotRecord, kind: str) -> dict[str, Any]:
    body = captured(record)
    op = body["op"]
    return {
        "another incarnation": body | {"incarnation": f"local:{OTHER_SLOT}:1"},
        "a well-formed stranger's incarnation": body | {"incarnation": EVENT_INCARNATION},
        "another slot": body | {"slot": OTHER_SLOT},
        "an absent slot": body | {"slot": "nobody"},
        "the settled restore op": body | {"op": op | {"ordinal": 1}},
        "an open launch op": body | {"op": op | {"ordinal": 3}},
        "no such op": body | {"op": op | {"ordinal": 9}},
        "another generation": body | {"op": op | {"generation": 2}},
        "signed by another slot's task": body,
    }[kind]


FORGERIES = [
    ("another incarnation", 403, NOT_THIS_TASK),
    ("a well-formed stranger's incarnation", 403, NOT_THIS_TASK),
    ("another slot", 403, NOT_THIS_TASK),
    ("an absent slot", 403, NOT_THIS_TASK),
    ("signed by another slot's task", 403, NOT_THIS_TASK),
    ("the settled restore op", 409, NOT_OPEN),
    ("an open launch op", 409, NOT_OPEN),
    ("no such op", 409, NOT_OPEN),
    ("another generation", 409, NOT_OPEN),
]


@pytest.mark.parametrize("route", ["upload", "record", "failed"])
@pytest.mark.parametrize(("kind", "status", "answer"), FORGERIES)
def test_a_forged_call_is_refused_and_writes_nothing(
    forgery: Forgery, route: str, kind: str, status: int, answer: dict[str, Any]
) -> None:
    body = forged(forgery.record, kind)
    if route == "failed":
        body = {k: v for k, v in body.items() if k not in {"size", "sha256", "md5"}}
        body |= {"reason": "capture-failed"}
    signer = f"local:{OTHER_SLOT}:1" if kind == "signed by another slot's task" else None
    assert call(route, body, signer) == (status, answer)
    assert {slot: raw_item(forgery.stack, slot) for slot in forgery.items} == forgery.items


def test_a_slot_not_being_checkpointed_grants_no_upload(stack: Stack) -> None:
    """Seeded, no checkpoint asked for: its one op (the settled restore) opens nothing."""
    record = stored_in(stack.store.lifecycle(), SLOT, State.SEEDED)
    restore = record.window.entries[0]
    body = {
        "slot": SLOT,
        "incarnation": INCARNATION,
        "op": {"ordinal": restore.ordinal, "generation": restore.generation},
        "size": len(DATA),
        "sha256": hashlib.sha256(DATA).hexdigest(),
        "md5": hashlib.md5(DATA, usedforsecurity=False).hexdigest(),
    }
    before = raw_item(stack)
    for route in ("upload", "record"):
        assert call(route, body) == (409, NOT_OPEN), route
    assert raw_item(stack) == before


# -- 3. a body other than the one declared -----------------------------------------------


def test_moto_stores_any_body_a_presigned_put_sends(stack: Stack, tmp_path: Path) -> None:
    """What the stand-in checks, so the tests below know what they rely on: nothing. R2
    refuses such a PUT (BadDigest, or a signature mismatch for another length)."""
    record = checkpointing(stack)
    grant = granted(record)
    wrong = DATA[:-1] + b"!"
    put(grant, wrong, tmp_path)  # wrong MD5 and SHA-256 headers: accepted
    facts = stack.r2.head(grant["key"], checksum=True)
    assert facts == ObjectFacts(
        key=grant["key"],
        size=len(wrong),
        etag=hashlib.md5(wrong, usedforsecurity=False).hexdigest(),
        sha256=None,
    )
    longer = DATA + b"more"
    put(grant, longer, tmp_path)  # another length than the signed one: accepted too
    facts = stack.r2.head(grant["key"], checksum=True)
    assert facts is not None
    assert facts.size == len(longer)


@pytest.mark.parametrize(
    ("sent", "why"),
    [
        (DATA[:-1] + b"!", "etag differs"),  # the same size, other bytes
        (DATA + b"more", "size differs"),
        (DATA[:-4], "size differs"),
    ],
)
def test_a_body_other_than_the_declared_one_is_never_recorded(
    stack: Stack, tmp_path: Path, sent: bytes, why: str
) -> None:
    record = checkpointing(stack)
    grant = granted(record)
    before = raw_item(stack)
    put(grant, sent, tmp_path)  # moto takes it (R2 would refuse it: nothing to record)
    assert call("record", captured(record)) == (409, refusal("checkpoint-unverified", why))
    assert raw_item(stack) == before
    assert current(stack).state is State.CHECKPOINTING


def test_a_checksum_the_store_kept_is_compared(stack: Stack, tmp_path: Path) -> None:
    """Moto keeps the header's SHA-256 when told the algorithm (R2 keeps it anyway): a
    record claiming another SHA-256 than the one the PUT carried is refused."""
    record = checkpointing(stack)
    grant = granted(record)
    put(grant, DATA, tmp_path, extra={"x-amz-sdk-checksum-algorithm": "SHA256"})
    facts = stack.r2.head(grant["key"], checksum=True)
    assert facts is not None
    assert facts.sha256 == hashlib.sha256(DATA).hexdigest()
    before = raw_item(stack)
    other = captured(record, sha256="0" * 64)
    assert call("record", other) == (409, refusal("checkpoint-unverified", "sha256 differs"))
    assert raw_item(stack) == before
    status, recorded = call("record", captured(record))
    assert (status, recorded["state"]) == (200, "checkpointed")


# -- 4. no upload at all -----------------------------------------------------------------


def test_a_frozen_slot_a_poll_brought_back_still_gets_its_upload(stack: Stack) -> None:
    """A task the platform is stopping never resumes its sandbox: what it captured while
    frozen is still uploaded after a poll moved the slot back to `seeded`. Once the task
    says it resumed the sandbox (the op abandoned), no upload is granted."""
    lifecycle = stack.store.lifecycle()
    asked = stored_in(lifecycle, SLOT, State.CHECKPOINTING)
    op = asked.window.entries[-1].ref
    frozen = lifecycle.apply(
        SLOT, transitions.FREEZE, transitions.Freezing(attempt=1, op=op, now=NOW)
    )
    assert isinstance(frozen, Written)
    poll = transitions.Poll(
        Binding(owner=owner(), seed=seed(), origin=ORIGIN), now=NOW, idle_deadline=NOW
    )
    thawed = lifecycle.apply(SLOT, transitions.THAW, poll)
    assert isinstance(thawed, Written)
    assert (thawed.record.state, thawed.record.frozen_at) == (State.SEEDED, NOW)

    status, grant = call("upload", captured(thawed.record))
    assert status == 200, grant

    resumed = lifecycle.apply(
        SLOT, transitions.THAWED, transitions.Thawed(attempt=1, op=op, now=NOW)
    )
    assert isinstance(resumed, Written)
    before = raw_item(stack)
    assert call("upload", captured(thawed.record)) == (409, NOT_OPEN)
    assert raw_item(stack) == before


def test_a_record_without_an_upload_is_unverified_and_writes_nothing(stack: Stack) -> None:
    record = checkpointing(stack)
    before = raw_item(stack)
    assert call("record", captured(record)) == (
        409,
        refusal("checkpoint-unverified", "no object"),
    )
    assert raw_item(stack) == before


# -- 5. a checkpoint not taken -------------------------------------------------------------


def emitted(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The EMF metrics printed so far (test_sweep reads them the same way)."""
    lines = capsys.readouterr().out.splitlines()
    return [json.loads(line) for line in lines if '"_aws"' in line]


def test_a_failed_checkpoint_seeds_the_slot_again_and_backs_off(
    stack: Stack, clock: Clock, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    record = frozen(stack, checkpointing(stack), clock.now)
    op = open_op(record)
    capsys.readouterr()

    status, answer = call("failed", not_taken(record, "capture-timeout"))

    assert (status, answer) == (
        200,
        {"slot": SLOT, "state": "seeded", "retry_at": clock.now + RETRY_FIRST},
    )
    first = current(stack)
    assert first.state is State.SEEDED
    assert (first.retained_reason, first.checkpoint_failures) == ("checkpoint-failed", 1)
    assert first.idle_deadline == clock.now + RETRY_FIRST >= record.idle_deadline
    assert (first.frozen_at, first.checkpoint) == (None, None)  # resumed; nothing kept
    entry = first.window.entry(op.ordinal)
    assert entry is not None
    assert (entry.status, entry.outcome) == (OpStatus.SETTLED, "capture-timeout")
    (metric,) = [m for m in emitted(capsys) if "CheckpointsFailed" in m]
    (declared,) = metric["_aws"]["CloudWatchMetrics"]
    assert (declared["Namespace"], declared["Dimensions"]) == ("Seedkeeper", [["reason"]])
    assert (metric["reason"], metric["CheckpointsFailed"]) == ("capture-timeout", [1.0])
    # The same op again: it is settled, so nothing more is counted.
    assert call("failed", not_taken(record, "capture-timeout")) == (409, NOT_OPEN)

    # Asked again once the backoff is over; a second failure in a row waits twice as long.
    clock.now = first.idle_deadline + 1
    again = stack.store.lifecycle().write(
        transitions.REQUEST_CHECKPOINT, first, transitions.At(now=clock.now)
    )
    assert isinstance(again, Written), again
    status, answer = call("failed", not_taken(again.record, "upload-failed"))
    assert (status, answer["retry_at"]) == (200, clock.now + 2 * RETRY_FIRST)
    second = current(stack)
    assert (second.checkpoint_failures, second.idle_deadline) == (2, clock.now + 2 * RETRY_FIRST)
    assert [m["reason"] for m in emitted(capsys) if "CheckpointsFailed" in m] == ["upload-failed"]

    # A checkpoint that then succeeds clears the count and the reason.
    clock.now = second.idle_deadline + 1
    third = stack.store.lifecycle().write(
        transitions.REQUEST_CHECKPOINT, second, transitions.At(now=clock.now)
    )
    assert isinstance(third, Written), third
    put(granted(third.record), DATA, tmp_path)
    assert call("record", captured(third.record))[0] == 200
    recorded = current(stack)
    assert recorded.state is State.CHECKPOINTED
    assert (recorded.checkpoint_failures, recorded.retained_reason) == (None, None)


# -- 6. a poll between the upload and the record ------------------------------------------


def test_a_poll_between_upload_and_record_keeps_the_slot_seeded(
    stack: Stack, clock: Clock, tmp_path: Path
) -> None:
    record = frozen(stack, checkpointing(stack), clock.now)
    grant = granted(record)
    put(grant, DATA, tmp_path)
    poll = {
        "slot": SLOT,
        "seed": seed().model_dump(mode="json"),
        "claim": owner().model_dump(mode="json"),
        "origin": ORIGIN,
    }
    status, polled = invoke(seed_function, event("seed-poll", body=poll))
    assert (status, polled["seeded"], polled["frozen"]) == (200, True, True)
    assert current(stack).state is State.SEEDED  # the poll wants its work back

    status, recorded = call("record", captured(record))

    assert (status, recorded["state"]) == (200, "seeded")
    after = current(stack)
    assert after.state is State.SEEDED
    assert after.checkpoint is not None
    assert after.checkpoint.key == grant["key"]
    entry = after.window.entry(open_op(record).ordinal)
    assert entry is not None
    assert entry.outcome == "uploaded"
    assert after.idle_deadline > clock.now  # the poll's deadline stands


# -- 7. a parked slot -----------------------------------------------------------------------


def test_a_parked_slot_is_receipted_until_its_object_goes(
    stack: Stack, clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_PARK_RETENTION", str(2 * DAY))
    record = checkpointing(stack)
    grant = granted(record)
    put(grant, DATA, tmp_path)
    status, recorded = call("record", captured(record))
    assert (status, recorded["expires_at"]) == (200, clock.now + 2 * DAY)

    # The sweep's two steps, as the sweep writes them.
    lifecycle = stack.store.lifecycle()
    clock.now += 1
    fenced = lifecycle.write(transitions.FENCE_PARK, current(stack), transitions.At(clock.now))
    assert isinstance(fenced, Written), fenced
    assert fenced.entry is not None
    parked = lifecycle.write(
        transitions.PARK,
        fenced.record,
        transitions.Parked(
            stop=fenced.entry.ref, now=clock.now, expires_at=recorded["expires_at"] + DAY
        ),
    )
    assert isinstance(parked, Written), parked
    assert current(stack).state is State.PARKED

    status, receipt = invoke(receipt_function, event("receipt", body=receipt_body()))
    assert status == 200
    assert (receipt["checkpoint"], receipt["parked"]) == ("present", True)
    assert receipt["retention_expires_at"] == recorded["expires_at"]
    assert receipt["sha256"] == hashlib.sha256(DATA).hexdigest()

    s3(stack).delete_object(Bucket=stack.r2_settings.bucket, Key=grant["key"])
    status, receipt = invoke(receipt_function, event("receipt", body=receipt_body()))
    assert (status, receipt["checkpoint"], receipt["parked"]) == (200, "lost", True)


# -- 8. bad bodies ---------------------------------------------------------------------------


def _without(body: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != name}


BAD_CAPTURED: list[tuple[str, Any, str]] = [
    ("slot missing", lambda b: _without(b, "slot"), "body.slot"),
    ("size missing", lambda b: _without(b, "size"), "body.size"),
    ("md5 missing", lambda b: _without(b, "md5"), "body.md5"),
    ("op missing", lambda b: _without(b, "op"), "body.op"),
    ("size a string", lambda b: b | {"size": str(b["size"])}, "body.size"),
    ("size zero", lambda b: b | {"size": 0}, "body.size"),
    ("size over 5 GiB", lambda b: b | {"size": 5 * 1024**3 + 1}, "body.size"),
    ("sha256 upper case", lambda b: b | {"sha256": b["sha256"].upper()}, "body.sha256"),
    ("md5 too short", lambda b: b | {"md5": b["md5"][:31]}, "body.md5"),
    ("slot a path", lambda b: b | {"slot": "../slot-1"}, "body.slot"),
    ("incarnation not one", lambda b: b | {"incarnation": "task-1"}, "body.incarnation"),
    ("op ordinal a string", lambda b: b | {"op": b["op"] | {"ordinal": "2"}}, "body.op.ordinal"),
    ("op naming an actor", lambda b: b | {"op": b["op"] | {"actor": "sweep"}}, "body.op.actor"),
    ("op generation zero", lambda b: b | {"op": b["op"] | {"generation": 0}}, "body.op.generation"),
    ("an unknown field", lambda b: b | {"key": "checkpoints/x/y/1.sqsh"}, "body.key"),
]


@pytest.mark.parametrize("route", ["upload", "record"])
@pytest.mark.parametrize(
    ("change", "field"), [(c, f) for _, c, f in BAD_CAPTURED], ids=[n for n, _, _ in BAD_CAPTURED]
)
def test_a_bad_captured_body_is_400_naming_the_field(
    stack: Stack, route: str, change: Any, field: str
) -> None:
    record = checkpointing(stack)
    before = raw_item(stack)
    status, answer = call(route, change(captured(record)))
    assert (status, answer["error"]) == (400, "invalid-request")
    assert field in {problem["field"] for problem in answer["fields"]}, answer
    assert raw_item(stack) == before


BAD_NOT_TAKEN: list[tuple[str, Any, str]] = [
    ("reason missing", lambda b: _without(b, "reason"), "body.reason"),
    ("reason not a token", lambda b: b | {"reason": "Capture Failed"}, "body.reason"),
    ("detail too long", lambda b: b | {"detail": "x" * 301}, "body.detail"),
    ("detail a number", lambda b: b | {"detail": 1}, "body.detail"),
    ("a digest where none belongs", lambda b: b | {"md5": "0" * 32}, "body.md5"),
]


@pytest.mark.parametrize(
    ("change", "field"), [(c, f) for _, c, f in BAD_NOT_TAKEN], ids=[n for n, _, _ in BAD_NOT_TAKEN]
)
def test_a_bad_failure_body_is_400_naming_the_field(stack: Stack, change: Any, field: str) -> None:
    record = checkpointing(stack)
    before = raw_item(stack)
    status, answer = call("failed", change(not_taken(record)))
    assert (status, answer["error"]) == (400, "invalid-request")
    assert field in {problem["field"] for problem in answer["fields"]}, answer
    assert raw_item(stack) == before


@pytest.mark.parametrize("route", ["upload", "record", "failed"])
def test_a_body_that_is_not_json_is_400(stack: Stack, route: str) -> None:
    status, answer = call(route, "{not json")
    assert (status, answer["error"]) == (400, "invalid-request")


# -- 9. no R2 ----------------------------------------------------------------------------------


def test_without_r2_nothing_is_granted_or_recorded_but_a_failure_is(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = checkpointing(stack)
    monkeypatch.delenv("SEEDKEEPER_R2_BUCKET")
    before = raw_item(stack)
    for route in ("upload", "record"):
        status, answer = call(route, captured(record))
        assert (status, answer["error"]) == (503, "r2-unconfigured"), route
    assert raw_item(stack) == before
    # Saying that no checkpoint was taken needs no R2.
    status, answer = call("failed", not_taken(record, "r2-unconfigured"))
    assert (status, answer["state"]) == (200, "seeded")


# -- a lost answer, a long key ------------------------------------------------------------------


def test_a_repeated_record_of_the_same_upload_is_answered_as_recorded(
    stack: Stack, clock: Clock, tmp_path: Path
) -> None:
    """The slot task retries a record whose answer it lost: the same capture, already
    recorded by this op, gets the same answer and nothing is written. (Refused, the task
    would take it for a touch and resume a sandbox the sweep is about to park.)"""
    record = checkpointing(stack)
    put(granted(record), DATA, tmp_path)
    first = call("record", captured(record))
    assert first[0] == 200
    recorded = raw_item(stack)
    clock.now += 1  # the retry comes after a timeout
    assert call("record", captured(record)) == first
    assert raw_item(stack) == recorded


def test_a_granted_key_can_always_be_recorded(stack: Stack, tmp_path: Path) -> None:
    """The longest slot id (IDENTIFIER_PATTERN allows 128) under a long incarnation (the
    local runtime's `local:<slot>:<attempt>`; an ECS ARN of a long cluster name) still
    gets a key `Checkpoint.key` allows (256 characters after `checkpoints/`): the
    incarnation's part is bounded, a digest keeping it unique."""
    slot = "s" * 128
    record = checkpointing(stack, slot)  # incarnation local:<slot>:1
    grant = granted(record)
    assert len(grant["key"]) <= len("checkpoints/") + 256
    put(grant, DATA, tmp_path)
    status, recorded = call("record", captured(record))
    assert (status, recorded.get("state")) == (200, "checkpointed"), recorded


def test_a_loss_the_stopping_task_records_raises_the_slots_lost_alarm_once(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The slots-lost alarm watches SlotsLost with the service dimension alone: a loss the
    task records (its checkpoint could not be made before the platform stopped it) counts
    there as the sweep's do, and its retried call, acknowledged, does not count again."""
    record = checkpointing(stack)
    assert record.incarnation is not None
    body = {"slot": SLOT, "incarnation": record.incarnation, "reason": "stop-timeout"}
    request = event("checkpoint-failed", rawPath="/tasks/lose", body=body)
    request["requestContext"]["http"]["path"] = "/tasks/lose"
    outcomes = [
        invoke(checkpoint_function, as_task(request, record.incarnation))[1]["outcome"]
        for _ in range(2)
    ]
    assert outcomes == ["written", "acknowledged"]
    assert current(stack).state is State.LOST
    (metric,) = [m for m in emitted(capsys) if "SlotsLost" in m]
    assert metric["SlotsLost"] == [1.0]
    # No dimension of its own: the alarm names only the service, which Powertools adds.
    (directive,) = metric["_aws"]["CloudWatchMetrics"]
    assert directive["Dimensions"] in ([[]], [["service"]])
