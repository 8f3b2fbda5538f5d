"""A fresh journaled filesystem per run.

Every run writes into a new ext4 of its own: a sparse image made before the run (its inode
tables and journal written then, so no lazy init thread writes during it), loop-mounted in
the run's folder, and removed whole after it, so no tree is ever deleted file by file.
This machine's root filesystem is ext4 without a journal, where creating files right after
deleting many is quadratic; a Fargate task's disk is fresh and journaled (LOCAL-AWS-NOTES).
As root only: otherwise a plain folder on the work dir's filesystem, and `description`
says so. The disk is synced before every timed run (`settle_disk`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from .runs import run_checked

# The commands a fresh filesystem takes (the command: its Debian package).
TOOLS = {"mkfs.ext4": "e2fsprogs", "mount": "mount"}


class Disks:
    """A new journaled ext4 per run, on a loop-mounted sparse image (root only); otherwise
    a plain folder on the work dir's own filesystem, and the report says so."""

    def __init__(self) -> None:
        self.mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
        self.loop = os.geteuid() == 0 and Path(self.mkfs).exists() and bool(shutil.which("mount"))

    @property
    def description(self) -> str:
        if self.loop:
            return "a fresh ext4 (journaled) per run, loop-mounted"
        return "the work dir's filesystem (no loop mount without root): NOT fresh per run"

    @contextlib.contextmanager
    def fresh(self, folder: Path, capacity: int) -> Iterator[Path]:
        """A fresh filesystem of `capacity` bytes mounted at `folder`/fs: its root."""
        mount = folder / "fs"
        mount.mkdir()
        if not self.loop:
            yield mount
            return
        image = folder / "fs.img"
        with image.open("wb") as sparse:
            sparse.truncate(capacity)
        # Inode tables and journal written now: no lazy init thread writing during a run.
        run_checked(
            [self.mkfs, "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image)]
        )
        run_checked(["mount", "-o", "loop", str(image), str(mount)])
        try:
            yield mount
        finally:
            unmount(mount)
            image.unlink(missing_ok=True)

    @contextlib.contextmanager
    def run(self, folder: Path, capacity: int) -> Iterator[Path]:
        """A run's own folder (its logs; made afresh, removed with all it holds after the
        run) with a fresh filesystem mounted in it: that filesystem's root."""
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            with self.fresh(folder, capacity) as root:
                yield root
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def settle_disk() -> None:
    """Start each timed run with no dirty pages from the one before (untimed)."""
    os.sync()
    time.sleep(0.2)


def unmount(mount: Path) -> None:
    """Unmount (the loop device detaches itself); lazily if something still holds it."""
    done = subprocess.run(["umount", str(mount)], check=False, capture_output=True)
    if done.returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def unmount_leftovers(runs: Path) -> None:
    """A run killed outright leaves its filesystem mounted under `runs`: unmount it first,
    so removing `runs` never descends into one still in use."""
    with contextlib.suppress(OSError):
        mounts = Path("/proc/mounts").read_text().splitlines()
        for line in reversed(mounts):
            point = line.split()[1].replace("\\040", " ")
            if point.startswith(f"{runs}/"):
                unmount(Path(point))


def clear(folder: Path) -> None:
    """`folder` removed, the filesystems a killed run left mounted in it unmounted first."""
    unmount_leftovers(folder)
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def scratch(*folders: Path) -> Iterator[None]:
    """Scratch folders of runs: cleared of what a run killed outright left (mounts first)
    before the block, and cleared again after it, however it ends."""
    for folder in folders:
        clear(folder)
    try:
        yield
    finally:
        for folder in folders:
            clear(folder)
