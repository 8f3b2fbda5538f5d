"""A hypothesis state machine over the lifecycle module and its operation window, against
moto's conditional writes. Rules include stale writers and records corrupted or written
by a newer deployment; the invariants are the ones nothing may ever break."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from builders import IDLE, NOW, ORIGIN, failure, owner, seed, success
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import WINDOW_SIZE, Actor, OpKind, OpRef
from seedkeeper.domain.record import SlotRecord, State, Supported, classify, slot_key
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Written

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

SEED_STATES = {State.SEEDING, State.SEEDED, State.SEED_FAILED}
NEVER_FENCED = {State.SEEDING, State.SEEDED, State.SEED_FAILED, State.CLOSING, State.RETIRED}
_slots = itertools.count()


def run_machine(lifecycle: Lifecycle, table: Table) -> None:
    class LifecycleMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.slot = f"machine-{next(_slots)}"
            self.now = NOW
            self.highest_rev = 0
            self.outcomes: dict[int, str | None] = {}
            self.previous_state: State | None = None
            self.stale: SlotRecord | None = None
            self.frozen: dict[str, Any] | None = None  # a record this code may never write

        # -- helpers -------------------------------------------------------------
        def item(self) -> dict[str, Any] | None:
            return table.get_item(Key=slot_key(self.slot), ConsistentRead=True).get("Item")

        def record(self) -> SlotRecord | None:
            classified = lifecycle.read(self.slot)
            if isinstance(classified, Supported):
                self.stale = self.stale or classified.record
                return classified.record
            return None

        # -- rules -------------------------------------------------------------------
        @initialize(seeded=st.booleans(), claimed=st.booleans())
        def birth(self, seeded: bool, claimed: bool) -> None:
            lifecycle.birth(
                self.slot,
                Binding(
                    owner=owner() if claimed else None,
                    seed=seed() if seeded else None,
                    origin=ORIGIN if claimed else None,
                ),
                now=self.now,
                idle_deadline=self.now + IDLE,
            )

        @rule()
        def record_incarnation(self) -> None:
            record = self.record()
            if record and record.window.entries:
                first = record.window.entries[0]
                lifecycle.write(
                    transitions.RECORD_INCARNATION,
                    record,
                    transitions.Launched(
                        incarnation=f"local:{self.slot}", launch=first.ref, now=self.now
                    ),
                )

        @precondition(lambda self: self.previous_state in SEED_STATES)
        @rule(succeeded=st.booleans(), attempt=st.sampled_from([1, 1, 2]))
        def settle_seed(self, succeeded: bool, attempt: int) -> None:
            record = self.record()
            if record:
                restores = [e for e in record.window.entries if e.kind is OpKind.RESTORE]
                restore = (
                    restores[-1].ref
                    if restores
                    else OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
                )
                lifecycle.write(
                    transitions.SETTLE_SEED,
                    record,
                    transitions.Verdict(
                        attempt=attempt if attempt == 1 else record.attempt,
                        restore=restore,
                        result=success() if succeeded else failure(),
                        now=self.now,
                    ),
                )

        @precondition(lambda self: self.previous_state is State.SEEDING)
        @rule()
        def a_lost_task_is_replaced(self) -> None:
            record = self.record()
            if record:
                outcome = lifecycle.write(
                    transitions.BEGIN_ATTEMPT, record, transitions.At(now=self.now)
                )
                if isinstance(outcome, Written):
                    assert outcome.record.attempt == record.attempt + 1
                    assert outcome.record.window.unsettled >= record.window.unsettled

        @rule(by_owner=st.booleans())
        def touch(self, by_owner: bool) -> None:
            record = self.record()
            if record:
                lifecycle.touch(
                    self.slot,
                    transitions.Poll(
                        Binding(
                            owner=record.owner if by_owner else owner(run="intruder"),
                            seed=record.seed,
                            origin=record.origin,
                        ),
                        now=self.now,
                        idle_deadline=self.now + IDLE,
                    ),
                )

        @rule(seconds=st.sampled_from([1, IDLE, IDLE + 1, 10 * IDLE]))
        def time_passes(self, seconds: int) -> None:
            self.now += seconds

        @rule()
        def fence(self) -> None:
            record = self.record()
            if record:
                outcome = lifecycle.write(transitions.FENCE, record, transitions.At(now=self.now))
                if isinstance(outcome, Written):
                    assert record.state is State.UNSEEDED
                    assert record.idle_deadline < self.now
                    assert record.window.unsettled == 0

        @precondition(lambda self: self.previous_state in {State.CLOSING, State.RETIRED})
        @rule()
        def retire(self) -> None:
            record = self.record()
            stops = [e for e in record.window.entries if e.kind is OpKind.STOP] if record else []
            if record and stops:
                stop = stops[-1].ref
                lifecycle.write(
                    transitions.RETIRE,
                    record,
                    transitions.Stopped(stop=stop, now=self.now, expires_at=self.now + 86_400),
                )

        @rule()
        def everything_in_flight_settles(self) -> None:
            record = self.record()
            while record and record.window.unsettled:
                entry = next(e for e in record.window.entries if not e.settled)
                outcome = lifecycle.write(
                    transitions.SETTLE,
                    record,
                    transitions.Settlement(ref=entry.ref, outcome="ok", now=self.now),
                )
                record = outcome.record if isinstance(outcome, Written) else None

        @rule()
        def reserve(self) -> None:
            record = self.record()
            if record:
                lifecycle.write(
                    transitions.RESERVE,
                    record,
                    transitions.Reservation(
                        kind=OpKind.CHECKPOINT, actor=Actor.SEED_FN, now=self.now
                    ),
                )

        @rule(pick=st.integers(0, WINDOW_SIZE - 1), outcome=st.sampled_from(["ok", "failed"]))
        def settle(self, pick: int, outcome: str) -> None:
            record = self.record()
            if record and record.window.entries:
                # Mostly work still in flight; duplicates once everything has settled.
                entries = [e for e in record.window.entries if not e.settled]
                entries = entries or list(record.window.entries)
                entry = entries[pick % len(entries)]
                lifecycle.write(
                    transitions.SETTLE,
                    record,
                    transitions.Settlement(ref=entry.ref, outcome=outcome, now=self.now),
                )

        @rule()
        def a_stale_writer_tries_everything(self) -> None:
            """A record read earlier is replayed into every transition."""
            stale = self.stale
            current = self.record()
            if stale is None or current is None or stale.rev == current.rev:
                return
            attempts = [
                lifecycle.write(transitions.FENCE, stale, transitions.At(now=self.now)),
                lifecycle.write(
                    transitions.RESERVE,
                    stale,
                    transitions.Reservation(
                        kind=OpKind.CHECKPOINT, actor=Actor.SEED_FN, now=self.now
                    ),
                ),
                lifecycle.write(
                    transitions.RECORD_INCARNATION,
                    stale,
                    transitions.Launched(
                        incarnation="local:stale",
                        launch=OpRef(ordinal=1, actor=Actor.SEED_FN, generation=1),
                        now=self.now,
                    ),
                ),
            ]
            assert not any(isinstance(outcome, Written) for outcome in attempts)
            self.stale = current

        @rule(newer=st.booleans(), dice=st.integers(0, 7))
        def corrupt(self, newer: bool, dice: int) -> None:
            item = self.item()
            if dice or item is None or self.frozen is not None:
                return  # rare, so most runs explore the live protocol first
            rev = item.get("rev", 0)
            self.frozen = (
                {**slot_key(self.slot), "schema": 2, "rev": rev + 1}
                if newer
                else item | {"rev": rev + 1, "ops": "lost"}
            )
            table.put_item(Item=self.frozen)

        # -- invariants ----------------------------------------------------------------
        @invariant()
        def unsupported_and_malformed_records_are_never_written(self) -> None:
            if self.frozen is not None:
                assert self.item() == self.frozen

        @invariant()
        def rev_only_grows_and_the_window_holds(self) -> None:
            item = self.item()
            if self.frozen is not None or item is None:
                return
            classified = classify(self.slot, item)
            assert isinstance(classified, Supported), classified
            record = classified.record
            assert record.rev >= self.highest_rev
            self.highest_rev = record.rev
            assert record.window.unsettled <= WINDOW_SIZE
            for entry in record.window.entries:
                if entry.settled:
                    assert self.outcomes.setdefault(entry.ordinal, entry.outcome) == entry.outcome
            if record.state is State.CLOSING and self.previous_state is not State.CLOSING:
                assert self.previous_state not in NEVER_FENCED
                assert self.previous_state is State.UNSEEDED
            self.previous_state = record.state

    run_state_machine_as_test(
        LifecycleMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=25,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_lifecycle_state_machine(lifecycle: Lifecycle, table: Table) -> None:
    run_machine(lifecycle, table)


def test_conflicts_carry_the_current_record_not_a_guess(lifecycle: Lifecycle) -> None:
    """The outcome type the machine relies on: a lost write tells who won."""
    birth = lifecycle.birth(
        "rival", Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=NOW + IDLE
    )
    assert isinstance(birth, Written)
    again = lifecycle.birth(
        "rival",
        Binding(owner=owner(), seed=seed(), origin=ORIGIN),
        now=NOW,
        idle_deadline=NOW + IDLE,
    )
    assert again == Conflict(Supported(birth.record))
