"""The local stack's store over a working day: it keeps nothing of a request but its effect
on the data, and it deletes what DynamoDB's TTL deletes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
import pytest
from moto.core.model_instances import model_data

from conftest import Stack
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.motoserver import AtomicMotoServer

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table


def models_kept() -> int:
    """The models moto keeps for its dashboard, of every service."""
    kept = 0
    for models in model_data.values():
        for model in models.values():
            tracked: list[object] = model.instances_tracked  # type: ignore[attr-defined]
            kept += len(tracked)
    return kept


def test_the_store_keeps_no_model_per_request(stack: Stack) -> None:
    # Given a store that has served some requests
    table = stack.table
    for index in range(5):
        table.put_item(Item={"PK": f"P#{index}", "SK": "S"})
    kept = models_kept()
    # When it serves many more, writes, reads and transactions
    for index in range(30):
        table.put_item(Item={"PK": f"Q#{index}", "SK": "S"})
        table.get_item(Key={"PK": f"Q#{index}", "SK": "S"})
        # The resource's client takes Python values, as the lifecycle's births pass them.
        put = {"TableName": table.name, "Item": {"PK": f"T#{index}", "SK": "S"}}
        table.meta.client.transact_write_items(TransactItems=[{"Put": put}])  # type: ignore[typeddict-item]
    # Then it keeps no more models than it did: only its data grew
    assert models_kept() <= kept


@pytest.fixture
def expiring(aws_credentials: None) -> Iterator[Table]:
    """A store that deletes expired items every tenth of a second, and a table on it whose
    TTL is enabled (template.yaml's `expires_at`)."""
    server = AtomicMotoServer(expire_every=0.1).start()
    name = f"ttl-{uuid.uuid4().hex[:12]}"
    try:
        create_table(boto3.client("dynamodb", endpoint_url=server.endpoint), name, load_template())
        yield boto3.resource("dynamodb", endpoint_url=server.endpoint).Table(name)
    finally:
        server.stop()


def present(table: Table, pk: str) -> bool:
    return "Item" in table.get_item(Key={"PK": pk, "SK": "S"}, ConsistentRead=True)


def test_items_whose_ttl_has_passed_are_deleted_as_dynamodb_does(expiring: Table) -> None:
    # Given items that expired, that expire later, whose TTL is not a number, or absent
    now = int(time.time())
    expiring.put_item(
        Item={
            "PK": "expired",
            "SK": "S",
            "expires_at": now - 10,
            "sweep": "live#00",
            "sweep_at": 1,
        }
    )
    expiring.put_item(Item={"PK": "later", "SK": "S", "expires_at": now + 3600})
    expiring.put_item(Item={"PK": "a-string", "SK": "S", "expires_at": str(now - 10)})
    expiring.put_item(Item={"PK": "no-ttl", "SK": "S"})
    # Then the expired one is deleted, from the table and its index alike
    deadline = time.monotonic() + 10
    while present(expiring, "expired"):
        assert time.monotonic() < deadline, "the expired item was never deleted"
        time.sleep(0.05)
    index = expiring.query(
        IndexName="by-deadline",
        KeyConditionExpression="sweep = :live",
        ExpressionAttributeValues={":live": "live#00"},
    )
    assert index["Items"] == []
    # And the others stay
    assert all(present(expiring, pk) for pk in ("later", "a-string", "no-ttl"))


def test_a_table_without_ttl_keeps_its_expired_items(
    expiring: Table, aws_credentials: None
) -> None:
    # Given a table whose TTL is not enabled, beside one whose TTL is
    client = expiring.meta.client
    name = f"no-ttl-{uuid.uuid4().hex[:12]}"
    client.create_table(
        TableName=name,
        KeySchema=[
            {"AttributeName": "PK", "KeyType": "HASH"},
            {"AttributeName": "SK", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "PK", "AttributeType": "S"},
            {"AttributeName": "SK", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    kept = boto3.resource("dynamodb", endpoint_url=client.meta.endpoint_url).Table(name)
    past = int(time.time()) - 10
    kept.put_item(Item={"PK": "old", "SK": "S", "expires_at": past})
    # When the TTL pass has run on the other table
    expiring.put_item(Item={"PK": "expired", "SK": "S", "expires_at": past})
    deadline = time.monotonic() + 10
    while present(expiring, "expired"):
        assert time.monotonic() < deadline, "the TTL pass never ran"
        time.sleep(0.05)
    # Then the table without TTL still has its item
    assert present(kept, "old")


def test_a_cancelled_transaction_leaves_every_item_as_it_was(stack: Stack) -> None:
    """The store copies only what a transaction names, for its rollback (the suite's moto
    does too): a cancelled one still undoes its own writes and touches nothing else."""
    table = stack.table
    for index in range(20):
        table.put_item(Item={"PK": f"P#{index}", "SK": "S", "n": index})
    before = sorted(table.scan()["Items"], key=lambda item: str(item["PK"]))
    client = table.meta.client
    with pytest.raises(client.exceptions.TransactionCanceledException):
        client.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": table.name, "Item": {"PK": "P#new", "SK": "S"}}},
                {
                    "Update": {
                        "TableName": table.name,
                        "Key": {"PK": "P#3", "SK": "S"},
                        "UpdateExpression": "SET n = :n",
                        "ExpressionAttributeValues": {":n": 99},
                    }
                },
                {
                    "ConditionCheck": {
                        "TableName": table.name,
                        "Key": {"PK": "P#4", "SK": "S"},
                        "ConditionExpression": "n = :wrong",
                        "ExpressionAttributeValues": {":wrong": -1},
                    }
                },
            ]
        )
    assert sorted(table.scan()["Items"], key=lambda item: str(item["PK"])) == before
    # and a transaction that succeeds writes what it names, and only that
    client.transact_write_items(
        TransactItems=[
            {
                "Update": {
                    "TableName": table.name,
                    "Key": {"PK": "P#3", "SK": "S"},
                    "UpdateExpression": "SET n = :n",
                    "ConditionExpression": "n = :was",
                    "ExpressionAttributeValues": {":n": 99, ":was": 3},
                }
            }
        ]
    )
    after = {str(item["PK"]): item["n"] for item in table.scan()["Items"]}
    assert after == {f"P#{index}": 99 if index == 3 else index for index in range(20)}


def test_a_condition_sent_again_is_judged_on_its_own_values(table: Table) -> None:
    """moto, as the suite and the store run it, parses a condition once per text, names and
    values (in-process, as here, for every request on one thread): the same text with other
    values, or other names, is judged on what it says."""
    client = table.meta.client
    table.put_item(Item={"PK": "P", "SK": "S", "a": 1, "b": 2})

    def update(name: str, was: int) -> bool:
        try:
            table.update_item(
                Key={"PK": "P", "SK": "S"},
                UpdateExpression="SET #f = :was",
                ConditionExpression="#f = :was",
                ExpressionAttributeNames={"#f": name},
                ExpressionAttributeValues={":was": was},
            )
        except client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    assert update("a", 1)
    assert not update("a", 2)
    assert update("b", 2)
    assert not update("b", 1)
