"""The checkpoint function (DESIGN §10, steps 3 and the failure path): the slot task's only
way to R2. It presigns the PUT of one checkpoint, verifies what was uploaded and records it,
or records why no checkpoint was taken.

Each call names the slot, the incarnation and the open `checkpoint` operation it works for;
the incarnation must be the task that signed the call (`Caller`), each is checked against the
record as read, and every write is conditional on the same (`seedkeeper.store.lifecycle`).
The object's key is derived from the record, never taken from the caller. A slot that is
absent or names another incarnation, and a call the named task did not sign, are one
refusal, `not-this-task`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from seedkeeper.adapters.r2 import R2, ObjectFacts
from seedkeeper.domain import transitions
from seedkeeper.domain.caller import NOT_THIS_TASK, Caller
from seedkeeper.domain.checkpoints import (
    MAX_CHECKPOINT_BYTES,
    RetentionSettings,
    checkpoint_key,
    new_checkpoint,
)
from seedkeeper.domain.models import Incarnation, Model, SlotId
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.outcomes import CheckpointNotTaken, CheckpointRecorded, UploadGrant
from seedkeeper.domain.record import Checkpoint, SlotRecord, State, Supported
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.task_api import TaskOp
from seedkeeper.observability import count, logger
from seedkeeper.store.lifecycle import Conflict, Lifecycle

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Md5 = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


# The slot task's `checkpoint` operation.
CheckpointOp = TaskOp


class CheckpointCall(Model):
    slot: SlotId
    incarnation: Incarnation
    op: CheckpointOp


class Captured(CheckpointCall):
    """A captured checkout: its size and digests, as the slot task computed them."""

    size: Annotated[int, Field(ge=1, le=MAX_CHECKPOINT_BYTES)]
    sha256: Sha256
    md5: Md5


class NotTaken(CheckpointCall):
    reason: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,63}$")]
    detail: Annotated[str, Field(max_length=300)] = ""


# What the checkpoint routes refuse with besides the request's own refusals.
REFUSALS = (NOT_THIS_TASK, "checkpoint-not-open", "checkpoint-unverified", "r2-unconfigured")


class CheckpointService:
    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        r2: R2 | None,
        settings: RetentionSettings,
        presign_expiry: int,
        clock: Callable[[], int],
    ) -> None:
        self._lifecycle = lifecycle
        self._r2 = r2
        self._settings = settings
        self._presign_expiry = presign_expiry
        self._clock = clock

    def upload(self, call: Captured, caller: Caller) -> UploadGrant | Refused:
        """A presigned PUT for this op's key, only while its checkpoint is open: the slot
        being checkpointed, or seeded again by a poll while its sandbox is still frozen (a
        task the platform is stopping never resumes it, and finishes what it captured)."""
        record = self._record(call, caller)
        if isinstance(record, Refused):
            return record
        frozen_still = record.state is State.SEEDED and record.frozen_at is not None
        if record.state is not State.CHECKPOINTING and not frozen_still:
            return Refused("checkpoint-not-open", f"the slot is {record.state}")
        not_open = _not_open(record, call)
        if not_open is not None:
            return not_open
        if self._r2 is None:
            return Refused("r2-unconfigured")
        key = checkpoint_key(call.slot, call.incarnation, call.op.ordinal)
        put = self._r2.presign_put(
            key, self._presign_expiry, size=call.size, sha256=call.sha256, md5=call.md5
        )
        return UploadGrant(
            key=key, url=put.url, headers=put.headers, expires_in=self._presign_expiry
        )

    def record(self, call: Captured, caller: Caller) -> CheckpointRecorded | Refused:
        """Verify the uploaded object against what the task captured, then record it,
        settling the op: `checkpointed` (or still `seeded`, when a poll came back). Asked
        again for a checkpoint already recorded (its answer was lost), the same answer."""
        record = self._read(call, caller)
        if isinstance(record, Refused):
            return record
        if _already_recorded(record, call):
            assert record.checkpoint is not None
            return _recorded(record, record.checkpoint)
        not_open = _not_open(record, call)
        if not_open is not None:
            return not_open
        if self._r2 is None:
            return Refused("r2-unconfigured")
        key = checkpoint_key(call.slot, call.incarnation, call.op.ordinal)
        facts = self._r2.head(key, checksum=True)
        mismatch = _mismatch(facts, call)
        if mismatch is not None:
            logger.warning("checkpoint unverified", slot=call.slot, why=mismatch)
            return Refused("checkpoint-unverified", mismatch)
        assert facts is not None
        checkpoint = new_checkpoint(
            self._settings,
            key=key,
            size=facts.size,
            etag=facts.etag,
            sha256=call.sha256,
            owner=record.owner,
            incarnation=call.incarnation,
            now=self._clock(),
        )
        uploaded = transitions.Uploaded(
            checkpoint=checkpoint, upload=call.op.ref, now=self._clock()
        )
        outcome = self._lifecycle.apply(
            call.slot,
            transitions.RECORD_CHECKPOINT,
            uploaded,
            as_read=record,
            guard=_its(call),
        )
        if isinstance(outcome, Refused | Conflict):
            return _refused(outcome)
        logger.info("checkpoint recorded", slot=call.slot, size=facts.size)
        return _recorded(outcome.record, checkpoint)

    def not_taken(self, call: NotTaken, caller: Caller) -> CheckpointNotTaken | Refused:
        """The task could not checkpoint (and has resumed its sandbox): the slot is seeded
        again, asked again after a backoff, the failure counted."""
        record = self._record(call, caller)
        if isinstance(record, Refused):
            return record
        failed = transitions.CheckpointFailed(op=call.op.ref, reason=call.reason, now=self._clock())
        outcome = self._lifecycle.apply(
            call.slot, transitions.CHECKPOINT_FAILED, failed, as_read=record, guard=_its(call)
        )
        if isinstance(outcome, Refused | Conflict):
            return _refused(outcome)
        logger.warning("checkpoint failed", slot=call.slot, reason=call.reason, detail=call.detail)
        count("CheckpointsFailed", reason=call.reason)
        return CheckpointNotTaken(
            slot=call.slot, state=outcome.record.state.value, retry_at=outcome.record.idle_deadline
        )

    def _record(self, call: CheckpointCall, caller: Caller) -> SlotRecord | Refused:
        """The slot's record, when it names this incarnation and has this op open as its
        attempt's checkpoint; the one `not-this-task` otherwise (nothing disclosed)."""
        record = self._read(call, caller)
        if isinstance(record, Refused):
            return record
        return _not_open(record, call) or record

    def _read(self, call: CheckpointCall, caller: Caller) -> SlotRecord | Refused:
        if not caller.is_task(call.incarnation):
            return Refused(NOT_THIS_TASK)
        classified = self._lifecycle.read(call.slot)
        if not isinstance(classified, Supported):
            return Refused(NOT_THIS_TASK)
        return _its(call)(classified.record) or classified.record


