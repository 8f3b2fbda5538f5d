"""Every lifecycle transition against moto's real conditional-write semantics, with its
losing paths, asserting what the table holds afterwards."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from botocore.stub import Stubber

from builders import (
    EXPIRED,
    IDLE,
    INCARNATION,
    NOW,
    ORIGIN,
    checkpoint,
    failure,
    lose,
    owner,
    resume,
    seed,
    success,
    written,
)
from conftest import TABLE_NAME
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding, OwnerClaim
from seedkeeper.domain.opwindow import Actor, OpKind, OpRef, OpStatus
from seedkeeper.domain.record import (
    SWEEP_SHARDS,
    Absent,
    Malformed,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
    Supported,
    Unsupported,
    slot_key,
    sweep_shard,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions import Acknowledged
from seedkeeper.errors import StoreError, StoreUnavailable
from seedkeeper.store.items import DEBT_PARTITION
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Outcome, Written, debt_key

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

SLOT = "slot-1"
LIVE = sweep_shard(SLOT, SWEEP_SHARDS)  # the slot's partition of the sweep's index
RESTORE = OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
LAUNCH = OpRef(ordinal=1, actor=Actor.SEED_FN, generation=1)


def stored(table: Table) -> dict[str, Any] | None:
    return table.get_item(Key=slot_key(SLOT), ConsistentRead=True).get("Item")


def current(lifecycle: Lifecycle) -> SlotRecord:
    classified = lifecycle.read(SLOT)
    assert isinstance(classified, Supported), classified
    return classified.record


def born_seeding(lifecycle: Lifecycle, claim: bool = True) -> SlotRecord:
    return written(
        lifecycle.birth(
            SLOT,
            Binding(
                owner=owner() if claim else None, seed=seed(), origin=ORIGIN if claim else None
            ),
            now=NOW,
            idle_deadline=NOW + IDLE,
        )
    )


def launched_seeding(lifecycle: Lifecycle) -> SlotRecord:
    return written(
        lifecycle.write(
            transitions.RECORD_INCARNATION,
            born_seeding(lifecycle),
            transitions.Launched(incarnation=INCARNATION, launch=RESTORE, now=NOW),
        )
    )


def launched_cold(lifecycle: Lifecycle) -> SlotRecord:
    birth = lifecycle.birth(
        SLOT, Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=NOW + IDLE
    )
    return written(
        lifecycle.write(
            transitions.RECORD_INCARNATION,
            written(birth),
            transitions.Launched(incarnation=INCARNATION, launch=LAUNCH, now=NOW),
        )
    )


def seeded(lifecycle: Lifecycle) -> SlotRecord:
    return written(
        lifecycle.write(
            transitions.SETTLE_SEED,
            launched_seeding(lifecycle),
            transitions.Verdict(attempt=1, restore=RESTORE, result=success(), now=NOW),
        )
    )


def closing(lifecycle: Lifecycle) -> SlotRecord:
    return written(
        lifecycle.write(transitions.FENCE, launched_cold(lifecycle), transitions.At(now=EXPIRED))
    )


def with_upload(lifecycle: Lifecycle) -> SlotRecord:
    """Asked to checkpoint by the sweep: `checkpointing`, the slot task's op open."""
    return written(
        lifecycle.write(transitions.REQUEST_CHECKPOINT, seeded(lifecycle), transitions.At(EXPIRED))
    )


def frozen(lifecycle: Lifecycle) -> SlotRecord:
    record = with_upload(lifecycle)
    freezing = transitions.Freezing(attempt=1, op=record.window.entries[-1].ref, now=NOW)
    return written(lifecycle.write(transitions.FREEZE, record, freezing))


def checkpointed(lifecycle: Lifecycle) -> SlotRecord:
    record = frozen(lifecycle)
    return written(
        lifecycle.write(
            transitions.RECORD_CHECKPOINT,
            record,
            transitions.Uploaded(
                checkpoint=checkpoint(), upload=record.window.entries[-1].ref, now=NOW
            ),
        )
    )


def closing_to_park(lifecycle: Lifecycle) -> SlotRecord:
    record = checkpointed(lifecycle)
    return written(lifecycle.write(transitions.FENCE_PARK, record, transitions.At(EXPIRED)))


def thawed_by_a_poll(lifecycle: Lifecycle) -> SlotRecord:
    record = frozen(lifecycle)
    poll = transitions.Poll(record.binding, now=NOW, idle_deadline=EXPIRED + IDLE)
    return written(lifecycle.write(transitions.THAW, record, poll))


