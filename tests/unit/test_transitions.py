"""Decision tables of the lifecycle transitions, without I/O."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any

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
    lose,
    owner,
    record_in,
    resume,
    seed,
    success,
)
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import WINDOW_SIZE, Actor, OpKind, OpRef, OpStatus
from seedkeeper.domain.record import (
    ENDED_STATES,
    LIVE_STATES,
    SlotRecord,
    State,
    encode,
)
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


def test_the_docs_state_diagram_is_drawn_from_the_table() -> None:
    page = (Path(__file__).parents[2] / "docs" / "concepts" / "lifecycle.md").read_text()
    diagrams = re.findall(r"```mermaid\n(stateDiagram-v2\n.*?)\n```", page, re.DOTALL)
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


# -- resume, keepalive, the task's own stop, loss ----------------------------------------

OTHER_INCARNATION = "local:another-task:1"
# A caller naming the slot's binding, or one field of it changed: refused with that reason.
BINDINGS = {
    "own": lambda r: r.binding,
    "claim-mismatch": lambda r: r.binding.model_copy(update={"owner": owner(run="run-2")}),
    "seed-mismatch": lambda r: r.binding.model_copy(update={"seed": seed(sha="c" * 40)}),
    "origin-mismatch": lambda r: r.binding.model_copy(
        update={"origin": "https://git.example.com/acme/other.git"}
    ),
}


def stopping(record: SlotRecord, **changes: Any) -> transitions.Stopping:
    """The slot's own task being stopped by the platform (`changes`: a late or stray one)."""
    own = transitions.Stopping(
        attempt=record.attempt, incarnation=record.incarnation or INCARNATION, now=EXPIRED
    )
    return dataclasses.replace(own, **changes)


def with_launch(record: SlotRecord) -> SlotRecord:
    """Other work in flight: a launch reserved by the seed function."""
    return changed(
        transitions.RESERVE.decide(
            record, transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=NOW)
        )
    ).record


def checkpointing_on_stop(*, frozen_at: int | None = EXPIRED) -> tuple[SlotRecord, OpRef]:
    """A seeded slot whose stopping task asked for its own checkpoint (and froze at
    `frozen_at`, None: not yet); its checkpoint op."""
    asked = changed(
        transitions.CHECKPOINT_ON_STOP.decide(
            record_in(State.SEEDED), stopping(record_in(State.SEEDED))
        )
    )
    assert asked.entry is not None
    record = asked.record
    if frozen_at is not None:
        freezing = transitions.Freezing(attempt=1, op=asked.entry.ref, now=frozen_at)
        record = changed(transitions.FREEZE.decide(record, freezing)).record
    return record, asked.entry.ref


def stopped_and_checkpointed(*, frozen_at: int = EXPIRED, created_at: int = EXPIRED) -> SlotRecord:
    """The stopping task's checkpoint recorded: what `park_on_stop` is asked on."""
    record, op = checkpointing_on_stop(frozen_at=frozen_at)
    made = checkpoint(created_at=created_at, expires_at=created_at + 7 * 86_400)
    uploaded = transitions.Uploaded(checkpoint=made, upload=op, now=created_at)
    return changed(transitions.RECORD_CHECKPOINT.decide(record, uploaded)).record


@pytest.mark.parametrize(("state", "caller"), list(itertools.product(State, BINDINGS)))
def test_only_the_parked_slots_own_binding_resumes_it(state: State, caller: str) -> None:
    """The binding is asked first: a stranger learns nothing of the slot's state."""
    record = record_in(state)
    poll = transitions.Poll(BINDINGS[caller](record), now=EXPIRED, idle_deadline=EXPIRED + IDLE)
    decision = transitions.RESUME.decide(record, poll)
    if caller != "own":
        assert decision == Refused(caller)
    elif state is State.PARKED:
        assert isinstance(decision, Change)
        assert decision.record.state is State.SEEDING
    else:
        assert decision == Refused("slot-closed")


