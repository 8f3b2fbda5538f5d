"""Lambda SnapStart's runtime hooks (template.yaml's `SeedSnapStart`, off by default).

With SnapStart, Lambda runs a version's init once, when the version is published, and
starts every later environment from a snapshot of it: whatever init made is shared by every
environment restored from it, and so is whatever it holds. Seedkeeper's init imports and
nothing more (services, clients and the R2 keys are built at the first request: see
`seedkeeper.config`), so nothing secret or unique is in a snapshot. Then:

- before the snapshot, the process session's loader reads the service models the function's
  clients need (`aws.read_models`), which the first request would otherwise read after
  every restore; no credentials are resolved and no connection is opened;
- after a restore, `random` is seeded afresh (a restored environment would otherwise draw
  the same numbers as every other: botocore's retry jitter does), and the process session is
  renewed, so credentials, clients and their connections are the restored environment's
  own. (`secrets`, `uuid.uuid4` and `os.urandom` read the kernel: nothing to do for them.)

`snapshot_restore_py` is part of Lambda's Python runtimes (3.12 on), not of the layer:
where it is absent (locally, in tests) nothing is registered.
"""

from __future__ import annotations

import random

from seedkeeper.adapters import aws


def before_snapshot(services: tuple[aws.Service, ...]) -> None:
    aws.read_models(services)


def after_restore() -> None:
    random.seed()
    aws.renew_session()


def register(services: tuple[aws.Service, ...]) -> bool:
    """Register the hooks with Lambda's runtime; False where there is none to register with."""
    try:
        from snapshot_restore_py import (  # noqa: PLC0415 - Lambda's runtime only
            register_after_restore,
            register_before_snapshot,
        )
    except ImportError:
        return False
    register_before_snapshot(before_snapshot, services)
    register_after_restore(after_restore)
    return True
