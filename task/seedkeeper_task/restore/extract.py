"""Extracting a downloaded squashfs archive so that its target appears last and complete.

unsquashfs writes into a fresh hidden sibling of the target (same filesystem, so the final
rename is atomic); the staged tree is checked, then renamed into place. Every failure
removes the staging directory, so a target that exists is always a whole, checked tree.

Two checks are defence in depth and do not rely on unsquashfs 4.5.1's own fixes
(CVE-2021-40153, CVE-2021-41072): the listing is read before anything is written (no
entry may be absolute, hold a `.` or `..` component, or come out of the archive's sorted
order, which is how one that appears twice is found), and the staged
tree is walked without following anything (no symlink may lead outside it; no device
node may be created from an archive).

Restored files belong to whoever extracts, never to the archive's owners, and lose setuid
and setgid bits. With a slot user, unsquashfs itself runs as that user (root only makes
the staging directory and hands it over), so a flaw in unsquashfs runs unprivileged and no
recursive chown is needed; the staged-tree check then finds nothing to fix.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import heapq
import operator
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import islice
from pathlib import Path, PurePosixPath

from seedkeeper.errors import SeedkeeperError
from seedkeeper_task.slot_user import SlotUser

# -user-xattrs: user.* xattrs are restored; security.* and trusted.* (file capabilities,
# SELinux labels of the publishing host) never are: they grant privilege or are
# meaningless here, and restoring them fails for non-root. -strict-errors: any error
# aborts, since a tree with a file or mode missing is refused anyway.
# -da/-fr 32: the data and fragment caches in MiB (256 each by default), so the extractor's
# memory stays flat as archives grow (measured: 437 MB -> 74 MB at 300 MB, no time cost).
UNSQUASHFS_COMMAND = (
    "unsquashfs",
    "-no-progress",
    "-quiet",
    "-strict-errors",
    "-user-xattrs",
    "-da",
    "32",
    "-fr",
    "32",
)
_STAGING = re.compile(r"\..+\.staging-[0-9a-f]{16}", re.DOTALL)
_STDERR_TAIL = 600
_OUTPUT_CHUNK = 1024 * 1024
_EXIT_GRACE = 1.0  # seconds for unsquashfs to exit once its output ended early
_MAX_SYMLINK_HOPS = 40  # Linux's MAXSYMLINKS: a longer chain cannot be resolved at all
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
_BATCH = 8192  # listed entries checked at a time
_SLASH_AS_NUL = bytes.maketrans(b"/", b"\0")
# The staged tree's walk: one find per processor, up to this many (measured on the 300 MB
# benchmark's 110,000-entry deps tree: 0.20 s with one, 0.10 s with two).
_MAX_WALKERS = 4
_STARTS_PER_WALKER = 16  # starting points a find gets, at least, when the tree has them
_MAX_LISTED_FOLDERS = 256  # folders listed to choose which to open


class UnsafeArchive(SeedkeeperError):
    """The archive would write outside its target: a `..` or absolute entry name, an
    absolute symlink, or a symlink whose target escapes the extracted root. Message names
    the entry (relative path), never a URL."""


class ExtractFailed(SeedkeeperError):
    """unsquashfs failed (corrupt or truncated archive, disk full...): message carries
    unsquashfs's stderr tail."""


