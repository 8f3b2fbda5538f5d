"""A hypothesis state machine over the lifecycle module and its operation window, against
moto's conditional writes. Rules include stale writers and records corrupted or written
by a newer deployment; the invariants are the ones nothing may ever break.

One rule moves the protocol: an actor (the sweep, the slot task, a poll, time, other
work) makes a move, each drawn by weight, the actor the state waits on the likeliest.
A rule per actor or per transition spread each run too thin: Hypothesis switches rules
off per run (swarm testing) and reaching `parked` takes the sweep and the slot task
taking turns, so few runs got there. One derandomized run now walks every state within
the suite's time; `test_lifecycle_state_machine` checks that it did."""

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

from builders import IDLE, NOW, ORIGIN, checkpoint, failure, owner, seed, success
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import counts_for
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import WINDOW_SIZE, Actor, OpKind, OpRef
from seedkeeper.domain.record import (
    ENDED_STATES,
    SlotRecord,
    State,
    Supported,
    classify,
    slot_key,
)
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Written

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

# A fence (the only way to `closing`) leaves an idle cold slot, or a checkpointed one.
FENCED_FROM = {State.UNSEEDED, State.CHECKPOINTED}
# Who moves next: anyone, but likeliest whoever the state waits on (`waits_on`; first:
# the next step). Without this bias few runs got past `checkpointing`.
ACTORS = ["the sweep", "the slot task", "a poll", "time passes", "other work"]
WAITS_ON: dict[State, list[str]] = {
    State.UNSEEDED: ["the sweep"] * 5,
    State.SEEDING: ["the slot task"] * 5,
    State.SEEDED: ["the sweep"] * 5,
    State.SEED_FAILED: ["a poll"] * 5,
    # The race the checkpoint path is about: the owner's poll against the checkpoint.
    State.CHECKPOINTING: ["the slot task"] * 3 + ["a poll"] * 2,
    State.CHECKPOINTED: ["the sweep"] * 3 + ["a poll"] * 3,
    State.CLOSING: ["the sweep"] * 5,
    State.RETIRED: ["the sweep"] * 5,
    State.PARKED: ["the sweep"] * 5,
}
# Each list of moves starts with the next step: Hypothesis shrinks towards it, and its
# first runs (each choice its first) then walk the protocol to its ends.
# When the sweep looks: mostly after the slot's deadline, sometimes exactly at it or
# before; or `raced` by the owner's poll between its read and its write.
WHEN = [*["late"] * 4, "at-deadline", "now", "raced"]
# Seconds that pass between two moves. Never as long as a checkpoint is kept: a park
# fence's checkpoint expiring before the sweep parks the slot makes the sweep retire it,
# which breaks "retired only from unseeded" (an open question, not explored here).
LATER = [1, IDLE, IDLE + 1, 10 * IDLE]
# The owner's poll (then a thaw), one whose thaw was lost (the seed function died after
# the touch), or an intruder's.
POLLS = ["owner", "owner-thaw-lost", "intruder"]
# What the slot's task may do, by the state it reads: mostly its next step, sometimes a
# late or misdirected one (refused or acknowledged). Repeated: likelier.
_TOO_LATE = ["record", "freeze", "fail", "thawed", "runs"]  # its task is stopped
TASK_MOVES: dict[State, list[str]] = {
    State.UNSEEDED: ["runs", "runs", "first-seeded", "lost", "record"],
    State.SEEDING: [
        "first-failed",
        "first-seeded",
        "latest-seeded",
        "latest-failed",
        "runs",
        "lost",
    ],
    State.SEEDED: [
        "thawed-abandon",
        "thawed",
        "record",
        "fail",
        "freeze",
        "first-seeded",
        "runs",
    ],
    State.SEED_FAILED: ["first-failed", "first-seeded", "runs", "lost", "record"],
    State.CHECKPOINTING: [*["record"] * 3, *["freeze"] * 2, *["fail"] * 2, "thawed"],
    State.CHECKPOINTED: ["record", "freeze", "fail", "thawed", "thawed-abandon"],
    State.CLOSING: _TOO_LATE,
    State.RETIRED: _TOO_LATE,
    State.PARKED: _TOO_LATE,
}


