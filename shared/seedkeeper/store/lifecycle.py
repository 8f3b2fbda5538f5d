"""The only code that writes slot lifecycle records.

Each transition of the table (`seedkeeper.domain.transitions`) is one conditional write,
derived from its declaration: the condition pins the record as read (`rev`, schema) and
makes the transition's own checks over the same attributes, so the write happens only if
the decision made on the read still holds; the update SETs what the effect changed and
REMOVEs what it dropped. A failed condition is an answer, not an error: it comes back as
`Conflict` with the current record (ReturnValuesOnConditionCheckFailure = ALL_OLD), and the
caller re-decides on it. Nothing here retries blindly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, get_args

from boto3.dynamodb.conditions import Attr, ConditionBase, Key
from boto3.dynamodb.types import TypeDeserializer
from botocore.exceptions import ClientError

from seedkeeper.domain.models import Binding, OwnerClaim
from seedkeeper.domain.opwindow import WINDOW_SIZE, Operation
from seedkeeper.domain.record import (
    LIVE_PREFIX,
    LIVE_STATES,
    SCHEMA,
    SUCCEEDED_STATES,
    SWEEP_SHARDS,
    Classified,
    FailureReason,
    SlotRecord,
    State,
    Supported,
    classify,
    encode,
    slot_key,
    sweep_shard,
)
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions import (
    ALL_STATES,
    KEEPALIVE,
    TOUCH,
    Acknowledged,
    Below,
    Change,
    Check,
    Equals,
    InState,
    KeepAlive,
    Poll,
    Transition,
    born,
    stored,
)
from seedkeeper.errors import translate_client_error
from seedkeeper.store.items import owed_since, transaction_condition
from seedkeeper.store.records import Records

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

_deserialize = TypeDeserializer().deserialize
P = TypeVar("P")
# A slot's owed checkpoint deletions sit beside its record, in the sweep's debt partition.
DEBT_PREFIX = "DEBT#"


def debt_key(slot: str, key: str) -> dict[str, str]:
    return {"PK": slot_key(slot)["PK"], "SK": DEBT_PREFIX + key}


@dataclass(frozen=True)
class Written:
    record: SlotRecord
    entry: Operation | None = None  # the operation the write reserved or settled


@dataclass(frozen=True)
class Conflict:
    """Someone else moved first: the condition failed against `current`."""

    current: Classified


@dataclass(frozen=True)
class Unmet:
    """A birth's precondition on another item failed: nothing was written."""


Outcome = Written | Conflict | Acknowledged | Refused


