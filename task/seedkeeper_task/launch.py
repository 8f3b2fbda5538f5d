"""The slot task's first moments (`python -m seedkeeper_task`): start, and set the
archives downloading, before anything else is loaded.

The task tells the checkpoint function its incarnation (`start`) and is answered the
presigned GETs it restores from, with the size and sha256 the records name for each. The
downloads begin at once (`Prefetch`), in the background: the supervisor's modules (the
restore, the capture) and the reads that must precede the restore (the record, the
workspace's marker) all happen while the archives come. Nothing here needs them: this
module imports only the settings, the plan and the grant, the download, and the signed
call.

The downloads write only into the state folder's `downloads` (root's; an earlier
attempt's debris there is removed first, as the preflight would). A task that turns out
not to be the live attempt, or whose restore fails, stops them and waits for them to end
before it removes anything (`Prefetch.close`).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from seedkeeper.domain.caller import NOT_THIS_TASK
from seedkeeper.domain.outcomes import GrantedArchive, RestoreGrant
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.standby import STANDBY_VARIABLE, StandbyPlan
from seedkeeper.observability import logger
from seedkeeper_task import function_url
from seedkeeper_task.restore.download import download
from seedkeeper_task.sandbox import STATE_DIR, make_undumpable
from seedkeeper_task.settings import STOP_MARGIN, CheckpointSettings, TaskSettings
from seedkeeper_task.task_api import Refused, TaskApi

ArchiveName = Literal["checkout", "deps", "resume"]
ARCHIVES: tuple[ArchiveName, ...] = ("checkout", "deps", "resume")


class NotStarted(Exception):
    """The checkpoint function did not answer the start: the task ends without a verdict,
    and the owner's next poll starts a new attempt (bounded)."""


def start(plan: SlotPlan, api: TaskApi) -> RestoreGrant | None:
    """Claim this attempt at the checkpoint function (it records this task as the
    attempt's incarnation if none is yet) and take what to restore from. None: this task
    is not the attempt's (another task of it came first, or the record moved on): it
    touches nothing. A seed rotated out since the launch is granted nothing: the restore
    then fails as `seed-missing`, recorded."""
    body = {
        "slot": plan.slot,
        "attempt": plan.attempt,
        "incarnation": api.incarnation,
        "op": {"ordinal": plan.op.ordinal, "generation": plan.op.generation},
    }
    try:
        return RestoreGrant.model_validate(api.post("/tasks/start", body))
    except Refused as refused:
        if refused.reason == NOT_THIS_TASK:
            return None
        if refused.reason == "seed-missing":
            return RestoreGrant(expires_in=0)  # nothing granted: recorded as seed-missing
        logger.warning("start refused", reason=refused.reason)
    except function_url.Unreachable as unreachable:
        logger.warning("start unanswered", why=str(unreachable))
    raise NotStarted("the checkpoint function did not answer the start")


