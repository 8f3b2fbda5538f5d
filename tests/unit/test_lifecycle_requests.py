"""The exact requests the lifecycle module sends, checked offline with botocore's Stubber."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from boto3.dynamodb.conditions import BuiltConditionExpression, ConditionExpressionBuilder
from boto3.dynamodb.types import TypeSerializer
from botocore.stub import ANY, Stubber

from builders import IDLE, NOW, ORIGIN, checkpoint, owner, record_in, seed, success
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import Absent, SlotRecord, State, Supported, encode
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Unmet, Written

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

# The resource layer hands the stub its parameters before serialising them.
KEY = {"PK": "SLOT#slot-1", "SK": "LIFECYCLE"}
_serialize = TypeSerializer().serialize


@pytest.fixture
def table(aws_credentials: None) -> Table:
    return boto3.resource("dynamodb", region_name="us-east-1").Table("offline")


def test_read_is_strongly_consistent(table: Table) -> None:
    with Stubber(table.meta.client) as stub:
        stub.add_response(
            "get_item", {}, {"TableName": "offline", "Key": KEY, "ConsistentRead": True}
        )
        assert Lifecycle(table).read("slot-1") == Absent("slot-1")
        stub.assert_no_pending_responses()


def test_a_transition_is_one_conditional_update_returning_the_old_item_on_failure(
    table: Table,
) -> None:
    record = record_in(State.SEEDED)
    with Stubber(table.meta.client) as stub:
        stub.add_response(
            "update_item",
            {},
            {
                "TableName": "offline",
                "Key": KEY,
                "UpdateExpression": ANY,
                "ConditionExpression": ANY,
                "ExpressionAttributeNames": ANY,
                "ExpressionAttributeValues": ANY,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            },
        )
        outcome = Lifecycle(table).write(
            transitions.RESERVE,
            record,
            transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW),
        )
        stub.assert_no_pending_responses()
    assert isinstance(outcome, Written)
    assert outcome.record.rev == record.rev + 1


def test_a_failed_condition_becomes_a_conflict_carrying_the_old_item(table: Table) -> None:
    read = record_in(State.SEEDED)
    winner = read.model_copy(update={"rev": read.rev + 3})
    with Stubber(table.meta.client) as stub:
        stub.add_client_error(
            "update_item",
            service_error_code="ConditionalCheckFailedException",
            http_status_code=400,
            response_meta={},
            modeled_fields={"Item": wire(winner)},
        )
        outcome = Lifecycle(table).write(
            transitions.RESERVE,
            read,
            transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW),
        )
    assert outcome == Conflict(Supported(winner))


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        ([{"Code": "ConditionalCheckFailed", "Item": "winner"}, {"Code": "None"}], "conflict"),
        ([{"Code": "None"}, {"Code": "ConditionalCheckFailed"}], "unmet"),
        # Both failed: the slot exists, so the caller re-decides on it.
        (
            [
                {"Code": "ConditionalCheckFailed", "Item": "winner"},
                {"Code": "ConditionalCheckFailed"},
            ],
            "conflict",
        ),
    ],
)
def test_a_birth_is_one_transaction_whose_reasons_become_answers(
    table: Table, reasons: list[dict[str, Any]], expected: str
) -> None:
    winner = record_in(State.SEEDED)
    key = {"PK": "RESIDENT#r", "SK": "SNAPSHOT#current"}
    requires = {"ConditionCheck": {"TableName": "offline", "Key": key, "ConditionExpression": "x"}}
    with Stubber(table.meta.client) as stub:
        stub.add_client_error(
            "transact_write_items",
            service_error_code="TransactionCanceledException",
            http_status_code=400,
            response_meta={},
            modeled_fields={
                "CancellationReasons": [
                    {**r, "Item": wire(winner)} if "Item" in r else r for r in reasons
                ]
            },
            expected_params={"TransactItems": [{"Put": ANY}, requires]},
        )
        outcome = Lifecycle(table).birth(
            "slot-1",
            Binding(owner=owner(), seed=seed(), origin=ORIGIN),
            now=NOW,
            idle_deadline=NOW + IDLE,
            requires=requires,
        )
        stub.assert_no_pending_responses()
    assert outcome == (Conflict(Supported(winner)) if expected == "conflict" else Unmet())


def wire(record: SlotRecord) -> dict[str, Any]:
    return {name: _serialize(value) for name, value in encode(record).items()}


# DynamoDB's limits on one expression: 4 KB of text, 300 operators and functions.
MAX_EXPRESSION = 4096
MAX_OPERATORS = 300
OPERATORS = re.compile(
    r"\b(?:AND|OR|NOT|BETWEEN|IN)\b|<>|<=|>=|=|<|>|\b(?:attribute_\w+|size|begins_with|contains)\("
)


def sent_update(
    table: Table, write: Callable[[Lifecycle], object]
) -> tuple[dict[str, Any], BuiltConditionExpression]:
    """The one UpdateItem `write` sends, and its condition as boto3 builds it for the wire."""
    sent: dict[str, Any] = {}

    def capture(params: dict[str, Any], **_: Any) -> None:
        sent.update(params)

    table.meta.client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", capture)
    with Stubber(table.meta.client) as stub:
        stub.add_response("update_item", {"Attributes": wire(record_in(State.SEEDED))})
        write(Lifecycle(table))
        stub.assert_no_pending_responses()
    return sent, ConditionExpressionBuilder().build_expression(sent["ConditionExpression"])


def sent_touch(table: Table, *, seeded: bool) -> tuple[dict[str, Any], BuiltConditionExpression]:
    poll = transitions.Poll(
        Binding(
            owner=owner() if seeded else None,
            seed=seed() if seeded else None,
            origin=ORIGIN if seeded else None,
        ),
        now=NOW,
        idle_deadline=NOW + IDLE,
    )
    return sent_update(table, lambda lifecycle: lifecycle.touch("slot-1", poll))


def sent_keepalive(
    table: Table, *, claimed: bool, seeded: bool
) -> tuple[dict[str, Any], BuiltConditionExpression]:
    keep = transitions.KeepAlive(
        owner=owner() if claimed else None, now=NOW, idle_deadline=NOW + IDLE
    )
    return sent_update(table, lambda lifecycle: lifecycle.keepalive("slot-1", keep, seeded=seeded))


def fits_dynamodb_limits(sent: dict[str, Any], condition: BuiltConditionExpression) -> None:
    """A touch's shape: one UpdateItem of the deadline (and the index keys: the slot's
    shard, `sweep_at` back to the deadline, a retain's backoff ended), answered with the
    new record or, when its condition fails, the old one; the condition within DynamoDB's
    limits."""
    assert sent["UpdateExpression"] == (
        "SET #deadline = :deadline, #sweep_at = :deadline, #sweep = :shard, #updated = :now"
        " REMOVE #next_look, #retains ADD #rev :one"
    )
    assert (sent["ReturnValues"], sent["ReturnValuesOnConditionCheckFailure"]) == (
        "ALL_NEW",
        "ALL_OLD",
    )
    expression = condition.condition_expression
    assert len(expression.encode()) <= MAX_EXPRESSION
    assert len(OPERATORS.findall(expression)) <= MAX_OPERATORS


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "cold"])
def test_a_touch_is_one_update_whose_condition_fits_dynamodb_limits(
    table: Table, seeded: bool
) -> None:
    fits_dynamodb_limits(*sent_touch(table, seeded=seeded))


@pytest.mark.parametrize(
    ("claimed", "seeded"),
    [(True, True), (False, True), (False, False)],
    ids=["claimed", "unclaimed", "cold"],
)
def test_a_keepalive_is_one_update_whose_condition_fits_dynamodb_limits(
    table: Table, claimed: bool, seeded: bool
) -> None:
    fits_dynamodb_limits(*sent_keepalive(table, claimed=claimed, seeded=seeded))


def _items_the_codec_writes() -> list[Any]:
    """Every attribute a record can carry, among these items: a seeded record with every
    optional fact (a resumed seed's result too), a failed one, the ended ones."""
    richest = record_in(State.SEEDED).model_copy(
        update={
            "checkpoint": checkpoint(),
            "retained_reason": "task-running",
            "frozen_at": NOW,
            "checkpoint_failures": 2,
            "next_look": NOW + 300,
            "retains": 1,
            "result": success(resumed=True),
        }
    )
    items = {
        "richest": richest,
        "seed_failed": record_in(State.SEED_FAILED),
        "retired": record_in(State.RETIRED),
        "parked": record_in(State.PARKED),
        "lost": record_in(State.LOST),
    }
    return [pytest.param(encode(record), id=name) for name, record in items.items()]


def carried(item: dict[str, Any]) -> set[str]:
    """The attribute names of `item` a touch's condition must name: the key is the
    request's; `owner`, `seed` and `origin` are pinned whole by equality; `result.steps`
    has open keys."""
    names = {name for name in item if name not in KEY}
    names |= set(item.get("result", {})) | set(item.get("checkpoint", {}))
    return names | set(item.get("checkpoint", {}).get("owner", {}))


@pytest.mark.parametrize("item", _items_the_codec_writes())
def test_the_touch_condition_tests_every_attribute_the_codec_writes(
    table: Table, item: dict[str, Any]
) -> None:
    """A new attribute in the codec must be added to the touch's condition too."""
    _, condition = sent_touch(table, seeded=True)
    assert carried(item) - set(condition.attribute_name_placeholders.values()) == set()


@pytest.mark.parametrize("item", _items_the_codec_writes())
def test_the_keepalive_condition_tests_every_attribute_the_codec_writes(
    table: Table, item: dict[str, Any]
) -> None:
    """As the touch's, for the kind of record the caller says it keeps alive (the seed
    and origin the touch pins by equality too)."""
    _, condition = sent_keepalive(table, claimed=True, seeded="seed" in item)
    assert carried(item) - set(condition.attribute_name_placeholders.values()) == set()
