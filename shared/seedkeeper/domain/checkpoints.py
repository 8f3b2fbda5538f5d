"""Checkpoints: a verified upload of a slot's checkout, tied to one owner and one
incarnation, kept longer than any idle window plus a grace period."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.domain.models import OwnerClaim
from seedkeeper.domain.record import Checkpoint


class IdleSettings(BaseSettings):
    """How long a slot may idle, and how much longer than that a checkpoint is kept."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    # Seconds; as short as a second for the local demo, at most a week.
    idle_window: Annotated[int, Field(ge=1, le=7 * 86_400)] = 1800
    checkpoint_grace: Annotated[int, Field(ge=3600, le=30 * 86_400)] = 86_400


def new_checkpoint(
    settings: IdleSettings,
    *,
    key: str,
    size: int,
    etag: str,
    sha256: str,
    owner: OwnerClaim | None,
    incarnation: str,
    now: int,
) -> Checkpoint:
    """The record of an upload R2 confirmed (key, size and ETag as R2 answered). It
    expires only after the longest idle window plus the grace period, so no idle deadline
    can outlive it."""
    return Checkpoint(
        key=key,
        size=size,
        etag=etag,
        sha256=sha256,
        created_at=now,
        expires_at=now + settings.idle_window + settings.checkpoint_grace,
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
