"""Which slot task is calling: the checkpoint function's callers are bound to the task their
signature names (DESIGN §11).

Every slot task signs with the one slot task role, so IAM cannot tell one from another. The
signature can: a function URL with `AWS_IAM` auth hands the function the caller's ARN
(`requestContext.authorizer.iam.userArn`), and an ECS task's role credentials are a session
of the task role named after the task's id, so a task calls as
`arn:aws:sts::<account>:assumed-role/<task role>/<task id>`. The task id is the last part of
its task ARN, its incarnation. A local runtime's task (`local:...`, `docker:...`) signs with
keys of its own, and the local gateway names its session after the incarnation's digest
(`task_id`), as ECS names it after the task's id.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# The one refusal of a call that is not the signer's own task's: the same whether the slot is
# absent, another task's, or the call names a task other than the signer.
NOT_THIS_TASK = "not-this-task"
# An IAM role's ARN (a path may come before its name) and a session of it, as STS names one.
_NAME = r"[\w+=,.@-]{1,64}"
_ROLE_ARN = re.compile(
    rf"arn:(?P<partition>aws[a-z-]*):iam::(?P<account>[0-9]{{12}}):role/(?:.*/)?(?P<name>{_NAME})"
)
_SESSION_ARN = re.compile(
    rf"arn:(?P<partition>aws[a-z-]*):sts::(?P<account>[0-9]{{12}}):assumed-role/(?P<name>{_NAME})"
    r"/(?P<session>[\w+=,.@-]{2,64})"
)
_ECS_TASK_ARN = re.compile(
    r"arn:aws[a-z-]*:ecs:[a-z0-9-]+:[0-9]{12}:task/[A-Za-z0-9_-]{1,255}/(?P<id>[a-f0-9]{32})"
)


@dataclass(frozen=True)
class TaskRole:
    """The slot task role, by its ARN (`arn:aws:iam::<account>:role/<name>`)."""

    arn: str

    def session(self, caller_arn: str | None) -> str | None:
        """The session name when `caller_arn` is a session of this role, else None: another
        role, another account, a user, anyone else."""
        role = _ROLE_ARN.fullmatch(self.arn)
        called = _SESSION_ARN.fullmatch(caller_arn or "")
        if role is None or called is None:
            return None
        ours = ("partition", "account", "name")
        if any(called.group(part) != role.group(part) for part in ours):
            return None
        return called.group("session")


def task_id(incarnation: str) -> str:
    """The id a task's role session is named after: an ECS task ARN's last part; for a
    local runtime's incarnation, its digest (32 hex digits, as long as an ECS task id)."""
    ecs = _ECS_TASK_ARN.fullmatch(incarnation)
    if ecs is not None:
        return ecs.group("id")
    return hashlib.sha256(incarnation.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Caller:
    """Who signed a call to the checkpoint function: the slot task role session (None: not
    a session of the slot task role at all)."""

    session: str | None

    def is_task(self, incarnation: str | None) -> bool:
        """Whether the caller is the task `incarnation`."""
        return (
            self.session is not None
            and incarnation is not None
            and task_id(incarnation) == self.session
        )
