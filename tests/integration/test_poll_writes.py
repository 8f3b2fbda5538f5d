"""The poll never writes a record it may not write.

A poll (`POST /seed` again with the same owner, seed and origin) is one UpdateItem with no
read, so its condition alone decides whether the record may be touched. Records planted
with each wrong fact a condition can see (a type, a bound, a size, a state's facts) are
polled through the seed function as Lambda invokes it, against moto: the answer is 409
`record-unsupported` and the stored item is byte for byte what was planted. The controls:
records the codec accepts (optional facts present, or NULL) are still touched.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from builders import NOW, ORIGIN, checkpoint, owner, seed, stored_in, written
from conftest import Stack
from functions import event, invoke, load_function
from seedkeeper.domain import transitions
from seedkeeper.domain.record import State, slot_key
from seedkeeper.store.lifecycle import Lifecycle

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

SLOT = "slot-1"
seed_function = load_function("seed")


def poll(seeded: bool = True) -> tuple[int, Any]:
    """The executor's same call again, for the records `stored_in` brings about."""
    body: dict[str, Any] = {"slot": SLOT, "seed": None}
    if seeded:
        identity = seed().model_dump(mode="json", exclude_none=True)
        body = {"slot": SLOT, "seed": identity, "claim": owner().model_dump(), "origin": ORIGIN}
    return invoke(seed_function, event("seed-new", body=json.dumps(body)))


def stored(table: Table) -> dict[str, Any]:
    item: dict[str, Any] = table.get_item(Key=slot_key(SLOT), ConsistentRead=True)["Item"]
    return item


def plant(table: Table, changes: dict[str, Any], removed: tuple[str, ...] = ()) -> None:
    item = stored(table)
    table.put_item(
        Item={name: value for name, value in (item | changes).items() if name not in removed}
    )


# (case, the attributes set, the attributes removed) on a seeded record.
SEEDED_WRONG: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("rev-string", {"rev": "2"}, ()),
    ("rev-zero", {"rev": 0}, ()),
    ("attempt-string", {"attempt": "1"}, ()),
    ("attempt-zero", {"attempt": 0}, ()),
    ("idle-deadline-string", {"idle_deadline": "soon"}, ()),
    ("idle-deadline-negative", {"idle_deadline": -1}, ()),
    ("created-at-string", {"created_at": "yesterday"}, ()),
    ("created-at-missing", {}, ("created_at",)),
    ("updated-at-string", {"updated_at": "now"}, ()),
    ("updated-at-missing", {}, ("updated_at",)),
    ("next-ordinal-string", {"next_ordinal": "2"}, ()),
    ("next-ordinal-missing", {}, ("next_ordinal",)),
    ("open-ops-string", {"open_ops": "0"}, ()),
    ("open-ops-over-the-window", {"open_ops": 17}, ()),
    ("ops-string", {"ops": "none"}, ()),
    ("ops-map", {"ops": {"0": "x"}}, ()),
    ("sweep-missing", {}, ("sweep",)),
    ("sweep-other", {"sweep": "gone"}, ()),
    ("sweep-unsharded", {"sweep": "live"}, ()),
    ("sweep-at-missing", {}, ("sweep_at",)),
    ("sweep-at-string", {"sweep_at": "soon"}, ()),
    ("next-look-without-its-count", {"next_look": NOW}, ()),
    ("retains-without-a-next-look", {"retains": 1}, ()),
    ("retains-zero", {"next_look": NOW, "retains": 0}, ()),
    ("expires-at-on-a-live-record", {"expires_at": 1_800_000_000}, ()),
    ("state-unknown", {"state": "hibernating"}, ()),
    ("schema-string", {"schema": "1"}, ()),
    ("incarnation-number", {"incarnation": 7}, ()),
    ("incarnation-too-long", {"incarnation": "local:" + "x" * 600}, ()),
    ("retained-reason-number", {"retained_reason": 7}, ()),
    ("retained-reason-empty", {"retained_reason": ""}, ()),
    ("retained-reason-too-long", {"retained_reason": "x" * 65}, ()),
    ("result-missing", {}, ("result",)),
    ("result-string", {"result": "seeded"}, ()),
    ("result-of-a-failure", {"result": {"outcome": "failed"}}, ()),
]

