"""The executor's client for Seedkeeper's function URLs: `SeedkeeperClient` and the models
it sends and reads.

Its names load at first use: the slot task signs its calls with `seedkeeper_client.transport`
alone, and starts faster without the client's models."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedkeeper_client.client import (
        BadAnswer,
        ClaimNotEchoed,
        SeedkeeperClient,
        SeedkeeperRefused,
    )
    from seedkeeper_client.models import (
        Archive,
        CheckpointState,
        Cold,
        DepsEntry,
        Evidence,
        KeptAlive,
        NewSnapshot,
        NotSeeded,
        ObjectCounts,
        OwnerClaim,
        Payment,
        Receipt,
        Recorded,
        SeedAnswer,
        Seeded,
        SeedHandle,
        SeedIdentity,
        Seeding,
        Snapshot,
        SnapshotStatus,
    )
    from seedkeeper_client.transport import AnswerTooLarge, SeedkeeperError, Unreachable

__all__ = [
    "AnswerTooLarge",
    "Archive",
    "BadAnswer",
    "CheckpointState",
    "ClaimNotEchoed",
    "Cold",
    "DepsEntry",
    "Evidence",
    "KeptAlive",
    "NewSnapshot",
    "NotSeeded",
    "ObjectCounts",
    "OwnerClaim",
    "Payment",
    "Receipt",
    "Recorded",
    "SeedAnswer",
    "SeedHandle",
    "SeedIdentity",
    "Seeded",
    "Seeding",
    "SeedkeeperClient",
    "SeedkeeperError",
    "SeedkeeperRefused",
    "Snapshot",
    "SnapshotStatus",
    "Unreachable",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    modules = (import_module(f"{__name__}.{part}") for part in ("client", "models", "transport"))
    return next(getattr(module, name) for module in modules if hasattr(module, name))
