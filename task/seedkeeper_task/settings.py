"""The slot task's settings, read from its environment (`SEEDKEEPER_*`). Light to import:
the task reads them, and makes its start call, before its heavier modules are loaded."""

from __future__ import annotations

import json
import math
import os
import urllib.request
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper_task.slot_user import SlotUser, slot_user

# Where a Fargate task reads its own metadata (its task ARN: its incarnation).
ECS_METADATA_VARIABLE = "ECS_CONTAINER_METADATA_URI_V4"
# Kept from a stop's budget for the last write (parked or lost) after the checkpoint.
STOP_MARGIN = 10.0


class TaskSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    workspace: Path = Path("/workspace")
    incarnation: str | None = None
    restore_timeout: Annotated[float, Field(gt=0)] = 900.0
    # Ranges per archive, all at once: a stream from R2 is held to its own rate, so the
    # download's speed is the ranges' sum (measured at 300 MB with 50 MiB/s per connection:
    # the seed 0.83 of aria2c -x4 with 4, 0.72 with 8; `benchmarks/restore.py`).
    download_parts: Annotated[int, Field(ge=1, le=32)] = 8
    download_stall_timeout: Annotated[float, Field(gt=0)] = 15.0  # seconds without a byte
    download_retries: Annotated[int, Field(ge=0, le=20)] = 5  # per range, in a row, no progress
    # The slot user: runs unsquashfs, git and the sandbox, owns the restored tree. None, or
    # a task that is not root: the task's own user does (a developer's local stack).
    slot_uid: int | None = None
    slot_gid: int | None = None
    sandbox_command: tuple[str, ...] = ()  # argv (JSON list); empty: wait until stopped
    # How often a standby asks for its assignment: a seed that takes it waits half this
    # long on average (docs/concepts/standby.md, "How one waits", prices each ask).
    standby_poll: Annotated[float, Field(gt=0, le=60)] = 0.25
    # The task's CPU units (the template's SlotCpu; 1024 a vCPU). A Fargate task sees more
    # processors than it may use, and an extractor or capture running a thread per
    # processor it sees loses time to switching under the quota (measured at 1 vCPU,
    # mksquashfs of the 300 MB tree: 5.1 s with one thread, 5.6 s with two). None: every
    # processor (a local stack).
    cpu_units: Annotated[int | None, Field(ge=128)] = None

    def slot_user(self) -> SlotUser | None:
        return slot_user(self.slot_uid, self.slot_gid)

    def processors(self) -> int | None:
        """How many threads mksquashfs and each unsquashfs may run: the task's vCPUs,
        rounded up (None: their own default, a thread per processor seen)."""
        return None if self.cpu_units is None else math.ceil(self.cpu_units / 1024)

    def own_incarnation(self) -> str | None:
        """This task's incarnation: the one its runtime named (the local runtimes), else
        its task ARN from the ECS task metadata endpoint (Fargate sets its address)."""
        if self.incarnation is not None:
            return self.incarnation
        endpoint = os.environ.get(ECS_METADATA_VARIABLE)
        if endpoint is None:
            return None
        try:
            with urllib.request.urlopen(f"{endpoint}/task", timeout=5) as answer:  # noqa: S310
                metadata = json.load(answer)
        except (OSError, ValueError):
            return None
        arn = metadata.get("TaskARN") if isinstance(metadata, dict) else None
        return arn if isinstance(arn, str) and arn.startswith("arn:") else None


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
    # Between the platform's SIGTERM and its SIGKILL (Fargate's stopTimeout, 120 s at
    # most): a stopped task checkpoints in this, less STOP_MARGIN.
    stop_timeout: Annotated[float, Field(gt=STOP_MARGIN, le=3600)] = 120.0