class Lifecycle(Records):
    """The record's reads (`Records`) and its writes."""

    def __init__(self, table: Table, *, shards: int = SWEEP_SHARDS) -> None:
        super().__init__(table)
        self._shards = shards  # how many shards of the sweep's index a live record spreads over

    def birth(
        self,
        slot: str,
        binding: Binding,
        *,
        now: int,
        idle_deadline: int,
        requires: Mapping[str, Any] | None = None,
    ) -> Written | Conflict | Unmet:
        """Write the slot's first record, in one transaction with `requires` (a condition
        on another item, such as the seed's snapshot being recorded) when given."""
        change = born(slot, binding, now=now, idle_deadline=idle_deadline)
        first_writer = Attr("PK").not_exists()  # a slot is born once
        put = {
            "TableName": self._table.name,
            "Item": encode(change.record, shards=self._shards),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            **transaction_condition(first_writer),
        }
        items = [{"Put": put}, *([requires] if requires is not None else [])]
        try:
            self._table.meta.client.transact_write_items(TransactItems=items)  # type: ignore[arg-type]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise translate_client_error(error) from error
            born_item, required = [*error.response.get("CancellationReasons", []), {}, {}][:2]
            if born_item.get("Code") == "ConditionalCheckFailed":
                return Conflict(classify(slot, _item(born_item.get("Item"))))
            if required.get("Code") == "ConditionalCheckFailed":
                return Unmet()
            if born_item.get("Code") == "TransactionConflict":
                return Conflict(self.read(slot))  # another birth is being written: re-decide
            raise translate_client_error(error) from error
        return Written(change.record, change.entry)

    def touch(self, slot: str, poll: Poll) -> Written | Conflict:
        """`TOUCH` without a read: extend the idle deadline for the slot's own binding in
        one UpdateItem, so a poll costs one call. The new record is returned.

        No `rev` is read first, so the condition itself must keep the touch off any record
        it may not write (unsupported, malformed, finished, another's): it makes TOUCH's
        checks (the binding, the live states) and checks every attribute the record codec
        knows, as far as a condition can see it (`_touchable`). What a condition cannot
        see, and why touching it anyway is safe:

        - An attribute the codec does not know (a newer deployment's, or planted): a
          condition names the attributes it tests and cannot ask "nothing else". The touch
          writes, the record read back is `Malformed`, the caller answers 409.
        - String patterns (ids, refs, sha, incarnation, reason tokens, the claim's text),
          whether a number is integral, and the members of maps with open keys
          (`result.steps`): only types, sizes and bounds are visible.
        - The operation window's entries (their members, ordinals below `next_ordinal`,
          `open_ops` counting the unsettled ones): a condition addresses list elements by
          fixed index only, and there are up to sixteen of them.
        - An unknown member inside `result`, `checkpoint` or the claim, for the same reason
          as an unknown attribute.

        In each case the touch changes only `idle_deadline`, `updated_at`, `rev` and the
        index keys (the slot's shard under the current count, `sweep_at` back to the new
        deadline, a retain's backoff cleared: the owner is back, so the sweep looks when
        the slot next idles): a later deadline only retains the slot longer (the sweep never
        stops a record it cannot read as supported), and no reader decides anything on
        `updated_at`, on the index keys or on the `rev` of a record it cannot decode. A
        record malformed only in a value the touch owns (`idle_deadline` or `updated_at` a
        fraction, `sweep_at` or the shard not as derived) becomes readable. The identity
        (owner, seed, origin) and the state are pinned exactly, so a touch never writes
        another caller's record, malformed or not.
        """
        condition = _checks(TOUCH, poll) & _touchable(seeded=poll.binding.seed is not None)
        return self._touch(slot, condition, now=poll.now, idle_deadline=poll.idle_deadline)

    def keepalive(self, slot: str, keep: KeepAlive, *, seeded: bool) -> Written | Conflict:
        """`KEEPALIVE` without a read, as `touch` (the owner's claim is the identity). The
        caller says whether the slot is a seeded one (a claim almost always means it is):
        one condition covering both kinds would pass DynamoDB's limits on an expression,
        and a wrong guess is a Conflict showing the record, so the caller tries once more.
        The seed and origin the touch pins by equality are checked here for their shape."""
        if seeded:
            named: ConditionBase = Attr("seed").attribute_type("M")
        else:
            named = _absent("seed")
        origin = _optional("origin", _text("origin", 1, _MAX_ORIGIN))
        condition = _checks(KEEPALIVE, keep) & _touchable(seeded=seeded) & named & origin
        return self._touch(slot, condition, now=keep.now, idle_deadline=keep.idle_deadline)

    def _touch(
        self, slot: str, condition: ConditionBase, *, now: int, idle_deadline: int
    ) -> Written | Conflict:
        try:
            response = self._table.update_item(
                Key=slot_key(slot),
                UpdateExpression=(
                    "SET #deadline = :deadline, #sweep_at = :deadline, #sweep = :shard,"
                    " #updated = :now REMOVE #next_look, #retains ADD #rev :one"
                ),
                ExpressionAttributeNames={
                    "#deadline": "idle_deadline",
                    "#sweep_at": "sweep_at",
                    "#sweep": "sweep",
                    "#updated": "updated_at",
                    "#next_look": "next_look",
                    "#retains": "retains",
                    "#rev": "rev",
                },
                ExpressionAttributeValues={
                    ":deadline": idle_deadline,
                    ":shard": sweep_shard(slot, self._shards),
                    ":now": now,
                    ":one": 1,
                },
                ConditionExpression=condition,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            return self._conflict(slot, error)
        touched = classify(slot, response["Attributes"])
        if not isinstance(touched, Supported):
            return Conflict(touched)
        return Written(touched.record)

    def write(self, transition: Transition[P], record: SlotRecord, params: P) -> Outcome:
        """Decide `transition` on `record` as read and write a `Change` as one UpdateItem,
        conditional on the record being as read and on the transition's own checks."""
        written = self._write(transition, record, params, alongside=())
        assert not isinstance(written, Unmet)  # nothing alongside: nothing else to meet
        return written

    def write_with(
        self,
        transition: Transition[P],
        record: SlotRecord,
        params: P,
        alongside: Sequence[Mapping[str, Any]],
    ) -> Outcome | Unmet:
        """`write`, in one transaction with `alongside` (writes or checks of other items,
        each with its own condition): `Unmet` when one of those failed, nothing written."""
        return self._write(transition, record, params, alongside=alongside)

    def _write(
        self,
        transition: Transition[P],
        record: SlotRecord,
        params: P,
        *,
        alongside: Sequence[Mapping[str, Any]],
    ) -> Outcome | Unmet:
        decision = transition.decide(record, params)
        if not isinstance(decision, Change):
            return decision
        unchanged_since_read = Attr("rev").eq(record.rev) & Attr("schema").eq(SCHEMA)
        condition = unchanged_since_read & _checks(transition, params)
        if decision.owes or alongside:
            return self._transact(record, decision, condition, alongside)
        expression, names, values = self._update(record, decision.record)
        try:
            self._table.update_item(
                Key=slot_key(record.slot),
                UpdateExpression=expression,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ConditionExpression=condition,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            return self._conflict(record.slot, error)
        return Written(decision.record, decision.entry)

    def _update(
        self, before: SlotRecord, after: SlotRecord
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        shards = self._shards
        return _update_expression(encode(before, shards=shards), encode(after, shards=shards))

    def _transact(
        self,
        record: SlotRecord,
        decision: Change,
        condition: ConditionBase,
        alongside: Sequence[Mapping[str, Any]],
    ) -> Written | Conflict | Unmet:
        """The record's update, a ledger debt for each object it owes (an object stops
        being named only where its deletion is owed), and `alongside`, in one transaction."""
        slot = record.slot
        expression, names, values = self._update(record, decision.record)
        built = transaction_condition(condition)
        update = {
            "TableName": self._table.name,
            "Key": slot_key(slot),
            "UpdateExpression": expression,
            "ConditionExpression": built["ConditionExpression"],
            "ExpressionAttributeNames": names | built["ExpressionAttributeNames"],
            "ExpressionAttributeValues": values | built.get("ExpressionAttributeValues", {}),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        now = decision.record.updated_at
        debts = [
            {
                "Put": {
                    "TableName": self._table.name,
                    "Item": {
                        **debt_key(slot, key),
                        "schema": SCHEMA,
                        "key": key,
                        **owed_since(now),
                    },
                    # Owed once: a new debt, or this very one again.
                    **transaction_condition(Attr("PK").not_exists() | Attr("key").eq(key)),
                }
            }
            for key in decision.owes
        ]
        try:
            self._table.meta.client.transact_write_items(
                TransactItems=[{"Update": update}, *debts, *alongside]  # type: ignore[list-item,typeddict-item]
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise translate_client_error(error) from error
            reasons = [*error.response.get("CancellationReasons", []), {}]
            if reasons[0].get("Code") == "ConditionalCheckFailed":
                return Conflict(classify(slot, _item(reasons[0].get("Item"))))
            others = reasons[1 + len(debts) : 1 + len(debts) + len(alongside)]
            if any(reason.get("Code") == "ConditionalCheckFailed" for reason in others):
                return Unmet()
            return Conflict(self.read(slot))  # a concurrent write: re-decide on what is there
        return Written(decision.record, decision.entry)

    def debts(self, slot: str) -> list[str]:
        """The checkpoint objects `slot` owes deletions of (the sweep pays them)."""
        try:
            page = self._table.query(
                KeyConditionExpression=Key("PK").eq(slot_key(slot)["PK"])
                & Key("SK").begins_with(DEBT_PREFIX),
                ConsistentRead=True,
            )
        except ClientError as error:
            raise translate_client_error(error) from error
        return sorted(str(item["key"]) for item in page["Items"] if "key" in item)

    def clear_debt(self, slot: str, key: str) -> None:
        """Forget a debt once its object is deleted (R2 answers a missing object alike)."""
        try:
            self._table.delete_item(
                Key=debt_key(slot, key), ConditionExpression=Attr("key").eq(key)
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise translate_client_error(error) from error

    def apply(
        self,
        slot: str,
        transition: Transition[P],
        params: P,
        *,
        as_read: SlotRecord | None = None,
        rounds: int = 4,
        guard: Callable[[SlotRecord], Refused | None] | None = None,
    ) -> Outcome:
        """Decide and write `transition` on the record (`as_read` when the caller already
        holds it, else read now), re-deciding on the newer record when someone moved first
        (a poll's touch, say). A `Conflict` comes back only when the record is not one this
        code may write, or it kept moving for `rounds` writes. `guard` refuses a record
        before anything is decided on it, each time one is read: the write is conditional
        on the record as read, so what it checked still holds when the write lands."""
        current: Classified = Supported(as_read) if as_read is not None else self.read(slot)
        for _ in range(rounds):
            if not isinstance(current, Supported):
                break
            refused = guard(current.record) if guard is not None else None
            if refused is not None:
                return refused
            outcome = self.write(transition, current.record, params)
            if not isinstance(outcome, Conflict):
                return outcome
            current = outcome.current
        return Conflict(current)

    @staticmethod
    def _conflict(slot: str, error: ClientError) -> Conflict:
        if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise translate_client_error(error) from error
        return Conflict(classify(slot, _item(error.response.get("Item"))))


def _checks(transition: Transition[P], params: P) -> ConditionBase:
    """A transition's checks as one condition: the same tests `Transition.decide` makes."""
    conditions = [_condition(check, params) for check in transition.checks]
    combined = conditions[0]
    for condition in conditions[1:]:
        combined = combined & condition
    return combined


def _condition(check: Check, params: Any) -> ConditionBase:
    if isinstance(check, InState):
        if check.states == ALL_STATES:
            return Attr("state").exists()
        return Attr("state").is_in(sorted(state.value for state in check.states))
    if isinstance(check, Equals):
        value = stored(check.value(params))
        return _absent(check.attribute) if value is None else Attr(check.attribute).eq(value)
    assert isinstance(check, Below)
    return Attr(check.attribute).lt(check.value(params))


def _item(returned: object) -> dict[str, Any] | None:
    """An item DynamoDB handed back with a failed condition (in its wire format)."""
    if not isinstance(returned, Mapping) or not returned:
        return None
    return {name: _deserialize(value) for name, value in returned.items()}


def _update_expression(
    before: dict[str, Any], after: dict[str, Any]
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """SET every attribute that changed, REMOVE every one that is gone; every name and
    value through a placeholder."""
    changed = [name for name in after if before.get(name) != after[name]]
    removed = [name for name in before if name not in after]
    names = {f"#a{index}": name for index, name in enumerate(changed + removed)}
    values = {f":a{index}": after[name] for index, name in enumerate(changed)}
    clauses = ["SET " + ", ".join(f"#a{index} = :a{index}" for index in range(len(changed)))]
    if removed:
        first = len(changed)
        clauses.append(
            "REMOVE " + ", ".join(f"#a{index}" for index in range(first, first + len(removed)))
        )
    return " ".join(clauses), names, values


# What the codec requires of a live record (record.py), as a condition can see it. Sizes
# are the models' own bounds; a comparison with a number is false for any other type.
_MAX_INCARNATION = 512
_MAX_BACKUP_ID = 128
_MAX_BRANCH = 255
_MAX_ORIGIN = 2048
_PENDING_STATES = (State.UNSEEDED, State.SEEDING)  # no verdict yet: no result
_SUCCEEDED_LIVE = sorted(state.value for state in SUCCEEDED_STATES & LIVE_STATES)


def _touchable(*, seeded: bool) -> ConditionBase:
    """A live record of this schema the codec would read, as far as a condition sees it.
    A cold poll (`seeded` false) may only touch an unseeded record: every other live state
    names a seed."""
    states = [s for s in State if s in LIVE_STATES and (s is not State.UNSEEDED) == seeded]
    pending = [s.value for s in _PENDING_STATES if s in states]
    verdict: ConditionBase = Attr("state").is_in(pending) & _absent("result")
    if seeded:
        verdict = (
            verdict
            | (Attr("state").is_in(_SUCCEEDED_LIVE) & _succeeded())
            | (Attr("state").eq(State.SEED_FAILED.value) & _failed())
        )
    return (
        Attr("schema").eq(SCHEMA)  # never write a newer deployment's record
        & Attr("state").is_in([s.value for s in states])
        & verdict
        & Attr("sweep").begins_with(LIVE_PREFIX)  # on the sweep's index, on any shard
        & _number("sweep_at", 0)
        & _absent("expires_at")  # only a retired record expires
        & _number("rev", 1)
        & _number("attempt", 1)
        & _number("idle_deadline", 0)
        & _number("created_at", 0)
        & _number("updated_at", 0)
        & _number("next_ordinal", 1)
        & _number("open_ops", 0, WINDOW_SIZE)
        & (
            Attr("ops").not_exists()
            | (Attr("ops").attribute_type("L") & Attr("ops").size().lte(WINDOW_SIZE))
        )
        & _optional("incarnation", _text("incarnation", 1, _MAX_INCARNATION))
        & _optional("retained_reason", _text("retained_reason", 1, 64))
        & (  # a retain's backoff: both facts or neither
            (_absent("next_look") & _absent("retains"))
            | (_number("next_look", 0) & _number("retains", 1, 1000))
        )
        & _optional("frozen_at", _number("frozen_at", 0))
        & _optional("checkpoint_failures", _number("checkpoint_failures", 1, 1000))
        & _optional("checkpoint", _checkpoint())
        & _absent("loss")  # only a lost record says what was lost, and it is not live
    )


def _succeeded() -> ConditionBase:
    return (
        Attr("result").attribute_type("M")
        & Attr("result.outcome").eq("seeded")
        & _text("result.ref", 1, _MAX_BRANCH)
        & _sha("result.head")
        & _text("result.from_backup", 1, _MAX_BACKUP_ID)
        & Attr("result.steps").attribute_type("M")
        & _number("result.ms", 0)
        & _optional("result.resumed", Attr("result.resumed").attribute_type("BOOL"))
    )


def _failed() -> ConditionBase:
    return (
        Attr("result").attribute_type("M")
        & Attr("result.outcome").eq("failed")
        & Attr("result.reason").is_in(list(get_args(FailureReason)))
        & _text("result.step", 1, 32)
        & _text("result.detail", 0, 512)
    )


def _checkpoint() -> ConditionBase:
    owner = "checkpoint.owner"
    claim: ConditionBase = Attr(owner).attribute_type("M")
    for member in OwnerClaim.model_fields:
        claim = claim & Attr(f"{owner}.{member}").attribute_type("S")
    return (
        Attr("checkpoint").attribute_type("M")
        & _text("checkpoint.key", len("checkpoints/") + 1, len("checkpoints/") + 256)
        & _number("checkpoint.size", 0)
        & _text("checkpoint.etag", 1, 128)
        & _text("checkpoint.sha256", 64, 64)
        & _number("checkpoint.created_at", 0)
        & _number("checkpoint.expires_at", 0)
        & _optional(owner, claim)  # absent (or null) for an unclaimed slot
        & _text("checkpoint.incarnation", 1, _MAX_INCARNATION)
    )


def _absent(path: str) -> ConditionBase:
    """No such fact: the codec reads a missing attribute and a NULL one alike."""
    return Attr(path).not_exists() | Attr(path).attribute_type("NULL")


def _optional(path: str, present: ConditionBase) -> ConditionBase:
    return _absent(path) | present


def _number(path: str, least: int, most: int | None = None) -> ConditionBase:
    bounded = Attr(path).gte(least) if most is None else Attr(path).between(least, most)
    return Attr(path).attribute_type("N") & bounded


def _text(path: str, least: int, most: int) -> ConditionBase:
    return Attr(path).attribute_type("S") & Attr(path).size().between(least, most)


def _sha(path: str) -> ConditionBase:
    size = Attr(path).size()  # sha-1 or sha-256
    return Attr(path).attribute_type("S") & (size.eq(40) | size.eq(64))
