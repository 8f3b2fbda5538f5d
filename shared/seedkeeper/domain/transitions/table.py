"""The table of every transition, and the state diagram drawn from it in the table's order."""

from __future__ import annotations

from typing import Any

from seedkeeper.domain.record import ENDED_STATES, State
from seedkeeper.domain.transitions.bookkeeping import NOTE_RETAINED, RESERVE, SETTLE
from seedkeeper.domain.transitions.checkpoint import (
    CHECKPOINT_FAILED,
    FREEZE,
    RECORD_CHECKPOINT,
    THAWED,
)
from seedkeeper.domain.transitions.idle import (
    FENCE,
    FENCE_PARK,
    PARK,
    REQUEST_CHECKPOINT,
    RETIRE,
)
from seedkeeper.domain.transitions.machinery import Transition
from seedkeeper.domain.transitions.polls import KEEPALIVE, RESUME, THAW, TOUCH
from seedkeeper.domain.transitions.seeding import (
    BEGIN_ATTEMPT,
    BIRTH_STATES,
    RECORD_INCARNATION,
    SETTLE_SEED,
)
from seedkeeper.domain.transitions.task_stop import CHECKPOINT_ON_STOP, LOSE, PARK_ON_STOP

TRANSITIONS: tuple[Transition[Any], ...] = (
    TOUCH,
    KEEPALIVE,
    RESUME,
    RECORD_INCARNATION,
    SETTLE_SEED,
    BEGIN_ATTEMPT,
    FENCE,
    RETIRE,
    REQUEST_CHECKPOINT,
    FREEZE,
    THAW,
    THAWED,
    RECORD_CHECKPOINT,
    CHECKPOINT_FAILED,
    FENCE_PARK,
    PARK,
    CHECKPOINT_ON_STOP,
    PARK_ON_STOP,
    LOSE,
    NOTE_RETAINED,
    RESERVE,
    SETTLE,
)


def mermaid() -> str:
    """The state diagram of the table: every transition that moves a record, from each
    state it leaves to each state it may reach; a birth from `[*]`, a tombstone's expiry
    (the table's TTL) to `[*]`."""
    lines = ["stateDiagram-v2"]
    lines += [f"    [*] --> {state}: born" for state in _ordered(BIRTH_STATES)]
    for transition in TRANSITIONS:
        for source in _ordered(transition.source - transition.stays):
            lines += [f"    {source} --> {to}: {transition.name}" for to in _ordered(transition.to)]
    lines += [f"    {state} --> [*]: expires" for state in _ordered(ENDED_STATES)]
    return "\n".join(lines)


def _ordered(states: frozenset[State]) -> list[State]:
    return [state for state in State if state in states]
