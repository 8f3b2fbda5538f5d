"""The operation window: a fixed ledger of the effects a slot has started that outlive the
request that started them (a launch, a restore, a checkpoint upload, a stop).

Pure: no I/O. The lifecycle module stores the window in the slot record and writes it back
with one conditional UpdateItem; every rule about what may be reserved or settled is here.

- `reserve` refuses once WINDOW_SIZE entries are unsettled, before any effect is started.
- `settle` matches ordinal, actor and generation; a duplicate settle is acknowledged and
  never replayed, so the first outcome stands; settles may arrive in any order.
- Settled entries are evicted oldest first, only when room is needed. Every ordinal below
  `next_ordinal` that is no longer in the window was therefore settled before eviction: a
  late settle for it is acknowledged from that low-water fact, without a write.
- `advance_generation` turns the open or detached work of earlier generations into `unknown`
  obligations: nobody is left to settle them, so they are kept and block retirement.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from seedkeeper.domain.models import Model

WINDOW_SIZE = 16


class OpKind(StrEnum):
    LAUNCH = "launch"
    RESTORE = "restore"
    CHECKPOINT = "checkpoint"
    STOP = "stop"


class Actor(StrEnum):
    """Who must settle an entry."""

    SEED_FN = "seed-fn"
    SLOT_TASK = "slot-task"
    SWEEP = "sweep"


class OpStatus(StrEnum):
    OPEN = "open"  # owned by the request that reserved it
    DETACHED = "detached"  # continues in the background, detached from that request
    SETTLED = "settled"
    UNKNOWN = "unknown"  # of an earlier generation, never settled: whether it happened is unknown


OpOutcome = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,63}$")]


class OpRef(Model):
    """What the actor that does the work carries to settle it."""

    ordinal: Annotated[int, Field(ge=1)]
    actor: Actor
    generation: Annotated[int, Field(ge=1)]


class Operation(OpRef):
    kind: OpKind
    status: OpStatus
    outcome: OpOutcome | None = None

    @property
    def ref(self) -> OpRef:
        return OpRef(ordinal=self.ordinal, actor=self.actor, generation=self.generation)

    @property
    def settled(self) -> bool:
        return self.status is OpStatus.SETTLED


class Window(Model):
    entries: Annotated[tuple[Operation, ...], Field(max_length=WINDOW_SIZE)] = ()
    next_ordinal: Annotated[int, Field(ge=1)] = 1

    @property
    def unsettled(self) -> int:
        return sum(not entry.settled for entry in self.entries)

    def entry(self, ordinal: int) -> Operation | None:
        return next((entry for entry in self.entries if entry.ordinal == ordinal), None)


@dataclass(frozen=True)
class Reserved:
    window: Window
    entry: Operation


@dataclass(frozen=True)
class WindowFull:
    """Every entry is unsettled: nothing may be started until one settles."""


@dataclass(frozen=True)
class Changed:
    window: Window
    entry: Operation


@dataclass(frozen=True)
class AlreadySettled:
    """A duplicate or late settle: acknowledged, nothing replayed. `entry` is None when the
    entry was settled and then evicted."""

    entry: Operation | None


@dataclass(frozen=True)
class Mismatch:
    """No entry matches this ordinal, actor and generation in a state this call may change."""

    reason: str


def reserve(window: Window, kind: OpKind, actor: Actor, generation: int) -> Reserved | WindowFull:
    entries = list(window.entries)
    if len(entries) == WINDOW_SIZE:
        oldest_settled = next((entry for entry in entries if entry.settled), None)
        if oldest_settled is None:
            return WindowFull()
        entries.remove(oldest_settled)
    entry = Operation(
        ordinal=window.next_ordinal,
        actor=actor,
        generation=generation,
        kind=kind,
        status=OpStatus.OPEN,
    )
    entries.append(entry)
    grown = Window(entries=tuple(entries), next_ordinal=window.next_ordinal + 1)
    return Reserved(window=grown, entry=entry)


def settle(window: Window, ref: OpRef, outcome: str) -> Changed | AlreadySettled | Mismatch:
    """Settle the entry `ref` names. An `unknown` entry may still be settled by its own
    actor and generation: a late answer turns an unknown obligation into a known one."""
    found = _find(window, ref)
    if not isinstance(found, Operation):
        return found
    if found.settled:
        return AlreadySettled(entry=found)
    return _replace(
        window, found.model_copy(update={"status": OpStatus.SETTLED, "outcome": outcome})
    )


def detach(window: Window, ref: OpRef) -> Changed | AlreadySettled | Mismatch:
    """Mark open work as continuing in the background. Idempotent; work that already
    settled (a fast task) stays settled."""
    found = _find(window, ref)
    if not isinstance(found, Operation):
        return found
    if found.settled:
        return AlreadySettled(entry=found)
    if found.status is not OpStatus.OPEN:
        return Changed(window=window, entry=found)
    return _replace(window, found.model_copy(update={"status": OpStatus.DETACHED}))


def advance_generation(window: Window, generation: int) -> Window:
    """Entries of generations before `generation` that never settled become unknown."""
    lost = {OpStatus.OPEN, OpStatus.DETACHED}
    return window.model_copy(
        update={
            "entries": tuple(
                entry.model_copy(update={"status": OpStatus.UNKNOWN})
                if entry.generation < generation and entry.status in lost
                else entry
                for entry in window.entries
            )
        }
    )


def _find(window: Window, ref: OpRef) -> Operation | AlreadySettled | Mismatch:
    if ref.ordinal >= window.next_ordinal:
        return Mismatch("ordinal-never-reserved")
    entry = window.entry(ref.ordinal)
    if entry is None:
        # Only settled entries are ever evicted.
        return AlreadySettled(entry=None)
    if entry.actor is not ref.actor or entry.generation != ref.generation:
        return Mismatch("actor-or-generation-mismatch")
    return entry


def _replace(window: Window, updated: Operation) -> Changed:
    entries = tuple(
        updated if entry.ordinal == updated.ordinal else entry for entry in window.entries
    )
    return Changed(window=window.model_copy(update={"entries": entries}), entry=updated)