def test_resume_is_a_new_attempt_restoring_the_checkpoint() -> None:
    record = record_in(State.PARKED).model_copy(update={"retained_reason": "parked"})
    assert record.checkpoint is not None
    poll = resume(record)
    decision = changed(transitions.RESUME.decide(record, poll))
    resumed = decision.record
    assert (resumed.state, resumed.attempt, resumed.rev) == (State.SEEDING, 2, record.rev + 1)
    assert resumed.resuming
    assert resumed.checkpoint == record.checkpoint  # named until the new attempt is seeded
    assert (resumed.incarnation, resumed.result, resumed.expires_at) == (None, None, None)
    assert (resumed.retained_reason, resumed.frozen_at) == (None, None)
    assert resumed.idle_deadline == poll.idle_deadline
    assert decision.entry is not None
    assert (decision.entry.kind, decision.entry.actor, decision.entry.generation) == (
        OpKind.RESTORE,
        Actor.SLOT_TASK,
        2,
    )
    assert decision.entry.status is OpStatus.OPEN
    assert resumed.window.unsettled == 1
    assert encode(resumed)["sweep"].startswith("live#")  # back on the sweep's index
    # Its task runs: the new incarnation is recorded and the restore goes on detached.
    launched = changed(
        transitions.RECORD_INCARNATION.decide(
            resumed,
            transitions.Launched(
                incarnation="local:slot-1:2", launch=decision.entry.ref, now=EXPIRED
            ),
        )
    ).record
    assert launched.incarnation == "local:slot-1:2"
    assert launched.resuming


@pytest.mark.parametrize(
    ("fact", "counts"),
    [
        ({}, True),
        ({"expires_at": EXPIRED + 1}, True),  # the last second it is kept
        ({"expires_at": EXPIRED}, False),
        ({"owner": owner(run="run-2")}, False),
        ({"incarnation": OTHER_INCARNATION}, False),
    ],
)
def test_resume_needs_the_checkpoint_to_count_for_the_owner_and_incarnation(
    fact: dict[str, object], counts: bool
) -> None:
    record = record_in(State.PARKED)
    assert record.checkpoint is not None
    record = record.model_copy(update={"checkpoint": record.checkpoint.model_copy(update=fact)})
    decision = transitions.RESUME.decide(record, resume(record, now=EXPIRED))
    assert isinstance(decision, Change) if counts else decision == Refused("checkpoint-not-counted")


def resuming() -> tuple[SlotRecord, OpRef]:
    """A parked slot resumed: seeding its second attempt from the checkpoint."""
    record = record_in(State.PARKED)
    decision = changed(transitions.RESUME.decide(record, resume(record)))
    assert decision.entry is not None
    return decision.record, decision.entry.ref


def test_a_resumed_seed_drops_its_checkpoint_and_owes_its_deletion() -> None:
    record, restore = resuming()
    assert record.checkpoint is not None
    verdict = transitions.Verdict(
        attempt=2, restore=restore, result=success(resumed=True), now=EXPIRED
    )
    decision = changed(transitions.SETTLE_SEED.decide(record, verdict))
    assert decision.record.state is State.SEEDED
    assert decision.record.checkpoint is None
    assert decision.owes == (record.checkpoint.key,)
    assert decision.record.result == success(resumed=True)
    assert decision.entry is not None
    assert decision.entry.outcome == "seeded"
    # Told again, the first verdict stands: nothing more is owed.
    assert transitions.SETTLE_SEED.decide(decision.record, verdict) == Acknowledged(
        decision.record, decision.entry
    )


def test_a_snapshot_seed_owes_nothing() -> None:
    decision = changed(
        transitions.SETTLE_SEED.decide(
            record_in(State.SEEDING),
            transitions.Verdict(attempt=1, restore=RESTORE, result=success(), now=NOW),
        )
    )
    assert decision.owes == ()


def test_a_failed_resume_keeps_naming_the_checkpoint() -> None:
    record, restore = resuming()
    verdict = transitions.Verdict(attempt=2, restore=restore, result=failure(), now=EXPIRED)
    decision = changed(transitions.SETTLE_SEED.decide(record, verdict))
    assert decision.record.state is State.SEED_FAILED
    assert decision.record.checkpoint == record.checkpoint
    assert decision.owes == ()


@pytest.mark.parametrize("resumed", [False, True], ids=["resume", "snapshot-seed"])
def test_a_verdict_of_the_other_kind_is_refused(resumed: bool) -> None:
    """A snapshot's verdict on a resume, or a resume's on a snapshot seed."""
    if resumed:
        record, restore = record_in(State.SEEDING), RESTORE
    else:
        record, restore = resuming()
    verdict = transitions.Verdict(
        attempt=record.attempt, restore=restore, result=success(resumed=resumed), now=EXPIRED
    )
    assert transitions.SETTLE_SEED.decide(record, verdict) == Refused("resume-mismatch")


def test_the_parked_attempts_late_verdict_is_superseded() -> None:
    record, _ = resuming()
    late = transitions.Verdict(attempt=1, restore=RESTORE, result=success(), now=EXPIRED)
    assert transitions.SETTLE_SEED.decide(record, late) == Refused("attempt-superseded")


