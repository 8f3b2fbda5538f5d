"""Real git repositories for tests: what a resident's checkout holds."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """Git as the tests' own user: a restored checkout belongs to the slot user, which git
    would otherwise refuse as of dubious ownership."""
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def new_repository(repo: Path) -> Path:
    """An initialised repository, nothing committed: a README, an executable script and a
    symlink to the README."""
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=main")
    git(repo, "config", "user.email", "resident@example.com")
    git(repo, "config", "user.name", "Resident")
    (repo / "README.md").write_text("# widgets\n")
    (repo / "src").mkdir()
    tool = repo / "src" / "tool.sh"
    tool.write_text("#!/bin/sh\necho widget\n")
    tool.chmod(0o755)
    (repo / "docs").symlink_to("README.md")
    return repo


def make_repository(root: Path) -> Path:
    """Commits, a symlink, an executable, an empty directory, an ignored file, and work
    that is not committed: a checkout as a resident holds it."""
    repo = new_repository(root / "widgets")
    (repo / ".gitignore").write_text("build/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", "first")
    (repo / "src" / "lib.py").write_text("VALUE = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", "second")
    (repo / "empty").mkdir()
    (repo / "build").mkdir()
    (repo / "build" / "artifact.bin").write_bytes(os.urandom(4096))
    (repo / "src" / "lib.py").write_text("VALUE = 2  # not committed yet\n")
    return repo


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under root: type, permission bits, and content or link target."""
    entries: dict[str, tuple[str, int, str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        relative = str(path.relative_to(root))
        if stat.S_ISLNK(info.st_mode):
            entries[relative] = ("link", 0, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            entries[relative] = ("dir", stat.S_IMODE(info.st_mode), "")
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            entries[relative] = ("file", stat.S_IMODE(info.st_mode), digest)
    return entries
