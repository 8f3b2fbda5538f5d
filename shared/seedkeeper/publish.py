"""Publishing a resident snapshot: squashfs archives of a checkout (with its `.git`) and
of its dependency tree, measured, uploaded to R2, then recorded through the rotation."""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from seedkeeper.clock import epoch_seconds
from seedkeeper.errors import PublishFailed
from seedkeeper.r2 import R2, backup_key
from seedkeeper.rotation import Recorded, Snapshots
from seedkeeper.snapshots import Archive, NewSnapshot

# Progress: (archive label, bytes done, bytes in all).
Progress = Callable[[str, int, int], None]


def publish(
    *,
    resource: str,
    checkout: Path,
    snapshots: Snapshots,
    r2: R2,
    deps: Path | None = None,
    lockfile_hash: str | None = None,
    ref: str | None = None,
    progress: Progress | None = None,
    workdir: Path | None = None,
) -> Recorded:
    """Archive, upload and record. The checkout's own ref and HEAD are recorded unless
    `ref` names another branch; a deps archive already recorded for `lockfile_hash` is
    reused rather than built again."""
    if (deps is None) != (lockfile_hash is None):
        raise PublishFailed("--deps and --lockfile-hash go together")
    sha, branch = head_of(checkout)
    branch = ref or branch
    with tempfile.TemporaryDirectory(prefix="seedkeeper-publish-", dir=workdir) as scratch:
        checkout_archive = upload_archive(
            checkout, Path(scratch), backup_id_for(resource, "checkout", sha), r2, progress
        )
        deps_archive = None
        if deps is not None and lockfile_hash is not None:
            deps_archive = snapshots.deps_archive(resource, lockfile_hash) or upload_archive(
                deps, Path(scratch), backup_id_for(resource, "deps", sha), r2, progress
            )
    new = NewSnapshot(
        resource=resource,
        ref=branch,
        sha=sha,
        created_at=epoch_seconds(),
        checkout=checkout_archive,
        deps=deps_archive,
        lockfile_hash=lockfile_hash,
    )
    return snapshots.record(new)


def build_squashfs(source: Path, target: Path) -> None:
    """Everything under `source`, `.git` and ignored files included: mksquashfs knows no
    ignore rules. zstd: fast to extract, which is what a seed waits on."""
    if not source.is_dir():
        raise PublishFailed(f"{source} is not a directory")
    _run(["mksquashfs", str(source), str(target), "-comp", "zstd", "-noappend", "-quiet"])


def measure(path: Path) -> tuple[int, str]:
    """Size and sha256, read once."""
    with path.open("rb") as archive:
        digest = hashlib.file_digest(archive, "sha256")
    return path.stat().st_size, digest.hexdigest()


def upload_archive(
    source: Path, scratch: Path, backup_id: str, r2: R2, progress: Progress | None = None
) -> Archive:
    """Build `source`'s archive in `scratch`, measure it, upload it as `backup_id`."""
    target = scratch / f"{backup_id}.sqsh"
    build_squashfs(source, target)
    size, sha256 = measure(target)
    sent = 0

    def advance(chunk: int) -> None:
        nonlocal sent
        sent += chunk
        if progress is not None:
            progress(backup_id, sent, size)

    uploaded = r2.upload(backup_key(backup_id), target, advance)
    if uploaded.size != size:
        raise PublishFailed(f"{backup_id}: R2 holds {uploaded.size} bytes, built {size}")
    return Archive(backup_id=backup_id, size=size, sha256=sha256)


def backup_id_for(resource: str, kind: str, sha: str) -> str:
    """Unique across resources and publishes, so no two archives ever share an object."""
    return f"{resource[:64]}-{kind}-{sha[:12]}-{secrets.token_hex(4)}"


def head_of(checkout: Path) -> tuple[str, str]:
    """The checkout's HEAD commit and branch."""
    sha = _git(checkout, "rev-parse", "--verify", "HEAD^{commit}")
    return sha, _git(checkout, "symbolic-ref", "--short", "HEAD")


def _git(checkout: Path, *args: str) -> str:
    return _run(["git", "-C", str(checkout), *args]).strip()


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError as missing:
        raise PublishFailed(f"{argv[0]} is not installed (make setup installs it)") from missing
    except subprocess.CalledProcessError as failed:
        raise PublishFailed(
            f"{' '.join(argv[:3])} failed: {failed.stderr.strip()[:300]}"
        ) from failed
    return done.stdout
