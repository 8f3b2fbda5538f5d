"""The resident snapshot records in DynamoDB: one Query reads a resource, one transaction
writes a rotation or a teardown. Every write carries a condition.

A backup id belongs to the resource that first recorded it. The rotation's transaction claims
each id of the new generation (`BACKUP#<id>`/`OWNER`, conditional on being absent or naming
this resource) and mirrors the claim in the resource's partition (`OWNS#<id>`), where the
resource's one Query reads it: paying the ledger deletes only mirrored ids, with no extra
call. A claim is never removed, so an id is never another resource's, even after its object
is gone; the mirror goes with the paid debt, so the partition never grows with history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from boto3.dynamodb.conditions import Attr, ConditionBase
from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from seedkeeper.domain.models import BackupId, Model, SeedIdentity, validate_item
from seedkeeper.domain.snapshots import (
    DepsEntry,
    PendingDeletion,
    Resident,
    Rotation,
    Snapshot,
    Teardown,
)
from seedkeeper.errors import MalformedRecord, translate_client_error
from seedkeeper.store.items import owed_since, partition, transaction_condition

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

SCHEMA = 1
RESIDENT_PREFIX = "RESIDENT#"
CURRENT_SK = "SNAPSHOT#current"
RETIRED_SK = "SNAPSHOT#retired"
DEPS_PREFIX = "DEPS#"
GARBAGE_PREFIX = "GARBAGE#"
OWNS_PREFIX = "OWNS#"
# The ownership claim: keyed by the id alone, so one condition decides it across resources.
# It carries no `sweep`/`sweep_at`: it stays out of the sparse index.
BACKUP_PREFIX = "BACKUP#"
OWNER_SK = "OWNER"
# Index attributes of the current item: what a seed may name (see `_seedable`).
SEEDABLE = "seedable"
SEEDABLE_DEPS = "seedable_deps"
# DynamoDB's limit on the items of one transaction.
TRANSACTION_ITEMS = 100

Purpose = Literal["records", "pending-check", "ownership"]


@dataclass(frozen=True)
class Committed:
    pass


@dataclass(frozen=True)
class Lost:
    """The transaction's conditions failed: `why` is a reason token, `backup_ids` the ids
    whose own conditions failed (another resource's, or still owed for deletion)."""

    why: Literal["conflict", "backup-id-pending-deletion", "backup-id-owned"]
    backup_ids: tuple[str, ...] = ()


class _Owned(Model):
    """The mirror of this resource's claim on an object."""

    backup_id: BackupId


class SnapshotStore:
    def __init__(self, table: Table) -> None:
        self._table = table

    def read(self, resource: str) -> Resident:
        """Every record of `resource`, strongly consistent, in one Query (paged only past
        1 MB, which two generations and their ledger never reach)."""
        items = partition(self._table, _pk(resource), consistent=True)
        return _resident(resource, items)

    def commit_rotation(self, rotation: Rotation) -> Committed | Lost:
        read, pk = rotation.read, _pk(rotation.current.resource)
        current = _put(
            pk, CURRENT_SK, rotation.current, _still(read.current), **_seedable(rotation)
        )
        operations: list[tuple[Purpose, dict[str, Any]]] = [("records", current)]
        if rotation.retired is not None:
            operations.append(
                ("records", _put(pk, RETIRED_SK, rotation.retired, _still(read.retired)))
            )
        if rotation.deps_put is not None:
            newer_than_entry = Attr("SK").not_exists() | Attr("generation").lt(
                rotation.deps_put.generation
            )
            operations.append(
                (
                    "records",
                    _put(pk, _deps_sk(rotation.deps_put), rotation.deps_put, newer_than_entry),
                )
            )
        for entry in rotation.deps_dropped:
            operations.append(("records", _delete(pk, _deps_sk(entry), _still(entry))))
        operations.extend(("records", _owe(pk, debt)) for debt in rotation.garbage)
        for backup_id in sorted(rotation.current.backup_ids):
            # A new snapshot may not name an object the ledger is about to delete,
            not_owed = Attr("SK").not_exists()
            operations.append(("pending-check", _check(pk, GARBAGE_PREFIX + backup_id, not_owed)))
            # nor an object another resource recorded first.
            operations.append(("ownership", _claim(rotation.current.resource, backup_id)))
            operations.append(("records", _owns(pk, backup_id)))
        return self._transact(operations)

    def recorded_check(self, seed: SeedIdentity) -> dict[str, Any]:
        """A transaction item that holds only while a recorded generation names the seed's
        archives at its sha and ref (what `Resident.archives_for` finds): a birth carrying
        it presigns nothing unrecorded, without a read of its own."""
        names = Attr("schema").eq(SCHEMA) & Attr(SEEDABLE).contains(
            _seed_token(seed.checkout_backup_id, seed.sha, seed.ref)
        )
        if seed.deps_backup_id is not None:
            names = names & Attr(SEEDABLE_DEPS).contains(seed.deps_backup_id)
        check = _check(_pk(seed.resource), CURRENT_SK, names)
        return {kind: {"TableName": self._table.name, **body} for kind, body in check.items()}

    def current_check(self, resource: str, generation: int) -> dict[str, Any]:
        """A transaction item that holds only while `generation` is the resource's current
        one: a pre-seeded standby is handed out only while its generation is not superseded."""
        current = Attr("schema").eq(SCHEMA) & Attr("generation").eq(generation)
        check = _check(_pk(resource), CURRENT_SK, current)
        return {kind: {"TableName": self._table.name, **body} for kind, body in check.items()}

    def commit_teardown(self, teardown: Teardown) -> Committed | Lost:
        """Remove every record; every object they named becomes a ledger debt."""
        read = teardown.read
        pk = _pk(read.resource)
        operations: list[tuple[Purpose, dict[str, Any]]] = []
        for sk, generation in ((CURRENT_SK, read.current), (RETIRED_SK, read.retired)):
            if generation is not None:
                operations.append(("records", _delete(pk, sk, _still(generation))))
        operations.extend(("records", _delete(pk, _deps_sk(e), _still(e))) for e in read.deps)
        operations.extend(("records", _owe(pk, debt)) for debt in teardown.garbage)
        return self._transact(operations) if operations else Committed()

    def clear_debts(self, resource: str, backup_ids: list[str]) -> None:
        """Clear the ledger entries of objects now deleted (or never this resource's to
        delete), each with the mirror of its claim, in one transaction. The condition only
        pins the entry to its object, so a concurrent clearer (the sweep) never cancels this."""
        pk = _pk(resource)
        per_transaction = TRANSACTION_ITEMS // 2  # an entry and its mirror go together
        for start in range(0, len(backup_ids), per_transaction):
            clears: list[tuple[Purpose, dict[str, Any]]] = [
                ("records", _delete(pk, prefix + i, _names_object(i)))
                for i in backup_ids[start : start + per_transaction]
                for prefix in (GARBAGE_PREFIX, OWNS_PREFIX)
            ]
            if isinstance(self._transact(clears), Lost):
                return  # left for the next payment: the debts stay recorded, nothing is lost

    def _transact(self, operations: list[tuple[Purpose, dict[str, Any]]]) -> Committed | Lost:
        table_name = self._table.name
        items = [
            {kind: {"TableName": table_name, **body}}
            for _, operation in operations
            for kind, body in operation.items()
        ]
        try:
            self._table.meta.client.transact_write_items(TransactItems=items)  # type: ignore[arg-type]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise translate_client_error(error) from error
            reasons = error.response.get("CancellationReasons", [])
            refused = [
                (purpose, operation)
                for (purpose, operation), reason in zip(operations, reasons, strict=False)
                if reason.get("Code") == "ConditionalCheckFailed"
            ]
            failed = [purpose for purpose, _ in refused]
            if failed and "records" not in failed:
                why: Literal["backup-id-owned", "backup-id-pending-deletion"] = (
                    "backup-id-owned" if "ownership" in failed else "backup-id-pending-deletion"
                )
                kind = "ownership" if why == "backup-id-owned" else "pending-check"
                named = sorted(_object_of(op) for purpose, op in refused if purpose == kind)
                return Lost(why, tuple(named))
            if failed or any(r.get("Code") == "TransactionConflict" for r in reasons):
                return Lost("conflict")
            raise translate_client_error(error) from error
        return Committed()


def _pk(resource: str) -> str:
    return RESIDENT_PREFIX + resource


def _seed_token(checkout_backup_id: str, sha: str, ref: str) -> str:
    """Unambiguous: a backup id cannot contain '@' and a sha is hex."""
    return f"{checkout_backup_id}@{sha}@{ref}"


def _seedable(rotation: Rotation) -> dict[str, set[str]]:
    """The current item indexes what both generations let a seed name, so one condition on
    it answers `Resident.archives_for`. Written in the rotation's own transaction."""
    generations = [g for g in (rotation.current, rotation.retired) if g is not None]
    index = {SEEDABLE: {_seed_token(g.checkout.backup_id, g.sha, g.ref) for g in generations}}
    deps = {g.deps.backup_id for g in generations if g.deps is not None}
    if deps:  # DynamoDB has no empty sets
        index[SEEDABLE_DEPS] = deps
    return index


def _deps_sk(entry: DepsEntry) -> str:
    return DEPS_PREFIX + entry.lockfile_hash


def _still(recorded: Snapshot | DepsEntry | None) -> ConditionBase:
    """The record is still the one read: a concurrent rotation or teardown loses."""
    if recorded is None:
        return Attr("SK").not_exists()
    return Attr("generation").eq(recorded.generation)


def _names_object(backup_id: str) -> ConditionBase:
    return Attr("SK").not_exists() | Attr("backup_id").eq(backup_id)


def _put(
    pk: str, sk: str, body: BaseModel, condition: ConditionBase, **index: object
) -> dict[str, Any]:
    fields = body.model_dump(mode="json", exclude_none=True)
    item = {"PK": pk, "SK": sk, "schema": SCHEMA, **fields, **index}
    return {"Put": {"Item": item, **transaction_condition(condition)}}


def _owe(pk: str, debt: PendingDeletion) -> dict[str, Any]:
    sk = GARBAGE_PREFIX + debt.backup_id
    first = Attr("SK").not_exists()
    return _put(pk, sk, debt, first, **owed_since(debt.since))


def _object_of(operation: dict[str, Any]) -> str:
    """The backup id an ownership claim or a pending-deletion check is about."""
    if "Put" in operation:
        return str(operation["Put"]["Item"]["PK"]).removeprefix(BACKUP_PREFIX)
    return str(operation["ConditionCheck"]["Key"]["SK"]).removeprefix(GARBAGE_PREFIX)


def _claim(resource: str, backup_id: str) -> dict[str, Any]:
    """The id is this resource's: first recorded by it now, or already its own."""
    first_or_ours = Attr("PK").not_exists() | Attr("resource").eq(resource)
    item = {"PK": BACKUP_PREFIX + backup_id, "SK": OWNER_SK, "schema": SCHEMA, "resource": resource}
    return {"Put": {"Item": item, **transaction_condition(first_or_ours)}}


def _owns(pk: str, backup_id: str) -> dict[str, Any]:
    return _put(pk, OWNS_PREFIX + backup_id, _Owned(backup_id=backup_id), _names_object(backup_id))


def _delete(pk: str, sk: str, condition: ConditionBase) -> dict[str, Any]:
    return {"Delete": {"Key": {"PK": pk, "SK": sk}, **transaction_condition(condition)}}


def _check(pk: str, sk: str, condition: ConditionBase) -> dict[str, Any]:
    return {"ConditionCheck": {"Key": {"PK": pk, "SK": sk}, **transaction_condition(condition)}}


# Keys and index attributes, not facts of the record.
_KEYS = frozenset({"PK", "SK", "schema", "sweep", "sweep_at", SEEDABLE, SEEDABLE_DEPS})


def _resident(resource: str, items: list[dict[str, Any]]) -> Resident:
    current = retired = None
    deps: list[DepsEntry] = []
    pending: list[PendingDeletion] = []
    owned: set[str] = set()
    for item in items:
        fields = {k: v for k, v in item.items() if k not in _KEYS}
        sk = item["SK"]
        try:
            if item.get("schema") != SCHEMA:
                raise MalformedRecord(f"{resource} {sk}: schema {item.get('schema')!r}")
            if sk == CURRENT_SK:
                current = validate_item(Snapshot, fields)
            elif sk == RETIRED_SK:
                retired = validate_item(Snapshot, fields)
            elif sk.startswith(DEPS_PREFIX):
                deps.append(validate_item(DepsEntry, fields))
            elif sk.startswith(GARBAGE_PREFIX):
                pending.append(validate_item(PendingDeletion, fields))
            elif sk.startswith(OWNS_PREFIX):
                owned.add(validate_item(_Owned, fields).backup_id)
            else:
                raise MalformedRecord(f"{resource}: unknown record {sk}")
        except ValidationError as invalid:
            raise MalformedRecord(f"{resource} {sk}: {invalid.errors()[0]['msg']}") from invalid
    return Resident(resource, current, retired, tuple(deps), tuple(pending), frozenset(owned))