def with_launch(lifecycle: Lifecycle) -> SlotRecord:
    return written(
        lifecycle.write(
            transitions.RESERVE,
            seeded(lifecycle),
            transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW),
        )
    )


def parked(lifecycle: Lifecycle) -> SlotRecord:
    record = closing_to_park(lifecycle)
    stop = transitions.Parked(
        stop=record.window.entries[-1].ref, now=EXPIRED, expires_at=EXPIRED + 30 * 86_400
    )
    return written(lifecycle.write(transitions.PARK, record, stop))


def resumed(lifecycle: Lifecycle) -> SlotRecord:
    """A parked slot whose owner came back: its second attempt restores the checkpoint."""
    record = parked(lifecycle)
    return written(lifecycle.write(transitions.RESUME, record, resume(record)))


def stopped_and_checkpointed(lifecycle: Lifecycle) -> SlotRecord:
    """A seeded slot's task stopped by the platform: it asked for its own checkpoint,
    froze, and its checkpoint is recorded."""
    asked = lifecycle.write(transitions.CHECKPOINT_ON_STOP, seeded(lifecycle), STOPPING)
    assert isinstance(asked, Written)
    assert asked.entry is not None
    op = asked.entry.ref
    record = written(
        lifecycle.write(
            transitions.FREEZE, asked.record, transitions.Freezing(attempt=1, op=op, now=NOW)
        )
    )
    uploaded = transitions.Uploaded(checkpoint=checkpoint(), upload=op, now=NOW)
    return written(lifecycle.write(transitions.RECORD_CHECKPOINT, record, uploaded))


def resumed_verdict(
    record: SlotRecord, result: SeedSucceeded | SeedFailed | None = None
) -> transitions.Verdict:
    """The resumed attempt's verdict (a success restored from the checkpoint, unless told)."""
    return transitions.Verdict(
        attempt=record.attempt,
        restore=record.window.entries[-1].ref,
        result=result or success(resumed=True),
        now=EXPIRED,
    )


STOPPING = transitions.Stopping(attempt=1, incarnation=INCARNATION, now=NOW)


# Each rev-conditioned transition: how to reach a record it accepts, and the call.
Transition = tuple[Callable[[Lifecycle], SlotRecord], Callable[[Lifecycle, SlotRecord], Outcome]]
TRANSITIONS: dict[str, Transition] = {
    "record_incarnation": (
        born_seeding,
        lambda lc, r: lc.write(
            transitions.RECORD_INCARNATION,
            r,
            transitions.Launched(incarnation=INCARNATION, launch=RESTORE, now=NOW),
        ),
    ),
    "settle_seed": (
        launched_seeding,
        lambda lc, r: lc.write(
            transitions.SETTLE_SEED,
            r,
            transitions.Verdict(attempt=1, restore=RESTORE, result=success(), now=NOW),
        ),
    ),
    "fence": (
        launched_cold,
        lambda lc, r: lc.write(transitions.FENCE, r, transitions.At(now=EXPIRED)),
    ),
    "retire": (
        closing,
        lambda lc, r: lc.write(
            transitions.RETIRE,
            r,
            transitions.Stopped(stop=r.window.entries[-1].ref, now=EXPIRED, expires_at=EXPIRED),
        ),
    ),
    "record_checkpoint": (
        with_upload,
        lambda lc, r: lc.write(
            transitions.RECORD_CHECKPOINT,
            r,
            transitions.Uploaded(checkpoint=checkpoint(), upload=r.window.entries[-1].ref, now=NOW),
        ),
    ),
    "request_checkpoint": (
        seeded,
        lambda lc, r: lc.write(transitions.REQUEST_CHECKPOINT, r, transitions.At(now=EXPIRED)),
    ),
    "freeze": (
        with_upload,
        lambda lc, r: lc.write(
            transitions.FREEZE,
            r,
            transitions.Freezing(attempt=1, op=r.window.entries[-1].ref, now=NOW),
        ),
    ),
    "thaw": (
        frozen,
        lambda lc, r: lc.write(
            transitions.THAW, r, transitions.Poll(r.binding, now=NOW, idle_deadline=EXPIRED)
        ),
    ),
    "thawed": (
        thawed_by_a_poll,
        lambda lc, r: lc.write(
            transitions.THAWED,
            r,
            transitions.Thawed(attempt=1, op=r.window.entries[-1].ref, now=NOW),
        ),
    ),
    "checkpoint_failed": (
        frozen,
        lambda lc, r: lc.write(
            transitions.CHECKPOINT_FAILED,
            r,
            transitions.CheckpointFailed(op=r.window.entries[-1].ref, reason="http-403", now=NOW),
        ),
    ),
    "fence_park": (
        checkpointed,
        lambda lc, r: lc.write(transitions.FENCE_PARK, r, transitions.At(now=EXPIRED)),
    ),
    "park": (
        closing_to_park,
        lambda lc, r: lc.write(
            transitions.PARK,
            r,
            transitions.Parked(
                stop=r.window.entries[-1].ref, now=EXPIRED, expires_at=EXPIRED + 30 * 86_400
            ),
        ),
    ),
    "resume": (
        parked,
        lambda lc, r: lc.write(transitions.RESUME, r, resume(r)),
    ),
    # The one transition written with another item: the resumed seed and its debt.
    "settle_seed-resumed": (
        resumed,
        lambda lc, r: lc.write(transitions.SETTLE_SEED, r, resumed_verdict(r)),
    ),
    "checkpoint_on_stop": (
        seeded,
        lambda lc, r: lc.write(transitions.CHECKPOINT_ON_STOP, r, STOPPING),
    ),
    "park_on_stop": (
        stopped_and_checkpointed,
        lambda lc, r: lc.write(transitions.PARK_ON_STOP, r, STOPPING),
    ),
    "lose": (
        with_upload,
        lambda lc, r: lc.write(transitions.LOSE, r, lose(r)),
    ),
    "reserve": (
        seeded,
        lambda lc, r: lc.write(
            transitions.RESERVE,
            r,
            transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW),
        ),
    ),
    "settle": (
        with_launch,
        lambda lc, r: lc.write(
            transitions.SETTLE,
            r,
            transitions.Settlement(ref=r.window.entries[-1].ref, outcome="launched", now=NOW),
        ),
    ),
}