def test_a_resume_whose_task_was_lost_restores_the_same_checkpoint_again() -> None:
    record, _ = resuming()
    again = changed(transitions.BEGIN_ATTEMPT.decide(record, transitions.At(now=EXPIRED)))
    assert again.record.resuming
    assert again.record.checkpoint == record.checkpoint
    assert again.entry is not None
    verdict = transitions.Verdict(
        attempt=3, restore=again.entry.ref, result=success(resumed=True), now=EXPIRED
    )
    assert record.checkpoint is not None
    assert changed(transitions.SETTLE_SEED.decide(again.record, verdict)).owes == (
        record.checkpoint.key,
    )


@pytest.mark.parametrize(
    ("state", "caller"), list(itertools.product(State, ["own", "another", "unclaimed"]))
)
def test_a_keepalive_extends_only_a_live_slot_of_its_owner(state: State, caller: str) -> None:
    record = record_in(state)
    claim = {"own": record.owner, "another": owner(run="run-2"), "unclaimed": None}[caller]
    keep = transitions.KeepAlive(owner=claim, now=NOW + 5, idle_deadline=NOW + 5 + IDLE)
    decision = transitions.KEEPALIVE.decide(record, keep)
    if claim != record.owner:
        assert decision == Refused("claim-mismatch")
    elif state in LIVE_STATES:
        kept = changed(decision).record
        assert kept == record.model_copy(
            update={
                "idle_deadline": NOW + 5 + IDLE,
                "rev": record.rev + 1,
                "updated_at": max(NOW + 5, record.updated_at),
            }
        )
    else:
        assert decision == Refused("slot-closed")


STOPPERS: dict[str, dict[str, Any]] = {
    "own": {},
    "superseded": {"attempt": 2},
    "stranger": {"incarnation": OTHER_INCARNATION},
}


@pytest.mark.parametrize(("state", "who"), list(itertools.product(State, STOPPERS)))
def test_only_the_slots_own_seeded_task_asks_its_checkpoint_on_stop(state: State, who: str) -> None:
    record = record_in(state)
    decision = transitions.CHECKPOINT_ON_STOP.decide(record, stopping(record, **STOPPERS[who]))
    if who == "superseded":
        assert decision == Refused("attempt-superseded")
    elif who == "stranger":
        assert decision == Refused("incarnation-mismatch")
    elif state is State.SEEDED:
        asked = changed(decision)
        assert asked.record.state is State.CHECKPOINTING
        assert asked.entry is not None
        assert (asked.entry.kind, asked.entry.actor, asked.entry.generation) == (
            OpKind.CHECKPOINT,
            Actor.SLOT_TASK,
            1,
        )
        assert asked.record.window.unsettled == 1
    elif state is State.CHECKPOINTING:
        # The sweep asked already: its op is the one the task works on (a stranger, even
        # of the same attempt, is never handed it).
        assert decision == Acknowledged(record, record.window.entries[-1])
    else:
        assert decision == Refused(f"state-{state}")


def test_asked_twice_on_stop_the_first_op_stands() -> None:
    record, op = checkpointing_on_stop(frozen_at=None)
    again = transitions.CHECKPOINT_ON_STOP.decide(record, stopping(record))
    assert isinstance(again, Acknowledged)
    assert again.entry is not None
    assert again.entry.ref == op


def test_no_checkpoint_on_stop_with_a_full_window() -> None:
    record = record_in(State.SEEDED)
    for _ in range(WINDOW_SIZE):
        record = with_launch(record)
    assert transitions.CHECKPOINT_ON_STOP.decide(record, stopping(record)) == Refused("window-full")


@pytest.mark.parametrize(("state", "who"), list(itertools.product(State, STOPPERS)))
def test_park_on_stop_over_every_state(state: State, who: str) -> None:
    """The identity first; then the state; the builders' records have no checkpoint made
    on a stop (seeded: none at all; checkpointed: captured with no freeze recorded)."""
    record = record_in(state)
    decision = transitions.PARK_ON_STOP.decide(record, stopping(record, **STOPPERS[who]))
    if state is State.PARKED:
        assert decision == Acknowledged(record)
    elif who == "superseded":
        assert decision == Refused("attempt-superseded")
    elif who == "stranger":
        assert decision == Refused("incarnation-mismatch")
    elif state is State.SEEDED:
        assert decision == Refused("checkpoint-not-counted")
    elif state is State.CHECKPOINTED:
        assert decision == Refused("not-frozen-since-capture")
    else:
        assert decision == Refused(f"state-{state}")


