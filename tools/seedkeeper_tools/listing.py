"""The operator's view of every slot lifecycle record (`seedkeeper status`): read-only.

It reads the WHOLE table with a paginated Scan, so its cost follows the table (every item
is read, and charged, before the filter drops it): an operator command, never a hot path.
Nothing the functions or the slot task run reads through here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.conditions import Attr, ConditionBase
from botocore.exceptions import ClientError

from seedkeeper.domain.record import (
    LIFECYCLE_SK,
    SCHEMA,
    SLOT_PREFIX,
    Classified,
    State,
    classify,
)
from seedkeeper.errors import translate_client_error

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table


@dataclass(frozen=True)
class Listing:
    slots: tuple[Classified, ...]  # each lifecycle record, classified as read
    pages: int  # Scan calls made
    scanned: int  # items read (and paid for), the filtered-out ones included


class SlotListing:
    def __init__(self, table: Table) -> None:
        self._table = table

    def scan(self, states: Collection[State] = ()) -> Listing:
        """Every slot lifecycle record (only those in `states`, when given), eventually
        consistent, in DynamoDB's pages of up to 1 MB read.

        Debts, snapshot records and the sweep's cursor are filtered out by their keys. A
        record whose schema or state this code cannot read (a newer deployment's, an
        unknown or missing state) is returned whatever `states` asks, classified
        `Unsupported` or `Malformed`: its state cannot be trusted, so no filter hides it."""
        scan: dict[str, Any] = {"FilterExpression": _filter(states)}
        slots: list[Classified] = []
        pages = scanned = 0
        try:
            while True:
                page = self._table.scan(**scan)
                pages += 1
                scanned += page["ScannedCount"]
                slots.extend(
                    classify(str(item["PK"]).removeprefix(SLOT_PREFIX), item)
                    for item in page["Items"]
                )
                if "LastEvaluatedKey" not in page:
                    break
                scan["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        except ClientError as error:
            raise translate_client_error(error) from error
        return Listing(tuple(slots), pages, scanned)


def _filter(states: Collection[State]) -> ConditionBase:
    lifecycle = Attr("SK").eq(LIFECYCLE_SK) & Attr("PK").begins_with(SLOT_PREFIX)
    if not states:
        return lifecycle
    unreadable = ~Attr("schema").eq(SCHEMA) | ~Attr("state").is_in([s.value for s in State])
    return lifecycle & (Attr("state").is_in([s.value for s in states]) | unreadable)
