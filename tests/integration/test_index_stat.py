"""A restored checkout's index takes the extracted files' stat data (index_stat): git then
sees the archive's files unchanged without re-reading them, still sees every later edit,
and an index from the archive is data: nothing in it makes the restore look outside the
checkout, follow a link, or rewrite what it does not understand."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from pathlib import Path

import pytest

from repos import git, make_repository
from seedkeeper_task.restore.extract import extract
from seedkeeper_task.restore.index_stat import adopt_stat_data
from seedkeeper_tools.publish import build_squashfs

pytestmark = pytest.mark.skipif(
    shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None,
    reason="squashfs-tools is not installed (make setup installs it)",
)

LONG_AGO = 1_700_000_000  # the resident's files: written long before its index


def resident(root: Path, *extra: str) -> Path:
    """A resident's checkout (make_repository: an uncommitted edit, an executable, a
    symlink...), its files' mtimes long past and its index refreshed after them, as a
    working checkout's index is."""
    repo = make_repository(root)
    for path in [repo, *repo.rglob("*")]:
        if ".git" not in path.relative_to(repo).parts:
            os.utime(path, (LONG_AGO, LONG_AGO), follow_symlinks=False)
    git(repo, "update-index", "-q", "--refresh")
    if extra:
        git(repo, "update-index", *extra)
    return repo


def restored(repo: Path, root: Path) -> Path:
    """`repo` archived and extracted as the task does: new inodes, ctimes and owner."""
    archive = root / "archive.sqsh"
    build_squashfs(repo, archive)
    checkout = root / "checkout"
    extract(archive, checkout)
    return checkout


def stat_dirty(checkout: Path) -> list[str]:
    """What git takes for changed on its stat data alone (no content read): `diff-files`
    without a refresh."""
    return git(checkout, "diff-files", "--name-only").splitlines()


def status(checkout: Path) -> list[str]:
    """`git status --porcelain`, each line stripped."""
    return [line.strip() for line in git(checkout, "status", "--porcelain").splitlines()]


def tracked(checkout: Path) -> list[str]:
    return git(checkout, "ls-files").splitlines()


def test_git_sees_the_restored_files_unchanged_on_their_stat_data_and_the_real_edit_still(
    tmp_path: Path,
) -> None:
    checkout = restored(resident(tmp_path), tmp_path)
    assert sorted(stat_dirty(checkout)) == sorted(tracked(checkout))  # every entry, before

    adopted = adopt_stat_data(checkout, None)

    assert adopted == len(tracked(checkout)) - 1  # all but the resident's uncommitted edit
    assert stat_dirty(checkout) == ["src/lib.py"]
    assert status(checkout) == ["M src/lib.py"]
    debug = git(checkout, "ls-files", "--debug", "README.md")
    info = (checkout / "README.md").lstat()
    assert f"ino: {info.st_ino}" in debug
    assert f"uid: {info.st_uid}\tgid: {info.st_gid}" in debug


def test_an_edit_after_the_restore_is_seen_even_of_the_same_size(tmp_path: Path) -> None:
    checkout = restored(resident(tmp_path), tmp_path)
    adopt_stat_data(checkout, None)
    readme = checkout / "README.md"
    readme.write_bytes(bytes(reversed(readme.read_bytes())))  # same size, a new mtime

    assert "README.md" in stat_dirty(checkout)
    assert "M README.md" in status(checkout)


