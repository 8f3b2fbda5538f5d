"""Standby slots (DESIGN §12; `seedkeeper.domain.standby`).

`StandbyDesk` answers a standby's task at the checkpoint function (`POST /tasks/standby`),
which it asks every `SEEDKEEPER_STANDBY_POLL` seconds while it waits: only the task the item
names, signed as that task (`Caller`). Its first call reports it in (`free`, or for a
pre-seeded one `preparing`, with the GETs of its generation's archives); a pre-seeded one
says when its restore is verified (`prepared`); then it is answered `free` until a seed
takes it (`assigned`, with the slot plan it now runs) or it is retired.

`StandbyPool` is the sweep's part: it keeps each pool at its target, launching standbys
(the item first, then RunTask, then the task it answered) and retiring, then stopping,
those over age, superseded, surplus, never started or gone. A standby past its age is also
told to leave when it next asks: so is one of a pool no longer kept, which no sweep looks
at any more.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from seedkeeper.adapters.r2 import R2
from seedkeeper.adapters.runtime import SlotRuntime
from seedkeeper.domain.caller import NOT_THIS_TASK, Caller
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.standby import (
    BLANK_POOL,
    LIVE,
    Generation,
    PoolSettings,
    Standby,
    StandbyState,
    never_started,
    tend,
)
from seedkeeper.domain.task_api import StandbyAnswer, StandbyCall
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper.observability import count, logger
from seedkeeper.services.task_start import archives_grant
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper.store.standbys import StandbyStore

REFUSALS = (NOT_THIS_TASK,)
_ROUNDS = 3  # a standby's own moves race only the sweep's retirement and a seed's take


class StandbyDesk:
    def __init__(
        self,
        *,
        standbys: StandbyStore,
        snapshots: SnapshotStore,
        r2: R2 | None,
        presign_expiry: int,
        clock: Callable[[], int],
    ) -> None:
        self._standbys = standbys
        self._snapshots = snapshots
        self._r2 = r2
        self._presign_expiry = presign_expiry
        self._clock = clock

    def call(self, call: StandbyCall, caller: Caller) -> StandbyAnswer | Refused:
        if not caller.is_task(call.incarnation):
            return Refused(NOT_THIS_TASK)
        pool = call.resource or BLANK_POOL
        for _ in range(_ROUNDS):
            standby = self._standbys.read(pool, call.standby)
            if standby is None or standby.incarnation != call.incarnation:
                return Refused(NOT_THIS_TASK)
            answered = self._answer(standby, call)
            if answered is not None:
                return answered
        return StandbyAnswer(state="retired")  # it kept moving: the task leaves, unassigned

    def _answer(self, standby: Standby, call: StandbyCall) -> StandbyAnswer | None:
        """What `standby` is told, moving it first where its task's call says so. None: the
        move lost a race; the caller reads it again."""
        now = self._clock()
        state = standby.state
        if state is StandbyState.ASSIGNED:
            return StandbyAnswer(state="assigned", plan=standby.plan)
        if state is StandbyState.RETIRED:
            return StandbyAnswer(state="retired")
        if call.leaving or now >= standby.retire_at:
            moved = self._standbys.move(standby, StandbyState.RETIRED, from_states=LIVE, now=now)
            return StandbyAnswer(state="retired") if moved else None
        if state is StandbyState.STARTING:
            to = StandbyState.FREE if standby.preseed is None else StandbyState.PREPARING
            self._standbys.move(standby, to, from_states={StandbyState.STARTING}, now=now)
            return None  # read again: answered as it now is, whoever moved it
        if state is StandbyState.PREPARING:
            assert standby.preseed is not None
            if call.prepared:
                moved = self._standbys.move(
                    standby, StandbyState.FREE, from_states={StandbyState.PREPARING}, now=now
                )
                return StandbyAnswer(state="free") if moved else None
            return self._preparing(standby, standby.preseed, now)
        return StandbyAnswer(state="free")

    def _preparing(
        self, standby: Standby, generation: Generation, now: int
    ) -> StandbyAnswer | None:
        """The GETs of the generation the standby holds, while it is the resource's current
        one; a superseded one is retired (the sweep stops it)."""
        current = self._snapshots.read(generation.resource).current
        if current is None or Generation.of(current) != generation or self._r2 is None:
            moved = self._standbys.move(standby, StandbyState.RETIRED, from_states=LIVE, now=now)
            return StandbyAnswer(state="retired") if moved else None
        grant = archives_grant(
            self._r2, current.checkout, current.deps, expires_in=self._presign_expiry
        )
        return StandbyAnswer(state="preparing", grant=grant)


@dataclass
class PoolReport:
    launched: int = 0
    retired: int = 0
    stopped: int = 0
    start_failures: int = 0
    free: dict[str, int] = field(default_factory=dict)  # by pool, after this look


class StandbyPool:
    def __init__(
        self,
        *,
        standbys: StandbyStore,
        snapshots: SnapshotStore,
        runtime: Callable[[], SlotRuntime],
        settings: PoolSettings,
        clock: Callable[[], int],
    ) -> None:
        self._standbys = standbys
        self._snapshots = snapshots
        self._runtime = runtime
        self._settings = settings
        self._clock = clock

    def tend(self) -> PoolReport:
        """One look at every pool: the blank one, and each configured resource's."""
        report = PoolReport()
        settings = self._settings
        self._tend(BLANK_POOL, settings.pool, None, report)
        for resource, target in sorted(settings.preseeded.items()):
            current = self._snapshots.read(resource).current
            wanted = Generation.of(current) if current is not None else None
            self._tend(resource, target if wanted is not None else 0, wanted, report)
        if report.start_failures:
            count("StandbyStartFailures", report.start_failures)
        if report.free:  # a pool is kept, or was: how many wait now (each pool's: the log)
            count("StandbysFree", sum(report.free.values()))
        return report

    def _tend(self, pool: str, target: int, wanted: Generation | None, report: PoolReport) -> None:
        standbys = self._standbys.pool(pool)
        if not standbys and not target:
            return
        now = self._clock()
        gone = self._gone(standbys)
        plan = tend(
            standbys, target=target, wanted=wanted, settings=self._settings, gone=gone, now=now
        )
        # Retired ones are stopped, then forgotten: these, and those an earlier look (or a
        # standby's own call) retired whose stop is still to do.
        retired = [s for s in standbys if s.state is StandbyState.RETIRED]
        for standby in plan.retire:
            if self._standbys.move(standby, StandbyState.RETIRED, from_states=LIVE, now=now):
                report.retired += 1
                retired.append(standby)
                # One whose task stopped before it was free, or that never reported in, never
                # started: counted, alarmed on. Not one that moved meanwhile (a seed took it).
                report.start_failures += never_started(
                    standby, settings=self._settings, gone=gone, now=now
                )
        for standby in retired:
            report.stopped += self._stop(standby)
        for _ in range(plan.launch):
            if self._launch(wanted, now):
                report.launched += 1
            else:
                report.start_failures += 1
        report.free[pool] = sum(
            s.state is StandbyState.FREE and s not in plan.retire for s in standbys
        )

    def _gone(self, standbys: list[Standby]) -> frozenset[str]:
        """The live standbys whose task has stopped (an unknown one is not gone)."""
        asked = [s.incarnation for s in standbys if s.state in LIVE and s.incarnation is not None]
        if not asked:
            return frozenset()
        try:
            states = self._runtime().statuses(asked)
        except RuntimeUnavailable:
            return frozenset()
        return frozenset(i for i, state in states.items() if state.status is TaskStatus.STOPPED)

    def _launch(self, wanted: Generation | None, now: int) -> bool:
        """The item first (so a task can only ever be one recorded), then its task, then the
        task recorded. A launch that fails leaves the item starting without a task: given up
        after the start timeout."""
        standby = Standby(
            standby=secrets.token_hex(16),
            preseed=wanted,
            state=StandbyState.STARTING,
            launched_at=now,
            retire_at=now + self._settings.max_age,
        )
        if not self._standbys.register(standby):
            return False
        try:
            incarnation = self._runtime().launch_standby(standby.launch)
        except RuntimeUnavailable as unavailable:
            logger.warning("standby not launched", why=str(unavailable))
            return False
        return self._standbys.launched(standby, incarnation)

    def _stop(self, standby: Standby) -> int:
        """Stop a retired standby's task, then forget it (one never launched is just
        forgotten). A stop that fails is tried again at the next look."""
        if standby.incarnation is not None:
            try:
                self._runtime().stop(standby.incarnation)
            except RuntimeUnavailable:
                logger.warning("standby not stopped", standby=standby.standby)
                return 0
        self._standbys.forget(standby)
        return 1