def extract(
    archive: Path,
    target: Path,
    *,
    processors: int | None = None,
    owner: SlotUser | None = None,
    worktree_links_may_leave: bool = False,
    staging_in: Path | None = None,
    before_placing: Callable[[], None] | None = None,
) -> dict[PurePosixPath, str]:
    """Extract `archive` so that `target` (which must not exist) appears last and complete:
    unsquashfs into a fresh staging folder (hidden name like `.<name>.staging-<random>`,
    in `staging_in`, by default target's parent: it must be on target's filesystem),
    check the staged tree, call `before_placing` (it may wait until target's parent is
    there, or raise to abandon), then rename(staging, target). On any failure, remove the
    staging directory and leave target absent. Never follow or create anything outside
    staging. With `owner`, unsquashfs runs as that user (who must be able to reach
    `archive` and the staging folder's parent) and the tree is theirs; without, it is this
    process's user's. Answers the tree's links (path relative to target -> link target).

    A corrupt or truncated archive raises ExtractFailed, from the listing when its tables
    are damaged, from the extraction when a data block is. An existing target raises
    FileExistsError, before anything is written and again (atomically) at the rename.

    `worktree_links_may_leave`: a slot's own checkpoint holds the links its run made (a
    virtualenv's `bin/python -> /usr/bin/python3`); outside `.git` they are restored as
    they were. Nothing root does with a restored worktree follows a link (the slot user's
    git reads it), and a link in `.git` is still refused if it leads outside, through a
    worktree link or not."""
    if target.name in ("", ".", ".."):
        raise ValueError(f"target {str(target)!r} names no directory entry")
    if processors is not None and processors < 1:
        raise ValueError("processors must be at least 1")
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "extraction target exists", str(target))
    _check_listed(archive, owner)
    staging = (staging_in or target.parent) / f".{target.name[:128]}.staging-{secrets.token_hex(8)}"
    # mkdir is exclusive: the staging directory is ours and fresh, never a planted symlink.
    staging.mkdir(mode=0o700)
    try:
        if owner is not None:
            os.chown(staging, owner.uid, owner.gid)
        threads = [] if processors is None else ["-processors", str(processors)]
        _unsquashfs([*UNSQUASHFS_COMMAND, *threads, "-d", str(staging), str(archive)], owner)
        owned_by = (os.geteuid(), os.getegid()) if owner is None else (owner.uid, owner.gid)
        links = check_tree(staging, owned_by, worktree_links_may_leave=worktree_links_may_leave)
        if before_placing is not None:
            before_placing()
        _rename_noreplace(staging, target)
    except BaseException:
        # subprocess.run has already killed and reaped unsquashfs if we were interrupted:
        # nothing is still writing into what we remove.
        remove_tree(staging)
        raise
    return links


def sweep_staging(parent: Path) -> list[Path]:
    """Remove leftover staging siblings (`.*.staging-*` directories) in parent from an
    earlier, interrupted attempt; return what was removed. Touches nothing else: only real
    directories (not symlinks) whose name has exactly the shape extract() gives them.
    Never call it while an extraction into the same parent may be running."""
    removed: list[Path] = []
    with os.scandir(parent) as entries:
        leftovers = [
            Path(entry.path)
            for entry in entries
            if _STAGING.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)
        ]
    for leftover in sorted(leftovers):
        remove_tree(leftover)
        removed.append(leftover)
    return removed


def check_listing(paths: Iterable[bytes]) -> None:
    """Refuse any listed entry that is absolute, has an empty, `.` or `..` component (a
    name holding `/` shows as one of these), or does not come after the one before it in
    the archive's order: a directory's entries sorted by name, each directory's tree right
    after it (how mksquashfs writes them, and how unsquashfs lists them). An entry that
    appears twice (a symlink and a directory of one name is how an extractor is led to
    write through the symlink) cannot be in that order, so nothing is kept of the entries
    but the last one: the memory stays flat however many come."""
    entries = iter(paths)
    _check_batches(iter(lambda: list(islice(entries, _BATCH)), []))


def _check_batches(batches: Iterable[list[bytes]]) -> None:
    """`check_listing` a batch at a time: per entry only a `translate` runs in Python, the
    checks themselves in C (a join, three searches, one comparison per neighbour)."""
    previous = b""
    for batch in filter(None, batches):
        # With `/` as NUL (no name holds one), bytes order is the archive's order and
        # a bad component is one between two NULs.
        keys = [path.translate(_SLASH_AS_NUL) for path in batch]
        joined = b"\0" + b"\0".join(keys) + b"\0"
        if any(bad in joined for bad in (b"\0\0", b"\0.\0", b"\0..\0")):
            path = next(path for path in batch if _has_bad_part(path))
            raise UnsafeArchive(f"entry {_show(path)} is absolute or has a '.' or '..' part")
        before = [previous, *keys]
        if not all(map(operator.lt, before, keys)):
            at = next(at for at, key in enumerate(keys) if key <= before[at])
            why = "appears twice" if keys[at] == before[at] else "is out of the archive's order"
            raise UnsafeArchive(f"entry {_show(batch[at])} {why}")
        previous = keys[-1]


