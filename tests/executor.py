"""The executor's side of the local stack: a signed client, a published snapshot, a claim,
all the executor's own (`seedkeeper_client`), never the server's models."""

from __future__ import annotations

from pathlib import Path

from botocore.credentials import Credentials

from builders import ORIGIN
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper_client import NewSnapshot, OwnerClaim, SeedIdentity, SeedkeeperClient
from seedkeeper_tools.local.stack import LocalStack
from seedkeeper_tools.publish import backup_id_for, head_of, upload_archive

__all__ = ["ORIGIN", "claim_for", "client_for", "publish"]


def client_for(stack: LocalStack) -> SeedkeeperClient:
    credentials = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    return SeedkeeperClient(stack.url, credentials=credentials)


def publish(client: SeedkeeperClient, repo: Path, scratch: Path) -> SeedIdentity:
    """Archive `repo`'s checkout into the stack's R2 as resource `widgets`; its seed."""
    sha, ref = head_of(repo)
    scratch.mkdir(exist_ok=True)
    archive = upload_archive(
        repo, scratch, backup_id_for("widgets", "checkout", sha), R2.from_settings(R2Settings())
    )
    client.publish(
        NewSnapshot(
            resource="widgets",
            ref=ref,
            sha=sha,
            created_at=1_800_000_000,
            checkout=archive.model_dump(),
        )
    )
    handle = client.snapshot_status("widgets").seed_handle
    assert handle is not None
    return SeedIdentity(resource="widgets", **handle.model_dump())


def claim_for(seed: SeedIdentity, **changes: str) -> OwnerClaim:
    fields = {
        "run": "run-1",
        "requester": "alice",
        "thread": "thread-1",
        "repository": "acme/widgets",
        "ref": seed.ref,
        "head": seed.sha,
    }
    return OwnerClaim.model_validate(fields | changes)
