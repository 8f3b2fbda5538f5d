"""Test data: valid values to start from, varied one field at a time."""

from __future__ import annotations

from typing import Any

from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.models import Binding, OwnerClaim, SeedIdentity
from seedkeeper.domain.record import (
    Checkpoint,
    Loss,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
)
from seedkeeper.store.lifecycle import Lifecycle, Written

ORIGIN = "https://git.example.com/acme/widgets.git"
NOW = 1_800_000_000
IDLE = 600


def owner(**changes: Any) -> OwnerClaim:
    fields: dict[str, Any] = {
        "run": "run-1",
        "requester": "alice",
        "thread": "thread-1",
        "repository": "acme/widgets",
        "ref": "main",
        "head": "a" * 40,
    }
    return OwnerClaim(**(fields | changes))


def seed(**changes: Any) -> SeedIdentity:
    fields: dict[str, Any] = {
        "resource": "acme-widgets",
        "ref": "main",
        "sha": "a" * 40,
        "checkout_backup_id": "checkout-0001",
        "deps_backup_id": "deps-0001",
    }
    return SeedIdentity(**(fields | changes))


INCARNATION = "local:slot-1:1"
EXPIRED = NOW + IDLE + 1


def success(**changes: Any) -> SeedSucceeded:
    fields: dict[str, Any] = {
        "ref": "main",
        "head": "a" * 40,
        "from_backup": "checkout-0001",
        "steps": {"download": 120, "extract": 80},
        "ms": 230,
    }
    return SeedSucceeded(**(fields | changes))


def failure() -> SeedFailed:
    return SeedFailed(reason="seed-failed", step="extract", detail="unsquashfs exited 1")


def loss(**changes: Any) -> Loss:
    fields: dict[str, Any] = {"reason": "task-stopped", "detail": "exit code 137", "at": EXPIRED}
    return Loss(**(fields | changes))


# A lost record is kept as long as a park would have been (the default retention).
LOST_RETENTION: int = RetentionSettings.model_fields["park_retention"].default


def lose(record: SlotRecord, **changes: Any) -> transitions.Lost:
    """The slot's own task found stopped with no verified checkpoint."""
    assert record.incarnation is not None
    return transitions.Lost(
        incarnation=record.incarnation,
        loss=loss(**changes),
        expires_at=EXPIRED + LOST_RETENTION,
    )


def resume(record: SlotRecord, now: int = EXPIRED) -> transitions.Poll:
    """The owner's seed again (same claim, seed and origin) on its parked slot."""
    return transitions.Poll(record.binding, now=now, idle_deadline=now + IDLE)


def changed(decision: transitions.Decision) -> transitions.Change:
    assert isinstance(decision, transitions.Change), decision
    return decision


def record_in(state: State, slot: str = "slot-1") -> SlotRecord:
    """A record brought to `state` by the transitions themselves, incarnation recorded."""
    cold = state in {State.UNSEEDED, State.CLOSING, State.RETIRED}
    birth = transitions.born(
        slot,
        Binding(
            owner=None if cold else owner(),
            seed=None if cold else seed(),
            origin=None if cold else ORIGIN,
        ),
        now=NOW,
        idle_deadline=NOW + IDLE,
    )
    assert birth.entry is not None
    record = changed(
        transitions.RECORD_INCARNATION.decide(
            birth.record,
            transitions.Launched(incarnation=INCARNATION, launch=birth.entry.ref, now=NOW),
        )
    ).record
    if state in SETTLED:
        verdict = failure() if state is State.SEED_FAILED else success()
        record = changed(
            transitions.SETTLE_SEED.decide(
                record,
                transitions.Verdict(attempt=1, restore=birth.entry.ref, result=verdict, now=NOW),
            )
        ).record
    if state in CHECKPOINT_PATH:
        record = checkpointed_to(record, state, decide=_decided)
    if state is State.LOST:
        record = changed(transitions.LOSE.decide(record, lose(record))).record
    if state in {State.CLOSING, State.RETIRED}:
        closing = changed(transitions.FENCE.decide(record, transitions.At(now=EXPIRED)))
        record = closing.record
        if state is State.RETIRED:
            assert closing.entry is not None
            record = changed(
                transitions.RETIRE.decide(
                    record,
                    transitions.Stopped(
                        stop=closing.entry.ref, now=EXPIRED, expires_at=EXPIRED + 86_400
                    ),
                )
            ).record
    assert record.state is state
    return record


