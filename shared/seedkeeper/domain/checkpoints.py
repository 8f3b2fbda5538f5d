"""Checkpoints: a verified upload of a slot's checkout, tied to one owner and one
incarnation, kept for the park retention (DESIGN §10)."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.domain.models import OwnerClaim
from seedkeeper.domain.record import Checkpoint

_DAY = 86_400
# One PUT: S3 and R2 take at most 5 GiB in a single upload.
MAX_CHECKPOINT_BYTES = 5 * 1024**3
# A failed checkpoint is asked for again after this long, doubling per failure in a row.
RETRY_FIRST = 60
RETRY_MOST = 3600


class IdleSettings(BaseSettings):
    """How long a slot may idle."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    # Seconds; as short as a second for the local demo, at most a week.
    idle_window: Annotated[int, Field(ge=1, le=7 * _DAY)] = 1800


class RetentionSettings(BaseSettings):
    """How long a checkpoint (and the parked slot that names it) is kept."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    # Seconds: a day to a year, 30 days unless set.
    park_retention: Annotated[int, Field(ge=_DAY, le=365 * _DAY)] = 30 * _DAY


# 256 characters after the prefix: a slot id of 128, two slashes, an ordinal of up to 20
# digits and ".sqsh" leave 101; an ECS task ARN (about 90) fits whole.
_NAME_CHARS = 100


def checkpoint_key(slot: str, incarnation: str, ordinal: int) -> str:
    """`checkpoints/<slot>/<incarnation>/<op>.sqsh`, short enough for the record's key
    (256 characters after the prefix) whatever the slot id. An incarnation is an ARN or a
    local name: every character a key should not hold becomes `-`, and a long one keeps
    its start and a digest of the whole (two incarnations never share a name)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", incarnation).strip(".-") or "task"
    if len(name) > _NAME_CHARS:
        digest = hashlib.sha256(incarnation.encode()).hexdigest()[:16]
        name = f"{name[: _NAME_CHARS - 17]}-{digest}"
    return f"checkpoints/{slot}/{name}/{ordinal}.sqsh"


def lifecycle_days(settings: RetentionSettings) -> int:
    """Days after which the bucket's rule deletes a checkpoint object: never before the
    record's retention ends (a day later: R2's rules run about daily, and the object was
    uploaded a little before it was recorded)."""
    return math.ceil(settings.park_retention / _DAY) + 1


@dataclass(frozen=True)
class Backoff:
    """A wait that doubles with each try in a row: `first` seconds after the first, at most
    `most`. The sweep's next look at a slot it retained (about one sweep period first), and
    a failed checkpoint's next request."""

    first: int = 300
    most: int = 3600

    def after(self, tries: int) -> int:
        return min(self.most, self.first << min(tries - 1, 16))


_CHECKPOINT_RETRY = Backoff(RETRY_FIRST, RETRY_MOST)


def retry_after(failures: int) -> int:
    """Seconds until a checkpoint that failed `failures` times in a row is asked for again."""
    return _CHECKPOINT_RETRY.after(failures)


def failing_for(failures: int) -> int:
    """At least how long a slot asked again after `failures` failed checkpoints in a row
    has kept its work unparked since the first failed: the retries' waits, end to end."""
    return sum(retry_after(failure) for failure in range(1, failures + 1))


def new_checkpoint(
    settings: RetentionSettings,
    *,
    key: str,
    size: int,
    etag: str,
    sha256: str,
    owner: OwnerClaim | None,
    incarnation: str,
    now: int,
) -> Checkpoint:
    """The record of an upload R2 confirmed (key, size and ETag as R2 answered), kept for
    the park retention."""
    return Checkpoint(
        key=key,
        size=size,
        etag=etag,
        sha256=sha256,
        created_at=now,
        expires_at=now + settings.park_retention,
        owner=owner,
        incarnation=incarnation,
    )


def counts_for(
    checkpoint: Checkpoint | None, *, owner: OwnerClaim | None, incarnation: str | None, now: int
) -> bool:
    """A checkpoint counts only for its own owner and incarnation, and only until it expires."""
    return (
        checkpoint is not None
        and checkpoint.owner == owner
        and checkpoint.incarnation == incarnation
        and checkpoint.expires_at > now
    )
