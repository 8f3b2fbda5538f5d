"""How a transition is declared and decided: its checks, its decision, and the record after
one write. The transitions themselves are declared by concern beside this module."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from seedkeeper.domain import opwindow
from seedkeeper.domain.opwindow import Actor, Operation, OpKind
from seedkeeper.domain.record import SlotRecord, State, encode
from seedkeeper.domain.refused import Refused


@dataclass(frozen=True)
class Change:
    record: SlotRecord
    entry: Operation | None = None  # the operation this change reserved or settled
    # Checkpoint objects this change makes owed deletions (a resume's superseded one): the
    # store writes each as a ledger debt in the same transaction as the record.
    owes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Acknowledged:
    """Already true: nothing to write, nothing replayed."""

    record: SlotRecord
    entry: Operation | None = None


Decision = Change | Acknowledged | Refused

P = TypeVar("P")


# -- checks: each one both a pure test of the record and a condition on its item ----------


@dataclass(frozen=True)
class InState:
    """The states a transition leaves. Refused as `state-<state>` unless `reason` says."""

    states: frozenset[State]
    reason: str | None = None


ALL_STATES = frozenset(State)


@dataclass(frozen=True)
class Equals(Generic[P]):
    """The record's `attribute` is `value` (None: absent), compared as the item stores it."""

    attribute: str
    value: Callable[[P], object]
    reason: str


@dataclass(frozen=True)
class Below(Generic[P]):
    """The record's `attribute` is a number below `value`."""

    attribute: str
    value: Callable[[P], int]
    reason: str


Check = InState | Equals[Any] | Below[Any]


def stored(value: object) -> object:
    """A value as the record's item holds it (`record.encode`): models as their JSON maps,
    absent facts as None."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    return value


def holds(check: Check, record: SlotRecord, item: Mapping[str, Any], params: Any) -> bool:
    """The check on the record as read: the same test the store's condition makes."""
    if isinstance(check, InState):
        return record.state in check.states
    if isinstance(check, Equals):
        return item.get(check.attribute) == stored(check.value(params))
    found = item.get(check.attribute)
    return isinstance(found, int) and found < check.value(params)


@dataclass(frozen=True)
class Transition(Generic[P]):
    name: str
    checks: tuple[Check, ...]  # in order; exactly one `InState`
    effect: Callable[[SlotRecord, P], Decision]  # may still refuse (a full window, say)
    to: frozenset[State] = frozenset()  # the states it may move to; empty: the state stays
    stays: frozenset[State] = frozenset()  # states it leaves as they are (not drawn as moves)
    already: Callable[[SlotRecord, P], Acknowledged | None] = field(
        default=lambda record, params: None
    )

    def __post_init__(self) -> None:
        if sum(isinstance(check, InState) for check in self.checks) != 1:
            raise ValueError(f"{self.name}: exactly one InState check")

    @property
    def source(self) -> frozenset[State]:
        return next(c.states for c in self.checks if isinstance(c, InState))

    def decide(self, record: SlotRecord, params: P) -> Decision:
        acknowledged = self.already(record, params)
        if acknowledged is not None:
            return acknowledged
        item = encode(record)
        for check in self.checks:
            if not holds(check, record, item, params):
                if isinstance(check, InState):
                    return Refused(check.reason or f"state-{record.state}")
                return Refused(check.reason)
        return self.effect(record, params)


@dataclass(frozen=True)
class At:
    """What a transition told nothing but the time is told besides the record."""

    now: int


# -- effects: the record after one write ----------------------------------------------------


def next_record(record: SlotRecord, now: int, **changes: object) -> SlotRecord:
    """The record after one write: `rev` grows by one, `updated_at` never goes back, and a
    retain's backoff ends unless this write is a retain."""
    updated = {
        "rev": record.rev + 1,
        "updated_at": max(now, record.updated_at),
        "next_look": None,
        "retains": None,
        **changes,
    }
    return SlotRecord.model_validate({**record.model_dump(), **updated})


def move_reserving(
    record: SlotRecord, now: int, state: State, kind: OpKind, actor: Actor
) -> Decision:
    """Into `state`, with `actor`'s `kind` of work reserved in the same write."""
    reserved = opwindow.reserve(record.window, kind, actor, record.attempt)
    if isinstance(reserved, opwindow.WindowFull):
        return Refused("window-full")
    changed = next_record(record, now, state=state, window=reserved.window)
    return Change(changed, reserved.entry)
