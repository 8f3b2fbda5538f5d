"""The local stack through a working day, over HTTP: requests at once each get their own
answer, a client that gives up is one log line, the store expires records by their TTL and
rolls a cancelled transaction back whole, and the stack's exit leaves no slot task running
and no zombie."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as StillWaiting
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from conftest import running_local_stack
from seedkeeper.adapters import aws
from seedkeeper.config import StoreSettings
from seedkeeper_client import Cold, SeedkeeperClient
from seedkeeper_tools.local.stack import REGION, LocalStack

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

HOLD = 3.0  # how long the first of two requests is held for the second to overtake it
WAIT = 30.0  # a bound on every wait, so a broken stack fails the test instead of hanging it


@pytest.fixture
def client(stack: LocalStack) -> SeedkeeperClient:
    credentials = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    return SeedkeeperClient(stack.url, credentials=credentials, timeout=WAIT)


@pytest.fixture
def table(stack: LocalStack) -> Table:
    return StoreSettings().table_resource()


class HoldTheFirst(logging.Handler):
    """Holds the first invocation right after Powertools has taken its event, when the
    route is found, until `released` (or HOLD seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = threading.Event()
        self.released = threading.Event()
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if not record.getMessage().startswith("Found a registered route"):
            return
        with self._lock:
            first = not self.held.is_set()
            self.held.set()
        if first:
            self.released.wait(HOLD)


@pytest.fixture
def hold_the_first() -> Iterator[HoldTheFirst]:
    router = logging.getLogger("aws_lambda_powertools.event_handler.api_gateway")
    hold, level = HoldTheFirst(), router.level
    router.addHandler(hold)
    router.setLevel(logging.DEBUG)
    try:
        yield hold
    finally:
        hold.released.set()
        router.removeHandler(hold)
        router.setLevel(level)


def test_two_requests_at_once_each_get_their_own_answer(
    client: SeedkeeperClient, hold_the_first: HoldTheFirst
) -> None:
    with ThreadPoolExecutor(2) as pool:
        # Given a request held in the middle of its invocation
        first = pool.submit(client.seed, "first", None)
        assert hold_the_first.held.wait(WAIT)
        # When another arrives, and the first goes on after it
        second = pool.submit(client.seed, "second", None)
        with contextlib.suppress(StillWaiting):  # it may overtake the first, or wait for it
            second.result(timeout=HOLD)
        hold_the_first.released.set()
        answers = {"first": first.result(WAIT), "second": second.result(WAIT)}
    # Then each answer is about its own request's slot
    for slot, answer in answers.items():
        assert isinstance(answer, Cold)
        assert answer.slot == slot


def signed_seed(stack: LocalStack, slot: str) -> bytes:
    url = f"{stack.url}/seed"
    body = json.dumps({"slot": slot, "seed": None}).encode()
    request = AWSRequest(method="POST", url=url, data=body)
    request.headers["Content-Type"] = "application/json"
    credentials = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    SigV4Auth(credentials, "lambda", REGION).add_auth(request)
    host = url.removeprefix("http://").split("/")[0]
    lines = [
        "POST /seed HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in request.headers.items()),
    ]
    return ("\r\n".join([*lines, "", ""])).encode() + body


def test_a_client_that_gives_up_is_one_log_line_not_a_traceback(
    stack: LocalStack, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a request whose function is still working
    working, gone = threading.Event(), threading.Event()

    def hold(**_: Any) -> None:
        working.set()
        gone.wait(WAIT)

    aws.session().events.register("before-call.dynamodb.UpdateItem", hold)
    try:
        host, port = stack.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT) as connection:
            connection.sendall(signed_seed(stack, "abandoned"))
            assert working.wait(WAIT)
            # When its client gives up (a reset, as a client's timeout often closes)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.set()
        deadline = time.monotonic() + WAIT
        while not any("went away" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < deadline, "the abandoned request was never logged"
            time.sleep(0.05)
    finally:
        gone.set()
        aws.session().events.unregister("before-call.dynamodb.UpdateItem", hold)
    # Then the gateway logs it once, as one line, and prints no traceback
    went_away = [r for r in caplog.records if "went away" in r.getMessage()]
    assert len(went_away) == 1
    assert went_away[0].exc_info is None
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out


def present(table: Table, pk: str) -> bool:
    return "Item" in table.get_item(Key={"PK": pk, "SK": "S"}, ConsistentRead=True)


def test_the_store_deletes_records_whose_ttl_has_passed(table: Table) -> None:
    # Given a record whose TTL has passed and one whose TTL has not
    now = int(time.time())
    table.put_item(Item={"PK": "retired-yesterday", "SK": "S", "expires_at": now - 86_400})
    table.put_item(Item={"PK": "retired-today", "SK": "S", "expires_at": now + 86_400})
    # Then the store deletes the first, as DynamoDB's TTL would, and keeps the other
    deadline = time.monotonic() + WAIT
    while present(table, "retired-yesterday"):
        assert time.monotonic() < deadline, "the expired record was never deleted"
        time.sleep(0.1)
    assert present(table, "retired-today")


def test_a_cancelled_transaction_leaves_every_item_as_it_was(table: Table) -> None:
    # Given items a transaction will update, delete and leave alone, one in the index
    table.put_item(Item={"PK": "updated", "SK": "S", "v": 1})
    table.put_item(Item={"PK": "deleted", "SK": "S", "v": 1, "sweep": "x", "sweep_at": 5})
    table.put_item(Item={"PK": "untouched", "SK": "S", "v": 1})
    before = sorted(table.scan(ConsistentRead=True)["Items"], key=lambda item: str(item["PK"]))

    def transaction(*, possible: bool) -> list[dict[str, Any]]:
        check = "attribute_not_exists(PK)" if possible else "attribute_exists(PK)"
        return [
            {
                "Update": {
                    "TableName": table.name,
                    "Key": {"PK": "updated", "SK": "S"},
                    "UpdateExpression": "SET v = :two",
                    "ExpressionAttributeValues": {":two": 2},
                }
            },
            {"Put": {"TableName": table.name, "Item": {"PK": "created", "SK": "S"}}},
            {"Delete": {"TableName": table.name, "Key": {"PK": "deleted", "SK": "S"}}},
            {
                "ConditionCheck": {
                    "TableName": table.name,
                    "Key": {"PK": "absent", "SK": "S"},
                    "ConditionExpression": check,
                }
            },
        ]

    # When a transaction fails on its last item, after its first three were applied
    with pytest.raises(ClientError) as cancelled:
        table.meta.client.transact_write_items(TransactItems=transaction(possible=False))  # type: ignore[arg-type]
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    # Then every item is as it was, the index too
    after = sorted(table.scan(ConsistentRead=True)["Items"], key=lambda item: str(item["PK"]))
    assert after == before
    index = table.query(
        IndexName="by-deadline",
        KeyConditionExpression="sweep = :x",
        ExpressionAttributeValues={":x": "x"},
    )
    assert [item["PK"] for item in index["Items"]] == ["deleted"]
    # And the same transaction, possible, is applied whole
    table.meta.client.transact_write_items(TransactItems=transaction(possible=True))  # type: ignore[arg-type]
    assert table.get_item(Key={"PK": "updated", "SK": "S"})["Item"]["v"] == 2
    assert present(table, "created")
    assert not present(table, "deleted")


def children_of(pid: int) -> dict[int, str]:
    """This process's children, and the state of each (Z: a zombie)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = fields[0]
    return found


def test_the_stacks_exit_stops_every_slot_task_and_leaves_no_zombie(
    tmp_path: Path, aws_credentials: None
) -> None:
    with running_local_stack(tmp_path) as stack:
        # Given slot tasks asked for all at once, and one already stopped
        client = SeedkeeperClient(
            stack.url,
            credentials=Credentials(stack.credentials.access_key, stack.credentials.secret_key),
            timeout=WAIT,
        )
        slots = [f"slot-{index}" for index in range(12)]
        with ThreadPoolExecutor(len(slots)) as pool:
            answers = list(pool.map(lambda slot: client.seed(slot, None), slots))
        assert all(isinstance(answer, Cold) for answer in answers)
        stack.runtime.stop("local:slot-0:1")
        records = [stack.workspace(slot).parent / "attempt-1.json" for slot in slots]
        tasks = {json.loads(record.read_text())["pid"] for record in records}
    # When the stack has stopped: then none of its tasks is left, running or as a zombie
    deadline = time.monotonic() + WAIT
    while left := tasks & children_of(os.getpid()).keys():
        assert time.monotonic() < deadline, f"left behind: {left}"
        time.sleep(0.05)
    assert "Z" not in children_of(os.getpid()).values()
