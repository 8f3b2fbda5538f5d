"""A hypothesis state machine over the lifecycle module and its operation window, against
moto's conditional writes. Rules include stale writers and records corrupted or written
by a newer deployment; the invariants are the ones nothing may ever break.

One rule moves the protocol: an actor (the sweep, the slot task, a poll, time, the
platform, other work) makes a move, each drawn by weight, the actor the state waits on the
likeliest. A rule per actor or per transition spread each run too thin: Hypothesis
switches rules off per run (swarm testing) and reaching `parked` takes the sweep and the
slot task taking turns, so few runs got there. One derandomized run (and a second of short
walks from a stopping or a parked slot) now walks every state and every move of resume and
loss within the suite's time; `test_lifecycle_state_machine` checks that it did.

The platform stops the slot's task (SIGTERM, or SIGKILL with no chance to act): a stopping
task checkpoints and parks its slot, or records it lost; a task gone without a word is
found by the sweep, which records the loss. A parked slot's owner comes back: its seed
resumes the slot from the checkpoint, which is owed once the resumed attempt is seeded."""

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

from builders import (
    EXPIRED,
    IDLE,
    NOW,
    ORIGIN,
    checkpoint,
    failure,
    owner,
    seed,
    stored_in,
    success,
)
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import counts_for
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import WINDOW_SIZE, Actor, OpKind, OpRef
from seedkeeper.domain.record import (
    ENDED_STATES,
    LIVE_STATES,
    Loss,
    SlotRecord,
    State,
    Supported,
    classify,
    slot_key,
)
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Written, debt_key

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