def test_git_reads_no_content_it_has_stat_data_for_which_is_the_limit_git_has_too(
    tmp_path: Path,
) -> None:
    """What this proves and what it cannot: git trusts stat data, so an archive whose file
    differs from its entry at the same size and mtime shows that file clean, as the
    resident's own git would have. The restore promises the archive's bytes (the recorded
    sha256) and HEAD (the claim's commit), not that the worktree is HEAD's tree."""
    checkout = restored(resident(tmp_path), tmp_path)
    readme = checkout / "README.md"
    before = readme.stat()
    readme.write_bytes(bytes(reversed(readme.read_bytes())))
    os.utime(readme, ns=(before.st_atime_ns, before.st_mtime_ns))

    adopt_stat_data(checkout, None)

    assert "README.md" not in stat_dirty(checkout)
    assert status(checkout) == ["M src/lib.py"]


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_every_index_version_git_writes_is_read(tmp_path: Path, version: str) -> None:
    repo = resident(tmp_path, "--index-version", version)
    if version == "3":
        git(repo, "update-index", "--skip-worktree", "README.md")  # extended flags
    checkout = restored(repo, tmp_path)

    adopted = adopt_stat_data(checkout, None)

    skipped = 1 if version == "3" else 0  # a skip-worktree entry is left as it is
    assert adopted == len(tracked(checkout)) - 1 - skipped
    assert stat_dirty(checkout) == ["src/lib.py"]
    git(checkout, "fsck", "--no-dangling")  # the index's checksum verifies


def test_a_sha256_repository(tmp_path: Path) -> None:
    repo = tmp_path / "resident"
    repo.mkdir()
    git(repo, "init", "--quiet", "--object-format=sha256", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "x")
    for path in (repo / "a.txt", repo / "run.sh"):
        os.utime(path, (LONG_AGO, LONG_AGO))
    git(repo, "update-index", "-q", "--refresh")
    checkout = restored(repo, tmp_path)

    assert adopt_stat_data(checkout, None) == 2
    assert stat_dirty(checkout) == []
    assert status(checkout) == []


def test_an_entry_of_another_type_mode_or_size_is_left_for_git_to_read(tmp_path: Path) -> None:
    checkout = restored(resident(tmp_path), tmp_path)
    (checkout / "src" / "tool.sh").chmod(0o644)  # the entry says executable
    link = checkout / "docs"
    target = os.readlink(link)
    link.unlink()
    link.write_text(target)  # the entry says symlink
    os.utime(link, (LONG_AGO, LONG_AGO))

    adopt_stat_data(checkout, None)

    assert sorted(stat_dirty(checkout)) == ["docs", "src/lib.py", "src/tool.sh"]


# -- the index is data ---------------------------------------------------------------