class Prefetch:
    """The granted archives, each downloading in its own thread from construction, into
    `<workspace>/<STATE_DIR>/downloads/<name>.sqsh`, verified against the grant's size and
    sha256. `result` waits for one; `close` stops them all and waits for them to end."""

    def __init__(self, grant: RestoreGrant, settings: TaskSettings, stop: threading.Event) -> None:
        self.grant = grant
        self.folder = settings.workspace / STATE_DIR / "downloads"
        granted = {name: getattr(grant, name) for name in ARCHIVES}
        wanted: dict[ArchiveName, GrantedArchive] = {
            name: archive for name, archive in granted.items() if archive is not None
        }
        self._cancel = _EitherSet(stop)
        self._pool = ThreadPoolExecutor(max(1, len(wanted)), thread_name_prefix="download")
        self._downloads: dict[str, Future[Path]] = {}
        if not wanted:
            return
        self._make_folder()
        deadline = time.monotonic() + settings.restore_timeout
        for name, archive in wanted.items():
            target = self.folder / f"{name}.sqsh"
            self._downloads[name] = self._pool.submit(
                self._download, archive, target, deadline, settings
            )

    def result(self, name: ArchiveName) -> Path:
        """The verified archive; raises DownloadFailed (KeyError when none was granted)."""
        return self._downloads[name].result()

    def close(self) -> None:
        """Stop every download and wait until none writes any more."""
        self._cancel.set()
        self._pool.shutdown(wait=True)

    def _make_folder(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)  # an earlier attempt's debris
        self.folder.mkdir(parents=True)
        # Searchable, not listable: the slot user's unsquashfs opens an archive by its name.
        for folder in (self.folder.parent, self.folder):
            folder.chmod(0o711)

    def _download(
        self, archive: GrantedArchive, target: Path, deadline: float, settings: TaskSettings
    ) -> Path:
        download(
            archive.url,
            target,
            size=archive.size,
            sha256=archive.sha256,
            deadline=deadline,
            parts=settings.download_parts,
            stall_timeout=settings.download_stall_timeout,
            max_retries=settings.download_retries,
            cancel=self._cancel,
        )
        return target


class _EitherSet(threading.Event):
    """Set when it is set or when `also` is: a cancel for work that must stop with the
    task as well as on its own account."""

    def __init__(self, also: threading.Event) -> None:
        super().__init__()
        self.also = also

    def is_set(self) -> bool:
        return super().is_set() or self.also.is_set()


def main() -> int:
    # First: the environment this process started with (plan, credentials) stays in its
    # memory, and the sandbox must not read it through /proc.
    make_undumpable()
    stop = threading.Event()
    for stopping in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stopping, lambda *_: stop.set())
    standing_by = os.environ.pop(STANDBY_VARIABLE, None)
    launched_for = os.environ.pop(PLAN_VARIABLE, None)
    settings = TaskSettings()
    checkpointing = CheckpointSettings()
    incarnation = settings.own_incarnation()
    logger.append_keys(incarnation=incarnation)
    if checkpointing.checkpoint_url is None or incarnation is None:
        logger.error("task not started", why="no checkpoint function or no incarnation")
        return 1
    # The task's one way to its record, its archives and R2: its own signed calls.
    api = TaskApi(
        checkpointing.checkpoint_url,
        "",  # a standby's slot is the one it is assigned
        incarnation,
        stop,
        stop_budget=checkpointing.stop_timeout - STOP_MARGIN,
    )
    prepared = False
    if standing_by is not None:
        from seedkeeper_task import standby  # noqa: PLC0415 - loaded before it is assigned

        waiting = StandbyPlan.from_env(standing_by)
        logger.append_keys(standby=waiting.standby)
        assigned = standby.wait(waiting, api, settings, stop)
        if assigned is None:
            return 0
        plan, prepared = assigned.plan, assigned.prepared
    elif launched_for is not None:
        plan = SlotPlan.from_env(launched_for)
    else:
        logger.error("task not started", why="no plan and no standby")
        return 1
    api.slot = plan.slot
    logger.append_keys(slot=plan.slot, attempt=plan.attempt)
    if prepared:
        # Restored ahead, verified: nothing to download (the record, read next, says
        # whether this task is still the attempt's).
        grant: RestoreGrant | None = RestoreGrant(expires_in=0)
    else:
        try:
            grant = start(plan, api)
        except NotStarted as unanswered:
            logger.error("task not started", why=str(unanswered))
            return 1
    if grant is None:
        logger.info("task not the attempt's: left")
        return 0
    logger.info("task started", seeded=plan.binding.seed is not None, prepared=prepared)
    prefetch = Prefetch(grant, settings, stop)
    try:
        from seedkeeper_task import supervisor  # noqa: PLC0415 - loaded while the archives come

        return supervisor.run(plan, settings, api, prefetch, stop)
    finally:
        prefetch.close()