def _has_bad_part(path: bytes) -> bool:
    return any(part in (b"", b".", b"..") for part in path.split(b"/"))


def listed_paths(listing: bytes, prefix: bytes) -> list[bytes]:
    """Entry paths (relative, raw bytes) from `unsquashfs -d <prefix> -ls` output.

    unsquashfs prints each path as `<prefix>/<path>\\n` with no escaping, so a name may
    hold spaces, ` -> ` or newlines. `prefix` is a fresh random token: a new entry starts
    exactly where `\\n<prefix>/` does, and a name cannot contain a token chosen after the
    archive was made. Anything else is refused rather than guessed at."""
    return [path for batch in _listed([listing], prefix) for path in batch]


def _listed(chunks: Iterable[bytes], prefix: bytes) -> Iterator[list[bytes]]:
    """`listed_paths` over the listing as it arrives, in chunks of any size: the paths of
    each chunk's complete entries, a list per chunk."""
    separator = b"\n" + prefix
    pending, root_seen = b"", False
    for chunk in chunks:
        *complete, pending = (pending + chunk).split(separator)
        if complete and not root_seen:
            if complete[0] != prefix:
                raise UnsafeArchive("archive listing is malformed (no root entry)")
            del complete[0]
            root_seen = True
        yield _listed_paths(complete)
    if not pending.endswith(b"\n"):
        raise UnsafeArchive("archive listing is malformed (no final newline)")
    if root_seen:
        yield _listed_paths([pending[:-1]])
    elif pending[:-1] != prefix:
        raise UnsafeArchive("archive listing is malformed (no root entry)")


def _listed_paths(pieces: list[bytes]) -> list[bytes]:
    if not all(map(operator.methodcaller("startswith", b"/"), pieces)):
        piece = next(piece for piece in pieces if not piece.startswith(b"/"))
        raise UnsafeArchive(f"archive listing is malformed near {_show(piece)}")
    return [piece[1:] for piece in pieces]


def check_tree(
    root: Path, owner: tuple[int, int], *, worktree_links_may_leave: bool = False
) -> dict[PurePosixPath, str]:
    """Walk the staged tree without following symlinks; refuse device nodes and any symlink
    that could lead outside `root`; give every entry to `owner` (uid, gid) and strip
    setuid/setgid bits (root restores an archive's owners and modes as they are). Answers
    its links (relative path -> target)."""
    _own(root, os.lstat(root), owner)
    opened, shares = walk_plan(os.fsencode(root), _walkers())
    for folder in opened:  # folders no find walks: each checked by itself, as the root is
        path = os.path.join(os.fsencode(root), folder)
        _own(path, os.lstat(path), owner)
    links: dict[PurePosixPath, str] = {}
    for kind, mode, owned_by, relative, target in _notable(root, owner, shares):
        if kind in (b"b", b"c"):
            raise UnsafeArchive(f"entry {_show(relative)} is a device node")
        path = os.path.join(os.fsencode(root), relative)
        if owned_by != owner:
            os.lchown(path, *owner)  # for a file, the kernel also drops setuid/setgid here
        if kind == b"l":
            links[PurePosixPath(os.fsdecode(relative))] = os.fsdecode(target)
        elif mode & _PRIVILEGE_BITS:
            os.chmod(path, mode & ~_PRIVILEGE_BITS)
    _refuse_escaping(links, worktree_links_may_leave=worktree_links_may_leave)
    return links


def check_links(
    root: Path, placed: PurePosixPath | None = None, placed_links: Mapping[PurePosixPath, str] = {}
) -> None:
    """Only `check_tree`'s symlink check, for a tree whose parts were each checked whole
    (a checkout with its deps tree inside). `placed`: a tree placed at that path once it was
    checked, whose links `check_tree` answered: not walked again."""
    skipped = [] if placed is None else ["-path", str(root / placed), "-prune", "-o"]
    expression = [*skipped, "-type", "l", "-printf", "%P\\0%l\\0"]
    found = {
        PurePosixPath(os.fsdecode(link)): os.fsdecode(to)
        for link, to in _find(root, expression, fields=2)
    }
    if placed is not None:
        found |= {placed / link: to for link, to in placed_links.items()}
    _refuse_escaping(found)


