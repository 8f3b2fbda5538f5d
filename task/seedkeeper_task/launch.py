"""The slot task's first moments (`python -m seedkeeper_task`): start, and set the
archives downloading, before anything else is loaded.

The task tells the checkpoint function its incarnation (`start`) and is answered the
presigned GETs it restores from, with the size and sha256 the records name for each. The
downloads begin at once (`Prefetch`), in the background: the supervisor's modules (boto3's
DynamoDB resources, the stores, the capture), the table's client, and the reads that must
precede the restore (the record, the workspace's marker, the snapshot records) all happen
while the archives come. Nothing here needs them: this module imports only the settings,
the plan and the grant, the download, and the signed call.

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

from seedkeeper.domain.outcomes import GrantedArchive, RestoreGrant
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.observability import logger
from seedkeeper_task import function_url
from seedkeeper_task.restore.download import download
from seedkeeper_task.sandbox import STATE_DIR, make_undumpable
from seedkeeper_task.settings import CheckpointSettings, TaskSettings

ArchiveName = Literal["checkout", "deps", "resume"]
ARCHIVES: tuple[ArchiveName, ...] = ("checkout", "deps", "resume")
# The start's call: tried this many times, waiting 1, 2, 4... seconds between (a function
# being deployed, a throttle); each call bounded.
_START_TRIES = 5
_START_TIMEOUT = 30.0


class NotStarted(Exception):
    """The checkpoint function did not answer the start: the task ends without a verdict,
    and the owner's next poll starts a new attempt (bounded)."""


def start(plan: SlotPlan, incarnation: str | None, stop: threading.Event) -> RestoreGrant | None:
    """Claim this attempt at the checkpoint function (it records this task as the
    attempt's incarnation if none is yet) and take what to restore from. None: this task
    is not the attempt's (another task of it came first, or the record moved on): it
    touches nothing. A seed rotated out since the launch is granted nothing: the restore
    then fails as `seed-missing`, recorded."""
    url = CheckpointSettings().checkpoint_url
    if url is None or incarnation is None:
        raise NotStarted("no checkpoint function or no incarnation")
    body = {
        "slot": plan.slot,
        "attempt": plan.attempt,
        "incarnation": incarnation,
        "op": {"ordinal": plan.op.ordinal, "generation": plan.op.generation},
    }
    for attempt in range(_START_TRIES):
        if attempt and stop.wait(2 ** (attempt - 1)):
            break
        try:
            status, answer = function_url.post(
                url.rstrip("/") + "/tasks/start", body, timeout=_START_TIMEOUT
            )
        except function_url.Unreachable as unreachable:
            logger.warning("start unanswered", why=str(unreachable))
            continue
        if status == 200:
            return RestoreGrant.model_validate(answer)
        reason = answer.get("error")
        if reason == "no-match":
            return None
        if reason == "seed-missing":
            return RestoreGrant(expires_in=0)  # nothing granted: recorded as seed-missing
        logger.warning("start refused", status=status, reason=str(reason)[:64])
        if status < 500:
            break
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
    plan = SlotPlan.from_env(os.environ.pop(PLAN_VARIABLE))
    settings = TaskSettings()
    incarnation = settings.own_incarnation()
    logger.append_keys(slot=plan.slot, attempt=plan.attempt, incarnation=incarnation)
    try:
        grant = start(plan, incarnation, stop)
    except NotStarted as unanswered:
        logger.error("task not started", why=str(unanswered))
        return 1
    if grant is None:
        logger.info("task not the attempt's: left")
        return 0
    logger.info("task started", seeded=plan.binding.seed is not None)
    prefetch = Prefetch(grant, settings, stop)
    try:
        from seedkeeper_task import supervisor  # noqa: PLC0415 - loaded while the archives come

        return supervisor.run(plan, settings, prefetch, stop)
    finally:
        prefetch.close()