# A fence (the only way to `closing`) leaves an idle cold slot, or a checkpointed one.
FENCED_FROM = {State.UNSEEDED, State.CHECKPOINTED}
# A running seeded slot: its task checkpoints when stopped, or the slot is recorded lost.
LOSABLE = frozenset({State.SEEDED, State.CHECKPOINTING, State.CHECKPOINTED})
# Who moves next: anyone, but likeliest whoever the state waits on (`waits_on`; first:
# the next step). Without this bias few runs got past `checkpointing`.
ACTORS = ["the sweep", "the slot task", "a poll", "time passes", "the platform", "other work"]
WAITS_ON: dict[State, list[str]] = {
    State.UNSEEDED: ["the sweep"] * 5,
    State.SEEDING: ["the slot task"] * 5,
    State.SEEDED: ["the sweep"] * 5,
    State.SEED_FAILED: ["a poll"] * 5,
    # The race the checkpoint path is about: the owner's poll against the checkpoint.
    State.CHECKPOINTING: ["the slot task"] * 3 + ["a poll"] * 2 + ["the platform"],
    State.CHECKPOINTED: ["the sweep"] * 3 + ["a poll"] * 3 + ["the platform"],
    State.CLOSING: ["the sweep"] * 5,
    State.RETIRED: ["the sweep"] * 5,
    # Its owner comes back (a seed resumes it).
    State.PARKED: ["a poll"] * 3 + ["the sweep"] * 2,
    State.LOST: ["the sweep"] * 5,  # nothing moves it: the sweep leaves it alone
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
# The owner's poll (then a thaw; on a parked slot, its seed resumes it), one whose thaw was
# lost (the seed function died after the touch), an intruder's, the owner's keepalive.
POLLS = ["owner", "owner-thaw-lost", "intruder", "keepalive"]
# What the slot's task may do, by the state it reads: mostly its next step, sometimes a
# late or misdirected one (refused or acknowledged). Repeated: likelier.
_TOO_LATE = ["record", "freeze", "fail", "thawed", "runs"]  # its task is stopped
TASK_MOVES: dict[State | str, list[str]] = {
    State.UNSEEDED: ["runs", "runs", "first-seeded", "lost", "record"],
    State.SEEDING: [
        "first-failed",
        "runs",
        "latest-seeded",
        "first-seeded",
        "latest-failed",
        "lost",
        "latest-wrong-kind",  # a snapshot's verdict on a resume, or the reverse: refused
    ],
    # A seeding slot that restores its parked checkpoint (`SlotRecord.resuming`).
    "resuming": [
        "latest-seeded",
        "runs",
        "latest-failed",
        "latest-wrong-kind",
        "first-seeded",  # the parked attempt's: superseded
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
    State.LOST: _TOO_LATE,
}
# A stopping task: mostly its next step (checkpoint, freeze, upload, park), or its
# checkpoint fails (lost), or it is killed before it is done.
STOP_MOVES = [*["next"] * 4, "fail", "dies"]
# The platform stops the task: with a SIGTERM (a stop timeout to act in), or kills it.
PLATFORM = ["sigterm", "sigterm", "sigkill"]
# The stop timeout, in the stopping task's moves: a seeded slot's task needs four to park
# it (ask, freeze, upload, park); with fewer, its budget runs out and the slot is lost.
# Mostly enough (first: what shrinking goes to).
BUDGETS = st.sampled_from([6, 1, 6, 3, 6, 0])
# Why a slot is lost: the sweep found its task stopped; its stopping task ran out of time
# or could not make a checkpoint that holds its work.
LOSS_REASONS = {"task-stopped", "stop-timeout", "stop-checkpoint-failed"}


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
# Every move of resume and loss some run wrote.
MOVED: set[str] = set()
MOVES = {
    "resume",
    "resumed-seed",
    "keepalive",
    "checkpoint-on-stop",
    "park-on-stop",
    "lost-by-the-task",
    "lost-by-the-sweep",
}


# Where a run starts. The whole protocol from a birth (or from a slot already seeded, so
# that runs reach the checkpoint path often); and, in a second run of short walks, the
# platform's stop and the owner's return, so that their moves are many whatever the first
# run draws.
STARTS = ["seeded", "cold", "seeding"]
RETURNS = ["stopping", "parked"]


def run_machine(
    lifecycle: Lifecycle, table: Table, starts: list[str], *, examples: int, steps: int
) -> None:
    class LifecycleMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.slot = f"machine-{next(_slots)}"
            self.now = NOW
            self.highest_rev = 0
            self.outcomes: dict[int, str | None] = {}
            self.previous: SlotRecord | None = None
            self.stale: SlotRecord | None = None
            self.frozen: dict[str, Any] | None = None  # a record this code may never write
            self.touched_until = 0  # the latest deadline an owner's poll set
            self.fenced_from: State | None = None
            self.current: SlotRecord | None = None  # as read after the last step
            self.acted = False  # `someone_acts` ran (see the adversaries' preconditions)
            self.stopping: str | None = None  # the incarnation the platform is stopping
            self.gone: str | None = None  # the incarnation whose task is gone
            self.budget = 0  # the stopping task's moves left before the platform ends it
            self.restored: set[str] = set()  # checkpoints a resume restored from
            self.owed: set[str] = set()  # ...and those found owed

        def teardown(self) -> None:
            # Each run's slot is its own. Left behind, it would slow every later birth: moto
            # runs a transaction on a copy of the whole table.
            table.delete_item(Key=slot_key(self.slot))
            for key in self.owed:
                table.delete_item(Key=debt_key(self.slot, key))

        # -- helpers -------------------------------------------------------------
        def item(self) -> dict[str, Any] | None:
            return table.get_item(Key=slot_key(self.slot), ConsistentRead=True).get("Item")

        def record(self) -> SlotRecord | None:
            """The record as read after the last step (the invariant's read: nothing has
            written since), None if it is not one this code may write."""
            self.stale = self.stale or self.current
            return self.current

        def poll(self, record: SlotRecord, *, by_owner: bool) -> Written | Conflict:
            touched = lifecycle.touch(self.slot, self.polled(record, by_owner=by_owner))
            if isinstance(touched, Written):
                self.touched_until = max(self.touched_until, self.now + IDLE)
            return touched

        def polled(self, record: SlotRecord, *, by_owner: bool) -> transitions.Poll:
            return transitions.Poll(
                Binding(
                    owner=record.owner if by_owner else owner(run="intruder"),
                    seed=record.seed,
                    origin=record.origin,
                ),
                now=self.now,
                idle_deadline=self.now + IDLE,
            )

        def stopped(self, record: SlotRecord) -> transitions.Stopping:
            assert record.incarnation is not None
            return transitions.Stopping(
                attempt=record.attempt, incarnation=record.incarnation, now=self.now
            )

        def lose(self, record: SlotRecord, reason: str) -> Written | None:
            """LOSE, with why; the loss's record kept as long as a park would be."""
            assert record.incarnation is not None
            loss = Loss(reason=reason, detail=f"{reason} at {self.now}", at=self.now)
            lost = transitions.Lost(
                incarnation=record.incarnation, loss=loss, expires_at=self.now + RETENTION
            )
            outcome = lifecycle.write(transitions.LOSE, record, lost)
            return outcome if isinstance(outcome, Written) else None

        @staticmethod
        def checkpoint_op(record: SlotRecord) -> OpRef:
            ops = [e for e in record.window.entries if e.kind is OpKind.CHECKPOINT]
            return (
                ops[-1].ref
                if ops
                else OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=record.attempt)
            )

        @staticmethod
        def open_checkpoint(record: SlotRecord) -> OpRef | None:
            return next(
                (
                    e.ref
                    for e in record.window.entries
                    if e.kind is OpKind.CHECKPOINT
                    and e.generation == record.attempt
                    and not e.settled
                ),
                None,
            )

        def waits_on(self, record: SlotRecord) -> list[str]:
            """The actors `record` waits on, repeated by how likely each is to move next."""
            task = ["the slot task"] * 5
            if record.incarnation is not None and record.state in LIVE_STATES:
                if record.incarnation == self.stopping:
                    return task * 2  # within its stop budget: checkpointing, then parking
                if record.incarnation == self.gone and record.state in LOSABLE:
                    return ["the sweep"] * 5  # to find it stopped
            if record.state is State.UNSEEDED and record.incarnation is None:
                return task  # to run: its launch settles, and only then may it be fenced
            checkpoint_open = any(
                e.kind is OpKind.CHECKPOINT and not e.settled for e in record.window.entries
            )
            if record.state is State.SEEDED and (checkpoint_open or record.frozen_at is not None):
                return task  # thawed by a poll: to resume its sandbox and abandon its checkpoint
            return WAITS_ON[record.state]

        # -- rules -------------------------------------------------------------------
        @initialize(
            start=st.sampled_from(starts),
            running=st.booleans(),
            claimed=st.booleans(),
            killed=st.booleans(),
            budget=BUDGETS,
        )
        def birth(
            self, start: str, running: bool, claimed: bool, killed: bool, budget: int
        ) -> None:
            """Born cold or seeding, its task perhaps `running` (its incarnation recorded);
            or already seeded (running, its restore settled), so that runs reach the
            checkpoint path often; or, a claimed slot brought there through the checkpoint
            path, already parked (so that runs reach its resume often), or seeded (asked
            to checkpoint if `running`) as the platform stops its task (with a stop
            `budget`), or has `killed` it."""
            incarnation = f"local:{self.slot}:1"
            if start in {"parked", "stopping"}:
                state = State.CHECKPOINTING if running else State.SEEDED
                record = stored_in(
                    lifecycle, self.slot, State.PARKED if start == "parked" else state, incarnation
                )
                # Idle already, unless its task is stopped before the sweep asks.
                self.now = NOW if record.state is State.SEEDED else EXPIRED
                if start == "stopping":
                    self.the_platform_stops(record, "sigkill" if killed else "sigterm", budget)
                return
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
                transitions.Launched(incarnation=incarnation, launch=born.entry.ref, now=self.now),
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
            waited_on = self.waits_on(record) if record else []
            actor = data.draw(st.sampled_from([*waited_on, *ACTORS]), label="actor")
            self.acted = True
            if actor == "time passes":
                self.now += data.draw(st.sampled_from(LATER), label="seconds")
            elif record is None:
                return
            elif actor == "the sweep":
                self.the_sweep_looks(record, data.draw(st.sampled_from(WHEN), label="when"))
            elif actor == "the platform":
                self.the_platform_stops(
                    record,
                    data.draw(st.sampled_from(PLATFORM), label="stop"),
                    data.draw(BUDGETS, label="budget"),
                )
            elif actor == "the slot task":
                self.the_slot_task(record, data)
            elif actor == "a poll":
                self.a_poll(record, data.draw(st.sampled_from(POLLS), label="poll"))
            else:
                self.other_work(
                    record,
                    data.draw(st.sampled_from(["reserve", "settle", "settle-all"]), label="work"),
                    data.draw(st.integers(0, WINDOW_SIZE - 1), label="pick"),
                    data.draw(st.sampled_from(["ok", "failed"]), label="outcome"),
                )

        def the_slot_task(self, record: SlotRecord, data: st.DataObject) -> None:
            """The task of the record's incarnation: stopping, gone, or at work."""
            ours = record.incarnation is not None and record.state in LIVE_STATES
            if ours and record.incarnation == self.stopping:
                self.the_stopping_task(record, data.draw(st.sampled_from(STOP_MOVES), label="move"))
                return
            if ours and record.incarnation == self.gone and record.state in LOSABLE:
                return  # nothing runs any more
            moves = TASK_MOVES["resuming" if record.resuming else record.state]
            move = data.draw(st.sampled_from(moves), label="move")
            if move in {"runs", "lost"} or move.startswith(("first", "latest")):
                self.the_birth_task(record, move)
            else:
                self.the_checkpointing_task(record, move)

        def a_poll(self, record: SlotRecord, poll: str) -> None:
            """A touch (the owner's, or an intruder's: refused). A sweep that reads the
            slot right after it finds it not idle. The seed function then moves a slot
            being checkpointed back to seeded (it tries any other state: the thaw refuses
            it), unless it died in between; on a parked slot (the touch refused) it
            resumes it for the owner. A keepalive is a touch without a seed."""
            if poll == "keepalive":
                keep = transitions.KeepAlive(
                    owner=record.owner, now=self.now, idle_deadline=self.now + IDLE
                )
                kept = lifecycle.keepalive(self.slot, keep, seeded=record.seed is not None)
                if isinstance(kept, Written):
                    assert record.state in LIVE_STATES
                    self.touched_until = max(self.touched_until, keep.idle_deadline)
                    MOVED.add("keepalive")
                    self.sweep_fences(kept.record)
                return
            by_owner = poll != "intruder"
            touched = self.poll(record, by_owner=by_owner)
            if isinstance(touched, Conflict):
                self.the_seed_resumes(record, by_owner=by_owner)
                return
            assert by_owner
            self.sweep_fences(touched.record)
            if poll == "owner":
                params = self.polled(touched.record, by_owner=True)
                thawed = lifecycle.write(transitions.THAW, touched.record, params)
                if isinstance(thawed, Written):
                    assert touched.record.state in transitions.CHECKPOINT_STATES

        def the_seed_resumes(self, record: SlotRecord, *, by_owner: bool) -> None:
            """The seed function on a slot its touch could not extend: a parked one is
            resumed from its checkpoint, for its owner alone."""
            params = self.polled(record, by_owner=by_owner)
            resumed = lifecycle.write(transitions.RESUME, record, params)
            if not isinstance(resumed, Written):
                return
            assert by_owner, "only the slot's owner resumes it"
            assert record.state is State.PARKED
            assert resumed.record.checkpoint is not None
            self.restored.add(resumed.record.checkpoint.key)
            self.touched_until = max(self.touched_until, params.idle_deadline)
            self.stopping = self.gone = None  # a new task, not yet launched
            MOVED.add("resume")

        def the_sweep_looks(self, record: SlotRecord, when: str) -> None:
            """The idle sweep reads the slot (mostly once its deadline has passed: `late`,
            or exactly at it) and writes what its state allows: a checkpoint request, a
            fence or a park fence; on `closing`, after the stop, it parks or retires. A
            running seeded slot whose task it finds stopped is recorded lost, unless its
            checkpoint counts (that one is parked). `raced`: the owner's poll comes between
            the sweep's read and its write, and wins."""
            if when != "now":
                past = 0 if when == "at-deadline" else 1
                self.now = max(self.now, record.idle_deadline + past)
            if record.state in {State.CLOSING, *ENDED_STATES}:
                self.finish(record)
                return
            gone = record.incarnation is not None and record.incarnation == self.gone
            counts = counts_for(
                record.checkpoint, owner=record.owner, incarnation=record.incarnation, now=self.now
            )
            expired = record.idle_deadline < self.now
            parkable = record.state is State.CHECKPOINTED and counts
            if gone and expired and record.state in LOSABLE and not parkable:
                if self.lose(record, "task-stopped") is not None:
                    MOVED.add("lost-by-the-sweep")
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

        def the_platform_stops(self, record: SlotRecord, how: str, budget: int) -> None:
            """The platform stops the slot's task: SIGTERM gives a running seeded slot's
            task `budget` moves to checkpoint in (any other task just exits, as one
            stopped by the sweep itself does); SIGKILL ends it with no word."""
            incarnation = record.incarnation
            if incarnation is None or incarnation == self.gone:
                return  # no task known to stop
            if how == "sigterm" and record.state in LOSABLE:
                self.stopping, self.budget = incarnation, budget
            else:
                self.gone = incarnation

        def the_stopping_task(self, record: SlotRecord, move: str) -> None:
            """The supervisor within its stop budget: its next step, or its capture or
            upload fails (there is no time to try again), or it is killed on the way.
            Its budget spent, it records the loss."""
            if self.budget == 0:
                self.gives_up(record, "stop-timeout")
                return
            self.budget -= 1
            if move == "dies":
                self.gone = record.incarnation
            elif move == "fail":
                self.gives_up(record, "stop-checkpoint-failed")
            else:
                self.next_stop_step(record, self.open_checkpoint(record))

        def next_stop_step(self, record: SlotRecord, op: OpRef | None) -> None:
            """Works on its open checkpoint (its own, or the sweep's): freezes, uploads;
            then parks, if the checkpoint holds the work (the table decides), or asks for
            its own; with neither, the loss is recorded."""
            if op is not None and record.state is State.CHECKPOINTING and not record.frozen_at:
                freezing = transitions.Freezing(attempt=record.attempt, op=op, now=self.now)
                lifecycle.write(transitions.FREEZE, record, freezing)
                return
            if op is not None:
                self.the_checkpointing_task(record, "record")
                return
            if record.checkpoint is not None:
                parked = lifecycle.write(transitions.PARK_ON_STOP, record, self.stopped(record))
                if isinstance(parked, Written):
                    MOVED.add("park-on-stop")
                    self.gone = record.incarnation
                    return
            if record.state is State.SEEDED:
                asked = lifecycle.write(
                    transitions.CHECKPOINT_ON_STOP, record, self.stopped(record)
                )
                if isinstance(asked, Written):
                    MOVED.add("checkpoint-on-stop")
            else:  # checkpointed, not parked: lost (refused if its checkpoint counts)
                self.gives_up(record, "stop-checkpoint-failed")

        def gives_up(self, record: SlotRecord, reason: str) -> None:
            """The stopping task records its slot lost, and goes."""
            if self.lose(record, reason) is not None:
                MOVED.add("lost-by-the-task")
            self.gone = record.incarnation

        def the_birth_task(self, record: SlotRecord, move: str) -> None:
            """It runs (its incarnation recorded), gives its verdict (the first attempt's,
            perhaps superseded, or the latest's: restored from the checkpoint when it
            resumes), or is lost and replaced."""
            restores = [e for e in record.window.entries if e.kind is OpKind.RESTORE]
            if move == "runs":
                if record.window.entries:
                    launch = restores[-1] if restores else record.window.entries[0]
                    lifecycle.write(
                        transitions.RECORD_INCARNATION,
                        record,
                        transitions.Launched(
                            incarnation=f"local:{self.slot}:{launch.generation}",
                            launch=launch.ref,
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
                    assert outcome.record.checkpoint == record.checkpoint
                return
            restore = (
                restores[-1].ref
                if restores
                else OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
            )
            resumed = record.resuming != (move == "latest-wrong-kind")
            outcome = lifecycle.write(
                transitions.SETTLE_SEED,
                record,
                transitions.Verdict(
                    attempt=1 if move.startswith("first") else record.attempt,
                    restore=restore,
                    result=failure() if move.endswith("failed") else success(resumed=resumed),
                    now=self.now,
                ),
            )
            if isinstance(outcome, Written):
                assert record.state is State.SEEDING
                assert move != "latest-wrong-kind", "a verdict of the other kind"
                if record.resuming and outcome.record.state is State.SEEDED:
                    MOVED.add("resumed-seed")

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
            transition (a resumed verdict with its debt too: neither is written)."""
            stale, current = self.stale, self.record()
            assert stale is not None
            assert current is not None
            at = transitions.At(now=self.now)
            incarnation = stale.incarnation or "local:stale"
            stopping = transitions.Stopping(stale.attempt, incarnation, now=self.now)
            loss = Loss(reason="task-stopped", detail="stale", at=self.now)
            restores = [e for e in stale.window.entries if e.kind is OpKind.RESTORE]
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
                lifecycle.write(transitions.RESUME, stale, self.polled(stale, by_owner=True)),
                lifecycle.write(transitions.CHECKPOINT_ON_STOP, stale, stopping),
                lifecycle.write(transitions.PARK_ON_STOP, stale, stopping),
                lifecycle.write(
                    transitions.LOSE,
                    stale,
                    transitions.Lost(incarnation, loss, expires_at=self.now + RETENTION),
                ),
            ]
            if stale.resuming and restores:
                owed = set(lifecycle.debts(self.slot))
                verdict = transitions.Verdict(
                    stale.attempt, restores[-1].ref, success(resumed=True), now=self.now
                )
                attempts.append(lifecycle.write(transitions.SETTLE_SEED, stale, verdict))
                assert set(lifecycle.debts(self.slot)) == owed, "a lost write owes nothing"
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
            previous, self.previous = self.previous, record
            # rev only grows, the window holds, settled outcomes never change.
            assert record.rev >= self.highest_rev
            self.highest_rev = record.rev
            assert record.window.unsettled <= WINDOW_SIZE
            for entry in record.window.entries:
                if entry.settled:
                    assert self.outcomes.setdefault(entry.ordinal, entry.outcome) == entry.outcome
            REACHED.add(record.state)
            if record.state in ENDED_STATES:
                assert record.frozen_at is None  # no task left to be frozen
            self.superseded_checkpoints_are_owed(record)
            if previous is None or previous.state is record.state:
                self.a_parked_slot_is_kept(record)
                return
            # A move: each state entered only the way it may be.
            if record.state is State.CLOSING:
                # Fenced: only an idle cold slot or a checkpointed one, never while an
                # owner's poll holds it.
                assert previous.state in FENCED_FROM
                assert self.now > self.touched_until
                self.fenced_from = previous.state
            if record.state is State.PARKED:
                self.parked_only_with_its_work_verified(previous, record)
            if record.state is State.LOST:
                self.lost_only_when_its_work_is_gone(previous, record)
            if record.state is State.RETIRED:
                assert self.fenced_from is State.UNSEEDED
            if record.state is State.CHECKPOINTED:
                assert record.checkpoint is not None
            if previous.state is State.PARKED:
                # Resumed: a new attempt restoring what was parked, no task of it yet.
                assert record.state is State.SEEDING
                assert record.resuming
                assert record.checkpoint == previous.checkpoint
                assert record.attempt == previous.attempt + 1
                assert record.incarnation is None
            self.a_parked_slot_is_kept(record)

        def a_parked_slot_is_kept(self, record: SlotRecord) -> None:
            """A parked slot names its owner's checkpoint of its last incarnation, still
            kept (no run lasts as long as the retention), and is kept no less long."""
            if record.state is not State.PARKED:
                return
            assert record.checkpoint is not None
            assert counts_for(
                record.checkpoint, owner=record.owner, incarnation=record.incarnation, now=self.now
            )
            assert record.expires_at is not None
            assert record.expires_at >= record.checkpoint.expires_at

        def parked_only_with_its_work_verified(
            self, previous: SlotRecord, record: SlotRecord
        ) -> None:
            """Through the sweep's park fence, or by the stopping task itself with a
            checkpoint captured since it froze the sandbox (never resumed since)."""
            if previous.state is State.CLOSING:
                assert self.fenced_from is State.CHECKPOINTED
                return
            assert previous.state in {State.CHECKPOINTED, State.SEEDED}
            assert previous.incarnation == self.stopping
            checkpoint = previous.checkpoint
            assert checkpoint is not None
            assert previous.frozen_at is not None
            assert checkpoint.created_at >= previous.frozen_at
            assert record.checkpoint == checkpoint

        def lost_only_when_its_work_is_gone(self, previous: SlotRecord, record: SlotRecord) -> None:
            """From a running seeded slot whose task was stopped, never a checkpointed one
            whose checkpoint counts (that one is parked); and it says why."""
            assert previous.state in LOSABLE
            assert record.loss is not None
            assert record.loss.reason in LOSS_REASONS
            assert record.incarnation in {self.stopping, self.gone}
            assert record.window.unsettled == 0
            counted = counts_for(
                previous.checkpoint,
                owner=previous.owner,
                incarnation=previous.incarnation,
                now=record.loss.at,
            )
            assert not (previous.state is State.CHECKPOINTED and counted), "parked, never lost"

        def superseded_checkpoints_are_owed(self, record: SlotRecord) -> None:
            """A checkpoint a resume restored from is owed once the record stops naming
            it (its resumed attempt seeded), never while it is named."""
            named = {record.checkpoint.key} if record.checkpoint else set()
            if record.resuming:
                self.restored |= named
            superseded = self.restored - named
            if superseded <= self.owed:
                return
            owed = set(lifecycle.debts(self.slot))
            assert superseded <= owed, "a superseded checkpoint is owed"
            assert not named & owed, "a checkpoint still named is never owed"
            assert record.state is State.SEEDED  # owed by the resumed seed's own write
            self.owed = owed

    run_state_machine_as_test(
        LifecycleMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_lifecycle_state_machine(lifecycle: Lifecycle, table: Table) -> None:
    run_machine(lifecycle, table, STARTS, examples=100, steps=25)
    run_machine(lifecycle, table, RETURNS, examples=30, steps=10)
    assert set(State) <= REACHED, "the machine never reached " + str(set(State) - REACHED)
    assert MOVES <= MOVED, "the machine never wrote " + str(MOVES - MOVED)


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
