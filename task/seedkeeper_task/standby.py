"""A standby's wait (DESIGN §12): a slot task started ahead, unassigned, asks the checkpoint
function what it is to do every `SEEDKEEPER_STANDBY_POLL` seconds (`POST /tasks/standby`,
signed as itself: only the task its item names is answered) until a seed takes it. It runs
nothing of anyone's meanwhile.

A pre-seeded standby first restores its generation, verified, exactly as a seed would
(`supervisor.SlotTask.prepare`), and says so; a seed of that generation then finds it ready.
Stopped while it waits, it tells the function it is leaving, so no seed takes it after.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from seedkeeper.domain.models import SeedIdentity
from seedkeeper.domain.opwindow import Actor, OpRef
from seedkeeper.domain.outcomes import RestoreGrant
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.standby import Generation, StandbyPlan
from seedkeeper.domain.task_api import StandbyAnswer, StandbyCall
from seedkeeper.observability import logger
from seedkeeper_task import function_url
from seedkeeper_task.launch import Prefetch
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.supervisor import Prepared, SlotTask
from seedkeeper_task.task_api import Refused, TaskApi


@dataclass(frozen=True)
class Assigned:
    plan: SlotPlan  # the attempt this task now runs
    prepared: bool  # its seed is the generation this task restored ahead


def wait(
    standby: StandbyPlan, api: TaskApi, settings: TaskSettings, stop: threading.Event
) -> Assigned | None:
    """Until assigned (the plan it now runs), or retired, refused or stopped (None: the
    task leaves, having run nothing)."""
    preseed = standby.preseed
    prepared: Prepared | None = None
    while True:
        call = StandbyCall(
            standby=standby.standby,
            resource=preseed.resource if preseed is not None else None,
            incarnation=api.incarnation,
            prepared=prepared is not None,
            leaving=stop.is_set(),
        )
        try:
            answer = api.standby(call)
        except Refused as refused:
            logger.info("standby refused", reason=refused.reason)
            return None
        except function_url.Unreachable as unreachable:  # tried again at the next poll
            logger.warning("standby call unanswered", why=str(unreachable))
            answer = StandbyAnswer(state="free")
            if stop.is_set():
                return None
        if answer.state == "assigned" and answer.plan is not None:
            plan = answer.plan
            held = (
                prepared is not None
                and plan.seed is not None
                and prepared.serves(plan.seed, plan.deps_path)
            )
            logger.info("standby assigned", slot=plan.slot, attempt=plan.attempt, prepared=held)
            return Assigned(plan, held)
        if answer.state == "retired" or stop.is_set():
            logger.info("standby leaves", state=answer.state)
            return None
        if answer.state == "preparing" and prepared is None:
            assert preseed is not None
            if answer.grant is not None:
                prepared = _prepare(preseed, answer.grant, api, settings, stop)
            if prepared is None:
                return None  # the sweep finds it gone, counts a start failure, replaces it
            continue  # says so at once
        stop.wait(settings.standby_poll)


def _prepare(
    generation: Generation,
    grant: RestoreGrant,
    api: TaskApi,
    settings: TaskSettings,
    stop: threading.Event,
) -> Prepared | None:
    """Restore the generation into the workspace, as a seed of it restores it (no owner,
    no origin yet: bound when assigned; its deps tree where a seed places it by default)."""
    seed = SeedIdentity(
        resource=generation.resource,
        ref=generation.ref,
        sha=generation.sha,
        checkout_backup_id=generation.checkout_backup_id,
        deps_backup_id=generation.deps_backup_id,
    )
    # A plan of no slot's: what the restore steps read (the seed, the deps path).
    op = OpRef(ordinal=1, actor=Actor.SLOT_TASK, generation=1)
    plan = SlotPlan(slot="standby", attempt=1, op=op, seed=seed)
    prefetch = Prefetch(grant, settings, stop)
    try:
        prepared = SlotTask(plan, settings, api, stop, prefetch=prefetch).prepare()
    finally:
        prefetch.close()
    logger.info("standby prepared" if prepared is not None else "standby not prepared")
    return prepared
