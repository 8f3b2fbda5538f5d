"""Who signs what on the local stack, as in a deployment: the executor's credentials, and one
session of the slot task role per slot task.

On ECS every task of the slot task role gets credentials of its own: a session of the role
named after its task id (`seedkeeper.domain.caller`). Locally, each task gets keys of its
own (`TaskKeys.issue`, at its launch), kept under the data directory (0700 and 0600, the
stack's: no sandbox reads them), and the gateway names the session that signed after the task
(`task_id` of its incarnation), so the checkpoint function binds each call to the task that
made it, as it does in AWS. A stopped task's keys are revoked with its workspace.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from seedkeeper.domain.caller import task_id

ACCOUNT = "000000000000"
TASK_ROLE = "seedkeeper-slot-task"
# The slot task role, as the functions are told it (SEEDKEEPER_TASK_ROLE_ARN).
TASK_ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/{TASK_ROLE}"
EXECUTOR_ARN = f"arn:aws:iam::{ACCOUNT}:user/local"
# A task's access key names its session: `seedkeeper-task-<task id>`.
_TASK_KEY = re.compile(r"seedkeeper-task-(?P<session>[0-9a-f]{32})")


# The function whose invocation is under way on this thread (its folder under functions/):
# in AWS each runs as its own role, and what it calls is that role's to be allowed. The
# local stack runs them all in one process, with the store's keys; this says which one is
# acting, for whoever evaluates its calls against its role (the suite's IAM check).
ACTING: ContextVar[str | None] = ContextVar("seedkeeper_acting_function", default=None)


@contextmanager
def acting_as(function: str) -> Iterator[None]:
    token = ACTING.set(function)
    try:
        yield
    finally:
        ACTING.reset(token)


@dataclass(frozen=True)
class LocalCredentials:
    access_key: str
    secret_key: str


def task_session_arn(session: str) -> str:
    """The ARN a function URL's event names a slot task's session by."""
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{TASK_ROLE}/{session}"


class TaskKeys:
    """The slot tasks' keys on one data directory: one pair per task, as STS gives each ECS
    task a session of the task role."""

    def __init__(self, data_dir: Path) -> None:
        self._folder = data_dir.resolve() / "task-keys"

    def issue(self, incarnation: str) -> LocalCredentials:
        """The task `incarnation`'s keys: new at its first launch, the same for a relaunch
        of it (a container already running holds them)."""
        session = task_id(incarnation)
        self._folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        keys = self._folder / session
        draft = self._folder / f".{session}.{secrets.token_hex(4)}"
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as written:
            written.write(secrets.token_urlsafe(32))
        try:
            os.link(draft, keys)  # whole, and only if none is there: the one exclusive step
        except FileExistsError:
            pass
        finally:
            draft.unlink()
        return LocalCredentials(f"seedkeeper-task-{session}", keys.read_text())

    def find(self, access_key: str) -> tuple[LocalCredentials, str] | None:
        """The keys `access_key` names and their session, when a task holds them."""
        named = _TASK_KEY.fullmatch(access_key)
        if named is None:
            return None
        try:
            secret = (self._folder / named.group("session")).read_text()
        except OSError:
            return None
        return LocalCredentials(access_key, secret), named.group("session")

    def revoke(self, incarnation: str) -> None:
        (self._folder / task_id(incarnation)).unlink(missing_ok=True)

    def revoke_all(self) -> None:
        """Every task's keys on this data directory (its stack's exit)."""
        for keys in self._folder.glob("*"):
            keys.unlink(missing_ok=True)
