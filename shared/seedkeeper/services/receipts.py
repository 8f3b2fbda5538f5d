"""Passive proof of a slot's state: receipts and slot evidence.

Both read the durable record and, for a recorded checkpoint, one R2 HEAD. Neither builds a
slot runtime: nothing here can launch, stop, describe or exec anything, so a stopped
container is never woken to be inspected. Both answer only an exact match; an absent slot
and any mismatch get the identical refusal, so neither is an existence oracle. Neither ever
permits a stop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from seedkeeper.adapters.r2 import R2
from seedkeeper.domain.checkpoints import counts_for
from seedkeeper.domain.models import Incarnation, Model, OwnerClaim, SeedIdentity, SlotId
from seedkeeper.domain.outcomes import CheckpointState, Evidence, Receipt
from seedkeeper.domain.record import Absent, Checkpoint, SlotRecord, State, Supported
from seedkeeper.domain.refused import Refused
from seedkeeper.errors import R2Unavailable
from seedkeeper.store.records import Records


class ReceiptRequest(Model):
    slot: SlotId
    claim: OwnerClaim
    seed: SeedIdentity
    incarnation: Incarnation


class EvidenceRequest(Model):
    slot: SlotId
    claim: OwnerClaim


_DISPOSITIONS: dict[State, Literal["retired", "parked", "lost"]] = {
    State.RETIRED: "retired",
    State.PARKED: "parked",
    State.LOST: "lost",
}
# The one refusal for an absent slot and for any mismatch: no existence oracle.
NO_MATCH = "no-match"


class Witness:
    def __init__(self, records: Records, r2: R2 | None, clock: Callable[[], int]) -> None:
        self._records = records
        self._r2 = r2
        self._clock = clock

    def receipt(self, request: ReceiptRequest) -> Receipt | Refused:
        classified = self._records.read(request.slot)
        if isinstance(classified, Absent):
            return Refused(NO_MATCH)
        if not isinstance(classified, Supported):
            return Receipt(slot=request.slot, checkpoint="unknown", why="record-unsupported")
        record = classified.record
        exact = (
            record.owner == request.claim
            and record.seed == request.seed
            and record.incarnation == request.incarnation
        )
        if not exact:
            return Refused(NO_MATCH)
        state, why = self._checkpoint_state(record)
        # A lost record's checkpoint (if any) is not its work: no facts are shown for it.
        checkpoint = record.checkpoint if state != "unknown" and record.loss is None else None
        parked = record.state is State.PARKED
        return Receipt(
            slot=request.slot,
            checkpoint=state,
            why=why,
            size=checkpoint.size if checkpoint else None,
            sha256=checkpoint.sha256 if checkpoint else None,
            created_at=checkpoint.created_at if checkpoint else None,
            expires_at=checkpoint.expires_at if checkpoint else None,
            parked=parked,
            retention_expires_at=checkpoint.expires_at if checkpoint and parked else None,
        )

    def evidence(self, request: EvidenceRequest) -> Evidence | Refused:
        classified = self._records.read(request.slot)
        if not isinstance(classified, Supported) or classified.record.owner != request.claim:
            return Refused(NO_MATCH)
        record = classified.record
        state, _ = self._checkpoint_state(record)
        return Evidence(
            slot=request.slot,
            incarnation=record.incarnation,
            state=record.state.value,
            checkpoint=state,
            disposition=_DISPOSITIONS.get(record.state, "retained"),
        )

    def _checkpoint_state(self, record: SlotRecord) -> tuple[CheckpointState, str | None]:
        if record.loss is not None:  # the task stopped with no verified checkpoint of its work
            return "lost", record.loss.reason
        checkpoint = record.checkpoint
        now = self._clock()
        if not counts_for(checkpoint, owner=record.owner, incarnation=record.incarnation, now=now):
            return "unknown", "no-checkpoint" if checkpoint is None else "checkpoint-not-counted"
        assert checkpoint is not None
        if self._r2 is None:
            return "unknown", "r2-unconfigured"
        return self._observe(checkpoint)

    def _observe(self, checkpoint: Checkpoint) -> tuple[CheckpointState, str | None]:
        assert self._r2 is not None
        try:
            facts = self._r2.head(checkpoint.key)
            if facts is None:
                # A bare 404 is also what a missing bucket answers: only a bucket that is
                # there makes a missing object "lost".
                return ("lost", None) if self._r2.bucket_exists() else ("unknown", "no-bucket")
        except R2Unavailable:
            return "unknown", "r2-unavailable"
        if facts.size == checkpoint.size and facts.etag == checkpoint.etag:
            return "present", None
        return "unknown", "checkpoint-changed"
