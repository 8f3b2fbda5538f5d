"""Decision tables of the lifecycle transitions, without I/O."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from builders import (
    EXPIRED,
    IDLE,
    INCARNATION,
    NOW,
    ORIGIN,
    changed,
    checkpoint,
    failure,
    owner,
    record_in,
    seed,
    success,
)
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import WINDOW_SIZE, Actor, OpKind, OpRef, OpStatus
from seedkeeper.domain.record import ENDED_STATES, SlotRecord, State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions import Acknowledged, Change

RESTORE = OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
LAUNCH = OpRef(ordinal=1, actor=Actor.SEED_FN, generation=1)


def unlaunched_seeding() -> SlotRecord:
    return transitions.born(
        "slot-1",
        Binding(owner=owner(), seed=seed(), origin=ORIGIN),
        now=NOW,
        idle_deadline=NOW + IDLE,
    ).record


def test_birth_marks_a_seeded_attempt_durably_before_any_effect() -> None:
    record = unlaunched_seeding()
    assert (record.state, record.rev, record.attempt) == (State.SEEDING, 1, 1)
    (restore,) = record.window.entries
    assert (restore.kind, restore.actor, restore.status) == (
        OpKind.RESTORE,
        Actor.SLOT_TASK,
        OpStatus.OPEN,
    )


def test_a_cold_birth_is_a_durable_unseeded_classification() -> None:
    birth = transitions.born(
        "slot-1", Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=NOW + IDLE
    )
    assert birth.record.state is State.UNSEEDED
    assert birth.entry is not None
    assert birth.entry.kind is OpKind.LAUNCH


def test_recording_the_incarnation_detaches_the_restore_and_settles_a_cold_launch() -> None:
    seeding = changed(
        transitions.RECORD_INCARNATION.decide(
            unlaunched_seeding(),
            transitions.Launched(incarnation=INCARNATION, launch=RESTORE, now=NOW),
        )
    )
    assert seeding.record.incarnation == INCARNATION
    assert seeding.record.window.entries[0].status is OpStatus.DETACHED
    assert seeding.record.rev == 2
    cold = transitions.born(
        "slot-1", Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=NOW + IDLE
    ).record
    launched = changed(
        transitions.RECORD_INCARNATION.decide(
            cold, transitions.Launched(incarnation=INCARNATION, launch=LAUNCH, now=NOW)
        )
    )
    assert launched.record.window.unsettled == 0


def test_the_incarnation_is_recorded_once() -> None:
    record = record_in(State.SEEDING)
    same = transitions.RECORD_INCARNATION.decide(
        record, transitions.Launched(incarnation=INCARNATION, launch=RESTORE, now=NOW)
    )
    assert same == Acknowledged(record)
    other = transitions.RECORD_INCARNATION.decide(
        record, transitions.Launched(incarnation="local:slot-1:2", launch=RESTORE, now=NOW)
    )
    assert other == Refused("incarnation-recorded")


def test_a_task_faster_than_the_launch_bookkeeping_keeps_its_verdict() -> None:
    fast = changed(
        transitions.SETTLE_SEED.decide(
            unlaunched_seeding(),
            transitions.Verdict(attempt=1, restore=RESTORE, result=success(), now=NOW),
        )
    ).record
    late = changed(
        transitions.RECORD_INCARNATION.decide(
            fast, transitions.Launched(incarnation=INCARNATION, launch=RESTORE, now=NOW)
        )
    )
    assert late.record.state is State.SEEDED
    assert late.record.window.entries[0].status is OpStatus.SETTLED


def test_settle_seed_moves_seeding_to_its_verdict() -> None:
    record = record_in(State.SEEDING)
    seeded = changed(
        transitions.SETTLE_SEED.decide(
            record, transitions.Verdict(attempt=1, restore=RESTORE, result=success(), now=NOW)
        )
    )
    assert seeded.record.state is State.SEEDED
    assert seeded.record.result == success()
    failed = changed(
        transitions.SETTLE_SEED.decide(
            record, transitions.Verdict(attempt=1, restore=RESTORE, result=failure(), now=NOW)
        )
    )
    assert failed.record.state is State.SEED_FAILED
    assert failed.record.window.unsettled == 0


def test_a_duplicate_verdict_is_acknowledged_and_the_first_stands() -> None:
    record = record_in(State.SEEDED)
    again = transitions.SETTLE_SEED.decide(
        record, transitions.Verdict(attempt=1, restore=RESTORE, result=failure(), now=NOW)
    )
    assert isinstance(again, Acknowledged)
    assert again.record.state is State.SEEDED


@pytest.mark.parametrize(
    ("attempt", "restore", "reason"),
    [
        (2, RESTORE, "attempt-superseded"),
        (1, OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=2), "attempt-superseded"),
        (1, OpRef(ordinal=1, actor=Actor.SWEEP, generation=1), "actor-or-generation-mismatch"),
        (1, OpRef(ordinal=5, actor=Actor.SLOT_TASK, generation=1), "ordinal-never-reserved"),
    ],
)
def test_settle_seed_refuses_anyone_but_the_live_attempt(
    attempt: int, restore: OpRef, reason: str
) -> None:
    record = record_in(State.SEEDING)
    decision = transitions.SETTLE_SEED.decide(
        record, transitions.Verdict(attempt=attempt, restore=restore, result=success(), now=NOW)
    )
    assert decision == Refused(reason)


@pytest.mark.parametrize(
    ("state", "expired", "unsettled"),
    list(itertools.product(State, [False, True], [False, True])),
)
def test_only_an_expired_unseeded_slot_with_nothing_in_flight_is_fenced(
    state: State, expired: bool, unsettled: bool
) -> None:
    record = record_in(state)
    if unsettled and record.window.unsettled == 0 and state not in ENDED_STATES:
        record = changed(
            transitions.RESERVE.decide(
                record,
                transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW),
            )
        ).record
    now = EXPIRED if expired else NOW + IDLE
    decision = transitions.FENCE.decide(record, transitions.At(now=now))
    permitted = state is State.UNSEEDED and expired and record.window.unsettled == 0
    assert isinstance(decision, Change) is permitted
    if permitted:
        assert isinstance(decision, Change)
        assert decision.record.state is State.CLOSING
        assert decision.entry is not None
        assert decision.entry.kind is OpKind.STOP


def test_the_fence_names_why_it_retains() -> None:
    assert transitions.FENCE.decide(
        record_in(State.SEEDED), transitions.At(now=EXPIRED)
    ) == Refused("state-seeded")
    assert transitions.FENCE.decide(
        record_in(State.UNSEEDED), transitions.At(now=NOW + IDLE)
    ) == Refused("not-idle")


def test_retire_settles_the_stop_and_needs_no_other_obligation() -> None:
    closing = record_in(State.CLOSING)
    stop = closing.window.entries[-1].ref
    retired = changed(
        transitions.RETIRE.decide(
            closing, transitions.Stopped(stop=stop, now=EXPIRED, expires_at=EXPIRED + 1)
        )
    )
    assert retired.record.state is State.RETIRED
    assert transitions.RETIRE.decide(
        retired.record, transitions.Stopped(stop=stop, now=EXPIRED, expires_at=EXPIRED + 1)
    ) == Acknowledged(retired.record)
    blocked = changed(
        transitions.RESERVE.decide(
            closing, transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW)
        )
    ).record
    assert transitions.RETIRE.decide(
        blocked, transitions.Stopped(stop=stop, now=EXPIRED, expires_at=EXPIRED + 1)
    ) == Refused("unsettled-operations")


@pytest.mark.parametrize("state", [s for s in State if s is not State.CLOSING])
def test_retire_refuses_without_the_fence(state: State) -> None:
    record = record_in(state)
    decision = transitions.RETIRE.decide(
        record, transitions.Stopped(stop=LAUNCH, now=EXPIRED, expires_at=EXPIRED + 1)
    )
    assert isinstance(decision, Refused | Acknowledged)
    if state is State.RETIRED:
        assert isinstance(decision, Acknowledged)


def test_a_checkpoint_counts_only_for_its_owner_and_incarnation() -> None:
    asked = changed(
        transitions.REQUEST_CHECKPOINT.decide(record_in(State.SEEDED), transitions.At(EXPIRED))
    )
    assert asked.entry is not None
    upload = asked.entry.ref
    recorded = changed(
        transitions.RECORD_CHECKPOINT.decide(
            asked.record, transitions.Uploaded(checkpoint=checkpoint(), upload=upload, now=NOW)
        )
    )
    assert recorded.record.checkpoint == checkpoint()
    assert recorded.record.state is State.CHECKPOINTED
    assert recorded.record.window.unsettled == 0
    for wrong, reason in [
        (checkpoint(owner=owner(run="run-2")), "claim-mismatch"),
        (checkpoint(incarnation="local:other"), "incarnation-mismatch"),
    ]:
        assert transitions.RECORD_CHECKPOINT.decide(
            asked.record, transitions.Uploaded(checkpoint=wrong, upload=upload, now=NOW)
        ) == Refused(reason)
    assert transitions.RECORD_CHECKPOINT.decide(
        record_in(State.SEEDING),
        transitions.Uploaded(checkpoint=checkpoint(), upload=upload, now=NOW),
    ) == Refused("state-seeding")


def test_reserve_refuses_a_full_window_and_a_retired_slot() -> None:
    record = record_in(State.SEEDED)
    for _ in range(WINDOW_SIZE):
        record = changed(
            transitions.RESERVE.decide(
                record,
                transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW),
            )
        ).record
    assert transitions.RESERVE.decide(
        record, transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW)
    ) == Refused("window-full")
    assert transitions.RESERVE.decide(
        record_in(State.RETIRED),
        transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW),
    ) == Refused("state-retired")


def test_every_change_grows_rev_by_one_and_never_moves_updated_at_back() -> None:
    record = record_in(State.SEEDED)
    later = changed(
        transitions.RESERVE.decide(
            record,
            transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW - 50),
        )
    ).record
    assert later.rev == record.rev + 1
    assert later.updated_at == record.updated_at


# -- the table -----------------------------------------------------------------------------


def test_the_readme_state_diagram_is_drawn_from_the_table() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    diagrams = re.findall(r"```mermaid\n(stateDiagram-v2\n.*?)\n```", readme, re.DOTALL)
    assert diagrams == [transitions.mermaid()], "redraw it: transitions.mermaid()"


def test_every_transition_leaves_named_states_and_is_named_once() -> None:
    names = [transition.name for transition in transitions.TRANSITIONS]
    assert len(names) == len(set(names))
    for transition in transitions.TRANSITIONS:
        assert transition.source, transition.name
        assert transition.to <= set(State), transition.name


def test_a_transition_with_two_state_checks_is_refused_at_declaration() -> None:
    with pytest.raises(ValueError, match="exactly one InState"):
        transitions.Transition[transitions.At](
            "twice",
            checks=(
                transitions.InState(frozenset({State.SEEDED})),
                transitions.InState(frozenset({State.SEEDING})),
            ),
            effect=lambda record, at: Refused("never"),
        )


def test_the_checks_are_made_in_their_declared_order() -> None:
    """The fence asks idleness before the state (the sweep leaves a fresh slot alone
    whatever its state), and a poll asks the binding before the state (a stranger learns
    nothing of a closed slot)."""
    seeded = record_in(State.SEEDED)
    fresh = transitions.FENCE.decide(seeded, transitions.At(now=NOW))
    assert fresh == Refused("not-idle")
    stranger = transitions.Poll(Binding(owner=owner()), now=NOW, idle_deadline=NOW + IDLE)
    assert transitions.TOUCH.decide(record_in(State.CLOSING), stranger) == Refused("claim-mismatch")


@pytest.mark.parametrize("kind", [OpKind.RESTORE, OpKind.STOP, OpKind.CHECKPOINT])
def test_work_that_moves_the_state_is_never_reserved_beside_its_protocol(kind: OpKind) -> None:
    """A checkpoint reserved by `reserve` would let `record_checkpoint` record one the
    sweep never asked for and no freeze preceded."""
    decision = transitions.RESERVE.decide(
        record_in(State.SEEDED), transitions.Reservation(kind=kind, actor=Actor.SLOT_TASK, now=NOW)
    )
    assert decision == Refused(f"{kind}-reserved-with-its-state")
