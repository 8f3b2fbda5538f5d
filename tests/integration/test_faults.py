"""Faults: a seed handler that dies half-way, a store that throttles, a deployment whose
settings are invalid."""

from __future__ import annotations

import json
from typing import Any

import pytest

from functions import event, invoke
from repos import make_repository
from seedkeeper.domain.models import Binding, SeedIdentity
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import Absent, slot_key
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.store.lifecycle import Written
from sessions import Answer, answer_calls, answered, injected_session
from slots import Slots, seed_function


def died_after_birth(slots: Slots, body: dict[str, Any]) -> OpRef:
    """What a handler leaves when it dies right after the birth write."""
    lifecycle = slots.stack.store.lifecycle()
    born = lifecycle.birth(
        body["slot"],
        Binding(
            owner=None,
            seed=SeedIdentity.model_validate(body["seed"]) if body["seed"] else None,
            origin=None,
        ),
        now=1_800_000_000,
        idle_deadline=1_800_000_600,
    )
    assert isinstance(born, Written)
    assert born.entry is not None
    return born.entry.ref


def test_a_handler_that_died_after_birth_is_finished_by_the_retry(
    slots: Slots, tmp_path: Any
) -> None:
    seed = slots.publish(make_repository(tmp_path))
    body = {"slot": "orphan", "seed": seed}  # an unclaimed caller, as older executors are
    died_after_birth(slots, body)
    assert slots.attempts("orphan") == []  # nothing was launched
    status, answer = slots.seed(body)
    assert status == 202
    assert answer["incarnation"] == "local:orphan:1"
    _, final = slots.settle(body)
    assert final["seeded"] is True
    assert slots.attempts("orphan") == ["attempt-1.json"]


def test_a_handler_that_died_after_launch_relaunches_nothing(slots: Slots, tmp_path: Any) -> None:
    seed = slots.publish(make_repository(tmp_path))
    body = {"slot": "half", "seed": seed}
    restore = died_after_birth(slots, body)
    # The launch happened, the incarnation was never recorded.
    plan = SlotPlan(slot="half", attempt=1, op=restore, seed=SeedIdentity.model_validate(seed))
    first = slots.runtime.launch(plan)
    assert slots.record("half").incarnation is None
    status, answer = slots.seed(body)  # the executor's retry
    assert status in {200, 202}
    assert answer["incarnation"] == first  # the same task: launches are idempotent
    assert slots.attempts("half") == ["attempt-1.json"]
    assert slots.runtime.status(first) in {TaskStatus.RUNNING, TaskStatus.STOPPED}


CANCELLED = {"Code": "TransactionCanceledException", "Message": "injected"}


@pytest.mark.parametrize(
    "error",
    [
        {"Error": {"Code": code, "Message": "injected"}}
        for code in ("ProvisionedThroughputExceededException", "ThrottlingException")
    ]
    + [
        {"Error": {"Code": "InternalServerError", "Message": "injected"}},
        # A transaction cancelled for no reason of its data: throttled, or in conflict
        # with a rotation writing the snapshot record the birth checks.
        {
            "Error": CANCELLED,
            "CancellationReasons": [{"Code": "None"}, {"Code": "ThrottlingError"}],
        },
        {
            "Error": CANCELLED,
            "CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}],
        },
    ],
    ids=["throughput", "throttling", "internal", "cancelled-throttled", "cancelled-conflict"],
)
def test_a_throttled_store_is_a_retryable_503_with_nothing_written(
    slots: Slots, tmp_path: Any, error: dict[str, Any]
) -> None:
    seed = slots.publish(make_repository(tmp_path))
    body = slots.body(seed, slot="throttled")
    status_code = 500 if error["Error"]["Code"] == "InternalServerError" else 400
    births: list[str] = []

    def throttled(**_: Any) -> Answer:
        """DynamoDB's answer to the birth's transaction, given without sending it."""
        births.append("TransactWriteItems")
        return answered(error, status_code)

    with injected_session() as session:
        answer_calls(session, "before-call.dynamodb.TransactWriteItems", throttled)
        status, answer = invoke(seed_function, event("seed-new", body=body))
    assert births == ["TransactWriteItems"]
    assert (status, answer["error"]) == (503, "retry-later")
    assert slots.stack.store.lifecycle().read("throttled") == Absent("throttled")
    assert slots.attempts("throttled") == []
    assert "Item" not in slots.stack.table.get_item(Key=slot_key("throttled"))
    assert "injected" not in json.dumps(answer)
    status, _ = slots.seed(body)  # the retry goes through
    assert status == 202


@pytest.mark.parametrize(
    "setting",
    [
        ("SEEDKEEPER_TABLE", "t!", "table"),
        ("SEEDKEEPER_IDLE_WINDOW", "soon-ish", "idle_window"),
        ("SEEDKEEPER_R2_ENDPOINT", "ftp://r2.internal.example", "endpoint"),
    ],
    ids=lambda setting: setting[0],
)
def test_invalid_settings_are_a_500_naming_the_setting_never_its_value(
    slots: Slots,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    setting: tuple[str, str, str],
) -> None:
    variable, value, field = setting
    monkeypatch.setenv(variable, value)
    status, answer = invoke(seed_function, event("seed-cold"))
    assert (status, answer) == (500, {"error": "internal-error", "detail": None, "fields": []})
    refusal = next(r for r in caplog.records if r.getMessage() == "settings invalid")
    assert refusal.__dict__["fields"] == [field]
    assert value not in caplog.text + repr([r.__dict__ for r in caplog.records])