def test_park_on_stop_parks_the_work_captured_while_frozen() -> None:
    record = stopped_and_checkpointed()
    assert record.state is State.CHECKPOINTED
    assert record.checkpoint is not None
    decision = changed(transitions.PARK_ON_STOP.decide(record, stopping(record)))
    assert decision.entry is None
    parked_on_stop = decision.record
    assert parked_on_stop.state is State.PARKED
    assert parked_on_stop.expires_at == record.checkpoint.expires_at
    assert parked_on_stop.checkpoint == record.checkpoint
    assert parked_on_stop.frozen_at is None
    assert "sweep" not in encode(parked_on_stop)
    assert transitions.PARK_ON_STOP.decide(parked_on_stop, stopping(record)) == Acknowledged(
        parked_on_stop
    )
    # And its owner can come back to it.
    assert isinstance(transitions.RESUME.decide(parked_on_stop, resume(parked_on_stop)), Change)


@pytest.mark.parametrize(
    ("frozen_at", "created_at", "reason"),
    [
        (EXPIRED - 5, EXPIRED, None),
        (EXPIRED, EXPIRED, None),  # frozen and captured within the same second
        (EXPIRED + 1, EXPIRED, "not-frozen-since-capture"),  # captured before the freeze
    ],
)
def test_park_on_stop_needs_a_capture_made_since_the_freeze(
    frozen_at: int, created_at: int, reason: str | None
) -> None:
    record = stopped_and_checkpointed(frozen_at=frozen_at, created_at=created_at)
    decision = transitions.PARK_ON_STOP.decide(record, stopping(record))
    assert isinstance(decision, Change) if reason is None else decision == Refused(reason)


def test_park_on_stop_refuses_a_sandbox_resumed_since_the_capture() -> None:
    """A poll came back, the task resumed the sandbox (`thawed`): the checkpoint no longer
    holds all the work."""
    record = stopped_and_checkpointed()
    poll = transitions.Poll(record.binding, now=EXPIRED + 1, idle_deadline=EXPIRED + IDLE)
    thawed = changed(transitions.THAW.decide(record, poll)).record
    resumed = changed(
        transitions.THAWED.decide(thawed, transitions.Thawed(attempt=1, op=None, now=EXPIRED + 1))
    ).record
    assert resumed.frozen_at is None
    assert transitions.PARK_ON_STOP.decide(resumed, stopping(resumed)) == Refused(
        "not-frozen-since-capture"
    )


def test_park_on_stop_of_a_slot_a_poll_wanted_back_before_it_was_resumed() -> None:
    """Touched after the capture but never resumed (the task is stopping): still frozen,
    so the checkpoint holds all the work."""
    record = stopped_and_checkpointed()
    poll = transitions.Poll(record.binding, now=EXPIRED + 1, idle_deadline=EXPIRED + IDLE)
    thawed = changed(transitions.THAW.decide(record, poll)).record
    assert (thawed.state, thawed.frozen_at) == (State.SEEDED, EXPIRED)
    assert changed(transitions.PARK_ON_STOP.decide(thawed, stopping(thawed))).record.state is (
        State.PARKED
    )


def test_park_on_stop_of_a_checkpoint_recorded_after_a_poll_came_back() -> None:
    """Touched while the stopping task captured: its upload is recorded on `seeded`, then
    parked."""
    record, op = checkpointing_on_stop()
    poll = transitions.Poll(record.binding, now=EXPIRED, idle_deadline=EXPIRED + IDLE)
    thawed = changed(transitions.THAW.decide(record, poll)).record
    uploaded = transitions.Uploaded(
        checkpoint=checkpoint(created_at=EXPIRED), upload=op, now=EXPIRED
    )
    recorded = changed(transitions.RECORD_CHECKPOINT.decide(thawed, uploaded)).record
    assert recorded.state is State.SEEDED
    assert changed(transitions.PARK_ON_STOP.decide(recorded, stopping(recorded))).record.state is (
        State.PARKED
    )


@pytest.mark.parametrize(
    ("fact", "now", "reason"),
    [
        ({}, EXPIRED + 7 * 86_400 - 1, None),
        ({}, EXPIRED + 7 * 86_400, "checkpoint-not-counted"),  # expired by now
        ({"owner": owner(run="run-2")}, EXPIRED, "checkpoint-not-counted"),
        ({"incarnation": OTHER_INCARNATION}, EXPIRED, "checkpoint-not-counted"),
    ],
)
def test_park_on_stop_needs_a_checkpoint_that_counts(
    fact: dict[str, object], now: int, reason: str | None
) -> None:
    record = stopped_and_checkpointed()
    assert record.checkpoint is not None
    record = record.model_copy(update={"checkpoint": record.checkpoint.model_copy(update=fact)})
    decision = transitions.PARK_ON_STOP.decide(record, stopping(record, now=now))
    assert isinstance(decision, Change) if reason is None else decision == Refused(reason)