def waits_on(record: SlotRecord) -> list[str]:
    """The actors `record` waits on, repeated by how likely each is to move next."""
    task = ["the slot task"] * 5
    if record.state is State.UNSEEDED and record.incarnation is None:
        return task  # to run: its launch settles, and only then may it be fenced
    checkpoint_open = any(
        e.kind is OpKind.CHECKPOINT and not e.settled for e in record.window.entries
    )
    if record.state is State.SEEDED and (checkpoint_open or record.frozen_at is not None):
        return task  # thawed by a poll: to resume its sandbox and abandon its checkpoint
    return WAITS_ON[record.state]


# Each sweep fence and the one state it may leave.
SWEEP_FENCES = {
    transitions.REQUEST_CHECKPOINT: State.SEEDED,
    transitions.FENCE: State.UNSEEDED,
    transitions.FENCE_PARK: State.CHECKPOINTED,
}
RETENTION = 30 * 86_400  # the checkpoints the slot task records are kept this long
TOMBSTONE = 86_400
_slots = itertools.count()
REACHED: set[State] = set()  # every state some run of the machine reached


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
            self.touched_until = 0  # the latest deadline an owner's poll set
            self.fenced_from: State | None = None
            self.current: SlotRecord | None = None  # as read after the last step
            self.acted = False  # `someone_acts` ran (see the adversaries' preconditions)

        def teardown(self) -> None:
            # Each run's slot is its own. Left behind, it would slow every later birth: moto
            # runs a transaction on a copy of the whole table.
            table.delete_item(Key=slot_key(self.slot))

        # -- helpers -------------------------------------------------------------
        def item(self) -> dict[str, Any] | None:
            return table.get_item(Key=slot_key(self.slot), ConsistentRead=True).get("Item")

        def record(self) -> SlotRecord | None:
            """The record as read after the last step (the invariant's read: nothing has
            written since), None if it is not one this code may write."""
            self.stale = self.stale or self.current
            return self.current

        def poll(self, record: SlotRecord, *, by_owner: bool) -> Written | Conflict:
            poll = transitions.Poll(
                Binding(
                    owner=record.owner if by_owner else owner(run="intruder"),
                    seed=record.seed,
                    origin=record.origin,
                ),
                now=self.now,
                idle_deadline=self.now + IDLE,
            )
            touched = lifecycle.touch(self.slot, poll)
            if isinstance(touched, Written):
                self.touched_until = max(self.touched_until, poll.idle_deadline)
            return touched

        @staticmethod
        def checkpoint_op(record: SlotRecord) -> OpRef:
            ops = [e for e in record.window.entries if e.kind is OpKind.CHECKPOINT]
            return (
                ops[-1].ref
                if ops
                else OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=record.attempt)
            )

        # -- rules -------------------------------------------------------------------
        @initialize(
            start=st.sampled_from(["seeded", "cold", "seeding"]),
            running=st.booleans(),
            claimed=st.booleans(),
        )
        def birth(self, start: str, running: bool, claimed: bool) -> None:
            """Born cold or seeding, its task perhaps `running` (its incarnation recorded);
            or already seeded (running, its restore settled), so that runs reach the
            checkpoint path often."""
            born = lifecycle.birth(
                self.slot,
                Binding(
                    owner=owner() if claimed else None,
                    seed=seed() if start != "cold" else None,
                    origin=ORIGIN if claimed else None,
                ),
                now=self.now,
                idle_deadline=self.now + IDLE,
            )
            assert isinstance(born, Written)
            assert born.entry is not None
            if not running and start != "seeded":
                return
            launched = lifecycle.write(
                transitions.RECORD_INCARNATION,
                born.record,
                transitions.Launched(
                    incarnation=f"local:{self.slot}", launch=born.entry.ref, now=self.now
                ),
            )
            assert isinstance(launched, Written)
            if start == "seeded":
                verdict = transitions.Verdict(
                    attempt=1, restore=born.entry.ref, result=success(), now=self.now
                )
                assert isinstance(
                    lifecycle.write(transitions.SETTLE_SEED, launched.record, verdict), Written
                )

        @rule(data=st.data())
        def someone_acts(self, data: st.DataObject) -> None:
            """One actor's move: the actor drawn (`ACTORS`, `WAITS_ON`), then its move."""
            record = self.record()
            waited_on = waits_on(record) if record else []
            actor = data.draw(st.sampled_from([*waited_on, *ACTORS]), label="actor")
            self.acted = True
            if actor == "time passes":
                self.now += data.draw(st.sampled_from(LATER), label="seconds")
            elif record is None:
                return
            elif actor == "the sweep":
                self.the_sweep_looks(record, data.draw(st.sampled_from(WHEN), label="when"))
            elif actor == "the slot task":
                move = data.draw(st.sampled_from(TASK_MOVES[record.state]), label="move")
                if move in {"runs", "lost"} or move.startswith(("first", "latest")):
                    self.the_birth_task(record, move)
                else:
                    self.the_checkpointing_task(record, move)
            elif actor == "a poll":
                self.a_poll(record, data.draw(st.sampled_from(POLLS), label="poll"))
            else:
                self.other_work(
                    record,
                    data.draw(st.sampled_from(["reserve", "settle", "settle-all"]), label="work"),
                    data.draw(st.integers(0, WINDOW_SIZE - 1), label="pick"),
                    data.draw(st.sampled_from(["ok", "failed"]), label="outcome"),
                )

        def a_poll(self, record: SlotRecord, poll: str) -> None:
            """A touch (the owner's, or an intruder's: refused). A sweep that reads the
            slot right after it finds it not idle. The seed function then moves a slot
            being checkpointed back to seeded (it tries any other state: the thaw refuses
            it), unless it died in between."""
            touched = self.poll(record, by_owner=poll != "intruder")
            if isinstance(touched, Written):
                assert poll != "intruder"
                self.sweep_fences(touched.record)
                if poll == "owner":
                    params = transitions.Poll(
                        touched.record.binding, now=self.now, idle_deadline=self.now + IDLE
                    )
                    thawed = lifecycle.write(transitions.THAW, touched.record, params)
                    if isinstance(thawed, Written):
                        assert touched.record.state in transitions.CHECKPOINT_STATES

        def the_sweep_looks(self, record: SlotRecord, when: str) -> None:
            """The idle sweep reads the slot (mostly once its deadline has passed: `late`,
            or exactly at it) and writes what its state allows: a checkpoint request, a
            fence or a park fence; on `closing`, after the stop, it parks or retires.
            `raced`: the owner's poll comes between the sweep's read and its write, and
            wins."""
            if when != "now":
                past = 0 if when == "at-deadline" else 1
                self.now = max(self.now, record.idle_deadline + past)
            if record.state in {State.CLOSING, *ENDED_STATES}:
                self.finish(record)
                return
            raced = when == "raced" and isinstance(self.poll(record, by_owner=True), Written)
            self.sweep_fences(record, raced=raced)

        def sweep_fences(self, record: SlotRecord, *, raced: bool = False) -> None:
            """The sweep's fences on `record` as read: at most its state's one is written,
            only when idle, nothing in flight, and no poll since (or `raced`) holds it."""
            for fence, source in SWEEP_FENCES.items():
                outcome = lifecycle.write(fence, record, transitions.At(now=self.now))
                if isinstance(outcome, Written):
                    assert not raced, "a touch between the sweep's read and write wins"
                    assert record.state is source
                    assert record.idle_deadline < self.now
                    assert self.now > self.touched_until, "a touched slot is never fenced"
                    assert record.window.unsettled == 0

        def finish(self, record: SlotRecord) -> None:
            """After the stop, as the sweep decides: park the slot when its checkpoint
            counts (never for less long than the checkpoint is kept), else retire it;
            again on an ended one (acknowledged)."""
            stops = [e for e in record.window.entries if e.kind is OpKind.STOP]
            if not stops:
                return
            stop = stops[-1].ref
            if record.checkpoint is None or not counts_for(
                record.checkpoint, owner=record.owner, incarnation=record.incarnation, now=self.now
            ):
                lifecycle.write(
                    transitions.RETIRE,
                    record,
                    transitions.Stopped(stop=stop, now=self.now, expires_at=self.now + TOMBSTONE),
                )
                return
            kept = record.checkpoint.expires_at
            too_short = transitions.Parked(stop=stop, now=self.now, expires_at=kept - 1)
            assert not isinstance(lifecycle.write(transitions.PARK, record, too_short), Written)
            lifecycle.write(
                transitions.PARK,
                record,
                transitions.Parked(stop=stop, now=self.now, expires_at=kept + TOMBSTONE),
            )

        def the_birth_task(self, record: SlotRecord, move: str) -> None:
            """It runs (its incarnation recorded), gives its verdict (the first attempt's,
            perhaps superseded, or the latest's), or is lost and replaced."""
            if move == "runs":
                if record.window.entries:
                    lifecycle.write(
                        transitions.RECORD_INCARNATION,
                        record,
                        transitions.Launched(
                            incarnation=f"local:{self.slot}",
                            launch=record.window.entries[0].ref,
                            now=self.now,
                        ),
                    )
                return
            if move == "lost":
                outcome = lifecycle.write(
                    transitions.BEGIN_ATTEMPT, record, transitions.At(now=self.now)
                )
                if isinstance(outcome, Written):
                    assert record.state is State.SEEDING
                    assert outcome.record.attempt == record.attempt + 1
                    assert outcome.record.window.unsettled >= record.window.unsettled
                return
            restores = [e for e in record.window.entries if e.kind is OpKind.RESTORE]
            restore = (
                restores[-1].ref
                if restores
                else OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
            )
            outcome = lifecycle.write(
                transitions.SETTLE_SEED,
                record,
                transitions.Verdict(
                    attempt=1 if move.startswith("first") else record.attempt,
                    restore=restore,
                    result=failure() if move.endswith("failed") else success(),
                    now=self.now,
                ),
            )
            if isinstance(outcome, Written):
                assert record.state is State.SEEDING

        def the_checkpointing_task(self, record: SlotRecord, move: str) -> None:
            """The supervisor on its checkpoint op: freezes, has the checkpoint function
            record its checkpoint (after one of another owner and one of another task,
            refused) or its failure, or reports the sandbox thawed after a touch
            (abandoning the op, or not)."""
            op = self.checkpoint_op(record)
            if move == "freeze":
                outcome = lifecycle.write(
                    transitions.FREEZE,
                    record,
                    transitions.Freezing(attempt=record.attempt, op=op, now=self.now),
                )
                if isinstance(outcome, Written):
                    assert record.state is State.CHECKPOINTING
            elif move == "fail":
                outcome = lifecycle.write(
                    transitions.CHECKPOINT_FAILED,
                    record,
                    transitions.CheckpointFailed(op=op, reason="http-403", now=self.now),
                )
                if isinstance(outcome, Written):
                    assert outcome.record.state is State.SEEDED
                    assert outcome.record.idle_deadline > self.now  # asked again later
            elif move.startswith("thawed"):
                outcome = lifecycle.write(
                    transitions.THAWED,
                    record,
                    transitions.Thawed(
                        attempt=record.attempt,
                        op=op if move == "thawed-abandon" else None,
                        now=self.now,
                    ),
                )
                if isinstance(outcome, Written):
                    assert record.state is State.SEEDED
            else:
                # Another owner's checkpoint, or another task's, is never recorded.
                made = checkpoint(
                    key=f"checkpoints/{self.slot}/{op.ordinal}.sqsh",
                    owner=record.owner,
                    incarnation=record.incarnation or "local:none",
                    created_at=self.now,
                    expires_at=self.now + RETENTION,
                )
                for misdirected in (
                    made.model_copy(update={"owner": owner(run="intruder")}),
                    made.model_copy(update={"incarnation": "local:another"}),
                ):
                    uploaded = transitions.Uploaded(checkpoint=misdirected, upload=op, now=self.now)
                    outcome = lifecycle.write(transitions.RECORD_CHECKPOINT, record, uploaded)
                    assert not isinstance(outcome, Written)
                lifecycle.write(
                    transitions.RECORD_CHECKPOINT,
                    record,
                    transitions.Uploaded(checkpoint=made, upload=op, now=self.now),
                )

        def other_work(self, record: SlotRecord, action: str, pick: int, outcome: str) -> None:
            """A launch reserved; one operation settled (mostly work still in flight,
            duplicates once everything has settled); or everything in flight settled."""
            if action == "reserve":
                lifecycle.write(
                    transitions.RESERVE,
                    record,
                    transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=self.now),
                )
            elif action == "settle" and record.window.entries:
                entries = [e for e in record.window.entries if not e.settled]
                entries = entries or list(record.window.entries)
                entry = entries[pick % len(entries)]
                lifecycle.write(
                    transitions.SETTLE,
                    record,
                    transitions.Settlement(ref=entry.ref, outcome=outcome, now=self.now),
                )
            elif action == "settle-all":
                current: SlotRecord | None = record
                while current and current.window.unsettled:
                    entry = next(e for e in current.window.entries if not e.settled)
                    settled = lifecycle.write(
                        transitions.SETTLE,
                        current,
                        transitions.Settlement(ref=entry.ref, outcome="ok", now=self.now),
                    )
                    current = settled.record if isinstance(settled, Written) else None

        # The adversaries wait for a first move: a run in which swarm testing switched
        # `someone_acts` off then has no rule to start with and is dropped at once,
        # rather than spent on stale writers and corruption alone.
        @precondition(
            lambda self: (
                None not in (self.stale, self.current) and self.stale.rev != self.current.rev
            )
        )
        @rule()
        def a_stale_writer_tries_everything(self) -> None:
            """A record read earlier, since written over, is replayed into every
            transition."""
            stale, current = self.stale, self.record()
            assert stale is not None
            assert current is not None
            at = transitions.At(now=self.now)
            attempts = [
                *(lifecycle.write(fence, stale, at) for fence in SWEEP_FENCES),
                lifecycle.write(
                    transitions.RESERVE,
                    stale,
                    transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=self.now),
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

        @precondition(lambda self: self.acted and self.frozen is None)
        @rule(newer=st.booleans(), dice=st.integers(0, 15))
        def corrupt(self, newer: bool, dice: int) -> None:
            if dice:
                return  # rare, so most runs explore the live protocol first
            item = self.item()
            if item is None:
                return
            rev = item.get("rev", 0)
            self.frozen = (
                {**slot_key(self.slot), "schema": 2, "rev": rev + 1}
                if newer
                else item | {"rev": rev + 1, "ops": "lost"}
            )
            table.put_item(Item=self.frozen)

        # -- invariants ----------------------------------------------------------------
        @invariant()
        def nothing_breaks_what_was_promised(self) -> None:
            """One read per step: the invariants share it."""
            item = self.item()
            self.current = None
            # Unsupported and malformed records are never written.
            if self.frozen is not None:
                assert item == self.frozen
                return
            if item is None:
                return
            classified = classify(self.slot, item)
            assert isinstance(classified, Supported), classified
            record = self.current = classified.record
            # rev only grows, the window holds, settled outcomes never change.
            assert record.rev >= self.highest_rev
            self.highest_rev = record.rev
            assert record.window.unsettled <= WINDOW_SIZE
            for entry in record.window.entries:
                if entry.settled:
                    assert self.outcomes.setdefault(entry.ordinal, entry.outcome) == entry.outcome
            if record.state is State.CLOSING and self.previous_state is not State.CLOSING:
                # Fenced: only an idle cold slot or a checkpointed one, never while an
                # owner's poll holds it.
                assert self.previous_state in FENCED_FROM
                assert self.now > self.touched_until
                self.fenced_from = self.previous_state
            if record.state is State.PARKED:
                # Only a park fence leads here, and only with this owner's checkpoint of
                # this incarnation, kept at least as long as the record.
                assert self.fenced_from is State.CHECKPOINTED
                assert record.checkpoint is not None
                assert record.checkpoint.owner == record.owner
                assert record.checkpoint.incarnation == record.incarnation
                assert record.expires_at is not None
                assert record.expires_at >= record.checkpoint.expires_at
            if record.state is State.RETIRED:
                assert self.fenced_from is State.UNSEEDED
            if record.state is State.CHECKPOINTED:
                assert record.checkpoint is not None
            self.previous_state = record.state
            REACHED.add(record.state)

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
    assert set(State) <= REACHED, "the machine never reached " + str(set(State) - REACHED)


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
