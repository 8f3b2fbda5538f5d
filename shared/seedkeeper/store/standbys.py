"""Standby items (`seedkeeper.domain.standby`) in the lifecycle table: one partition per pool,
`STANDBY#<pool>`, one item per standby. Every write is conditional on the state it moves
from and on the standby's own task, so a standby is taken once, and only while free."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.conditions import Attr, ConditionBase
from botocore.exceptions import ClientError
from pydantic import ValidationError

from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.standby import LIVE, STANDBY_PREFIX, Generation, Standby, StandbyState
from seedkeeper.errors import translate_client_error
from seedkeeper.observability import logger
from seedkeeper.store.items import partition, transaction_condition

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

SCHEMA = 1
# How long an assigned or retired standby's item is kept (TTL): for the record of who
# served whom, a slot's task's life at most.
KEPT_AFTER = 7 * 86_400


def standby_key(pool: str, standby: str) -> dict[str, str]:
    return {"PK": STANDBY_PREFIX + pool, "SK": standby}


class StandbyStore:
    def __init__(self, table: Table) -> None:
        self._table = table

    def pool(self, pool: str, *, consistent: bool = True) -> list[Standby]:
        """Every standby of `pool` (a seed's look, eventually consistent, may be a moment
        behind: its take is conditional). An item this code cannot read is left out."""
        items = partition(self._table, STANDBY_PREFIX + pool, consistent=consistent)
        return [standby for item in items if (standby := _standby(item)) is not None]

    def read(self, pool: str, standby: str) -> Standby | None:
        try:
            item = self._table.get_item(Key=standby_key(pool, standby), ConsistentRead=True)
        except ClientError as error:
            raise translate_client_error(error) from error
        return _standby(item["Item"]) if "Item" in item else None

    def register(self, standby: Standby) -> bool:
        """A new standby, before its task is launched (False: the id is taken)."""
        try:
            item: dict[str, Any] = {**standby_key(standby.pool, standby.standby), "schema": SCHEMA}
            self._table.put_item(
                Item=item | standby.to_item(),
                ConditionExpression=Attr("PK").not_exists(),
            )
        except ClientError as error:
            return _failed(error)
        return True

    def launched(self, standby: Standby, incarnation: str) -> bool:
        """The task RunTask answered for a starting standby, recorded once."""
        return self._update(
            standby,
            {"incarnation": incarnation},
            _is(standby, {StandbyState.STARTING}) & _absent("incarnation"),
        )

    def move(
        self,
        standby: Standby,
        to: StandbyState,
        *,
        from_states: Collection[StandbyState],
        now: int,
    ) -> bool:
        """Its task's own moves (reported in, prepared, leaving) and the sweep's retirement:
        only from `from_states`, only while it is the same task."""
        values: dict[str, Any] = {"state": to.value}
        if to is StandbyState.RETIRED:
            values["expires_at"] = now + KEPT_AFTER
        condition = _is(standby, from_states) & Attr("incarnation").eq(standby.incarnation)
        if standby.incarnation is None:
            condition = _is(standby, from_states) & _absent("incarnation")
        return self._update(standby, values, condition)

    def retire_superseded(self, resource: str, current: Generation | None, now: int) -> int:
        """Retire the live standbys of `resource`'s pool that hold another generation than
        `current` (a rotation's, or a teardown's: none): none of them is handed out again,
        and the sweep stops them. How many it retired."""
        return sum(
            self.move(standby, StandbyState.RETIRED, from_states=LIVE, now=now)
            for standby in self.pool(resource)
            if standby.state in LIVE and standby.preseed != current
        )

    def take(self, standby: Standby, plan: SlotPlan, now: int) -> dict[str, Any]:
        """The transaction item that assigns a free standby to `plan`'s attempt: it fails
        unless the standby is still free, with the same task, launched when it was read (so
        not one since given up and replaced under the same id)."""
        condition = (
            _is(standby, {StandbyState.FREE})
            & Attr("incarnation").eq(standby.incarnation)
            & Attr("launched_at").eq(standby.launched_at)
        )
        expression = transaction_condition(condition)
        return {
            "Update": {
                "TableName": self._table.name,
                "Key": standby_key(standby.pool, standby.standby),
                "UpdateExpression": "SET #state = :assigned, #plan = :plan, #expires = :expires",
                "ConditionExpression": expression["ConditionExpression"],
                "ExpressionAttributeNames": expression["ExpressionAttributeNames"]
                | {"#state": "state", "#plan": "plan", "#expires": "expires_at"},
                "ExpressionAttributeValues": expression.get("ExpressionAttributeValues", {})
                | {
                    ":assigned": StandbyState.ASSIGNED.value,
                    ":plan": plan.to_env(),
                    ":expires": now + KEPT_AFTER,
                },
            }
        }

    def forget(self, standby: Standby) -> bool:
        """A retired standby's item, once its task is stopped (or one never launched)."""
        try:
            self._table.delete_item(
                Key=standby_key(standby.pool, standby.standby),
                ConditionExpression=_is(standby, {StandbyState.RETIRED, StandbyState.STARTING}),
            )
        except ClientError as error:
            return _failed(error)
        return True

    def _update(self, standby: Standby, values: dict[str, Any], condition: ConditionBase) -> bool:
        # Placeholders of their own: boto3 names the condition's `#n0`, `:v0`...
        names = {f"#s{index}": name for index, name in enumerate(values)}
        try:
            self._table.update_item(
                Key=standby_key(standby.pool, standby.standby),
                UpdateExpression="SET "
                + ", ".join(f"#s{index} = :s{index}" for index in range(len(values))),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={
                    f":s{index}": value for index, value in enumerate(values.values())
                },
                ConditionExpression=condition,
            )
        except ClientError as error:
            return _failed(error)
        return True


def _is(standby: Standby, states: Collection[StandbyState]) -> ConditionBase:
    """The standby's item, of this schema, in one of `states`."""
    return (
        Attr("schema").eq(SCHEMA)
        & Attr("standby").eq(standby.standby)
        & Attr("state").is_in(sorted(state.value for state in states))
    )


def _absent(name: str) -> ConditionBase:
    return Attr(name).not_exists()


def _failed(error: ClientError) -> bool:
    """False for a failed condition (someone moved first); raised otherwise."""
    if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
        raise translate_client_error(error) from error
    return False


def _standby(item: dict[str, Any]) -> Standby | None:
    """The standby an item holds; None (and said) for one this code cannot read, or one
    whose key is not its own."""
    why = "schema"
    if item.get("schema") == SCHEMA:
        try:
            standby = Standby.from_item(item)
        except ValidationError as invalid:
            why = ".".join(map(str, invalid.errors()[0]["loc"]))
        except ValueError:
            why = "value"
        else:
            key = {"PK": item.get("PK"), "SK": item.get("SK")}
            if standby_key(standby.pool, standby.standby) == key:
                return standby
            why = "key"
    logger.warning("standby item unreadable", key=str(item.get("SK"))[:64], why=why)
    return None