def test_park_on_stop_waits_for_every_operation_to_settle() -> None:
    record, _ = checkpointing_on_stop()
    assert transitions.PARK_ON_STOP.decide(record, stopping(record)) == Refused(
        "state-checkpointing"
    )
    busy = with_launch(stopped_and_checkpointed())
    assert transitions.PARK_ON_STOP.decide(busy, stopping(busy)) == Refused("unsettled-operations")


@pytest.mark.parametrize(("state", "who"), list(itertools.product(State, ["own", "stranger"])))
def test_only_a_running_seeded_slots_own_task_is_lost(state: State, who: str) -> None:
    record = record_in(state)
    lost = lose(record)
    if who == "stranger":
        lost = dataclasses.replace(lost, incarnation=OTHER_INCARNATION)
    decision = transitions.LOSE.decide(record, lost)
    if state is State.LOST:
        assert decision == Acknowledged(record)
    elif who == "stranger":
        assert decision == Refused("incarnation-mismatch")
    elif state in {State.SEEDED, State.CHECKPOINTING}:
        assert changed(decision).record.state is State.LOST
    elif state is State.CHECKPOINTED:
        # Its checkpoint counts, a freeze before its capture recorded or not (the sweep's
        # park fence takes it): parked, never lost.
        assert isinstance(
            transitions.FENCE_PARK.decide(record, transitions.At(EXPIRED + 1)), Change
        )
        assert decision == Refused("checkpoint-counts")
    else:
        assert decision == Refused(f"state-{state}")


def test_a_loss_is_recorded_with_why_and_kept_like_a_park() -> None:
    record = record_in(State.SEEDED)
    lost = lose(record, reason="spot-interruption", detail="SpotInterruption", at=EXPIRED + 3)
    recorded = changed(transitions.LOSE.decide(record, lost)).record
    assert recorded.state is State.LOST
    assert recorded.loss == lost.loss
    assert recorded.expires_at == lost.expires_at
    assert recorded.updated_at == EXPIRED + 3
    assert recorded.result == record.result  # the seed did succeed
    assert recorded.incarnation == record.incarnation
    assert "sweep" not in encode(recorded)
    assert transitions.LOSE.decide(recorded, lose(record, reason="task-stopped")) == Acknowledged(
        recorded
    )


@pytest.mark.parametrize("frozen_at", [None, EXPIRED], ids=["asked", "frozen"])
def test_a_stopped_task_s_open_checkpoint_is_settled_lost(frozen_at: int | None) -> None:
    record, op = checkpointing_on_stop(frozen_at=frozen_at)
    decision = changed(transitions.LOSE.decide(record, lose(record, reason="stop-timeout")))
    assert decision.record.state is State.LOST
    assert decision.record.frozen_at is None
    entry = decision.record.window.entry(op.ordinal)
    assert entry is not None
    assert (entry.status, entry.outcome) == (OpStatus.SETTLED, "lost")
    assert decision.record.window.unsettled == 0


def test_a_loss_waits_for_other_work_in_flight() -> None:
    for record in (with_launch(record_in(State.SEEDED)), with_launch(checkpointing_on_stop()[0])):
        assert transitions.LOSE.decide(record, lose(record)) == Refused("unsettled-operations")


@pytest.mark.parametrize(
    ("fact", "at", "reason"),
    [
        ({}, EXPIRED, "checkpoint-counts"),
        ({}, EXPIRED + 7 * 86_400, None),  # expired: the work is gone after all
        ({"owner": owner(run="run-2")}, EXPIRED, None),
        ({"incarnation": OTHER_INCARNATION}, EXPIRED, None),
    ],
)
def test_a_checkpointed_slot_is_lost_only_when_its_checkpoint_no_longer_counts(
    fact: dict[str, object], at: int, reason: str | None
) -> None:
    record = stopped_and_checkpointed()
    assert record.checkpoint is not None
    record = record.model_copy(update={"checkpoint": record.checkpoint.model_copy(update=fact)})
    decision = transitions.LOSE.decide(record, lose(record, at=at))
    if reason is not None:
        assert decision == Refused(reason)
    else:
        lost = changed(decision).record
        assert lost.state is State.LOST
        assert lost.checkpoint == record.checkpoint  # named, but not its work: no receipt facts
