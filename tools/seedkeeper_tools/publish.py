"""Publishing a resident snapshot: squashfs archives of a checkout (with its `.git`) and
of its dependency tree, measured, uploaded to R2, then recorded through the rotation.

A checkout whose repository holds credentials (DESIGN §9) is refused, naming what it holds,
unless the caller asks to scrub it: then the archive carries a scrubbed copy of
`.git/config` (and no credentialed FETCH_HEAD or legacy remote file) while the checkout
itself is left as it is.
A checkout the restore would refuse (a gitfile, `core.worktree`, an include...) is refused
here first."""

from __future__ import annotations

import hashlib
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from seedkeeper.adapters.clock import epoch_seconds
from seedkeeper.adapters.r2 import R2, backup_key
from seedkeeper.domain.outcomes import Recorded
from seedkeeper.domain.snapshots import Archive, NewSnapshot
from seedkeeper.errors import PublishFailed
from seedkeeper.services.rotation import Snapshots
from seedkeeper_task.restore.repository import (
    ConfigEntry,
    SafeGit,
    UnsafeRepository,
    check_layout,
    checkout_credentials,
    credential_files,
    empty_home,
    read_config,
    render_config,
    repository_format,
    without_credentials,
)

# Progress: (archive label, bytes done, bytes in all).
Progress = Callable[[str, int, int], None]
# Told what a scrub removed: key names (user-info redacted) and files, never a value.
Scrubbed = Callable[[list[str]], None]


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
    scrub_credentials: bool = False,
    scrubbed: Scrubbed | None = None,
) -> Recorded:
    """Archive, upload and record. The checkout's own ref and HEAD are recorded unless
    `ref` names another branch; a deps archive already recorded for `lockfile_hash` is
    reused rather than built again. Credentials in the checkout's repository refuse the
    publish unless `scrub_credentials`; `scrubbed` is told what a scrub removed."""
    if (deps is None) != (lockfile_hash is None):
        raise PublishFailed("--deps and --lockfile-hash go together")
    checkout = checkout.resolve()  # git, the checks and mksquashfs all read the same one
    with tempfile.TemporaryDirectory(prefix="seedkeeper-publish-", dir=workdir) as scratch:
        with _git_for(checkout) as git:
            sha, branch = _head(git)
            entries = _inspect(git)
        found = checkout_credentials(checkout, entries)
        if found and not scrub_credentials:
            raise PublishFailed(
                f"the checkout's repository holds credentials ({', '.join(found)}); remove "
                "them, or publish with --scrub-credentials to archive a copy of its "
                ".git/config without them (the checkout is left as it is)"
            )
        replaced, excluded = _scrubbed_copy(checkout, entries, Path(scratch)) if found else ({}, [])
        if found and scrubbed is not None:
            scrubbed(found)
        checkout_archive = upload_archive(
            checkout,
            Path(scratch),
            backup_id_for(resource, "checkout", sha),
            r2,
            progress,
            replaced=replaced,
            excluded=excluded,
        )
        deps_archive = None
        if deps is not None and lockfile_hash is not None:
            deps_archive = snapshots.deps_archive(resource, lockfile_hash) or upload_archive(
                deps, Path(scratch), backup_id_for(resource, "deps", sha), r2, progress
            )
    new = NewSnapshot(
        resource=resource,
        ref=ref or branch,
        sha=sha,
        created_at=epoch_seconds(),
        checkout=checkout_archive,
        deps=deps_archive,
        lockfile_hash=lockfile_hash,
    )
    return snapshots.record(new)


def _inspect(git: SafeGit) -> list[ConfigEntry]:
    """The checkout's config entries; refuses what a seed would refuse."""
    try:
        check_layout(git.checkout)
        entries = read_config(git, git.checkout / ".git" / "config")
        repository_format(entries)
    except UnsafeRepository as unsafe:
        raise PublishFailed(f"a seed would refuse this checkout: {unsafe}") from unsafe
    return entries


def _scrubbed_copy(
    checkout: Path, entries: list[ConfigEntry], scratch: Path
) -> tuple[dict[str, Path], list[str]]:
    """A scrubbed `.git/config` in scratch to archive in place of the checkout's, and the
    files beside it to leave out (FETCH_HEAD and legacy remotes: a seed removes them)."""
    config = scratch / "scrubbed.config"
    config.write_text(render_config(without_credentials(entries)))
    return {".git/config": config}, [f".git/{name}" for name in credential_files(checkout)]


def build_squashfs(
    source: Path,
    target: Path,
    *,
    replaced: Mapping[str, Path] | None = None,
    excluded: Sequence[str] = (),
) -> None:
    """Everything under `source`, `.git` and ignored files included: mksquashfs knows no
    ignore rules. zstd: fast to extract, which is what a seed waits on. `replaced` maps a
    path in the archive to the file whose content it holds instead (its owner and mode
    kept); `excluded` paths are left out. `source` itself is never written."""
    if not source.is_dir():
        raise PublishFailed(f"{source} is not a directory")
    argv = ["mksquashfs", str(source), str(target), "-comp", "zstd", "-noappend", "-quiet"]
    replaced = replaced or {}
    for name, content in replaced.items():
        original = (source / name).lstat()
        # A pseudo file: mksquashfs runs its command with /bin/sh, so the path is quoted.
        command = f"cat {shlex.quote(str(content))}"
        mode = f"{original.st_mode & 0o7777:o}"
        argv += ["-p", f"{name} f {mode} {original.st_uid} {original.st_gid} {command}"]
    # A replaced file must be excluded for its pseudo file to take its place. Last: -e
    # takes every argument after it.
    dropped = [*replaced, *(name for name in excluded if (source / name).exists())]
    if dropped:
        argv += ["-e", *dropped]
    _run(argv)


def measure(path: Path) -> tuple[int, str]:
    """Size and sha256, read once."""
    with path.open("rb") as archive:
        digest = hashlib.file_digest(archive, "sha256")
    return path.stat().st_size, digest.hexdigest()


def upload_archive(
    source: Path,
    scratch: Path,
    backup_id: str,
    r2: R2,
    progress: Progress | None = None,
    *,
    replaced: Mapping[str, Path] | None = None,
    excluded: Sequence[str] = (),
) -> Archive:
    """Build `source`'s archive in `scratch` (see build_squashfs), measure it, upload it
    as `backup_id`."""
    target = scratch / f"{backup_id}.sqsh"
    build_squashfs(source, target, replaced=replaced, excluded=excluded)
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
    with _git_for(checkout) as git:
        return _head(git)


@contextmanager
def _git_for(checkout: Path) -> Iterator[SafeGit]:
    """Git for the resident's checkout, hardened as the slot task's is: the resident trusts
    its own checkout, but git then reads nothing else and runs none of its commands.
    Absolute: SafeGit gives git the checkout twice, `-C` and a GIT_DIR that git then reads
    from inside it, and `.` has no parent to stop discovery at."""
    checkout = checkout.resolve()
    with empty_home() as home:
        yield SafeGit(checkout, ceiling=checkout.parent, home=home)


def _head(git: SafeGit) -> tuple[str, str]:
    sha = _git(git, "rev-parse", "--verify", "HEAD^{commit}")
    return sha, _git(git, "symbolic-ref", "--short", "HEAD")


def _git(git: SafeGit, *args: str) -> str:
    try:
        return git(*args)
    except FileNotFoundError as missing:
        raise PublishFailed("git is not installed (make setup installs it)") from missing
    except subprocess.CalledProcessError as failed:
        raise PublishFailed(
            f"git -C {git.checkout} {args[0]} failed: {failed.stderr.strip()[:300]}"
        ) from failed


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
