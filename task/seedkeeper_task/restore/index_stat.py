"""Give a restored checkout's git index the stat data of the files just extracted.

An archive's `.git/index` holds the stat data of the resident's files: their inodes,
device, ctimes and owners are not the extracted files', so git takes every entry for
changed and re-reads and re-hashes the whole worktree on the first command that looks
(the fix-up's checkout: most of its time). Git's own rule is that an entry whose stat data
match the file is unchanged; here an entry is given the file's inode, device, ctime and
owner when what the archive carries of the file itself matches the entry: its type, its
executable bit, its size and its mtime (squashfs keeps whole seconds, as git compares
them). Git then still compares every later look against these stat data, so an edit made
after the restore is seen as any edit is.

The index is data from the archive (DESIGN §9): it is parsed within bounds, its checksum
verified, and any surprise (a version, an extension or a layout we do not rewrite, a path
that is not a plain relative one, a folder that is a link) leaves the entry, or the whole
index, as it came; git then re-hashes as it would have. Files are looked at through folder
descriptors opened without following links, never by path. What this does not prove, and
git's stat check never does either: an entry whose size and mtime match a file of other
content is taken as unchanged, so an archive can show a worktree edit to `git status` as
clean, as the resident's own git would have shown it. The archive's bytes are the
resident's (verified against the sha256 it recorded); HEAD is the claim's commit.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from seedkeeper_task.restore.repository import replace_file
from seedkeeper_task.slot_user import SlotUser

INDEX_LIMIT = 64 * 1024 * 1024  # larger indexes are left to git (the task's memory stays flat)
_SIGNATURE = b"DIRC"
_HEADER = struct.Struct(">4sLL")
# ctime s, ns, mtime s, ns, dev, ino, mode, uid, gid, size
_STAT = struct.Struct(">10L")
_FLAGS = struct.Struct(">H")
_ASSUME_VALID, _EXTENDED, _STAGE = 0x8000, 0x4000, 0x3000
_SKIP_WORKTREE, _INTENT_TO_ADD = 0x4000, 0x2000
_REGULAR, _SYMLINK = 0o100000, 0o120000
_TYPE_BITS = 0o170000
# Split index ("link": entries live in another file) and sparse index ("sdir": entries
# that are folders): not rewritten here.
_UNSUPPORTED_EXTENSIONS = (b"link", b"sdir")
_MAX_DEPTH = 256
_U32 = 0xFFFFFFFF


class _Entry(NamedTuple):  # one per index entry: a tuple is made fastest
    offset: int  # of its stat data in the index
    path: bytes
    mode: int
    size: int
    mtime: int
    flags: int  # 0 unless stage 0, valid, and neither skip-worktree nor intent-to-add


class _Unreadable(Exception):
    """The index is not one this module rewrites: it is left as it is."""


def adopt_stat_data(checkout: Path, owner: SlotUser | None) -> int:
    """Rewrite `checkout`/.git/index with the stat data of the files that match their
    entries (replaced through a new file, `owner`'s); the count of entries given them.
    Nothing is rewritten (0) when none matches or the index is not one this reads."""
    index = checkout / ".git" / "index"
    try:
        data = _read_regular(index)
        layout = _layout(data)
        adopted = _adopt(checkout, data, layout)
    except (OSError, _Unreadable):
        return 0
    if not adopted:
        return 0
    digest_size = layout.digest_size
    body = memoryview(data)[:-digest_size]
    if any(data[-digest_size:]):  # all zeros: written with index.skipHash, kept so
        data[-digest_size:] = _digest(digest_size, body)
    body.release()
    replace_file(index, data, owner)
    return adopted


def _adopt(checkout: Path, data: bytearray, layout: _Layout) -> int:
    """Write into `data` (the index) the stat data of each entry's file that matches it;
    the count written. Raises _Unreadable (leaving `data` half written) for an index this
    does not read, wherever the surprise is."""
    adopted = 0
    with _Folders(checkout) as folders:
        for entry in _entries(data, layout):
            info = folders.lstat(entry.path)
            if info is not None and _matches(entry, info):
                _STAT.pack_into(
                    data,
                    entry.offset,
                    info.st_ctime_ns // 1_000_000_000 & _U32,
                    info.st_ctime_ns % 1_000_000_000,
                    info.st_mtime_ns // 1_000_000_000 & _U32,
                    info.st_mtime_ns % 1_000_000_000,
                    info.st_dev & _U32,
                    info.st_ino & _U32,
                    entry.mode,
                    info.st_uid & _U32,
                    info.st_gid & _U32,
                    entry.size,
                )
                adopted += 1
    return adopted


def _matches(entry: _Entry, info: os.stat_result) -> bool:
    if entry.flags:
        return False
    if entry.mode & _TYPE_BITS == _REGULAR:
        executable = entry.mode & 0o111 != 0
        if not stat.S_ISREG(info.st_mode) or bool(info.st_mode & 0o100) != executable:
            return False
    elif entry.mode & _TYPE_BITS != _SYMLINK or not stat.S_ISLNK(info.st_mode):
        return False  # a gitlink, or another type than the entry's
    return (info.st_size & _U32) == entry.size and (
        info.st_mtime_ns // 1_000_000_000 & _U32
    ) == entry.mtime


class _Layout(NamedTuple):
    version: int
    entry_count: int
    digest_size: int


def _layout(data: bytearray) -> _Layout:
    """An index's version (2 to 4), entry count and digest size, read before anything in it
    is written; raises _Unreadable for anything else, a checksum that does not verify
    included."""
    if len(data) < _HEADER.size + 20:
        raise _Unreadable("too short")
    signature, version, count = _HEADER.unpack_from(data)
    if signature != _SIGNATURE or version not in (2, 3, 4):
        raise _Unreadable("not an index this reads")
    return _Layout(version, count, _digest_size(data))


def _entries(data: bytearray, layout: _Layout) -> Iterator[_Entry]:
    """The entries of an index as they are read, none kept (the memory stays that of the
    index itself); raises _Unreadable, when it comes to it, for an entry, a path or an
    extension this does not read."""
    version, count, digest_size = layout
    end = len(data) - digest_size
    oid_size = digest_size
    offset, previous = _HEADER.size, b""
    for _ in range(count):
        fixed = offset + _STAT.size + oid_size + _FLAGS.size
        if fixed > end:
            raise _Unreadable("an entry past the end")
        fields = _STAT.unpack_from(data, offset)
        (flags,) = _FLAGS.unpack_from(data, fixed - _FLAGS.size)
        extended = 0
        name_at = fixed
        if flags & _EXTENDED:
            if version < 3 or name_at + 2 > end:
                raise _Unreadable("extended flags where none may be")
            (extended,) = _FLAGS.unpack_from(data, name_at)
            name_at += 2
        if version == 4:
            strip, name_at = _varint(data, name_at, end)
            if strip > len(previous):
                raise _Unreadable("a prefix longer than the previous path")
            nul = data.find(b"\0", name_at, end)
            if nul < 0:
                raise _Unreadable("an unterminated path")
            path = previous[: len(previous) - strip] + bytes(data[name_at:nul])
            next_offset = nul + 1
        else:
            nul = data.find(b"\0", name_at, end)
            if nul < 0:
                raise _Unreadable("an unterminated path")
            path = bytes(data[name_at:nul])
            length = nul - offset
            next_offset = offset + (length + 8) // 8 * 8  # 1 to 8 NULs pad it to 8 bytes
            if next_offset > end or any(data[nul:next_offset]):
                raise _Unreadable("bad padding")
        unusable = flags & (_ASSUME_VALID | _STAGE) or extended & (_SKIP_WORKTREE | _INTENT_TO_ADD)
        yield _Entry(offset, path, fields[6], fields[9], fields[2], 1 if unusable else 0)
        offset, previous = next_offset, path
    _check_extensions(data, offset, end)


def _check_extensions(data: bytearray, offset: int, end: int) -> None:
    while offset < end:
        if offset + 8 > end:
            raise _Unreadable("a truncated extension")
        signature = bytes(data[offset : offset + 4])
        (size,) = struct.unpack_from(">L", data, offset + 4)
        if signature in _UNSUPPORTED_EXTENSIONS:
            raise _Unreadable("a split or sparse index")
        offset += 8 + size
    if offset != end:
        raise _Unreadable("an extension past the end")


def _digest_size(data: bytearray) -> int:
    """20 (SHA-1) or 32 (SHA-256): the trailing checksum that verifies, or all zeros."""
    view = memoryview(data)
    for size in (20, 32):
        trailer = view[-size:]
        if not any(trailer) or _digest(size, view[:-size]) == trailer:
            return size
    raise _Unreadable("the checksum does not verify")


def _digest(size: int, body: memoryview) -> bytes:
    return (
        hashlib.sha1(body, usedforsecurity=False) if size == 20 else hashlib.sha256(body)
    ).digest()


def _varint(data: bytearray, offset: int, end: int) -> tuple[int, int]:
    """git's offset varint (each continuation adds one before shifting): value, next offset."""
    value = -1
    for position in range(offset, min(end, offset + 9)):
        byte = data[position]
        value = (value + 1) << 7 | byte & 0x7F
        if not byte & 0x80:
            return value, position + 1
    raise _Unreadable("a bad varint")


class _Folders:
    """lstat of index paths through folder descriptors opened with O_NOFOLLOW, from the
    checkout down: a folder that is a link, or a path that is not plain, answers None.
    Entries come sorted, so the open folders are a stack along the current path, and
    the entries of one folder come together: its path is checked once for all of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stack: list[tuple[bytes, int]] = []
        self.folder: bytes = b""  # the last entry's, with its final slash
        self.descriptor: int | None = None

    def __enter__(self) -> _Folders:
        self.top = self.descriptor = _open_folder(None, os.fsencode(self.root))
        return self

    def __exit__(self, *_: object) -> None:
        for _name, descriptor in self.stack:
            os.close(descriptor)
        os.close(self.top)

    def lstat(self, path: bytes) -> os.stat_result | None:
        cut = path.rfind(b"/") + 1
        folder, name = path[:cut], path[cut:]
        if folder != self.folder:
            self.folder, self.descriptor = folder, self._open(folder)
        if self.descriptor is None or not _plain(name):
            return None
        try:
            return os.stat(name, dir_fd=self.descriptor, follow_symlinks=False)
        except OSError:
            return None

    def _open(self, folder: bytes) -> int | None:
        """The descriptor of `folder` (a path with its final slash; empty: the checkout),
        opening what of it is not open yet; None when it is not plain, is in a `.git`, or
        cannot be opened without following a link."""
        folders = folder[:-1].split(b"/") if folder else []
        if len(folders) > _MAX_DEPTH or not all(map(_plain, folders)):
            return None
        if b".git" in (part.lower() for part in folders):
            return None  # git never checks out into a repository's folder
        common = 0
        while (
            common < min(len(folders), len(self.stack)) and self.stack[common][0] == folders[common]
        ):
            common += 1
        while len(self.stack) > common:
            os.close(self.stack.pop()[1])
        try:
            for part in folders[common:]:
                parent = self.stack[-1][1] if self.stack else self.top
                self.stack.append((part, _open_folder(parent, part)))
        except OSError:
            return None
        return self.stack[-1][1] if self.stack else self.top


def _plain(part: bytes) -> bool:
    return part not in (b"", b".", b"..")


def _open_folder(parent: int | None, name: bytes) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=parent)


def _read_regular(path: Path) -> bytearray:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb", buffering=0) as index:
        info = os.fstat(index.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > INDEX_LIMIT:
            raise _Unreadable("not a regular file of a size this reads")
        data = bytearray(info.st_size)
        if index.readinto(data) != info.st_size or index.read(1):
            raise _Unreadable("the index changed while it was read")
        return data
