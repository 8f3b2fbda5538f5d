from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import (
    EXPIRED,
    IDLE,
    NOW,
    ORIGIN,
    checkpoint,
    loss,
    owner,
    record_in,
    seed,
    success,
)
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import Actor, OpKind, OpRef
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
    classify,
    encode,
    sweep_shard,
)


def seeding_record() -> SlotRecord:
    return transitions.born(
        "slot-1",
        Binding(owner=owner(), seed=seed(), origin=ORIGIN),
        now=NOW,
        idle_deadline=NOW + IDLE,
    ).record


def as_read(value: Any) -> Any:
    """What boto3's resource layer hands back: every number a Decimal."""
    if isinstance(value, dict):
        return {key: as_read(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [as_read(inner) for inner in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    return value


def test_an_encoded_record_reads_back_as_the_same_supported_record() -> None:
    record = seeding_record()
    item = encode(record)
    assert item["PK"] == "SLOT#slot-1"
    assert item["SK"] == "LIFECYCLE"
    assert item["schema"] == 1
    assert item["open_ops"] == 1
    assert item["sweep"] == sweep_shard("slot-1", SWEEP_SHARDS)  # its shard of the index
    assert item["sweep_at"] == record.idle_deadline
    assert "incarnation" not in item  # absent facts are absent attributes
    assert classify("slot-1", as_read(item)) == Supported(record)


def test_a_checkpoint_of_an_unclaimed_slot_reads_back() -> None:
    """An unclaimed slot's checkpoint has no owner: encoding drops it, decoding must not
    then call the record malformed."""
    record = record_in(State.SEEDED).model_copy(update={"checkpoint": checkpoint(owner=None)})
    assert classify("slot-1", as_read(encode(record))) == Supported(record)


def test_a_retired_record_leaves_the_sweep_index() -> None:
    retired = record_in(State.RETIRED)
    item = encode(retired)
    assert "sweep" not in item
    assert "sweep_at" not in item
    assert item["expires_at"] == retired.expires_at
    assert classify("slot-1", as_read(item)) == Supported(retired)


def test_no_item_is_absent() -> None:
    assert classify("slot-1", None) == Absent("slot-1")


@pytest.mark.parametrize("schema", [2, Decimal(7)])
def test_a_newer_schema_is_unsupported_whatever_else_it_holds(schema: object) -> None:
    item = {"PK": "SLOT#slot-1", "SK": "LIFECYCLE", "schema": schema, "shape": "unknown"}
    assert classify("slot-1", item) == Unsupported("slot-1", int(schema))  # type: ignore[call-overload]


def _without(name: str) -> Any:
    return lambda item: {key: value for key, value in item.items() if key != name}


def _with(**changes: Any) -> Any:
    return lambda item: item | changes


@pytest.mark.parametrize(
    ("corrupt", "complaint"),
    [
        (_without("rev"), "rev"),
        (_without("schema"), "schema"),
        (_with(schema=0), "schema"),
        (_with(schema="1"), "schema"),
        (_with(rev="5"), "rev"),
        (_with(rev=Decimal("1.5")), "rev"),
        (_with(rev=0), "rev"),
        (_with(state="sleeping"), "state"),
        (_with(state="seeded"), "result"),
        (_with(state="unseeded"), "seed"),
        (_with(open_ops=0), "open_ops"),
        (_without("sweep"), "sweep"),
        (_with(sweep="live"), "sweep"),  # the index key before it was sharded
        (_with(sweep="live#7"), "sweep"),
        (_without("sweep_at"), "sweep_at"),
        (_with(sweep_at=NOW), "sweep_at"),  # not the record's idle deadline
        (_with(next_look=EXPIRED), "next look"),  # a backoff without its count
        (_with(surprise=True), "surprise"),
        (_with(owner={"run": "r"}), "owner"),
        (_with(origin="https://user:pw@example.com/r.git"), "origin"),
        (_with(ops=[{"ordinal": 1}]), "window"),
        (_with(ops="everything"), "window"),
        (_with(SK="SNAPSHOT#current"), "key"),
        (_with(PK="SLOT#slot-2"), "another slot"),
        (_with(expires_at=NOW), "expires_at"),
    ],
)
def test_a_record_that_fails_validation_is_malformed(corrupt: Any, complaint: str) -> None:
    item = corrupt(as_read(encode(seeding_record())))
    classified = classify("slot-1", item)
    assert isinstance(classified, Malformed)
    assert complaint in classified.error


def test_results_belong_to_their_states() -> None:
    record = seeding_record()
    success = SeedSucceeded(
        ref="main", head="a" * 40, from_backup="checkout-0001", steps={"download": 12}, ms=40
    )
    failure = SeedFailed(reason="seed-failed", step="extract", detail="unsquashfs exited 1")
    seeded = SlotRecord.model_validate(
        {**record.model_dump(), "state": State.SEEDED, "result": success}
    )
    assert seeded.result == success
    with pytest.raises(ValueError, match="seeded"):
        SlotRecord.model_validate({**record.model_dump(), "state": State.SEEDED, "result": failure})


@given(
    steps=st.lists(st.sampled_from(["reserve", "settle", "touch"]), max_size=30),
    claimed=st.booleans(),
)
def test_codec_round_trips_any_reachable_record(steps: list[str], claimed: bool) -> None:
    change = transitions.born(
        "slot-1",
        Binding(
            owner=owner() if claimed else None, seed=seed(), origin=ORIGIN if claimed else None
        ),
        now=NOW,
        idle_deadline=NOW + IDLE,
    )
    record = change.record
    for step in steps:
        if step == "reserve":
            decision = transitions.RESERVE.decide(
                record,
                transitions.Reservation(kind=OpKind.CHECKPOINT, actor=Actor.SEED_FN, now=NOW),
            )
        elif step == "settle":
            open_entry = next((e for e in record.window.entries if not e.settled), None)
            if open_entry is None:
                continue
            decision = transitions.SETTLE.decide(
                record,
                transitions.Settlement(
                    ref=OpRef.model_validate(open_entry.ref.model_dump()), outcome="ok", now=NOW
                ),
            )
        else:
            record = record.model_copy(update={"idle_deadline": record.idle_deadline + 1})
            continue
        if isinstance(decision, transitions.Change):
            record = decision.record
        assert classify("slot-1", as_read(encode(record))) == Supported(record)


def test_a_lost_record_says_why_expires_and_leaves_the_sweep_index() -> None:
    lost = record_in(State.LOST)
    assert lost.loss == loss()
    item = encode(lost)
    assert "sweep" not in item
    assert item["loss"] == {"reason": "task-stopped", "detail": "exit code 137", "at": EXPIRED}
    assert item["expires_at"] == lost.expires_at
    assert classify("slot-1", as_read(item)) == Supported(lost)


@pytest.mark.parametrize(
    ("state", "changes", "complaint"),
    [
        (State.LOST, {"loss": None}, "lost"),  # lost, and not said why
        (State.SEEDED, {"loss": loss()}, "lost"),  # a loss on a slot that runs
        (State.PARKED, {"loss": loss()}, "lost"),
        (State.LOST, {"expires_at": None}, "expires_at"),  # kept for ever
        (State.LOST, {"frozen_at": EXPIRED}, "frozen"),  # no task left to be frozen
        (State.PARKED, {"frozen_at": EXPIRED}, "frozen"),
        (State.LOST, {"result": None}, "result"),  # its seed did succeed
    ],
)
def test_a_lost_record_carries_exactly_its_facts(
    state: State, changes: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        SlotRecord.model_validate({**record_in(state).model_dump(), **changes})
    # The same facts as an item: a model as its map, an absent fact as no attribute.
    facts = {name: transitions.stored(value) for name, value in changes.items()}
    item = {**as_read(encode(record_in(state))), **as_read(facts)}
    item = {name: value for name, value in item.items() if value is not None}
    classified = classify("slot-1", item)
    assert isinstance(classified, Malformed)


@pytest.mark.parametrize(
    "loss_fields",
    [
        {"reason": "Spot Interruption"},  # a token, not the runtime's prose
        {"reason": ""},
        {"detail": "x" * 513},
        {"at": -1},
    ],
)
def test_a_loss_names_a_token_and_a_bounded_detail(loss_fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="loss"):
        SlotRecord.model_validate(
            {**record_in(State.LOST).model_dump(), "loss": loss().model_dump() | loss_fields}
        )


def test_only_a_seeding_record_naming_a_checkpoint_is_resuming() -> None:
    seeding = record_in(State.SEEDING)
    assert not seeding.resuming
    assert seeding.model_copy(update={"checkpoint": checkpoint()}).resuming
    assert not record_in(State.SEED_FAILED).model_copy(update={"checkpoint": checkpoint()}).resuming
    assert not record_in(State.PARKED).resuming


def test_a_resumed_result_reads_back_and_an_old_one_is_not_resumed() -> None:
    resumed = record_in(State.SEEDED).model_copy(update={"result": success(resumed=True)})
    item = encode(resumed)
    assert item["result"]["resumed"] is True
    assert classify("slot-1", as_read(item)) == Supported(resumed)
    older = encode(record_in(State.SEEDED))
    del older["result"]["resumed"]  # written before resumes existed
    classified = classify("slot-1", as_read(older))
    assert isinstance(classified, Supported)
    assert isinstance(classified.record.result, SeedSucceeded)
    assert classified.record.result.resumed is False