# Changes inside the seeded record's `result` map.
RESULT_WRONG: list[tuple[str, dict[str, Any]]] = [
    ("result-ms-string", {"ms": "230"}),
    ("result-ms-negative", {"ms": -1}),
    ("result-head-number", {"head": 7}),
    ("result-head-short", {"head": "a" * 12}),
    ("result-ref-missing", {"ref": None}),
    ("result-from-backup-number", {"from_backup": 7}),
    ("result-steps-list", {"steps": ["download"]}),
]

# Changes inside a recorded `checkpoint` map.
CHECKPOINT_WRONG: list[tuple[str, dict[str, Any]]] = [
    ("checkpoint-size-string", {"size": "1024"}),
    ("checkpoint-size-negative", {"size": -1}),
    ("checkpoint-sha256-short", {"sha256": "0" * 63}),
    ("checkpoint-etag-empty", {"etag": ""}),
    ("checkpoint-key-number", {"key": 7}),
    ("checkpoint-owner-string", {"owner": "alice"}),
    ("checkpoint-owner-run-number", {"owner": owner().model_dump() | {"run": 7}}),
    ("checkpoint-incarnation-missing", {"incarnation": None}),
    ("checkpoint-created-at-string", {"created_at": "x"}),
    ("checkpoint-expires-at-string", {"expires_at": "x"}),
]


def assert_refused_and_untouched(stack: Stack, seeded: bool = True) -> None:
    planted = stack.wire_item(SLOT)
    status, answer = poll(seeded)
    assert (status, answer) == (409, {"error": "record-unsupported", "detail": None, "fields": []})
    assert stack.wire_item(SLOT) == planted


@pytest.mark.parametrize(
    ("changes", "removed"), [pytest.param(c, r, id=case) for case, c, r in SEEDED_WRONG]
)
def test_a_seeded_record_with_a_wrong_fact_is_never_touched(
    stack: Stack, changes: dict[str, Any], removed: tuple[str, ...]
) -> None:
    stored_in(Lifecycle(stack.table), SLOT, State.SEEDED)
    plant(stack.table, changes, removed)
    assert_refused_and_untouched(stack)


@pytest.mark.parametrize(
    "changes", [pytest.param(changes, id=case) for case, changes in RESULT_WRONG]
)
def test_a_seeded_result_with_a_wrong_member_is_never_touched(
    stack: Stack, changes: dict[str, Any]
) -> None:
    record = stored_in(Lifecycle(stack.table), SLOT, State.SEEDED)
    assert record.result is not None
    result = record.result.model_dump(mode="json") | changes
    plant(stack.table, {"result": {k: v for k, v in result.items() if v is not None}})
    assert_refused_and_untouched(stack)


def test_a_failed_result_with_an_unknown_reason_is_never_touched(stack: Stack) -> None:
    record = stored_in(Lifecycle(stack.table), SLOT, State.SEED_FAILED)
    assert record.result is not None
    plant(stack.table, {"result": record.result.model_dump(mode="json") | {"reason": "gone"}})
    assert_refused_and_untouched(stack)


def with_checkpoint(lifecycle: Lifecycle) -> dict[str, Any]:
    """A seeded record with a verified checkpoint, as a poll during the checkpoint leaves
    it: asked, moved back to seeded by the poll, then recorded by the checkpoint function."""
    asked = stored_in(lifecycle, SLOT, State.CHECKPOINTING)
    upload = asked.window.entries[-1].ref
    poll = transitions.Poll(asked.binding, now=NOW, idle_deadline=NOW + 600)
    thawed = written(lifecycle.write(transitions.THAW, asked, poll))
    recorded = checkpoint(incarnation=asked.incarnation)
    written(
        lifecycle.write(
            transitions.RECORD_CHECKPOINT,
            thawed,
            transitions.Uploaded(checkpoint=recorded, upload=upload, now=NOW),
        )
    )
    return recorded.model_dump(mode="json")