@pytest.mark.parametrize("name", TRANSITIONS)
def test_a_transition_writes_exactly_its_record_with_rev_plus_one(
    lifecycle: Lifecycle, table: Table, name: str
) -> None:
    reach, call = TRANSITIONS[name]
    before = reach(lifecycle)
    after = written(call(lifecycle, before))
    assert after.rev == before.rev + 1
    assert current(lifecycle) == after


@pytest.mark.parametrize("name", TRANSITIONS)
def test_a_stale_rev_loses_and_is_answered_with_the_current_record(
    lifecycle: Lifecycle, table: Table, name: str
) -> None:
    reach, call = TRANSITIONS[name]
    stale = reach(lifecycle)
    moved = written(  # another writer moves first
        lifecycle.write(
            transitions.NOTE_RETAINED, stale, transitions.Retained("another-writer", now=NOW)
        )
    )
    item = stored(table)
    outcome = call(lifecycle, stale)
    assert outcome == Conflict(Supported(moved))
    assert stored(table) == item
    assert lifecycle.debts(SLOT) == []  # nothing owed by a write that did not happen


@pytest.mark.parametrize("name", TRANSITIONS)
def test_an_unsupported_record_is_never_written(
    lifecycle: Lifecycle, table: Table, name: str
) -> None:
    reach, call = TRANSITIONS[name]
    read = reach(lifecycle)
    newer: dict[str, Any] = {**slot_key(SLOT), "schema": 2, "rev": read.rev + 1, "future": {"x": 1}}
    table.put_item(Item=newer)
    outcome = call(lifecycle, read)
    assert outcome == Conflict(Unsupported(SLOT, 2))
    assert stored(table) == newer
    assert lifecycle.debts(SLOT) == []


@pytest.mark.parametrize("name", TRANSITIONS)
def test_a_malformed_record_is_never_written(lifecycle: Lifecycle, table: Table, name: str) -> None:
    reach, call = TRANSITIONS[name]
    read = reach(lifecycle)
    item = stored(table)
    assert item is not None
    corrupted = item | {"rev": read.rev + 1, "state": "sleeping"}
    table.put_item(Item=corrupted)
    outcome = call(lifecycle, read)
    assert isinstance(outcome, Conflict)
    assert isinstance(outcome.current, Malformed)
    assert stored(table) == corrupted
    assert lifecycle.debts(SLOT) == []


def test_birth_happens_once_and_the_loser_sees_the_winner(
    lifecycle: Lifecycle, table: Table
) -> None:
    winner = born_seeding(lifecycle)
    item = stored(table)
    loser = lifecycle.birth(
        SLOT,
        Binding(owner=owner(run="run-2"), seed=seed(), origin=ORIGIN),
        now=NOW + 1,
        idle_deadline=NOW + IDLE,
    )
    assert loser == Conflict(Supported(winner))
    assert stored(table) == item


