from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seedkeeper.domain import opwindow
from seedkeeper.domain.opwindow import (
    WINDOW_SIZE,
    Actor,
    AlreadySettled,
    Changed,
    Mismatch,
    OpKind,
    OpRef,
    OpStatus,
    Reserved,
    Window,
    WindowFull,
)


def reserve(window: Window, generation: int = 1, actor: Actor = Actor.SEED_FN) -> Reserved:
    reserved = opwindow.reserve(window, OpKind.CHECKPOINT, actor, generation)
    assert isinstance(reserved, Reserved)
    return reserved


def filled(count: int, generation: int = 1) -> Window:
    window = Window()
    for _ in range(count):
        window = reserve(window, generation).window
    return window


def settled(window: Window, ref: OpRef, outcome: str = "ok") -> Window:
    changed = opwindow.settle(window, ref, outcome)
    assert isinstance(changed, Changed)
    return changed.window


def ref(ordinal: int, actor: Actor = Actor.SEED_FN, generation: int = 1) -> OpRef:
    return OpRef(ordinal=ordinal, actor=actor, generation=generation)


def test_reserve_hands_out_increasing_ordinals_as_open_entries() -> None:
    first = reserve(Window())
    second = reserve(first.window)
    assert (first.entry.ordinal, second.entry.ordinal) == (1, 2)
    assert second.entry.status is OpStatus.OPEN
    assert second.window.next_ordinal == 3
    assert second.window.unsettled == 2


def test_a_full_window_of_unsettled_work_refuses_before_any_effect() -> None:
    window = filled(WINDOW_SIZE)
    assert window.unsettled == WINDOW_SIZE
    assert isinstance(opwindow.reserve(window, OpKind.STOP, Actor.SWEEP, 1), WindowFull)


def test_room_is_made_by_evicting_the_oldest_settled_entry_only() -> None:
    window = filled(WINDOW_SIZE)
    window = settled(window, ref(9))
    window = settled(window, ref(4))
    grown = reserve(window)
    ordinals = [entry.ordinal for entry in grown.window.entries]
    assert 4 not in ordinals
    assert 9 in ordinals
    assert grown.entry.ordinal == WINDOW_SIZE + 1
    assert len(ordinals) == WINDOW_SIZE


def test_settle_records_the_outcome_once() -> None:
    window = settled(filled(1), ref(1), "uploaded")
    entry = window.entry(1)
    assert entry is not None
    assert (entry.status, entry.outcome) == (OpStatus.SETTLED, "uploaded")
    assert window.unsettled == 0


def test_a_duplicate_settle_is_acknowledged_without_replay() -> None:
    window = settled(filled(1), ref(1), "uploaded")
    again = opwindow.settle(window, ref(1), "failed")
    assert isinstance(again, AlreadySettled)
    assert again.entry is not None
    assert again.entry.outcome == "uploaded"


def test_settles_may_arrive_out_of_order() -> None:
    window = filled(3)
    window = settled(window, ref(3))
    window = settled(window, ref(1))
    assert [entry.status for entry in window.entries] == [
        OpStatus.SETTLED,
        OpStatus.OPEN,
        OpStatus.SETTLED,
    ]


def test_a_settle_for_an_evicted_ordinal_is_answered_from_the_low_water_mark() -> None:
    window = settled(filled(WINDOW_SIZE), ref(1))
    window = reserve(window).window  # evicts ordinal 1
    assert window.entry(1) is None
    answer = opwindow.settle(window, ref(1), "ok")
    assert answer == AlreadySettled(entry=None)


@pytest.mark.parametrize(
    "wrong",
    [
        ref(1, actor=Actor.SWEEP),
        ref(1, generation=2),
    ],
)
def test_settle_must_match_actor_and_generation(wrong: OpRef) -> None:
    window = filled(1)
    assert opwindow.settle(window, wrong, "ok") == Mismatch("actor-or-generation-mismatch")
    assert window.unsettled == 1


def test_settle_of_an_ordinal_never_reserved_is_refused() -> None:
    assert opwindow.settle(filled(2), ref(3), "ok") == Mismatch("ordinal-never-reserved")


def test_detach_marks_background_work_that_still_counts_as_unsettled() -> None:
    detached = opwindow.detach(filled(1), ref(1))
    assert isinstance(detached, Changed)
    assert detached.entry.status is OpStatus.DETACHED
    assert detached.window.unsettled == 1
    again = opwindow.detach(detached.window, ref(1))
    assert isinstance(again, Changed)
    assert again.window == detached.window
    assert isinstance(settled(detached.window, ref(1)), Window)


def test_detach_leaves_work_that_already_settled_alone() -> None:
    window = settled(filled(1), ref(1))
    assert isinstance(opwindow.detach(window, ref(1)), AlreadySettled)


def test_an_earlier_generations_unsettled_work_becomes_unknown_and_is_kept() -> None:
    window = filled(3, generation=1)
    window = settled(window, ref(1))
    window = opwindow.detach(window, ref(2)).window  # type: ignore[union-attr]
    advanced = opwindow.advance_generation(window, 2)
    assert [entry.status for entry in advanced.entries] == [
        OpStatus.SETTLED,
        OpStatus.UNKNOWN,
        OpStatus.UNKNOWN,
    ]
    assert advanced.unsettled == 2
    current = reserve(advanced, generation=2).entry
    assert current.status is OpStatus.OPEN
    assert opwindow.advance_generation(advanced, 2) == advanced


def test_unknown_obligations_are_never_evicted_and_can_fill_the_window() -> None:
    window = opwindow.advance_generation(filled(WINDOW_SIZE, generation=1), 2)
    assert isinstance(opwindow.reserve(window, OpKind.STOP, Actor.SWEEP, 2), WindowFull)


def test_a_late_answer_from_the_earlier_generation_settles_its_unknown_entry() -> None:
    window = opwindow.advance_generation(filled(1, generation=1), 2)
    window = settled(window, ref(1, generation=1), "uploaded")
    assert window.unsettled == 0


operations = st.lists(
    st.tuples(st.sampled_from(["reserve", "settle", "detach", "advance"]), st.integers(1, 40)),
    max_size=120,
)


@given(operations)
def test_window_invariants_hold_for_any_sequence(steps: list[tuple[str, int]]) -> None:
    window, generation = Window(), 1
    outcomes: dict[int, str | None] = {}
    for action, number in steps:
        if action == "reserve":
            result = opwindow.reserve(window, OpKind.CHECKPOINT, Actor.SEED_FN, generation)
            if isinstance(result, Reserved):
                window = result.window
        elif action == "advance":
            generation += 1
            window = opwindow.advance_generation(window, generation)
        else:
            entry = window.entry(number)
            target = ref(number, generation=entry.generation if entry else generation)
            if action == "settle":
                changed = opwindow.settle(window, target, f"outcome-{len(outcomes)}")
            else:
                changed = opwindow.detach(window, target)
            if isinstance(changed, Changed):
                window = changed.window
        ordinals = [entry.ordinal for entry in window.entries]
        assert ordinals == sorted(set(ordinals))
        assert len(ordinals) <= WINDOW_SIZE
        assert window.unsettled <= WINDOW_SIZE
        assert all(ordinal < window.next_ordinal for ordinal in ordinals)
        for entry in window.entries:
            if entry.settled:
                assert outcomes.setdefault(entry.ordinal, entry.outcome) == entry.outcome
        # Only settled entries are ever evicted.
        assert all(
            ordinal in ordinals or outcomes.get(ordinal) is not None
            for ordinal in range(1, window.next_ordinal)
        )