def _refuse_escaping(
    links: Mapping[PurePosixPath, str], *, worktree_links_may_leave: bool = False
) -> None:
    for link, link_target in links.items():
        in_worktree = link.parts[:1] != (".git",)
        if worktree_links_may_leave and in_worktree:
            continue
        if symlink_escapes(link, link_target, links):
            raise UnsafeArchive(
                f"symlink {_show(link)} -> {_show(link_target)} leads outside the archive"
            )


def symlink_escapes(
    link: PurePosixPath, target: str, links: Mapping[PurePosixPath, str] | None = None
) -> bool:
    """Whether the symlink at `link` (relative to the extracted root) pointing at `target`
    could lead outside the root: an absolute target, or one whose `..` climbs above the
    root when resolved relative to the link's own directory.

    Without `links` the resolution is purely lexical. With `links` (every symlink in the
    tree, relative path -> target) a component that is itself a symlink is followed as the
    kernel would, since `..` after a symlink climbs from where the symlink points, not from
    where it sits (`a/b/up -> ../..` is harmless alone, yet `x -> a/b/up/../y` escapes). A
    chain longer than the kernel allows, or a loop, counts as escaping: containment cannot
    be shown."""
    hops = [_MAX_SYMLINK_HOPS]
    try:
        _resolve(list(link.parent.parts), target, links or {}, hops)
    except _Escapes:
        return True
    return False


class _Escapes(Exception):
    pass


def _resolve(
    start: list[str], target: str, links: Mapping[PurePosixPath, str], hops: list[int]
) -> list[str]:
    """The components of where `target` leads from directory `start`, inside the root."""
    if target.startswith("/"):
        raise _Escapes
    where = list(start)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                raise _Escapes
            where.pop()
            continue
        where.append(part)
        inner = links.get(PurePosixPath(*where))
        if inner is not None:
            hops[0] -= 1
            if hops[0] < 0:
                raise _Escapes
            where = _resolve(where[:-1], inner, links, hops)
    return where


def _notable(
    root: Path, owner: tuple[int, int], shares: list[list[bytes]]
) -> Iterator[tuple[bytes, int, tuple[int, int], bytes, bytes]]:
    """(type letter, mode, (uid, gid), relative path, link target) of each entry in `shares`
    (`walk_plan`'s) that is a device node or a link, has a setuid or setgid bit, or is not
    `owner`'s: one find(1) per share, all at once, walks its part of the tree (never
    following a link) and lstat's each entry, so the walk costs no Python per entry."""
    uid, gid = (str(number) for number in owner)
    wanted = ["(", "-type", "b", "-o", "-type", "c", "-o", "-type", "l", "-o", "-perm"]
    wanted += ["/6000", "-o", "!", "-uid", uid, "-o", "!", "-gid", gid, ")"]
    printed = ["-printf", "%y\\0%m\\0%U\\0%G\\0%p\\0%l\\0"]
    prefix = len(os.fsencode(root)) + 1  # %p is the path as given: root's, then the entry's
    with ThreadPoolExecutor(max(1, len(shares)), thread_name_prefix="walk") as walkers:
        walks = walkers.map(
            lambda share: _find(root, [*wanted, *printed], fields=6, starts=share), shares
        )
        for found in list(walks):
            for kind, mode, found_uid, found_gid, path, target in found:
                yield kind, int(mode, 8), (int(found_uid), int(found_gid)), path[prefix:], target


