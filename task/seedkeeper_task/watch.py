"""The supervisor's watch of its own record, and the checkpoint it makes when asked
(DESIGN §10, steps 2, 3 and 5).

Every watch interval (30 s unless set, jittered so a fleet's reads spread) the supervisor
reads its record through the checkpoint function, its API (`task_api.TaskApi`): eventually
consistent (half a read unit; a stale answer only delays it by one interval, and every write
the function then makes for it is conditional on a consistent read). When the
sweep has asked for a checkpoint (`checkpointing`, an open `checkpoint` op of this attempt):

1. it records that the sandbox may be frozen (`FREEZE`: a poll says so from then on),
   stops every process of the slot user and syncs (`capture.freeze`);
2. captures the checkout as a zstd squashfs, credentials scrubbed from `.git/config`;
3. asks the checkpoint function for a presigned PUT, uploads, and asks it to verify and
   record the object (`checkpointed`). The sandbox stays frozen: nothing changes after
   the capture. Upload and record are retried with backoff; after the last failure the
   sandbox is resumed and the failure recorded (`/checkpoints/failed`: the slot is seeded
   again, asked again later, the failure counted).

While frozen it looks every `frozen_watch_interval` seconds (a poll waits on it), also during
the capture and the upload: a poll that came back (`seeded`) abandons the checkpoint, resumes
the sandbox (SIGCONT) and clears the record's `frozen_at` (`THAWED`).

When the platform stops the task (SIGTERM with no request of ours: Spot, retirement,
scale-in; DESIGN §10, step 7), `stopping` keeps the work if it can: within the stop budget
(`stop_timeout` less a margin for the last write) it checkpoints the slot (the sweep's open
request, else its own, `CHECKPOINT_ON_STOP`), then parks it (`PARK_ON_STOP`); when that fails
or the budget runs out, the record says the work is lost and why (`LOSE`). A checkpoint under
way when the stop comes goes on (only the budget cancels it). From the stop on, the sandbox
is never resumed: the platform ends the task, and nothing may change after a capture.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from seedkeeper.domain.caller import NOT_THIS_TASK
from seedkeeper.domain.checkpoints import MAX_CHECKPOINT_BYTES, retry_after
from seedkeeper.domain.opwindow import Actor, Operation, OpKind
from seedkeeper.domain.record import SlotRecord, State
from seedkeeper.domain.task_api import TaskWrite
from seedkeeper.observability import logger
from seedkeeper_task import function_url
from seedkeeper_task.capture import (
    Captured,
    CaptureFailed,
    FreezeFailed,
    UploadFailed,
    capture,
    freeze,
    thaw,
    upload,
)
from seedkeeper_task.settings import STOP_MARGIN, CheckpointSettings
from seedkeeper_task.slot_user import SlotUser
from seedkeeper_task.task_api import Refused, TaskApi

_CAPTURE = "checkpoint.sqsh"
_BACKOFF = 2.0  # seconds before the second try of an upload; doubled for each further one
# The states a stopping task checkpoints from; any other is left as it is (closing: the
# sweep's own stop, for a park or a retirement; ended; a seed with no verdict yet).
_KEPT_ON_STOP = frozenset({State.SEEDED, State.CHECKPOINTING, State.CHECKPOINTED})
LOST_ON_STOP = "checkpoint-failed-on-stop"
STOP_TIMEOUT = "stop-timeout"

Ending = Literal["checkpointed", "abandoned", "failed", "stopping", "superseded"]
StopEnding = Literal["parked", "lost", "left", "unrecorded"]


@dataclass(frozen=True)
class WatchSettings:
    """Which slot task watches, where its checkout is, and who its sandbox runs as."""

    slot: str
    attempt: int
    checkout: Path
    state_dir: Path
    user: SlotUser | None
    processors: int | None  # mksquashfs's threads (None: one per processor it sees)
    checkpointing: CheckpointSettings


class Abandoned(Exception):
    """A poll came back (or the record moved on) while the checkpoint was being made."""


class Watcher:
    def __init__(self, settings: WatchSettings, api: TaskApi, stop: threading.Event) -> None:
        self.settings = settings
        self.api = api
        self.stop = stop
        self.frozen = False
        self.sandbox_group: int | None = None  # the sandbox's process group, once it runs
        # After a failure it could not record, the record still asks: not before then.
        self._not_before = 0.0
        # Why the checkpoint under way when the stop came was not made: the stop's loss.
        self._failed_on_stop: _NotMade | None = None

    def interval(self) -> float:
        """Seconds to the next look: jittered by ±20 %, shorter while a poll may wait."""
        base = (
            self.settings.checkpointing.frozen_watch_interval
            if self.frozen
            else self.settings.checkpointing.watch_interval
        )
        return base * random.uniform(0.8, 1.2)  # noqa: S311 - spreading reads, not a secret

    def look(self) -> None:
        """Read the record once and do what it asks: checkpoint, resume, or nothing."""
        record = self._peek()
        if record is None or record.attempt != self.settings.attempt:
            return
        if self.frozen and record.state is State.SEEDED and self._came_back():
            self._thaw(None)
            return
        op = _open_checkpoint(record)
        asked = record.state is State.CHECKPOINTING and not self.frozen
        if op is not None and asked and time.monotonic() >= self._not_before:
            ending = self.checkpoint(record, op)
            logger.info("checkpoint ended", ending=ending)

    def checkpoint(self, record: SlotRecord, op: Operation) -> Ending:
        """Freeze, capture, upload, record. Any ending but `checkpointed` leaves the
        sandbox running and the record saying so, unless the task is stopped meanwhile:
        then the sandbox stays frozen and `stopping` settles the slot."""
        if not self.settings.checkpointing.checkpoint_url:
            # Nowhere to upload: nothing is stopped; the sweep retains the slot meanwhile.
            logger.warning("checkpoint asked for, but no checkpoint function is configured")
            return "failed"
        if not self._mark_frozen(record, op):
            return "superseded"  # touched or moved on before anything was stopped
        try:
            answer = self._capture_and_record(record, op)
        except Abandoned as abandoned:
            if self.stop.is_set():
                self._failed_on_stop = _NotMade("checkpoint-abandoned", str(abandoned))
                return "stopping"
            self._thaw(op)
            return "abandoned"
        except _NotMade as failed:
            if self.stop.is_set():
                self._failed_on_stop = failed
                return "stopping"
            return self._give_up(record, op, failed.reason, failed.detail)
        if answer.get("state") == State.SEEDED.value:
            self._thaw(None)  # recorded, but a poll came back meanwhile: it wants the work
        return "checkpointed"

    def _mark_frozen(self, record: SlotRecord, op: Operation) -> bool:
        """Record that the sandbox may be frozen (`FREEZE`), before anything is stopped."""
        if not self.api.freeze(self.settings.attempt, op.ref).done:
            return False
        self.frozen = True
        return True

    def _capture_and_record(self, record: SlotRecord, op: Operation) -> dict[str, Any]:
        """Stop the sandbox, capture the checkout, upload and record it: the record call's
        answer. Raises Abandoned (a poll came back, or the record moved on) or _NotMade."""
        settings = self.settings
        target = settings.state_dir / _CAPTURE
        try:
            with self._watching() as cancel:
                try:
                    freeze(settings.user, self.sandbox_group)
                    captured = capture(
                        settings.checkout,
                        target,
                        user=settings.user,
                        processors=settings.processors,
                        timeout=settings.checkpointing.checkpoint_timeout,
                        cancel=cancel,
                        max_bytes=MAX_CHECKPOINT_BYTES,
                    )
                    answer = self._upload_and_record(record, op, captured, cancel)
                except (FreezeFailed, CaptureFailed, _NotUploaded) as failed:
                    if not self.stop.is_set() and cancel.is_set():
                        raise Abandoned("touched") from None  # a poll came back meanwhile
                    if self.stop.is_set() and time.monotonic() >= self.api.stop_budget_end():
                        budget = settings.checkpointing.stop_timeout - STOP_MARGIN
                        detail = f"not done in the stop's {budget:g} s ({failed.reason})"
                        raise _NotMade(STOP_TIMEOUT, detail) from None
                    raise _NotMade(failed.reason, failed.detail[:300]) from None
        finally:
            target.unlink(missing_ok=True)
        logger.info("checkpoint recorded", size=captured.size, sha256=captured.sha256)
        return answer

    # -- a stop by the platform ----------------------------------------------------------

    def stopping(self) -> StopEnding:
        """The platform is stopping the task: keep the slot's work, or say it is lost.

        Read consistently: a record that is not this attempt's, or not seeded,
        checkpointing or checkpointed (closing: the sweep stops the task itself; ended), is
        left as it is. Otherwise park it on a checkpoint captured while frozen: the one
        already recorded, else a new one (`CHECKPOINT_ON_STOP`, or the sweep's open
        request), all within the stop budget; when that fails, `LOSE` with the reason."""
        self.api.stop_budget_end()  # the budget runs from the stop, not from the end of a look
        record = self.api.read()
        if (
            record is None
            or record.attempt != self.settings.attempt
            or record.state not in _KEPT_ON_STOP
            or record.incarnation is None
        ):
            logger.info("stopped: left", state=record.state.value if record else None)
            return "left"
        failed = self._failed_on_stop
        if failed is None and self.frozen and self._park():
            return "parked"  # its checkpoint was recorded while frozen, as it still is
        if failed is None:
            try:
                self._checkpoint_on_stop()
            except _NotMade as not_made:
                failed = not_made
        if failed is None:
            if self._park():
                return "parked"
            failed = _NotMade("park-refused", "the checkpoint was recorded, the park refused")
        return self._lose(failed)

    def _checkpoint_on_stop(self) -> None:
        """Checkpoint the slot for the stop: the open request (the sweep's, or this task's
        own on an earlier try) or a new one; freeze, capture, upload, record. Raises
        _NotMade."""
        if not self.settings.checkpointing.checkpoint_url:
            raise _NotMade("checkpoint-unconfigured", "no checkpoint function is configured")
        asked = self.api.checkpoint_on_stop(self.settings.attempt)
        if not asked.done or asked.record is None or asked.entry is None:
            raise _NotMade("checkpoint-refused", _why(asked))
        if not self._mark_frozen(asked.record, asked.entry):
            raise _NotMade("checkpoint-refused", "the record moved on before the freeze")
        try:
            self._capture_and_record(asked.record, asked.entry)
        except Abandoned as abandoned:
            raise _NotMade("checkpoint-abandoned", str(abandoned)) from None

    def _park(self) -> bool:
        """`PARK_ON_STOP`: the checkpoint counts and was captured frozen, as the sandbox
        still is."""
        outcome = self.api.park_on_stop(self.settings.attempt)
        if outcome.done and outcome.record is not None:
            logger.info("stopped: parked", expires_at=outcome.record.expires_at)
            return True
        logger.info("park on stop refused", why=_why(outcome))
        return False

    def _lose(self, failed: _NotMade) -> StopEnding:
        """The work goes with the task: the record says so, and why, for as long as a
        park would have kept it (the function's retention)."""
        if failed.reason == STOP_TIMEOUT:
            reason, detail = STOP_TIMEOUT, failed.detail
        else:  # the loss's detail names the failure
            reason, detail = LOST_ON_STOP, ": ".join(filter(None, (failed.reason, failed.detail)))
        outcome = self.api.lose(reason, detail)
        if outcome.done:
            logger.warning("stopped: lost", reason=reason, detail=detail[:300])
            return "lost"
        logger.warning("stopped: loss unrecorded", reason=reason, why=_why(outcome))
        return "unrecorded"

    # -- the checkpoint function --------------------------------------------------------

    def _upload_and_record(
        self, record: SlotRecord, op: Operation, captured: Captured, cancel: threading.Event
    ) -> dict[str, Any]:
        body = {
            "slot": self.settings.slot,
            "incarnation": self.api.incarnation,
            "op": {"ordinal": op.ordinal, "generation": op.generation},
            "size": captured.size,
            "sha256": captured.sha256,
            "md5": captured.md5,
        }
        reason = "upload-failed"
        for attempt in range(self.settings.checkpointing.checkpoint_attempts):
            if attempt and cancel.wait(_BACKOFF * 2 ** (attempt - 1)):
                break
            if attempt and (recorded := self._recorded(op)) is not None:
                return recorded  # the last try was recorded; only its answer was lost
            try:
                grant = self._call("/checkpoints/upload", body)
                headers = {
                    name: value
                    for name, value in grant["headers"].items()
                    if name.lower() != "content-length"  # upload sends the size itself
                }
                upload(
                    grant["url"],
                    captured.path,
                    headers,
                    size=captured.size,
                    timeout=self.settings.checkpointing.upload_timeout,
                    cancel=cancel,
                )
                return self._call("/checkpoints/record", body)
            except UploadFailed as failed:
                reason = failed.reason if failed.reason.startswith("http-") else "upload-failed"
            except Refused as refused:
                if refused.reason in {"checkpoint-not-open", NOT_THIS_TASK}:
                    recorded = self._recorded(op)
                    if recorded is not None:
                        return recorded
                    raise Abandoned(refused.reason) from None
                reason = refused.reason
            except function_url.Unreachable:
                reason = "checkpoint-function-unreachable"
            logger.warning("checkpoint upload failed", reason=reason, attempt=attempt + 1)
        if cancel.is_set() and not self.stop.is_set():
            raise Abandoned("touched")
        raise _NotUploaded(reason)

    def _give_up(self, record: SlotRecord, op: Operation, reason: str, detail: str) -> Ending:
        """Resume the sandbox, then record why there is no checkpoint (which clears
        `frozen_at`). Unrecorded, the record stays `checkpointing`: the next look asks
        again, and the sweep retains the slot meanwhile."""
        self._resume()
        body = {
            "slot": self.settings.slot,
            "incarnation": self.api.incarnation,
            "op": {"ordinal": op.ordinal, "generation": op.generation},
            "reason": _token(reason),
            "detail": detail,
        }
        try:
            self._call("/checkpoints/failed", body)
        except (Refused, function_url.Unreachable) as unrecorded:
            logger.warning("checkpoint failure not recorded", why=str(unrecorded))
            self._not_before = time.monotonic() + retry_after(1)
        logger.warning("checkpoint failed", reason=reason)
        return "failed"

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One try: the checkpoint's own loop tries again, watching for a poll meanwhile."""
        return self.api.post(path, body, tries=1)

    # -- the record ------------------------------------------------------------------------

    def _peek(self, *, consistent: bool = False) -> SlotRecord | None:
        try:
            return self.api.read(consistent=consistent)
        except (Refused, function_url.Unreachable, ValueError):  # look again next time
            logger.warning("record not read")
            return None

    def _recorded(self, op: Operation) -> dict[str, Any] | None:
        """The answer a recorded checkpoint of `op` would have had, read from the record
        (consistently); None when `op` is not recorded."""
        record = self._peek(consistent=True)
        entry = record.window.entry(op.ordinal) if record is not None else None
        if record is None or entry is None or entry.ref != op.ref or entry.outcome != "uploaded":
            return None
        return {"state": record.state.value}

    def _came_back(self) -> bool:
        """Confirmed by a consistent read: an eventually consistent one may still show the
        record from before the sweep's request, and resuming on it would let the sandbox
        change what was captured."""
        record = self._peek(consistent=True)
        return record is not None and (
            record.state is State.SEEDED or record.attempt != self.settings.attempt
        )

    def _resume(self) -> bool:
        """SIGCONT to the sandbox, unless the task is being stopped (True: resumed)."""
        if self.stop.is_set():
            return False  # it stays as it is until the task ends it
        thaw(self.settings.user, self.sandbox_group)
        self.frozen = False
        return True

    def _thaw(self, op: Operation | None) -> None:
        """A poll came back: SIGCONT first, then the record says so (so it never claims
        the sandbox runs while it is stopped)."""
        if not self._resume():
            return
        try:
            recorded = self.api.thaw(self.settings.attempt, op.ref if op else None).done
        except (Refused, function_url.Unreachable):
            recorded = False  # the next look sees the record still frozen and says so again
        logger.info("sandbox resumed", recorded=recorded)

    @contextmanager
    def _watching(self) -> Iterator[threading.Event]:
        """An event set when a poll came back, or when the stop's budget has run out,
        looked at by the capture and the upload; a thread reads the record every frozen
        interval until the task is stopped (then a poll no longer resumes anything)."""
        cancel = threading.Event()
        done = threading.Event()

        def watch() -> None:
            next_look = time.monotonic() + self.settings.checkpointing.frozen_watch_interval
            while not done.wait(0.1):
                if self.stop.is_set():
                    if time.monotonic() >= self.api.stop_budget_end():
                        cancel.set()
                        return
                    continue
                if time.monotonic() < next_look:
                    continue
                record = self._peek()
                wanted = record is not None and record.state is State.CHECKPOINTING
                if record is not None and not wanted and self._came_back():
                    cancel.set()
                    return
                next_look = time.monotonic() + self.settings.checkpointing.frozen_watch_interval

        watcher = threading.Thread(target=watch, name="checkpoint-watch", daemon=True)
        watcher.start()
        try:
            yield cancel
        finally:
            done.set()
            watcher.join()


class _NotUploaded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = ""


class _NotMade(Exception):
    """No checkpoint was made: `reason` a token, `detail` what else is known (never a
    URL)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _why(outcome: TaskWrite) -> str:
    """A write's refusal as a log or a loss says it: the reason token, or the conflict."""
    return outcome.reason or "the record kept moving"


def _token(reason: str) -> str:
    """A failure's reason as a record keeps it: lower case, letters, digits and dashes."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", reason.lower()).strip("-")
    return (cleaned if cleaned[:1].isalpha() else f"x-{cleaned}")[:64]


def _open_checkpoint(record: SlotRecord) -> Operation | None:
    """This attempt's open checkpoint op, the one the sweep reserved for the slot task."""
    return next(
        (
            entry
            for entry in record.window.entries
            if entry.kind is OpKind.CHECKPOINT
            and entry.actor is Actor.SLOT_TASK
            and entry.generation == record.attempt
            and not entry.settled
        ),
        None,
    )
