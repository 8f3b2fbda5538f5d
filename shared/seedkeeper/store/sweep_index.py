"""The idle sweep's reads and its one bookkeeping write: the sparse `by-deadline` index
(live slots whose idle deadline has passed; the debt partition: resources owing deletions,
slots owing their superseded checkpoints) and the cursor that lets a long backlog be
resumed, not restarted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from seedkeeper.domain.record import SLOT_PREFIX, SWEEP_PARTITION, Classified, classify
from seedkeeper.errors import translate_client_error
from seedkeeper.store.items import DEBT_PARTITION
from seedkeeper.store.snapshots import RESIDENT_PREFIX

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

INDEX = "by-deadline"
CURSOR_KEY = {"PK": "SWEEP", "SK": "CURSOR"}
Cursor = dict[str, Any]


class OwedCheckpoint(NamedTuple):
    """A superseded checkpoint object `slot` owes the deletion of."""

    slot: str
    key: str


@dataclass(frozen=True)
class Owed:
    """One page of the debt partition, by kind of debtor."""

    resources: tuple[str, ...]  # resources whose rotation ledgers owe deletions
    checkpoints: tuple[OwedCheckpoint, ...]


@dataclass(frozen=True)
class Page:
    slots: tuple[Classified, ...]  # each expired index entry, classified as read
    cursor: Cursor | None  # where the next page starts; None at the end


class SweepIndex:
    def __init__(self, table: Table) -> None:
        self._table = table

    def expired(self, now: int, *, start: Cursor | None, limit: int) -> Page:
        """One page of live slots whose idle deadline is before `now`."""
        query: dict[str, Any] = {
            "IndexName": INDEX,
            "KeyConditionExpression": Key("sweep").eq(SWEEP_PARTITION)
            & Key("idle_deadline").lt(now),
            "Limit": limit,
        }
        if start is not None:
            query["ExclusiveStartKey"] = start
        try:
            page = self._table.query(**query)
        except ClientError as error:
            raise translate_client_error(error) from error
        slots = tuple(
            classify(str(item["PK"]).removeprefix(SLOT_PREFIX), item) for item in page["Items"]
        )
        cursor = page.get("LastEvaluatedKey")
        return Page(slots, dict(cursor) if cursor is not None else None)

    def cursor(self) -> Cursor | None:
        """Where the last invocation stopped, if it did not reach the end."""
        try:
            item = self._table.get_item(Key=CURSOR_KEY, ConsistentRead=True).get("Item")
        except ClientError as error:
            raise translate_client_error(error) from error
        cursor = item.get("cursor") if item else None
        return dict(cursor) if isinstance(cursor, dict) else None

    def keep_cursor(self, cursor: Cursor | None) -> None:
        """Where the next invocation resumes; removed once a pass reaches the end. Two
        sweeps at once only redo each other's work: every decision is fenced."""
        only_a_cursor = Attr("SK").not_exists() | Attr("cursor").exists()
        try:
            if cursor is None:
                self._table.delete_item(Key=CURSOR_KEY, ConditionExpression=only_a_cursor)
            else:
                self._table.put_item(
                    Item={**CURSOR_KEY, "cursor": cursor}, ConditionExpression=only_a_cursor
                )
        except ClientError as error:
            raise translate_client_error(error) from error

    def owing(self, now: int, *, limit: int) -> Owed:
        """What is owed by now: one page of the debt partition's index entries."""
        try:
            page = self._table.query(
                IndexName=INDEX,
                KeyConditionExpression=Key("sweep").eq(DEBT_PARTITION)
                & Key("idle_deadline").lte(now),
                Limit=limit,
            )
        except ClientError as error:
            raise translate_client_error(error) from error
        resources: set[str] = set()
        checkpoints: set[OwedCheckpoint] = set()
        for item in page["Items"]:
            debtor = str(item["PK"])
            if debtor.startswith(RESIDENT_PREFIX):
                resources.add(debtor.removeprefix(RESIDENT_PREFIX))
            elif debtor.startswith(SLOT_PREFIX) and "key" in item:
                checkpoints.add(OwedCheckpoint(debtor.removeprefix(SLOT_PREFIX), str(item["key"])))
        return Owed(tuple(sorted(resources)), tuple(sorted(checkpoints)))