def test_birth_over_an_unsupported_or_malformed_record_leaves_it_alone(
    lifecycle: Lifecycle, table: Table
) -> None:
    foreigns: list[dict[str, Any]] = [{"schema": 3}, {"schema": 1, "rev": "x"}]
    for foreign in foreigns:
        item = {**slot_key(SLOT), **foreign}
        table.put_item(Item=item)
        outcome = lifecycle.birth(
            SLOT, Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=NOW + IDLE
        )
        assert isinstance(outcome, Conflict)
        assert isinstance(outcome.current, Unsupported | Malformed)
        assert stored(table) == item


def test_birth_writes_the_full_record_into_the_sweep_index(
    lifecycle: Lifecycle, table: Table
) -> None:
    born_seeding(lifecycle)
    item = stored(table)
    assert item is not None
    assert item["state"] == "seeding"
    assert item["sweep"] == LIVE  # its shard of the index
    assert item["sweep_at"] == item["idle_deadline"]
    assert item["open_ops"] == 1
    assert item["ops"][0]["kind"] == "restore"
    expired = table.query(
        IndexName="by-deadline",
        KeyConditionExpression="sweep = :live AND sweep_at < :now",
        ExpressionAttributeValues={":live": LIVE, ":now": EXPIRED},
    )
    assert [found["PK"] for found in expired["Items"]] == ["SLOT#slot-1"]


def test_read_classifies_absent(lifecycle: Lifecycle) -> None:
    assert lifecycle.read(SLOT) == Absent(SLOT)


def test_settle_seed_by_the_wrong_attempt_is_refused_or_loses(
    lifecycle: Lifecycle, table: Table
) -> None:
    record = launched_seeding(lifecycle)
    item = stored(table)
    refused = lifecycle.write(
        transitions.SETTLE_SEED,
        record,
        transitions.Verdict(attempt=2, restore=RESTORE, result=success(), now=NOW),
    )
    assert refused == Refused("attempt-superseded")
    assert stored(table) == item
    assert item is not None
    newer_attempt = item | {"attempt": 2, "rev": record.rev + 1}
    table.put_item(Item=newer_attempt)
    lost = lifecycle.write(
        transitions.SETTLE_SEED,
        record,
        transitions.Verdict(attempt=1, restore=RESTORE, result=failure(), now=NOW),
    )
    assert isinstance(lost, Conflict)
    assert stored(table) == newer_attempt


def test_the_first_verdict_stands(lifecycle: Lifecycle, table: Table) -> None:
    record = seeded(lifecycle)
    item = stored(table)
    again = lifecycle.write(
        transitions.SETTLE_SEED,
        record,
        transitions.Verdict(attempt=1, restore=RESTORE, result=failure(), now=NOW),
    )
    assert isinstance(again, Acknowledged)
    assert stored(table) == item


def test_touch_extends_the_deadline_for_the_exact_owner_in_one_call(
    lifecycle: Lifecycle, table: Table
) -> None:
    record = seeded(lifecycle)
    touched = lifecycle.touch(
        SLOT,
        transitions.Poll(
            Binding(owner=owner(), seed=seed(), origin=ORIGIN),
            now=NOW + 5,
            idle_deadline=NOW + 5 + IDLE,
        ),
    )
    after = written(touched)
    assert after.idle_deadline == NOW + 5 + IDLE
    assert after.rev == record.rev + 1
    assert current(lifecycle) == after


@pytest.mark.parametrize(
    "caller",
    [
        {"owner": owner(run="run-2")},
        {"owner": owner(head="b" * 40)},
        {"owner": None},
        {"seed": seed(sha="c" * 40)},
        {"seed": seed(deps_backup_id=None)},
        {"origin": "https://git.example.com/acme/other.git"},
        {"origin": None},
    ],
)
def test_touch_by_anyone_else_loses_and_changes_nothing(
    lifecycle: Lifecycle, table: Table, caller: dict[str, Any]
) -> None:
    record = seeded(lifecycle)
    item = stored(table)
    identity: dict[str, Any] = {"owner": owner(), "seed": seed(), "origin": ORIGIN} | caller
    outcome = lifecycle.touch(
        SLOT, transitions.Poll(Binding(**identity), now=NOW + 5, idle_deadline=NOW + 5 + IDLE)
    )
    assert outcome == Conflict(Supported(record))
    assert stored(table) == item


def test_an_unclaimed_caller_touches_an_unclaimed_record(lifecycle: Lifecycle) -> None:
    born_seeding(lifecycle, claim=False)
    outcome = lifecycle.touch(
        SLOT,
        transitions.Poll(
            Binding(owner=None, seed=seed(), origin=None), now=NOW + 1, idle_deadline=NOW + 1 + IDLE
        ),
    )
    assert written(outcome).idle_deadline == NOW + 1 + IDLE


