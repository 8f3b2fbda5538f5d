"""The idle sweep's reads and its one bookkeeping write: the sparse `by-deadline` index
(live slots, on their shards `live#00`..., due once their `sweep_at` has passed; the debt
partition: resources owing deletions, slots owing their superseded checkpoints) and the
progress item: where a long backlog resumes, and how many shards were ever used."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from seedkeeper.domain.record import (
    SLOT_PREFIX,
    SWEEP_SHARDS,
    Classified,
    classify,
    shard_partition,
)
from seedkeeper.errors import translate_client_error
from seedkeeper.store.items import DEBT_PARTITION
from seedkeeper.store.snapshots import RESIDENT_PREFIX

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

INDEX = "by-deadline"
PROGRESS_KEY = {"PK": "SWEEP", "SK": "CURSOR"}


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
class Position:
    """Where a pass is: a shard, and where in it (the index's last key read; None: its
    start)."""

    shard: int
    after: dict[str, Any] | None = None


START = Position(0)


@dataclass(frozen=True)
class Progress:
    shards: int  # the shards to query: the configured count, or more if more were used
    resume: Position | None  # where the last run stopped, if it did not reach the end


@dataclass(frozen=True)
class Page:
    slots: tuple[Classified, ...]  # each due index entry, classified as read
    next: Position | None  # where the next page starts; None at the end of the last shard
    queries: int


class SweepIndex:
    def __init__(self, table: Table, *, shards: int = SWEEP_SHARDS) -> None:
        self._table = table
        self._shards = shards  # as the writers are configured

    def due(self, now: int, *, start: Position, shards: int, limit: int) -> Page:
        """Up to `limit` live slots whose `sweep_at` is before `now`, from `start` on, one
        shard after the other (a page fills across shards, so the tasks it waits on are
        asked in few batches)."""
        slots: list[Classified] = []
        position: Position | None = start
        queries = 0
        while position is not None and len(slots) < limit:
            query: dict[str, Any] = {
                "IndexName": INDEX,
                "KeyConditionExpression": Key("sweep").eq(shard_partition(position.shard))
                & Key("sweep_at").lt(now),
                "Limit": limit - len(slots),
            }
            if position.after is not None:
                query["ExclusiveStartKey"] = position.after
            try:
                page = self._table.query(**query)
            except ClientError as error:
                raise translate_client_error(error) from error
            queries += 1
            slots += (
                classify(str(item["PK"]).removeprefix(SLOT_PREFIX), item) for item in page["Items"]
            )
            last = page.get("LastEvaluatedKey")
            if last is not None:
                position = Position(position.shard, dict(last))
            elif position.shard + 1 < shards:
                position = Position(position.shard + 1)
            else:
                position = None
        return Page(tuple(slots), position, queries)

    def progress(self) -> Progress:
        """Where the last run stopped, and the shards to query: never fewer than were ever
        queried, so a shard count configured lower still finds the records on the higher
        shards (a record moves only when it is next born, resumed or touched)."""
        try:
            item = self._table.get_item(Key=PROGRESS_KEY, ConsistentRead=True).get("Item")
        except ClientError as error:
            raise translate_client_error(error) from error
        item = item or {}
        recorded = item.get("shards")
        shards = max(self._shards, int(recorded) if isinstance(recorded, Decimal) else 0)
        return Progress(shards, _position(item.get("cursor"), shards))

    def keep_progress(self, shards: int, resume: Position | None) -> None:
        """Where the next run resumes (None: at the start), and the shards it queried. Two
        sweeps at once only redo each other's work (every decision is fenced); the shard
        count recorded never goes down."""
        item: dict[str, Any] = {**PROGRESS_KEY, "shards": shards}
        if resume is not None:
            item["cursor"] = {
                "shard": resume.shard,
                **({"after": resume.after} if resume.after else {}),
            }
        never_fewer = Attr("shards").not_exists() | Attr("shards").lte(shards)
        try:
            self._table.put_item(Item=item, ConditionExpression=never_fewer)
        except ClientError as error:
            # Failed: a sweep that knows more shards recorded its progress; it stands.
            if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise translate_client_error(error) from error

    def owing(self, now: int, *, limit: int) -> Owed:
        """What is owed by now: one page of the debt partition's index entries."""
        try:
            page = self._table.query(
                IndexName=INDEX,
                KeyConditionExpression=Key("sweep").eq(DEBT_PARTITION) & Key("sweep_at").lte(now),
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


def _position(stored: object, shards: int) -> Position | None:
    """The stored cursor, if it names a shard there is (anything else: start over)."""
    if not isinstance(stored, dict) or not isinstance(stored.get("shard"), Decimal):
        return None
    shard, after = int(stored["shard"]), stored.get("after")
    if not 0 <= shard < shards:
        return None
    if after is not None and not (
        isinstance(after, dict) and after.get("sweep") == shard_partition(shard)
    ):
        return None
    return Position(shard, after)
