"""Reading a slot's record, the lifecycle table's one read.

Apart from the writes (`seedkeeper.store.lifecycle`, which extends `Records`): a function
that only reads (receipts, slot evidence) never imports them, nor the transitions they are
derived from, about 11 ms of its cold start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from seedkeeper.domain.record import Classified, classify, slot_key
from seedkeeper.errors import translate_client_error

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table


class Records:
    def __init__(self, table: Table) -> None:
        self._table = table

    def read(self, slot: str, *, consistent: bool = True) -> Classified:
        """The record as it is now. Strongly consistent unless told: reads that decide must
        not see the past. A watcher that only looks for a change (the slot task's, half the
        cost) reads eventually consistent and re-reads consistently before it acts."""
        try:
            response = self._table.get_item(Key=slot_key(slot), ConsistentRead=consistent)
        except ClientError as error:
            raise translate_client_error(error) from error
        return classify(slot, response.get("Item"))