@pytest.mark.parametrize(
    "foreign",
    [
        {"schema": 2},
        {"rev": "7"},
        {"ops": "none"},
        {"state": "closing"},
        {"state": "retired"},
        {"loss": {"reason": "planted", "detail": "", "at": NOW}},  # only on a lost record
    ],
)
def test_touch_never_writes_an_unsupported_malformed_or_finished_record(
    lifecycle: Lifecycle, table: Table, foreign: dict[str, Any]
) -> None:
    seeded(lifecycle)
    item = stored(table)
    assert item is not None
    table.put_item(Item=item | foreign)
    outcome = lifecycle.touch(
        SLOT,
        transitions.Poll(
            Binding(owner=owner(), seed=seed(), origin=ORIGIN),
            now=NOW + 5,
            idle_deadline=NOW + 5 + IDLE,
        ),
    )
    assert isinstance(outcome, Conflict)
    assert stored(table) == item | foreign


def test_touch_of_an_absent_slot_is_a_conflict_with_absent(lifecycle: Lifecycle) -> None:
    outcome = lifecycle.touch(
        SLOT,
        transitions.Poll(
            Binding(owner=owner(), seed=seed(), origin=ORIGIN), now=NOW, idle_deadline=NOW + IDLE
        ),
    )
    assert outcome == Conflict(Absent(SLOT))


def test_a_touch_in_the_same_tick_makes_the_fence_fail(lifecycle: Lifecycle, table: Table) -> None:
    record = launched_cold(lifecycle)
    written(
        lifecycle.touch(
            SLOT,
            transitions.Poll(
                Binding(owner=None, seed=None, origin=None), now=EXPIRED, idle_deadline=EXPIRED
            ),
        )
    )
    item = stored(table)
    outcome = lifecycle.write(transitions.FENCE, record, transitions.At(now=EXPIRED))
    assert isinstance(outcome, Conflict)
    assert stored(table) == item
    assert current(lifecycle).state is State.UNSEEDED


@pytest.mark.parametrize("reach", [born_seeding, launched_seeding, seeded])
def test_the_fence_never_closes_a_seeding_or_seeded_slot(
    lifecycle: Lifecycle, table: Table, reach: Callable[[Lifecycle], SlotRecord]
) -> None:
    record = reach(lifecycle)
    item = stored(table)
    assert isinstance(
        lifecycle.write(transitions.FENCE, record, transitions.At(now=EXPIRED + 10_000)), Refused
    )
    assert stored(table) == item


def test_fence_then_retire_takes_the_slot_out_of_the_sweep_index(
    lifecycle: Lifecycle, table: Table
) -> None:
    fenced = closing(lifecycle)
    stop = fenced.window.entries[-1]
    assert (stop.kind, stop.status) == (OpKind.STOP, OpStatus.OPEN)
    retired = written(
        lifecycle.write(
            transitions.RETIRE,
            fenced,
            transitions.Stopped(stop=stop.ref, now=EXPIRED, expires_at=EXPIRED + 9),
        )
    )
    item = stored(table)
    assert item is not None
    assert item["state"] == "retired"
    assert "sweep" not in item
    assert item["expires_at"] == EXPIRED + 9
    assert retired.window.unsettled == 0
    index = table.query(
        IndexName="by-deadline",
        KeyConditionExpression="sweep = :live",
        ExpressionAttributeValues={":live": LIVE},
    )
    assert index["Items"] == []


def test_a_checkpoint_of_another_owner_is_refused(lifecycle: Lifecycle, table: Table) -> None:
    record = with_upload(lifecycle)
    item = stored(table)
    outcome = lifecycle.write(
        transitions.RECORD_CHECKPOINT,
        record,
        transitions.Uploaded(
            checkpoint=checkpoint(owner=owner(requester="mallory")),
            upload=record.window.entries[-1].ref,
            now=NOW,
        ),
    )
    assert outcome == Refused("claim-mismatch")
    assert stored(table) == item


def test_a_duplicate_settle_writes_nothing(lifecycle: Lifecycle, table: Table) -> None:
    record = with_launch(lifecycle)
    ref = record.window.entries[-1].ref
    settled = written(
        lifecycle.write(
            transitions.SETTLE, record, transitions.Settlement(ref=ref, outcome="launched", now=NOW)
        )
    )
    item = stored(table)
    again = lifecycle.write(
        transitions.SETTLE, settled, transitions.Settlement(ref=ref, outcome="failed", now=NOW)
    )
    assert isinstance(again, Acknowledged)
    assert again.entry is not None
    assert again.entry.outcome == "launched"
    assert stored(table) == item


