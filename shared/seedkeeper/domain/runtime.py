"""What a slot runtime can say about a task: the one fact the sweep and the seed decide on."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    UNKNOWN = "unknown"  # nothing known about this incarnation: never a reason to destroy
