"""The slot task's API: the checkpoint function, signed with the task role (the task's own
session of it), and the only AWS the task reaches. The task role holds no table grant: the
task reads its record and makes its own transitions here (`seedkeeper.services.task_records`),
and the function acts only for the task that signed (DESIGN §11).

A call that gets no answer, or a 5xx, is tried again (each transition is acknowledged when it
is already true, so a retried write that had landed does nothing twice); while the task is
being stopped, no call outlasts the stop's budget. `not-this-task` says the record names
another task now (a later attempt's): the task leaves the slot alone.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, TypeVar

from botocore.credentials import Credentials
from pydantic import BaseModel

from seedkeeper.domain.caller import NOT_THIS_TASK
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.record import SeedFailed, SeedSucceeded, SlotRecord
from seedkeeper.domain.task_api import StandbyAnswer, StandbyCall, TaskRecord, TaskWrite
from seedkeeper_client.transport import refusal_reason
from seedkeeper_task import function_url

M = TypeVar("M", bound=BaseModel)
CALL_TIMEOUT = 10.0  # seconds for one call: the function answers these in milliseconds
_TRIES = 4  # in all; waiting 1, 2, 4 s between (a function being deployed, a throttle)


class Refused(Exception):
    """The function refused the call: `reason` is its token (or `http-<status>`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TaskApi:
    def __init__(
        self,
        url: str,
        slot: str,
        incarnation: str,
        stop: threading.Event,
        *,
        stop_budget: float | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """`stop_budget`: seconds a stopping task has for its calls, from the moment the stop
        is first seen (None: once stopped, a call is not tried again). `credentials`: what
        it signs with (None: the process's, the task role's session)."""
        self._credentials = credentials
        self.url = url.rstrip("/")
        self.slot = slot
        self.incarnation = incarnation
        self.stop = stop
        self._stop_budget = stop_budget
        self._stop_lock = threading.Lock()
        self._stop_deadline: float | None = None

    def stop_budget_end(self) -> float:
        """When the stop's work must be done by (monotonic): the stop budget from the moment
        the stop was first seen (the task looks several times a second)."""
        with self._stop_lock:
            if self._stop_deadline is None:
                self._stop_deadline = time.monotonic() + (self._stop_budget or 0.0)
            return self._stop_deadline

    def post(self, path: str, body: dict[str, Any], *, tries: int = _TRIES) -> dict[str, Any]:
        """A call, signed, answered 2xx: its JSON object. Raises Refused (a 4xx; a 5xx too
        once the tries are spent) or function_url.Unreachable."""
        failure: Exception = function_url.Unreachable("not tried")
        for attempt in range(tries):
            if attempt and self._wait(2.0 ** (attempt - 1)):
                break
            try:
                status, answer = function_url.post(
                    self.url + path, body, timeout=self._timeout(), credentials=self._credentials
                )
            except function_url.Unreachable as unreachable:
                failure = unreachable
                continue
            if status < 300:
                return answer
            failure = Refused(refusal_reason(answer, f"http-{status}"))
            if status < 500 and status != 429:
                break
        raise failure

    def read(self, *, consistent: bool = True) -> SlotRecord | None:
        """The task's record now (eventually consistent: half the cost, for a watch that
        only looks for a change); None when it names another task now."""
        try:
            answer = self.post("/tasks/record", self._call(consistent=consistent))
        except Refused as refused:
            if refused.reason == NOT_THIS_TASK:
                return None
            raise
        return _parsed(TaskRecord, answer).record

    def standby(self, call: StandbyCall) -> StandbyAnswer:
        """A standby's ask (DESIGN §12): what it is to do now."""
        return _parsed(StandbyAnswer, self.post("/tasks/standby", call.model_dump(mode="json")))

    def settle_seed(
        self, attempt: int, restore: OpRef, result: SeedSucceeded | SeedFailed
    ) -> TaskWrite:
        body = self._call(
            attempt=attempt,
            restore=_ref(restore),
            result=result.model_dump(mode="json"),
        )
        return self._write("/tasks/settle", body)

    def freeze(self, attempt: int, op: OpRef) -> TaskWrite:
        return self._write("/tasks/freeze", self._call(attempt=attempt, op=_ref(op)))

    def thaw(self, attempt: int, op: OpRef | None) -> TaskWrite:
        body = self._call(attempt=attempt, op=_ref(op) if op is not None else None)
        return self._write("/tasks/thaw", body)

    def checkpoint_on_stop(self, attempt: int) -> TaskWrite:
        return self._write("/tasks/checkpoint-on-stop", self._call(attempt=attempt))

    def park_on_stop(self, attempt: int) -> TaskWrite:
        return self._write("/tasks/park-on-stop", self._call(attempt=attempt))

    def lose(self, reason: str, detail: str) -> TaskWrite:
        return self._write("/tasks/lose", self._call(reason=reason, detail=detail[:512]))

    def _write(self, path: str, body: dict[str, Any]) -> TaskWrite:
        try:
            return _parsed(TaskWrite, self.post(path, body))
        except Refused as refused:
            if refused.reason == NOT_THIS_TASK:
                return TaskWrite(outcome="refused", reason=NOT_THIS_TASK)
            raise

    def _call(self, **fields: Any) -> dict[str, Any]:
        return {"slot": self.slot, "incarnation": self.incarnation, **fields}

    def _timeout(self) -> float:
        """A call's timeout: a stopping task's may not outlast the stop's budget by much."""
        if not self.stop.is_set():
            return CALL_TIMEOUT
        return max(1.0, min(CALL_TIMEOUT, self.stop_budget_end() - time.monotonic()))

    def _wait(self, seconds: float) -> bool:
        """Wait before a retry; True when there is no time for one (the stop's budget)."""
        if self.stop.is_set() and time.monotonic() + seconds >= self.stop_budget_end():
            return True
        time.sleep(seconds)
        return False


def _parsed(model: type[M], answer: dict[str, Any]) -> M:
    """An answer as JSON, validated in strict mode as the function wrote it."""
    return model.model_validate_json(json.dumps(answer))


def _ref(op: OpRef) -> dict[str, Any]:
    """An op of the task's as a call names it (the actor is the slot task)."""
    return {"ordinal": op.ordinal, "generation": op.generation}