def test_a_checkpoint_op_is_never_settled_without_its_state(
    lifecycle: Lifecycle, table: Table
) -> None:
    """A checkpoint left `checkpointing` with no op open would wait forever: only the
    transitions that also move the state (or the frozen mark) may settle it."""
    record = with_upload(lifecycle)
    item = stored(table)
    outcome = lifecycle.write(
        transitions.SETTLE,
        record,
        transitions.Settlement(ref=record.window.entries[-1].ref, outcome="uploaded", now=NOW),
    )
    assert outcome == Refused("checkpoint-settles-with-its-state")
    assert stored(table) == item


def test_each_transition_is_one_dynamodb_call(lifecycle: Lifecycle, table: Table) -> None:
    calls: Counter[str] = Counter()

    def count(event_name: str, **_: object) -> None:
        calls[event_name.rsplit(".", 1)[-1]] += 1

    table.meta.client.meta.events.register("before-call.dynamodb", count)
    record = born_seeding(lifecycle)
    record = written(
        lifecycle.write(
            transitions.RECORD_INCARNATION,
            record,
            transitions.Launched(incarnation=INCARNATION, launch=RESTORE, now=NOW),
        )
    )
    lifecycle.touch(
        SLOT,
        transitions.Poll(
            Binding(owner=owner(), seed=seed(), origin=ORIGIN),
            now=NOW + 1,
            idle_deadline=NOW + IDLE,
        ),
    )
    record = current(lifecycle)
    written(
        lifecycle.write(
            transitions.SETTLE_SEED,
            record,
            transitions.Verdict(attempt=1, restore=RESTORE, result=success(), now=NOW),
        )
    )
    assert calls == Counter({"TransactWriteItems": 1, "UpdateItem": 3, "GetItem": 1})


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("ProvisionedThroughputExceededException", StoreUnavailable),
        ("ThrottlingException", StoreUnavailable),
        ("InternalServerError", StoreUnavailable),
        ("ValidationException", StoreError),
    ],
)
def test_store_errors_are_translated_by_code_and_nothing_is_written(
    lifecycle: Lifecycle, table: Table, code: str, error: type[Exception]
) -> None:
    record = seeded(lifecycle)
    with Stubber(table.meta.client) as stub:
        stub.add_client_error("update_item", service_error_code=code, http_status_code=400)
        with pytest.raises(error, match=code):
            lifecycle.write(
                transitions.RESERVE,
                record,
                transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW),
            )
        stub.add_client_error("get_item", service_error_code=code, http_status_code=400)
        with pytest.raises(error, match=code):
            lifecycle.read(SLOT)
    assert current(lifecycle) == record
    assert table.name == TABLE_NAME


# -- a resume's superseded checkpoint: owed in the settle's own transaction ----------------


def debt_item(table: Table, key: str) -> dict[str, Any] | None:
    return table.get_item(Key=debt_key(SLOT, key), ConsistentRead=True).get("Item")


def test_a_resumed_seed_and_its_debt_are_written_in_one_transaction(
    lifecycle: Lifecycle, table: Table
) -> None:
    record = resumed(lifecycle)
    assert record.checkpoint is not None
    key = record.checkpoint.key
    calls: Counter[str] = Counter()

    def count(event_name: str, **_: object) -> None:
        calls[event_name.rsplit(".", 1)[-1]] += 1

    table.meta.client.meta.events.register("before-call.dynamodb", count)
    after = written(lifecycle.write(transitions.SETTLE_SEED, record, resumed_verdict(record)))
    assert calls == Counter({"TransactWriteItems": 1})
    assert (after.state, after.checkpoint) == (State.SEEDED, None)
    assert current(lifecycle) == after
    assert debt_item(table, key) == {
        **debt_key(SLOT, key),
        "schema": 1,
        "key": key,
        "sweep": DEBT_PARTITION,
        "sweep_at": EXPIRED,
    }
    assert lifecycle.debts(SLOT) == [key]
    # The sweep finds it in its index's debt partition, due at once.
    due = table.query(
        IndexName="by-deadline",
        KeyConditionExpression="sweep = :debt AND sweep_at <= :now",
        ExpressionAttributeValues={":debt": DEBT_PARTITION, ":now": EXPIRED},
    )
    assert [item["key"] for item in due["Items"]] == [key]
    # The slot's record is still the one item a read of it classifies.
    assert isinstance(lifecycle.read(SLOT), Supported)


