"""What one look at a standby pool decides (`seedkeeper.domain.standby.tend`), for any pool."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from seedkeeper.domain.models import SeedIdentity
from seedkeeper.domain.standby import LIVE, Generation, PoolSettings, Standby, StandbyState, tend

NOW = 1_800_000_000
SETTINGS = PoolSettings(max_age=3600, start_timeout=600)
GENERATIONS = [
    Generation(
        resource="widgets",
        generation=number,
        ref="main",
        sha=f"{number:040x}",
        checkout_backup_id=f"checkout-{number}",
    )
    for number in (1, 2)
]


@st.composite
def pools(draw: st.DrawFn) -> tuple[list[Standby], Generation | None, frozenset[str]]:
    wanted = draw(st.sampled_from([None, *GENERATIONS]))
    standbys = [
        Standby(
            standby=f"{index:032x}",
            preseed=draw(st.sampled_from([wanted, *GENERATIONS])),
            state=draw(st.sampled_from(list(StandbyState))),
            incarnation=f"local:_standby-{index:032x}:1",
            launched_at=NOW - draw(st.integers(0, 2 * SETTINGS.max_age)),
            retire_at=NOW + SETTINGS.max_age,
        )
        for index in range(draw(st.integers(0, 8)))
    ]
    gone = frozenset(
        s.incarnation for s in standbys if s.incarnation is not None and draw(st.booleans())
    )
    return standbys, wanted, gone


@given(pools(), st.integers(0, 6))
def test_a_look_keeps_exactly_the_target_and_retires_only_what_it_may(
    pool: tuple[list[Standby], Generation | None, frozenset[str]], target: int
) -> None:
    standbys, wanted, gone = pool
    plan = tend(standbys, target=target, wanted=wanted, settings=SETTINGS, gone=gone, now=NOW)
    live = [s for s in standbys if s.state in LIVE]
    # Never an assigned one (its slot's), never one already retired.
    assert all(s.state in LIVE for s in plan.retire)
    assert len({s.standby for s in plan.retire}) == len(plan.retire)
    # Exactly the target waits afterwards: what is kept, and what is launched.
    assert len(live) - len(plan.retire) + plan.launch == target
    for standby in live:
        age = NOW - standby.launched_at
        must_go = (
            age >= SETTINGS.max_age
            or (standby.state is StandbyState.STARTING and age >= SETTINGS.start_timeout)
            or standby.incarnation in gone
            or standby.preseed != wanted
        )
        if must_go:
            assert standby in plan.retire, standby


def test_beyond_the_target_the_least_ready_go_first_then_the_newest() -> None:
    def standby(index: int, state: StandbyState, age: int) -> Standby:
        return Standby(
            standby=f"{index:032x}",
            state=state,
            incarnation=f"local:_standby-{index:032x}:1",
            launched_at=NOW - age,
            retire_at=NOW - age + SETTINGS.max_age,
        )

    old_free = standby(1, StandbyState.FREE, 300)
    new_free = standby(2, StandbyState.FREE, 100)
    starting = standby(3, StandbyState.STARTING, 10)
    plan = tend(
        [old_free, new_free, starting],
        target=1,
        wanted=None,
        settings=SETTINGS,
        gone=frozenset(),
        now=NOW,
    )
    assert plan.retire == (starting, new_free)
    assert plan.launch == 0


def test_a_generation_holds_only_the_seed_that_names_it_with_nothing_to_fetch() -> None:
    generation = GENERATIONS[0]
    seed = SeedIdentity(
        resource="widgets",
        ref="main",
        sha=generation.sha,
        checkout_backup_id=generation.checkout_backup_id,
    )
    assert generation.holds(seed)
    assert not generation.holds(seed.model_copy(update={"fetch_ref": "feature"}))
    assert not generation.holds(seed.model_copy(update={"deps_backup_id": "deps-1"}))
    assert not generation.holds(seed.model_copy(update={"resource": "gadgets"}))
    assert not GENERATIONS[1].holds(seed)