def walk_plan(root: bytes, walkers: int) -> tuple[list[bytes], list[list[bytes]]]:
    """How `walkers` finds share the walk of the tree under `root`: (the folders opened to
    find where to start, which no find walks; for each find, its starting points, walked
    whole). Every entry is in exactly one of them; paths are relative to `root`.

    The folder with the most entries is opened first, until there are enough starting
    points for even shares (`_STARTS_PER_WALKER` each), so a tree held in one folder (a
    virtualenv's `lib/python3.x/site-packages`) is split below it. At most
    `_MAX_LISTED_FOLDERS` are listed to decide; a folder that cannot be listed is a
    starting point (its find then fails on it, as a single walk would); a root that cannot
    be listed raises UnsafeArchive."""
    wanted = walkers * _STARTS_PER_WALKER
    opened: list[bytes] = []
    starts: list[bytes] = []  # what is not a listed folder: files, links, unlisted folders
    folders: list[tuple[int, bytes]] = []  # listed, not opened: (-entries, path), a heap
    listings: dict[bytes, list[tuple[bytes, bool]]] = {}
    unsorted = _entries(root, b"")
    if unsorted is None:
        raise UnsafeArchive("the tree cannot be walked whole, so cannot be checked: its root")
    while len(starts) + len(folders) + len(unsorted) < wanted:
        for path, is_folder in unsorted:
            listable = is_folder and len(listings) < _MAX_LISTED_FOLDERS
            listed = _entries(root, path) if listable else None
            if listed is None:
                starts.append(path)
            else:
                listings[path] = listed
                heapq.heappush(folders, (-len(listed), path))
        if not folders:
            unsorted = []
            break
        _, largest = heapq.heappop(folders)
        opened.append(largest)
        unsorted = listings[largest]
    starts += [path for path, _ in unsorted]
    starts += [path for _, path in sorted(folders)]
    return opened, [share for share in (starts[at::walkers] for at in range(walkers)) if share]


def _entries(root: bytes, folder: bytes) -> list[tuple[bytes, bool]] | None:
    """(path relative to root, is a folder and not a link) of each entry in `folder`,
    sorted; None when it cannot be listed."""
    try:
        with os.scandir(os.path.join(root, folder)) as found:
            return sorted(
                (os.path.join(folder, entry.name), entry.is_dir(follow_symlinks=False))
                for entry in found
            )
    except OSError:
        return None


def _walkers() -> int:
    """One find per processor this process may run on, up to `_MAX_WALKERS`."""
    return max(1, min(_MAX_WALKERS, len(os.sched_getaffinity(0))))


def _find(
    root: Path, expression: list[str], *, fields: int, starts: list[bytes] | None = None
) -> list[list[bytes]]:
    """find(1) under `root` (never following a link), its NUL-separated output in groups of
    `fields`. Without `starts`: root's entries, not itself. With: the entries at those paths
    (relative to root) and under them, given on find's input, so that no name in the tree
    is ever an argument. A directory that cannot be read makes find fail: what it holds
    cannot be checked."""
    if starts is None:
        argv, given = ["find", str(root), "-mindepth", "1", *expression], None
    else:
        folder = os.fsencode(root)
        argv = ["find", "-files0-from", "-", *expression]
        given = b"".join(os.path.join(folder, start) + b"\0" for start in starts)
    done = subprocess.run(argv, input=given, capture_output=True, check=False, env=_environment())
    if done.returncode != 0:
        tail = os.fsdecode(done.stderr).strip()[-_STDERR_TAIL:]
        raise UnsafeArchive(f"the tree cannot be walked whole, so cannot be checked: {tail}")
    values = done.stdout.split(b"\0")[:-1]
    if len(values) % fields:
        raise UnsafeArchive("the tree's listing is malformed")
    return [values[index : index + fields] for index in range(0, len(values), fields)]


def _own(path: str | bytes | Path, info: os.stat_result, owner: tuple[int, int]) -> None:
    """Give one staged entry (never following it) to owner, without setuid/setgid bits."""
    if (info.st_uid, info.st_gid) != owner:
        os.lchown(path, *owner)  # for a file, the kernel also drops setuid/setgid here
    if info.st_mode & _PRIVILEGE_BITS and not stat.S_ISLNK(info.st_mode):
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~_PRIVILEGE_BITS)


def _check_listed(archive: Path, owner: SlotUser | None) -> None:
    """`check_listing` of the archive's entry paths, read from its metadata before anything
    is written, as unsquashfs prints them (never held whole: the memory stays flat)."""
    prefix = f"seedkeeper-{secrets.token_hex(16)}"
    argv = ["unsquashfs", "-no-progress", "-d", prefix, "-ls", str(archive)]
    _unsquashfs(argv, owner, lambda chunks: _check_batches(_listed(chunks, prefix.encode())))