def test_a_resumed_seed_that_lost_its_race_owes_nothing(lifecycle: Lifecycle, table: Table) -> None:
    stale = resumed(lifecycle)
    touched = written(
        lifecycle.touch(
            SLOT, transitions.Poll(stale.binding, now=EXPIRED + 1, idle_deadline=EXPIRED + IDLE)
        )
    )
    item = stored(table)
    outcome = lifecycle.write(transitions.SETTLE_SEED, stale, resumed_verdict(stale))
    assert outcome == Conflict(Supported(touched))
    assert stored(table) == item
    assert lifecycle.debts(SLOT) == []
    # Re-decided on the record as it now is, it is written, with its debt.
    assert stale.checkpoint is not None
    again = written(lifecycle.apply(SLOT, transitions.SETTLE_SEED, resumed_verdict(stale)))
    assert again.state is State.SEEDED
    assert lifecycle.debts(SLOT) == [stale.checkpoint.key]


def test_a_debt_owed_again_is_the_same_debt(lifecycle: Lifecycle, table: Table) -> None:
    record = resumed(lifecycle)
    assert record.checkpoint is not None
    key = record.checkpoint.key
    table.put_item(Item={**debt_key(SLOT, key), "key": key, "sweep": DEBT_PARTITION})
    written(lifecycle.write(transitions.SETTLE_SEED, record, resumed_verdict(record)))
    assert lifecycle.debts(SLOT) == [key]


def test_an_item_in_the_debts_place_naming_another_object_stops_the_settle(
    lifecycle: Lifecycle, table: Table
) -> None:
    """Never overwritten: the record stays as it was, naming its checkpoint."""
    record = resumed(lifecycle)
    assert record.checkpoint is not None
    foreign = {**debt_key(SLOT, record.checkpoint.key), "key": "checkpoints/elsewhere.sqsh"}
    table.put_item(Item=foreign)
    item = stored(table)
    outcome = lifecycle.write(transitions.SETTLE_SEED, record, resumed_verdict(record))
    assert outcome == Conflict(Supported(record))
    assert stored(table) == item
    assert debt_item(table, record.checkpoint.key) == foreign


def test_a_failed_resume_owes_nothing_and_keeps_naming_the_checkpoint(
    lifecycle: Lifecycle,
) -> None:
    record = resumed(lifecycle)
    after = written(
        lifecycle.write(transitions.SETTLE_SEED, record, resumed_verdict(record, failure()))
    )
    assert after.state is State.SEED_FAILED
    assert after.checkpoint == record.checkpoint
    assert lifecycle.debts(SLOT) == []


def test_a_paid_debt_is_forgotten_once(lifecycle: Lifecycle, table: Table) -> None:
    record = resumed(lifecycle)
    assert record.checkpoint is not None
    key = record.checkpoint.key
    written(lifecycle.write(transitions.SETTLE_SEED, record, resumed_verdict(record)))
    other = "checkpoints/slot-1/other/9.sqsh"
    foreign = {**debt_key(SLOT, other), "key": "checkpoints/someone-else.sqsh"}
    table.put_item(Item=foreign)
    lifecycle.clear_debt(SLOT, key)
    lifecycle.clear_debt(SLOT, key)  # paid twice (a retried sweep): nothing to forget
    lifecycle.clear_debt(SLOT, other)  # an item there that is not this debt stays
    assert debt_item(table, key) is None
    assert debt_item(table, other) == foreign
    assert current(lifecycle).state is State.SEEDED


# -- keepalive, the task's own stop, loss ---------------------------------------------------


def test_a_keepalive_extends_the_owners_live_slot_in_one_call(
    lifecycle: Lifecycle, table: Table
) -> None:
    record = seeded(lifecycle)
    calls: Counter[str] = Counter()

    def count(event_name: str, **_: object) -> None:
        calls[event_name.rsplit(".", 1)[-1]] += 1

    table.meta.client.meta.events.register("before-call.dynamodb", count)
    keep = transitions.KeepAlive(owner=owner(), now=NOW + 5, idle_deadline=NOW + 5 + IDLE)
    after = written(lifecycle.keepalive(SLOT, keep, seeded=True))
    assert calls == Counter({"UpdateItem": 1})
    assert (after.idle_deadline, after.rev) == (NOW + 5 + IDLE, record.rev + 1)
    assert current(lifecycle) == after


@pytest.mark.parametrize(
    ("reach", "seeded"),
    [(launched_cold, False), (lambda lc: born_seeding(lc, claim=False), True)],
    ids=["cold", "seeded"],
)
def test_an_unclaimed_slot_is_kept_alive_without_a_claim(
    lifecycle: Lifecycle, reach: Callable[[Lifecycle], SlotRecord], seeded: bool
) -> None:
    reach(lifecycle)
    keep = transitions.KeepAlive(owner=None, now=NOW + 5, idle_deadline=NOW + 5 + IDLE)
    assert written(lifecycle.keepalive(SLOT, keep, seeded=seeded)).idle_deadline == (NOW + 5 + IDLE)