def _its(call: CheckpointCall) -> Callable[[SlotRecord], Refused | None]:
    """Refuses a record that does not name the call's incarnation, each time one is read."""
    return lambda record: None if record.incarnation == call.incarnation else Refused(NOT_THIS_TASK)


def _not_open(record: SlotRecord, call: CheckpointCall) -> Refused | None:
    """Why `call` names no open checkpoint of the record's attempt; None when it does."""
    entry = record.window.entry(call.op.ordinal)
    if (
        entry is None
        or entry.ref != call.op.ref
        or entry.kind is not OpKind.CHECKPOINT
        or entry.settled
        or call.op.generation != record.attempt
    ):
        return Refused("checkpoint-not-open", "no such open checkpoint")
    return None


def _already_recorded(record: SlotRecord, captured: Captured) -> bool:
    entry = record.window.entry(captured.op.ordinal)
    checkpoint = record.checkpoint
    return (
        entry is not None
        and entry.ref == captured.op.ref
        and entry.outcome == "uploaded"
        and checkpoint is not None
        and checkpoint.key == checkpoint_key(captured.slot, captured.incarnation, entry.ordinal)
        and (checkpoint.size, checkpoint.sha256) == (captured.size, captured.sha256)
    )


def _recorded(record: SlotRecord, checkpoint: Checkpoint) -> CheckpointRecorded:
    return CheckpointRecorded(
        slot=record.slot,
        state=record.state.value,
        key=checkpoint.key,
        size=checkpoint.size,
        sha256=checkpoint.sha256,
        created_at=checkpoint.created_at,
        expires_at=checkpoint.expires_at,
    )


def _mismatch(facts: ObjectFacts | None, captured: Captured) -> str | None:
    """Why the stored object is not what the task captured; None when it is. A single PUT's
    ETag is its MD5; the SHA-256 is compared too whenever the store kept it."""
    if facts is None:
        return "no object"
    if facts.size != captured.size:
        return "size differs"
    if facts.etag != captured.md5:
        return "etag differs"
    if facts.sha256 is not None and facts.sha256 != captured.sha256:
        return "sha256 differs"
    return None


def _refused(outcome: Refused | Conflict) -> Refused:
    """A transition's refusal as the caller sees it: the record moved on, the op closed."""
    if isinstance(outcome, Conflict):
        return Refused("checkpoint-not-open", "the record kept moving")
    if outcome.reason in {NOT_THIS_TASK, "incarnation-mismatch", "claim-mismatch"}:
        return Refused(NOT_THIS_TASK)
    return Refused("checkpoint-not-open", outcome.reason)