@pytest.mark.parametrize(
    "changes", [pytest.param(changes, id=case) for case, changes in CHECKPOINT_WRONG]
)
def test_a_checkpoint_with_a_wrong_member_is_never_touched(
    stack: Stack, changes: dict[str, Any]
) -> None:
    recorded = with_checkpoint(Lifecycle(stack.table)) | changes
    plant(stack.table, {"checkpoint": {k: v for k, v in recorded.items() if v is not None}})
    assert_refused_and_untouched(stack)


def test_a_window_wider_than_sixteen_entries_is_never_touched(stack: Stack) -> None:
    stored_in(Lifecycle(stack.table), SLOT, State.SEEDED)
    plant(stack.table, {"ops": stored(stack.table)["ops"] * 17})
    assert_refused_and_untouched(stack)


@pytest.mark.parametrize(
    ("changes", "removed"),
    [
        pytest.param({"result": {"outcome": "failed"}}, (), id="result-on-an-unseeded-record"),
        pytest.param({"state": "seeding"}, (), id="seeding-without-a-seed"),
        pytest.param({"state": "seeded"}, (), id="seeded-without-a-seed"),
    ],
)
def test_a_cold_record_with_a_wrong_fact_is_never_touched(
    stack: Stack, changes: dict[str, Any], removed: tuple[str, ...]
) -> None:
    stored_in(Lifecycle(stack.table), SLOT, State.UNSEEDED)
    plant(stack.table, changes, removed)
    assert_refused_and_untouched(stack, seeded=False)


# Controls: what the codec accepts is touched, so the condition never refuses a record the
# seed function then takes as its own (that would be a 503 after every round).


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="as-written"),
        pytest.param({"retained_reason": None, "incarnation": None}, id="null-optionals"),
        pytest.param({"checkpoint": None, "expires_at": None}, id="null-checkpoint"),
        pytest.param({"retained_reason": "task-running"}, id="retained-reason"),
        pytest.param(
            {"next_look": NOW + 900, "retains": 2, "sweep_at": NOW + 900},
            id="retained-with-a-backoff",
        ),
    ],
)
def test_a_record_the_codec_accepts_is_touched(stack: Stack, changes: dict[str, Any]) -> None:
    stored_in(Lifecycle(stack.table), SLOT, State.SEEDED)
    plant(stack.table, changes)
    before = stored(stack.table)
    status, answer = poll()
    assert status == 200, answer
    after = stored(stack.table)
    assert after["rev"] == before["rev"] + 1
    assert after["idle_deadline"] != before["idle_deadline"]


def test_a_record_with_a_checkpoint_is_touched(stack: Stack) -> None:
    with_checkpoint(Lifecycle(stack.table))
    status, answer = poll()
    assert status == 200, answer


def test_a_checkpoint_with_no_owner_is_touched(stack: Stack) -> None:
    """An unclaimed slot's checkpoint has no owner: the codec accepts it, so must the poll."""
    recorded = with_checkpoint(Lifecycle(stack.table))
    plant(stack.table, {"checkpoint": {k: v for k, v in recorded.items() if k != "owner"}})
    status, answer = poll()
    assert status == 200, answer


def test_a_cold_record_is_touched(stack: Stack) -> None:
    stored_in(Lifecycle(stack.table), SLOT, State.UNSEEDED)
    status, answer = poll(seeded=False)
    assert status == 200, answer


def test_an_unknown_attribute_is_refused_after_the_deadline_moved(stack: Stack) -> None:
    """What a condition cannot see: it names the attributes it tests, never the ones it
    does not know. The touch writes (deadline, sweep_at, updated_at, rev), the answer is
    still 409: the record read back is malformed. Safe, because a later deadline only
    retains longer and nothing else the touch writes is a fact any reader decides on."""
    stored_in(Lifecycle(stack.table), SLOT, State.SEEDED)
    plant(stack.table, {"planted_by_a_newer_deployment": "x"})
    before = stored(stack.table)
    status, answer = poll()
    assert (status, answer) == (409, {"error": "record-unsupported", "detail": None, "fields": []})
    after = stored(stack.table)
    assert after["rev"] == before["rev"] + 1
    assert after["idle_deadline"] != before["idle_deadline"]
    unchanged = {"rev", "idle_deadline", "sweep_at", "updated_at"}
    assert {k: v for k, v in after.items() if k not in unchanged} == {
        k: v for k, v in before.items() if k not in unchanged
    }
