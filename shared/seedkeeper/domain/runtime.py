"""What a slot runtime can say about a task: the one fact the sweep and the seed decide on,
and, once it stopped, why (what a lost slot's record says)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class TaskStatus(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    UNKNOWN = "unknown"  # nothing known about this incarnation: never a reason to destroy


# Why a task stopped when its runtime says no more than that it did.
TASK_STOPPED = "task-stopped"
_TOKEN = re.compile(r"[a-z][a-z0-9-]{0,63}")
_DETAIL_MOST = 512  # what a `Loss` keeps


@dataclass(frozen=True)
class TaskState:
    """A task's status and, for a stopped one, its cause as a `Loss` token and what the
    runtime said of it."""

    status: TaskStatus
    reason: str = TASK_STOPPED
    detail: str = ""

    @classmethod
    def stopped(cls, cause: str | None, detail: str) -> TaskState:
        """A stopped task, its cause as the runtime names it (`SpotInterruption`, `OOMKilled`;
        None: not said), its detail cut to what a record keeps."""
        return cls(TaskStatus.STOPPED, stop_token(cause), detail[:_DETAIL_MOST])


@dataclass(frozen=True)
class Launch:
    """What a runtime launched a task for: one attempt of one slot."""

    slot: str
    attempt: int


RUNNING = TaskState(TaskStatus.RUNNING)
UNKNOWN = TaskState(TaskStatus.UNKNOWN)


def stop_token(cause: str | None) -> str:
    """A runtime's stop cause as a token: `SpotInterruption` is `spot-interruption`,
    `OOMKilled` is `oom-killed`; `task-stopped` when it says nothing a token can hold."""
    if not re.fullmatch(r"[A-Za-z0-9]+", cause or ""):
        return TASK_STOPPED
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", cause or "")
    token = "-".join(word.lower() for word in words)[:64]
    return token if _TOKEN.fullmatch(token) else TASK_STOPPED
