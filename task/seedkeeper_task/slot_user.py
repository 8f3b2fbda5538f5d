"""The slot user: who the sandbox runs as, who owns the restored tree, and who runs the
restore's unsquashfs and git. The task's supervisor stays root (DESIGN §9)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SlotUser:
    uid: int
    gid: int

    def subprocess_kwargs(self) -> dict[str, Any]:
        """What `subprocess.run`/`Popen` need to start a child as this user, with no
        supplementary group of the supervisor's."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def slot_user(uid: int | None, gid: int | None) -> SlotUser | None:
    """The configured slot user, when this process can become it (only root can). None:
    children run as the task's own user (a developer's unprivileged local stack)."""
    if uid is None or os.geteuid() != 0:
        return None
    return SlotUser(uid=uid, gid=uid if gid is None else gid)