def _unsquashfs(
    argv: list[str], owner: SlotUser | None, read: Callable[[Iterator[bytes]], None] | None = None
) -> None:
    """unsquashfs reads hostile bytes: it runs as the owner when there is one, and never
    sees this process's environment (which may hold credentials). `read` is handed its
    output as it comes (without one, the output is discarded); whatever ends this early (a
    refusal from `read`, an interruption) kills and reaps unsquashfs first."""
    dropped = owner.subprocess_kwargs() if owner is not None else {}
    with tempfile.TemporaryFile() as errors:
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if read is not None else subprocess.DEVNULL,
                stderr=errors,
                env=_environment(),
                **dropped,
            )
        except FileNotFoundError as missing:
            raise ExtractFailed("unsquashfs is not installed (squashfs-tools)") from missing
        with process:
            try:
                if read is not None:
                    assert process.stdout is not None
                    # A pipe as large as a read: unsquashfs writes on while one is checked
                    # (the 300 MB benchmark's deps listing: 0.12 s -> 0.07 s). Only faster.
                    with contextlib.suppress(OSError):
                        fcntl.fcntl(process.stdout, fcntl.F_SETPIPE_SZ, _OUTPUT_CHUNK)
                    read(iter(partial(process.stdout.read, _OUTPUT_CHUNK), b""))
                process.wait()
            except BaseException as stopped:
                refused = isinstance(stopped, UnsafeArchive)
                if refused:  # output cut short because unsquashfs failed: it is exiting
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=_EXIT_GRACE)
                process.kill()
                process.wait()
                if not (refused and process.returncode > 0):
                    raise
                # unsquashfs failed on its own, so its output was cut short: its error says why
        if process.returncode != 0:
            errors.seek(0)
            tail = os.fsdecode(errors.read()).strip()[-_STDERR_TAIL:]
            raise ExtractFailed(f"unsquashfs exited {process.returncode}: {tail}")


def _environment() -> dict[str, str]:
    """All a helper (unsquashfs, find) is given of the environment."""
    return {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}


def _rename_noreplace(source: Path, target: Path) -> None:
    """rename(2) that never replaces: plain os.rename silently replaces an empty directory
    that appeared at target while we extracted. renameat2(RENAME_NOREPLACE) where libc and
    the filesystem have it; otherwise a check just before the rename."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        flags = _RENAME_NOREPLACE
        if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(code, os.strerror(code), str(source), None, str(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "extraction target exists", str(target))
    os.rename(source, target)


def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    function = getattr(libc, "renameat2", None)
    if function is None:
        return None
    int_, path = ctypes.c_int, ctypes.c_char_p
    function.argtypes = [int_, path, int_, path, ctypes.c_uint]
    function.restype = ctypes.c_int
    call: Callable[[int, bytes, int, bytes, int], int] = function
    return call


def remove_tree(path: Path) -> None:
    """Remove a staged tree that may hold read-only directories (a Go module cache does):
    rmtree never follows symlinks; if it is refused, give our own directories u+rwx (never
    through a symlink) and try once more."""
    if not os.path.lexists(path):
        return
    try:
        shutil.rmtree(path)
    except OSError:
        _make_removable(path)
        shutil.rmtree(path)


def _make_removable(root: Path) -> None:
    """Give every directory under root (root included) u+rwx, top-down so each is made
    readable before it is read; symlinks are never followed (lstat decides what is a
    directory, and nothing else writes into a staging tree)."""
    pending = [root]
    while pending:
        directory = pending.pop()
        mode = directory.lstat().st_mode
        if not stat.S_ISDIR(mode):
            continue
        os.chmod(directory, stat.S_IMODE(mode) | stat.S_IRWXU)
        with os.scandir(directory) as entries:
            pending.extend(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))


def _show(name: bytes | str | PurePosixPath) -> str:
    """A name as a quoted literal: newlines and control characters stay visible and cannot
    forge a log line."""
    text = os.fsdecode(name) if isinstance(name, bytes) else str(name)
    return repr(text)