def write_index(path: Path, entries: list[tuple[bytes, int, int, int]], *, count: int = -1) -> None:
    """An index (version 2) of (path, mode, size, mtime) entries with any blob: what an
    archive can carry, git's checks or not. `count`: the header's, if not the true one."""
    body = bytearray(struct.pack(">4sLL", b"DIRC", 2, len(entries) if count < 0 else count))
    for name, mode, size, mtime in entries:
        start = len(body)
        body += struct.pack(">10L", 0, 0, mtime, 0, 0, 0, mode, 0, 0, size)
        body += (
            hashlib.sha1(name, usedforsecurity=False).digest()
            + struct.pack(">H", min(len(name), 0xFFF))
            + name
        )
        body += b"\0" * (8 - (len(body) - start) % 8)
    path.write_bytes(bytes(body) + hashlib.sha1(body, usedforsecurity=False).digest())


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A checkout with a `.git` and, beside it, a secret file the index will name."""
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "inside").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("root's\n")
    os.utime(outside / "secret", (LONG_AGO, LONG_AGO))
    return checkout, outside / "secret"


def entry_for(name: bytes, file: Path) -> tuple[bytes, int, int, int]:
    info = file.stat()
    return (name, 0o100644, info.st_size, int(info.st_mtime))


@pytest.mark.parametrize(
    "name",
    [b"../outside/secret", b"inside/../../outside/secret", b"/outside/secret", b"inside//x"],
)
def test_an_entry_whose_path_leaves_the_checkout_is_never_looked_at(
    planted: tuple[Path, Path], name: bytes
) -> None:
    checkout, secret = planted
    index = checkout / ".git" / "index"
    if name.startswith(b"/"):
        name = os.fsencode(secret)
    write_index(index, [entry_for(name, secret)])
    before = index.read_bytes()

    assert adopt_stat_data(checkout, None) == 0
    assert index.read_bytes() == before


def test_a_folder_that_is_a_link_is_never_followed(planted: tuple[Path, Path]) -> None:
    """`inside/link` leads to the secret's folder: the entry `inside/link/secret` matches
    the secret's size and mtime, and followed it would put root's file's inode and owner
    into an index the slot user reads."""
    checkout, secret = planted
    (checkout / "inside" / "link").symlink_to(secret.parent)
    index = checkout / ".git" / "index"
    write_index(index, [entry_for(b"inside/link/secret", secret)])
    before = index.read_bytes()

    assert adopt_stat_data(checkout, None) == 0
    assert index.read_bytes() == before


def test_entries_of_one_folder_are_judged_together_and_the_next_folder_afresh(
    planted: tuple[Path, Path],
) -> None:
    """A folder's path is checked once for the entries that come together in it: every
    entry through the link is refused, not only the first, a name that is not plain is
    refused in a folder that is, and the plain file beside them is still adopted."""
    checkout, secret = planted
    (checkout / "inside" / "link").symlink_to(secret.parent)
    mine = checkout / "inside" / "mine"
    mine.write_text("mine\n")
    os.utime(mine, (LONG_AGO, LONG_AGO))
    index = checkout / ".git" / "index"
    through_link = entry_for(b"inside/link/secret", secret)
    write_index(
        index,
        [
            entry_for(b"inside/..", secret),
            through_link,
            through_link,
            entry_for(b"inside/mine", mine),
            through_link,
        ],
    )

    assert adopt_stat_data(checkout, None) == 1  # inside/mine alone


def test_an_entry_in_the_git_directory_is_never_looked_at(planted: tuple[Path, Path]) -> None:
    checkout, _ = planted
    config = checkout / ".git" / "config"
    config.write_text("[core]\n")
    index = checkout / ".git" / "index"
    write_index(index, [entry_for(b".git/config", config), entry_for(b"a/.GIT/config", config)])
    before = index.read_bytes()

    assert adopt_stat_data(checkout, None) == 0
    assert index.read_bytes() == before


@pytest.mark.parametrize("damage", ["checksum", "count", "truncated", "padding", "version"])
def test_an_index_this_cannot_read_whole_is_left_as_it_is(
    planted: tuple[Path, Path], damage: str
) -> None:
    checkout, _ = planted
    (checkout / "inside" / "file").write_text("x\n")
    index = checkout / ".git" / "index"
    write_index(index, [entry_for(b"inside/file", checkout / "inside" / "file")])
    data = bytearray(index.read_bytes())
    if damage == "checksum":
        data[-1] ^= 1
    elif damage == "count":
        write_index(index, [entry_for(b"inside/file", checkout / "inside" / "file")], count=9)
        data = bytearray(index.read_bytes())
    elif damage == "truncated":
        data = data[:40] + data[-20:]
    else:
        if damage == "padding":
            data[12 + 62 + len(b"inside/file") + 1] = ord("x")
        else:
            data[7] = 5
        data[-20:] = hashlib.sha1(data[:-20], usedforsecurity=False).digest()
    index.write_bytes(bytes(data))

    assert adopt_stat_data(checkout, None) == 0
    assert index.read_bytes() == bytes(data)


def test_an_index_that_is_a_link_is_not_followed(planted: tuple[Path, Path]) -> None:
    checkout, secret = planted
    elsewhere = secret.parent / "index"
    write_index(elsewhere, [entry_for(b"inside/file", secret)])
    before = elsewhere.read_bytes()
    (checkout / "inside" / "file").write_text(secret.read_text())
    os.utime(checkout / "inside" / "file", (LONG_AGO, LONG_AGO))
    (checkout / ".git" / "index").symlink_to(elsewhere)

    assert adopt_stat_data(checkout, None) == 0
    assert elsewhere.read_bytes() == before
    assert (checkout / ".git" / "index").is_symlink()


def test_a_split_index_is_left_to_git(tmp_path: Path) -> None:
    checkout = restored(resident(tmp_path, "--split-index"), tmp_path)
    before = (checkout / ".git" / "index").read_bytes()
    assert b"link" in before  # the entries are in a shared index file

    assert adopt_stat_data(checkout, None) == 0
    assert (checkout / ".git" / "index").read_bytes() == before
    assert status(checkout) == ["M src/lib.py"]  # git re-reads, as without this module