@pytest.mark.parametrize("reach", [seeded, launched_cold])
def test_a_keepalive_guessing_the_wrong_kind_of_slot_is_shown_the_record(
    lifecycle: Lifecycle, table: Table, reach: Callable[[Lifecycle], SlotRecord]
) -> None:
    """The caller guesses whether the slot is seeded: wrong, nothing is written and the
    conflict shows the record, so the second try is right."""
    record = reach(lifecycle)
    item = stored(table)
    keep = transitions.KeepAlive(owner=record.owner, now=NOW + 5, idle_deadline=NOW + 5 + IDLE)
    wrong = lifecycle.keepalive(SLOT, keep, seeded=record.seed is None)
    assert wrong == Conflict(Supported(record))
    assert stored(table) == item
    assert written(lifecycle.keepalive(SLOT, keep, seeded=record.seed is not None)).rev == (
        record.rev + 1
    )


@pytest.mark.parametrize(
    ("reach", "claim"),
    [
        (seeded, owner(run="run-2")),
        (seeded, None),
        (launched_cold, owner()),
        (parked, owner()),
        (closing, None),
    ],
    ids=["another-owner", "no-claim", "cold-slot-claimed", "parked", "closing"],
)
def test_a_keepalive_by_anyone_else_or_on_a_closed_slot_changes_nothing(
    lifecycle: Lifecycle,
    table: Table,
    reach: Callable[[Lifecycle], SlotRecord],
    claim: OwnerClaim | None,
) -> None:
    record = reach(lifecycle)
    item = stored(table)
    keep = transitions.KeepAlive(owner=claim, now=NOW + 5, idle_deadline=NOW + 5 + IDLE)
    outcome = lifecycle.keepalive(SLOT, keep, seeded=record.seed is not None)
    assert outcome == Conflict(Supported(record))
    assert stored(table) == item


@pytest.mark.parametrize(
    "foreign",
    [
        {"schema": 2},
        {"rev": "7"},
        {"state": "lost"},
        {"loss": {"reason": "planted", "detail": "", "at": NOW}},  # only on a lost record
        {"seed": "planted"},
        {"origin": 7},
    ],
)
def test_a_keepalive_never_writes_an_unsupported_malformed_or_ended_record(
    lifecycle: Lifecycle, table: Table, foreign: dict[str, Any]
) -> None:
    seeded(lifecycle)
    item = stored(table)
    assert item is not None
    table.put_item(Item=item | foreign)
    keep = transitions.KeepAlive(owner=owner(), now=NOW + 5, idle_deadline=NOW + 5 + IDLE)
    assert isinstance(lifecycle.keepalive(SLOT, keep, seeded=True), Conflict)
    assert stored(table) == item | foreign


@pytest.mark.parametrize(
    ("reach", "call", "state"),
    [
        (
            stopped_and_checkpointed,
            lambda lc, r: lc.write(transitions.PARK_ON_STOP, r, STOPPING),
            State.PARKED,
        ),
        (with_upload, lambda lc, r: lc.write(transitions.LOSE, r, lose(r)), State.LOST),
        (seeded, lambda lc, r: lc.write(transitions.LOSE, r, lose(r)), State.LOST),
    ],
    ids=["parked-on-stop", "lost-checkpointing", "lost-seeded"],
)
def test_a_stopped_task_s_slot_leaves_the_sweep_index_and_expires(
    lifecycle: Lifecycle,
    table: Table,
    reach: Callable[[Lifecycle], SlotRecord],
    call: Callable[[Lifecycle, SlotRecord], Outcome],
    state: State,
) -> None:
    after = written(call(lifecycle, reach(lifecycle)))
    item = stored(table)
    assert item is not None
    assert (item["state"], "sweep" in item, "frozen_at" in item) == (state.value, False, False)
    assert item["expires_at"] == after.expires_at
    assert after.window.unsettled == 0
    index = table.query(
        IndexName="by-deadline",
        KeyConditionExpression="sweep = :live",
        ExpressionAttributeValues={":live": LIVE},
    )
    assert index["Items"] == []


def test_a_loss_refused_writes_nothing(lifecycle: Lifecycle, table: Table) -> None:
    record = with_launch(lifecycle)
    item = stored(table)
    assert lifecycle.write(transitions.LOSE, record, lose(record)) == Refused(
        "unsettled-operations"
    )
    assert stored(table) == item
