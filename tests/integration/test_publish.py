"""Publishing a real git repository: mksquashfs, upload to moto-as-R2, record, then read
the archive back with unsquashfs and find the very same tree and repository."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import Stack
from repos import git, make_repository, tree
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.errors import PublishFailed
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_tools.publish import publish

SEEDKEEPER = str(Path(sys.executable).with_name("seedkeeper"))


def fetch(url: str, target: Path) -> None:
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - loopback only
        target.write_bytes(response.read())


def test_a_published_repository_reads_back_identical(stack: Stack, tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    deps = tmp_path / "node_modules"
    (deps / "left-pad").mkdir(parents=True)
    (deps / "left-pad" / "index.js").write_text("module.exports = 1\n")
    seen: dict[str, int] = {}

    recorded = publish(
        resource="widgets",
        checkout=repo,
        snapshots=stack.snapshots,
        r2=stack.r2,
        deps=deps,
        lockfile_hash="lock-1",
        progress=lambda label, done, total: seen.__setitem__(label, done),
    )

    current = recorded.current
    assert (current.ref, current.sha) == ("main", git(repo, "rev-parse", "HEAD"))
    assert current.deps is not None
    assert seen == {
        current.checkout.backup_id: current.checkout.size,
        current.deps.backup_id: current.deps.size,
    }
    archive = tmp_path / "checkout.sqsh"
    fetch(stack.r2.presign_get(backup_key(current.checkout.backup_id), 60), archive)
    assert archive.stat().st_size == current.checkout.size
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == current.checkout.sha256

    restored = tmp_path / "restored"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(restored), str(archive)], check=True)
    assert tree(restored) == tree(repo)
    assert (restored / "empty").is_dir()
    assert (restored / "build" / "artifact.bin").exists()  # nothing excluded by ignore rules
    git(restored, "fsck", "--full", "--strict")
    assert git(restored, "rev-parse", "HEAD") == current.sha
    assert git(restored, "status", "--porcelain") == git(repo, "status", "--porcelain")


def test_a_deps_archive_recorded_for_the_lockfile_is_reused(stack: Stack, tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "pkg.txt").write_text("pinned\n")
    first = publish(
        resource="widgets",
        checkout=repo,
        snapshots=stack.snapshots,
        r2=stack.r2,
        deps=deps,
        lockfile_hash="lock-1",
    )
    (repo / "src" / "more.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", "third")
    second = publish(
        resource="widgets",
        checkout=repo,
        snapshots=stack.snapshots,
        r2=stack.r2,
        deps=deps,
        lockfile_hash="lock-1",
    )
    assert second.current.deps == first.current.deps
    assert second.current.checkout != first.current.checkout
    assert second.retired == first.current


def test_publishing_something_that_is_not_a_repository_fails_clearly(
    stack: Stack, tmp_path: Path
) -> None:
    with pytest.raises(PublishFailed, match="git -C"):
        publish(resource="widgets", checkout=tmp_path, snapshots=stack.snapshots, r2=stack.r2)
    assert not SnapshotStore(stack.table).read("widgets").exists


def test_publish_and_inspect_from_the_command_line(stack: Stack, tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    env = os.environ | {"COLUMNS": "250"}

    def seedkeeper(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SEEDKEEPER, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    published = seedkeeper("publish", "--resource", "widgets", "--checkout", str(repo))
    assert published.returncode == 0, published.stdout + published.stderr
    assert "rotated" in published.stdout
    sha = git(repo, "rev-parse", "HEAD")
    shown = seedkeeper("snapshots", "show", "widgets")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"#1 main {sha[:12]}" in shown.stdout
    assert "1 recorded, 1 present in R2" in shown.stdout

    bad = seedkeeper("publish", "--resource", "../widgets", "--checkout", str(repo))
    assert bad.returncode == 2
    assert "resource" in bad.stderr

    deleted = seedkeeper("snapshots", "delete", "widgets")
    assert deleted.returncode == 0, deleted.stdout
    missing = seedkeeper("snapshots", "show", "widgets")
    assert missing.returncode == 1
    assert "ResourceNotFound" in missing.stdout


TOKEN = "ghp_PublishTestSecret0123456789"  # noqa: S105 - a planted credential, not a real one


def plant_credentials(repo: Path) -> None:
    secret_url = f"https://resident:{TOKEN}@git.example.com/acme/widgets.git"
    git(repo, "config", "remote.origin.url", secret_url)
    git(repo, "config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")
    git(repo, "config", "http.https://git.example.com/.extraheader", f"Authorization: {TOKEN}")
    git(repo, "config", "credential.helper", "store")
    (repo / ".git" / "FETCH_HEAD").write_text(f"{'0' * 40}\t\tbranch 'main' of {secret_url}\n")
    (repo / ".git" / "remotes").mkdir()  # a legacy remote definition, read by git still
    (repo / ".git" / "remotes" / "mirror").write_text(f"URL: {secret_url}\n")


def test_a_checkout_holding_credentials_is_refused_naming_keys_never_values(
    stack: Stack, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path)
    plant_credentials(repo)
    with pytest.raises(PublishFailed, match="--scrub-credentials") as refused:
        publish(resource="widgets", checkout=repo, snapshots=stack.snapshots, r2=stack.r2)
    message = str(refused.value)
    named = (
        "remote.origin.url",
        "extraheader",
        "credential.helper",
        "FETCH_HEAD",
        "remotes/mirror",
    )
    for key in named:
        assert key in message
    assert TOKEN not in message
    assert not SnapshotStore(stack.table).read("widgets").exists


def test_scrubbing_archives_a_config_without_credentials_and_leaves_the_checkout_as_it_is(
    stack: Stack, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path)
    plant_credentials(repo)
    before = tree(repo)
    removed: list[list[str]] = []

    recorded = publish(
        resource="widgets",
        checkout=repo,
        snapshots=stack.snapshots,
        r2=stack.r2,
        scrub_credentials=True,
        scrubbed=removed.append,
    )

    assert removed == [
        [
            "remote.origin.url",
            "http.https://git.example.com/.extraheader",
            "credential.helper",
            "FETCH_HEAD",
            "remotes/mirror",
        ]
    ]
    assert tree(repo) == before
    archive = tmp_path / "checkout.sqsh"
    fetch(stack.r2.presign_get(backup_key(recorded.current.checkout.backup_id), 60), archive)
    restored = tmp_path / "restored"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(restored), str(archive)], check=True)
    for path in restored.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert TOKEN.encode() not in path.read_bytes(), path
    config = git(restored, "config", "--file", ".git/config", "--list").splitlines()
    assert "remote.origin.url=https://git.example.com/acme/widgets.git" in config
    assert "user.name=Resident" in config  # the rest of the config is kept
    untouched = {".git/config", ".git/FETCH_HEAD", ".git/remotes/mirror"}
    expected = {path: entry for path, entry in before.items() if path not in untouched}
    restored_tree = tree(restored)
    assert restored_tree.pop(".git/config")[:2] == before[".git/config"][:2]  # type and mode
    assert restored_tree == expected
    git(restored, "fsck", "--full", "--strict")


def test_a_checkout_a_seed_would_refuse_is_refused_before_anything_is_uploaded(
    stack: Stack, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path)
    git(repo, "config", "core.worktree", str(tmp_path))
    with pytest.raises(PublishFailed, match=r"a seed would refuse this checkout: core\.worktree"):
        publish(resource="widgets", checkout=repo, snapshots=stack.snapshots, r2=stack.r2)
    assert not SnapshotStore(stack.table).read("widgets").exists