# The states a seeded slot passes through on its way to being parked, in order.
CHECKPOINT_PATH = (State.CHECKPOINTING, State.CHECKPOINTED, State.PARKED)
# The states reached through a seed's verdict (`lost`: a seeded slot whose task was found
# stopped with nothing checkpointed).
SETTLED = frozenset({State.SEEDED, State.SEED_FAILED, State.LOST, *CHECKPOINT_PATH})


def _decided(transition: Any, record: SlotRecord, params: Any) -> tuple[SlotRecord, Any]:
    change = changed(transition.decide(record, params))
    return change.record, change.entry


def checkpointed_to(record: SlotRecord, state: State, *, decide: Any) -> SlotRecord:
    """A seeded `record` taken along the checkpoint path to `state` by `decide(transition,
    record, params) -> (record, entry)`: the pure decision, or a store's write."""
    record, upload = decide(transitions.REQUEST_CHECKPOINT, record, transitions.At(now=EXPIRED))
    if state is State.CHECKPOINTING:
        return record
    made = checkpoint(key=f"checkpoints/{record.slot}/1.sqsh", incarnation=record.incarnation)
    record, _ = decide(
        transitions.RECORD_CHECKPOINT,
        record,
        transitions.Uploaded(checkpoint=made, upload=upload.ref, now=EXPIRED),
    )
    if state is State.CHECKPOINTED:
        return record
    record, stop = decide(transitions.FENCE_PARK, record, transitions.At(now=EXPIRED))
    parked = transitions.Parked(stop=stop.ref, now=EXPIRED, expires_at=made.expires_at + 86_400)
    record, _ = decide(transitions.PARK, record, parked)
    return record


def checkpoint(**changes: Any) -> Checkpoint:
    fields: dict[str, Any] = {
        "key": "checkpoints/slot-1/1.sqsh",
        "size": 1024,
        "etag": '"abc"',
        "sha256": "0" * 64,
        "created_at": NOW,
        "expires_at": NOW + 7 * 86_400,
        "owner": owner(),
        "incarnation": INCARNATION,
    }
    return Checkpoint.model_validate(fields | changes)


def written(outcome: object) -> SlotRecord:
    assert isinstance(outcome, Written), outcome
    return outcome.record


def stored_in(
    lifecycle: Lifecycle, slot: str, state: State, incarnation: str | None = None
) -> SlotRecord:
    """A record in the table, brought to `state` through the lifecycle module itself."""
    cold = state in {State.UNSEEDED, State.CLOSING}
    birth = written(
        lifecycle.birth(
            slot,
            Binding(
                owner=None if cold else owner(),
                seed=None if cold else seed(),
                origin=None if cold else ORIGIN,
            ),
            now=NOW,
            idle_deadline=NOW + IDLE,
        )
    )
    first = birth.window.entries[0].ref
    record = written(
        lifecycle.write(
            transitions.RECORD_INCARNATION,
            birth,
            transitions.Launched(
                incarnation=incarnation or f"local:{slot}:1", launch=first, now=NOW
            ),
        )
    )
    if state in SETTLED:
        verdict = failure() if state is State.SEED_FAILED else success()
        record = written(
            lifecycle.write(
                transitions.SETTLE_SEED,
                record,
                transitions.Verdict(attempt=1, restore=first, result=verdict, now=NOW),
            )
        )
    if state in CHECKPOINT_PATH:

        def write(transition: Any, record: SlotRecord, params: Any) -> tuple[SlotRecord, Any]:
            outcome = lifecycle.write(transition, record, params)
            assert isinstance(outcome, Written), outcome
            return outcome.record, outcome.entry

        record = checkpointed_to(record, state, decide=write)
    if state is State.LOST:
        record = written(lifecycle.write(transitions.LOSE, record, lose(record)))
    if state is State.CLOSING:
        record = written(lifecycle.write(transitions.FENCE, record, transitions.At(now=EXPIRED)))
    return record
