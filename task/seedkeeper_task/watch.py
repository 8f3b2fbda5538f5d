"""The supervisor's watch of its own record, and the checkpoint it makes when asked
(DESIGN §10, steps 2, 3 and 5).

Every watch interval (30 s unless set, jittered so a fleet's reads spread) the supervisor
reads its record, eventually consistent (half a read unit; a stale answer only delays it by
one interval, and every write it then makes is conditional on a consistent read). When the
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
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.adapters import aws
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import MAX_CHECKPOINT_BYTES, retry_after
from seedkeeper.domain.opwindow import Actor, Operation, OpKind
from seedkeeper.domain.record import SlotRecord, State, Supported
from seedkeeper.observability import logger
from seedkeeper.store.lifecycle import Lifecycle, Written
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
from seedkeeper_task.slot_user import SlotUser

_CAPTURE = "checkpoint.sqsh"
_CALL_TIMEOUT = 30.0
_BACKOFF = 2.0  # seconds before the second try of an upload; doubled for each further one

Ending = Literal["checkpointed", "abandoned", "failed", "stopping", "superseded"]


class CheckpointSettings(BaseSettings):
    """The checkpoint's part of the slot task's environment: the function's URL, how often
    the record is read (a poll waits on the frozen interval), the bounds of one capture
    and one upload, and how many times upload and record are tried."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    checkpoint_url: str | None = None
    watch_interval: Annotated[float, Field(gt=0, le=3600)] = 30.0
    frozen_watch_interval: Annotated[float, Field(gt=0, le=60)] = 2.0
    checkpoint_timeout: Annotated[float, Field(gt=0)] = 600.0  # the capture
    upload_timeout: Annotated[float, Field(gt=0)] = 60.0  # no byte moving for this long
    checkpoint_attempts: Annotated[int, Field(ge=1, le=10)] = 3


@dataclass(frozen=True)
class WatchSettings:
    """Which slot task watches, where its checkout is, and who its sandbox runs as."""

    slot: str
    attempt: int
    checkout: Path
    state_dir: Path
    user: SlotUser | None
    checkpointing: CheckpointSettings


class Abandoned(Exception):
    """A poll came back (or the record moved on) while the checkpoint was being made."""


class Watcher:
    def __init__(
        self, settings: WatchSettings, lifecycle: Lifecycle, stop: threading.Event
    ) -> None:
        self.settings = settings
        self.lifecycle = lifecycle
        self.stop = stop
        self.frozen = False
        self.sandbox_group: int | None = None  # the sandbox's process group, once it runs
        # After a failure it could not record, the record still asks: not before then.
        self._not_before = 0.0

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
        sandbox running and the record saying so."""
        settings = self.settings
        if not settings.checkpointing.checkpoint_url:
            # Nowhere to upload: nothing is stopped; the sweep retains the slot meanwhile.
            logger.warning("checkpoint asked for, but no checkpoint function is configured")
            return "failed"
        freezing = transitions.Freezing(attempt=settings.attempt, op=op.ref, now=_now())
        marked = self.lifecycle.apply(settings.slot, transitions.FREEZE, freezing, as_read=record)
        if not isinstance(marked, Written | transitions.Acknowledged):
            return "superseded"  # touched or moved on before anything was stopped
        self.frozen = True
        target = settings.state_dir / _CAPTURE
        try:
            with self._watching() as cancel:
                try:
                    freeze(settings.user, self.sandbox_group)
                    captured = capture(
                        settings.checkout,
                        target,
                        user=settings.user,
                        timeout=settings.checkpointing.checkpoint_timeout,
                        cancel=cancel,
                        max_bytes=MAX_CHECKPOINT_BYTES,
                    )
                    answer = self._upload_and_record(record, op, captured, cancel)
                except Abandoned:
                    self._thaw(op)
                    return "abandoned"
                except (FreezeFailed, CaptureFailed, _NotUploaded) as failed:
                    if self.stop.is_set():
                        return self._give_up(record, op, "task-stopping", "")
                    if cancel.is_set():  # a poll came back while it was failing
                        self._thaw(op)
                        return "abandoned"
                    return self._give_up(record, op, failed.reason, str(failed)[:300])
        finally:
            target.unlink(missing_ok=True)
        logger.info("checkpoint recorded", size=captured.size, sha256=captured.sha256)
        if answer.get("state") == State.SEEDED.value:
            self._thaw(None)  # recorded, but a poll came back meanwhile: it wants the work
        return "checkpointed"

    # -- the checkpoint function --------------------------------------------------------

    def _upload_and_record(
        self, record: SlotRecord, op: Operation, captured: Captured, cancel: threading.Event
    ) -> dict[str, Any]:
        body = {
            "slot": self.settings.slot,
            "incarnation": record.incarnation,
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
            except _Refused as refused:
                if refused.reason in {"checkpoint-not-open", "no-match"}:
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
            "incarnation": record.incarnation,
            "op": {"ordinal": op.ordinal, "generation": op.generation},
            "reason": _token(reason),
            "detail": detail,
        }
        try:
            self._call("/checkpoints/failed", body)
        except (_Refused, function_url.Unreachable) as unrecorded:
            logger.warning("checkpoint failure not recorded", why=str(unrecorded))
            self._not_before = time.monotonic() + retry_after(1)
        logger.warning("checkpoint failed", reason=reason)
        return "stopping" if reason == "task-stopping" else "failed"

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.settings.checkpointing.checkpoint_url
        assert url is not None  # `checkpoint` starts nothing without one
        session = aws.session()
        credentials = session.get_credentials()
        if credentials is None:
            raise _Refused("no-credentials")
        status, payload = function_url.call(
            "POST",
            url.rstrip("/") + path,
            body,
            credentials=credentials,
            region=session.region_name or "us-east-1",
            timeout=_CALL_TIMEOUT,
        )
        try:
            answer = json.loads(payload or b"{}")
        except ValueError:
            answer = {}
        if status >= 300:
            reason = answer.get("error") or answer.get("message") or f"http-{status}"
            raise _Refused(str(reason)[:64])
        result: dict[str, Any] = answer
        return result

    # -- the record ------------------------------------------------------------------------

    def _peek(self, *, consistent: bool = False) -> SlotRecord | None:
        try:
            classified = self.lifecycle.read(self.settings.slot, consistent=consistent)
        except Exception:  # a store that does not answer: look again next time
            logger.warning("record not read")
            return None
        return classified.record if isinstance(classified, Supported) else None

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

    def _resume(self) -> None:
        thaw(self.settings.user, self.sandbox_group)
        self.frozen = False

    def _thaw(self, op: Operation | None) -> None:
        """A poll came back: SIGCONT first, then the record says so (so it never claims
        the sandbox runs while it is stopped)."""
        self._resume()
        thawed = transitions.Thawed(
            attempt=self.settings.attempt, op=op.ref if op else None, now=_now()
        )
        outcome = self.lifecycle.apply(self.settings.slot, transitions.THAWED, thawed)
        logger.info("sandbox resumed", recorded=isinstance(outcome, Written))

    @contextmanager
    def _watching(self) -> Iterator[threading.Event]:
        """An event set when the task is stopping or a poll came back, looked at by the
        capture and the upload; a thread reads the record every frozen interval."""
        cancel = threading.Event()
        done = threading.Event()

        def watch() -> None:
            next_look = time.monotonic() + self.settings.checkpointing.frozen_watch_interval
            while not done.wait(0.1):
                if self.stop.is_set():
                    cancel.set()
                    return
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


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _NotUploaded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


def _now() -> int:
    return int(time.time())
