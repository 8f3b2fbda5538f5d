"""Extracting real squashfs archives (mksquashfs, unsquashfs 4.5.1): exact round trips, the
target appearing last, and refusal of archives that would write or point outside it."""

from __future__ import annotations

import ast
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repos import git, new_repository
from seedkeeper_task.restore.extract import (
    ExtractFailed,
    UnsafeArchive,
    _listed,
    check_listing,
    extract,
    listed_paths,
    sweep_staging,
    symlink_escapes,
    walk_plan,
)
from seedkeeper_task.sandbox import let_slot_user_reach
from seedkeeper_task.slot_user import SlotUser
from seedkeeper_tools.publish import build_squashfs

STAGING_NAME = re.compile(r"\.checkout\.staging-[0-9a-f]{16}")
ZSTD_FRAME = bytes.fromhex("28b52ffd")
REAL_UNSQUASHFS = shutil.which("unsquashfs")

pytestmark = pytest.mark.skipif(
    REAL_UNSQUASHFS is None or shutil.which("mksquashfs") is None,
    reason="squashfs-tools is not installed (make setup installs it)",
)

Entry = tuple[str, int, bytes, int]


def make_checkout(root: Path) -> Path:
    """A real repository with its .git, committed and uncommitted work, a file symlink and
    a directory symlink, an executable, an empty and a read-only directory, a fifo, and
    names with a space, ` -> ` and a newline."""
    repo = new_repository(root / "source")
    (repo / "src" / "up").symlink_to("../README.md")
    (repo / "lib").symlink_to("src")
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", "first")
    (repo / "src" / "tool.sh").write_text("#!/bin/sh\necho changed\n")
    (repo / "empty").mkdir()
    (repo / "a name -> with arrow").write_text("spaces and an arrow\n")
    (repo / "two\nlines").write_text("a newline in the name\n")
    (repo / "dangling").symlink_to("nowhere/at/all")
    os.mkfifo(repo / "pipe")
    frozen = repo / "frozen"
    frozen.mkdir()
    (frozen / "module.go").write_text("package frozen\n")
    frozen.chmod(0o555)
    repo.chmod(0o750)
    return repo


def snapshot(root: Path) -> dict[str, Entry]:
    """Every entry under root (root included): type, mode bits, content or link target,
    and mtime (symlinks' own mtimes are not compared)."""
    entries: dict[str, Entry] = {}
    pending = [root]
    while pending:
        path = pending.pop()
        info = path.lstat()
        relative = str(path.relative_to(root))
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            entries[relative] = ("link", mode, os.fsencode(os.readlink(path)), 0)
        elif stat.S_ISDIR(info.st_mode):
            entries[relative] = ("dir", mode, b"", int(info.st_mtime))
            pending.extend(path.iterdir())
        elif stat.S_ISFIFO(info.st_mode):
            entries[relative] = ("fifo", mode, b"", int(info.st_mtime))
        else:
            entries[relative] = ("file", mode, path.read_bytes(), int(info.st_mtime))
    return entries


def squash(source: Path, archive: Path, *options: str) -> Path:
    subprocess.run(
        ["mksquashfs", str(source), str(archive), "-noappend", "-quiet", *options],
        check=True,
        capture_output=True,
    )
    return archive


def build_squashfs_to(source: Path, archive: Path) -> Path:
    build_squashfs(source, archive)
    return archive


def leftovers(parent: Path) -> list[str]:
    return [name for name in os.listdir(parent) if ".staging-" in name]


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """The directory the target appears in; nothing else is put there."""
    where = tmp_path / "slot"
    where.mkdir()
    return where


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    """A directory outside every target whose contents must never change."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("untouched\n")
    return outside


def install_fake_unsquashfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """Put an `unsquashfs` first on PATH that logs its argv, runs `body` (Python, with
    `argv`, `real` and `log` in scope) and otherwise behaves as the real one."""
    assert REAL_UNSQUASHFS is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    script = bin_dir / "unsquashfs"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, subprocess, sys\n"
        f"real, log = {REAL_UNSQUASHFS!r}, {str(log)!r}\n"
        "argv = sys.argv[1:]\n"
        "with open(log, 'a') as f:\n"
        "    f.write(repr(argv) + '\\n')\n" + body + "\nos.execv(real, [real, *argv])\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[list[str]]:
    return [ast.literal_eval(line) for line in log.read_text().splitlines()]


def walked(root: Path, plan: tuple[list[bytes], list[list[bytes]]]) -> list[str]:
    """Every entry `plan` covers: its opened folders, and each start with all under it."""
    opened, shares = plan
    covered = [os.fsdecode(folder) for folder in opened]
    for start in (start for share in shares for start in share):
        path = root / os.fsdecode(start)
        covered.append(os.fsdecode(start))
        if path.is_dir() and not path.is_symlink():
            covered += [str(inner.relative_to(root)) for inner in path.rglob("*")]
    return covered


def every_entry(root: Path) -> list[str]:
    return [str(path.relative_to(root)) for path in root.rglob("*")]


def venv_like(root: Path, packages: int = 60) -> Path:
    """A virtualenv's shape: a few entries at the top, nearly all in one deep folder."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to("python3.13")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "lib64").symlink_to("lib")
    site = root / "lib" / "python3.13" / "site-packages"
    for index in range(packages):
        package = site / f"package{index:02}"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"N = {index}\n")
        (package / "data").mkdir()
        (package / "data" / "table.csv").write_text("a,b\n")
    return root


# ---------------------------------------------------------------- the walk's shares


@pytest.mark.parametrize("walkers", [1, 2, 4])
@pytest.mark.parametrize("shape", ["venv", "flat", "empty", "one file"])
def test_the_walk_plan_covers_every_entry_exactly_once(
    tmp_path: Path, walkers: int, shape: str
) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    if shape == "venv":
        venv_like(root)
    elif shape == "flat":
        for index in range(100):
            (root / f"pkg{index}").mkdir()
            (root / f"pkg{index}" / "index.js").write_text("")
    elif shape == "one file":
        (root / "only").write_text("")

    plan = walk_plan(os.fsencode(root), walkers)

    covered = walked(root, plan)
    assert sorted(covered) == sorted(every_entry(root))  # all of them, none twice
    assert len(plan[1]) <= walkers
    assert all(share for share in plan[1])


def test_a_tree_held_in_one_folder_is_shared_below_it(tmp_path: Path) -> None:
    """A virtualenv's packages all sit in `lib/python3.x/site-packages`: the walk opens
    the folders down to it, so each find gets a fair part of the packages."""
    root = venv_like(tmp_path / "venv")

    opened, shares = walk_plan(os.fsencode(root), 2)

    assert b"lib/python3.13/site-packages" in opened
    per_share = [sum(b"site-packages/" in start for start in share) for share in shares]
    assert len(per_share) == 2
    assert min(per_share) >= 29  # 60 packages, split evenly
    assert b"lib64" not in opened  # a link is never opened: it is walked as itself


def test_a_folder_that_cannot_be_listed_stays_a_starting_point_and_a_root_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreadable folder is not skipped by the plan: it stays a starting point, so a
    find is given it (and fails on it, as `_find` fails on any folder it cannot read). A
    root that cannot be listed is refused at once."""
    root = venv_like(tmp_path / "venv")
    real_scandir = os.scandir
    unreadable = os.fsencode(root / "lib")

    def scandir(path: bytes) -> object:
        if path == unreadable:
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    opened, shares = walk_plan(os.fsencode(root), 2)

    assert b"lib" not in opened
    assert any(b"lib" in share for share in shares)
    monkeypatch.setattr(os, "scandir", lambda path: (_ for _ in ()).throw(OSError(13, "no")))
    with pytest.raises(UnsafeArchive, match="cannot be walked whole"):
        walk_plan(os.fsencode(root), 2)


# ---------------------------------------------------------------- round trips


def test_a_checkout_round_trips_exactly(tmp_path: Path, place: Path) -> None:
    source = make_checkout(tmp_path)
    archive = tmp_path / "checkout.sqsh"
    build_squashfs(source, archive)  # exactly as `seedkeeper publish` builds it
    target = place / "checkout"

    extract(archive, target)

    assert snapshot(target) == snapshot(source)
    assert os.listdir(place) == ["checkout"]
    assert git(target, "rev-parse", "HEAD") == git(source, "rev-parse", "HEAD")
    assert git(target, "status", "--porcelain") == git(source, "status", "--porcelain")
    assert (target / "lib" / "tool.sh").read_text() == "#!/bin/sh\necho changed\n"


def test_the_target_is_absent_until_the_tree_is_complete(
    tmp_path: Path, place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While unsquashfs writes, the target does not exist and the staging directory is a
    fresh, empty, hidden sibling; afterwards only the complete target remains."""
    source = make_checkout(tmp_path)
    archive = build_squashfs_to(source, tmp_path / "checkout.sqsh")
    target = place / "checkout"
    log = install_fake_unsquashfs(
        tmp_path,
        monkeypatch,
        "if '-ls' not in argv:\n"
        "    dest = argv[argv.index('-d') + 1]\n"
        "    with open(log, 'a') as f:\n"
        f"        f.write(repr([os.path.lexists({str(target)!r}), os.listdir(dest),\n"
        "                      os.path.dirname(dest)]) + '\\n')\n",
    )

    extract(archive, target, processors=2)

    listing, extraction, observed = calls(log)
    assert listing[:2] == ["-no-progress", "-d"]
    assert listing[3:] == ["-ls", str(archive)]
    dest = Path(extraction[extraction.index("-d") + 1])
    assert STAGING_NAME.fullmatch(dest.name)
    assert extraction[:9] == [
        "-no-progress",
        "-quiet",
        "-strict-errors",
        "-user-xattrs",
        "-da",
        "32",
        "-fr",
        "32",
        "-processors",
    ]
    assert extraction[9:] == ["2", "-d", str(dest), str(archive)]
    assert observed == [False, [], str(place)]  # no target, staging empty, a sibling
    assert snapshot(target) == snapshot(source)
    assert leftovers(place) == []


def test_xattrs_user_ones_are_restored_privileged_ones_are_not(tmp_path: Path, place: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    note = source / "note"
    note.write_text("x")
    try:
        os.setxattr(note, "user.origin", b"resident")
        os.setxattr(note, "trusted.grant", b"privilege")
    except OSError:
        pytest.skip("this filesystem or user cannot set user and trusted xattrs")
    archive = build_squashfs_to(source, tmp_path / "x.sqsh")

    extract(archive, place / "checkout")

    assert os.listxattr(place / "checkout" / "note") == ["user.origin"]
    assert os.getxattr(place / "checkout" / "note", "user.origin") == b"resident"


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("links", "refused"),
    [
        ({"evil": "../../outside"}, "evil"),
        ({"abs": "/etc/passwd"}, "abs"),
        ({"deep/er/climb": "../../../outside/precious"}, "deep/er/climb"),
        # each harmless on its own lexically; `x` climbs from where `up` points
        ({"a/b/up": "../..", "x": "a/b/up/../outside"}, "x"),
    ],
)
def test_a_symlink_leading_outside_is_refused(
    tmp_path: Path, place: Path, sentinel: Path, links: dict[str, str], refused: str
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "README.md").write_text("fine\n")
    for name, link_target in links.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).symlink_to(link_target)
    archive = build_squashfs_to(source, tmp_path / "evil.sqsh")
    before = snapshot(sentinel)

    with pytest.raises(UnsafeArchive, match=re.escape(repr(refused))) as refusal:
        extract(archive, place / "checkout")

    assert "leads outside" in str(refusal.value)
    assert os.listdir(place) == []  # no target, no staging
    assert snapshot(sentinel) == before


def test_a_device_node_is_refused(tmp_path: Path, place: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    try:
        os.mknod(source / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    archive = build_squashfs_to(source, tmp_path / "dev.sqsh")

    with pytest.raises(UnsafeArchive, match="'null' is a device node"):
        extract(archive, place / "checkout")

    assert os.listdir(place) == []


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        ("/../escaped", "'../escaped' is absolute or has a '.' or '..' part"),
        ("/d/../../escaped", "'d/../../escaped' is absolute"),
        ("//etc/passwd", "'/etc/passwd' is absolute"),
        ("/README.md", "'README.md' appears twice"),
        ("/AAA", "'AAA' is out of the archive's order"),
    ],
)
def test_our_listing_check_refuses_without_relying_on_unsquashfs(
    tmp_path: Path, place: Path, monkeypatch: pytest.MonkeyPatch, forged: str, why: str
) -> None:
    """An unsquashfs that listed a hostile entry (as one without the CVE-2021-40153/41072
    fixes would) is stopped by our check before anything is extracted."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "README.md").write_text("fine\n")
    archive = build_squashfs_to(source, tmp_path / "a.sqsh")
    log = install_fake_unsquashfs(
        tmp_path,
        monkeypatch,
        "if '-ls' in argv:\n"
        "    prefix = argv[argv.index('-d') + 1]\n"
        "    sys.stdout.flush()\n"
        "    done = subprocess.run([real, *argv], check=True)\n"
        f"    print(prefix + {forged!r}, flush=True)\n"
        "    sys.exit(0)\n",
    )

    with pytest.raises(UnsafeArchive, match=re.escape(why)):
        extract(archive, place / "checkout")

    assert all("-ls" in argv for argv in calls(log))  # unsquashfs never extracted
    assert os.listdir(place) == []


def test_a_crafted_dotdot_entry_is_refused_and_nothing_lands_outside(
    tmp_path: Path, place: Path
) -> None:
    """With uncompressed metadata the directory table stores names as plain bytes and the
    image has no checksum: renaming the top-level directory `zz` to `..` gives an entry
    that would write `../pwn` beside the target. unsquashfs 4.5.1's own name check fires
    in the listing ("invalid characters in name"), so it is refused as ExtractFailed."""
    source = tmp_path / "source"
    (source / "zz").mkdir(parents=True)
    (source / "zz" / "pwn").write_text("planted\n")
    (source / "aa").write_text("keep\n")
    raw = squash(source, tmp_path / "raw.sqsh", "-noI", "-noD", "-noF", "-noX")
    image = bytearray(raw.read_bytes())
    assert image.count(b"zz") == 1  # the name, in the directory table, and nothing else
    at = image.index(b"zz")
    image[at : at + 2] = b".."
    crafted = tmp_path / "dotdot.sqsh"
    crafted.write_bytes(image)

    # The patched image parses as far as that name: the listing of its root fails there.
    listing = subprocess.run(
        ["unsquashfs", "-d", "T", "-ls", str(crafted)], check=False, capture_output=True, text=True
    )
    assert listing.returncode == 1
    assert "invalid characters in name" in listing.stderr

    with pytest.raises(ExtractFailed, match="invalid characters in name"):
        extract(crafted, place / "checkout")

    assert os.listdir(place) == []
    assert not (tmp_path / "pwn").exists()


def test_a_crafted_symlink_and_directory_of_one_name_are_refused(
    tmp_path: Path, place: Path, sentinel: Path
) -> None:
    """CVE-2021-41072's shape: a symlink `zj` to the sentinel, then a directory also named
    `zj` whose file would be written through the symlink. unsquashfs 4.5.1 sees the
    duplicate in the listing; our own duplicate check is the second line."""
    source = tmp_path / "source"
    (source / "zk").mkdir(parents=True)
    (source / "zk" / "pwned").write_text("planted\n")
    (source / "zj").symlink_to(sentinel)
    raw = squash(source, tmp_path / "raw.sqsh", "-noI", "-noD", "-noF", "-noX")
    image = raw.read_bytes()
    assert image.count(b"zk") == 1
    crafted = tmp_path / "dup.sqsh"
    crafted.write_bytes(image.replace(b"zk", b"zj"))
    before = snapshot(sentinel)

    with pytest.raises(ExtractFailed, match="duplicate names"):
        extract(crafted, place / "checkout")

    assert os.listdir(place) == []
    assert snapshot(sentinel) == before


def compressible_tree(root: Path) -> Path:
    """Text that zstd compresses into many data blocks."""
    source = root / "source"
    source.mkdir()
    words = [f"w{n:x}q{n * 7919 % 1000}" for n in range(400)]
    (source / "big.txt").write_text(" ".join(words[(n * 31) % 400] for n in range(300_000)))
    (source / "small").write_text("x\n")
    return source


def test_a_corrupted_archive_fails_and_leaves_nothing(tmp_path: Path, place: Path) -> None:
    """Flipping the zstd frame header of the data block nearest the middle: the listing
    (metadata at the end) succeeds, the extraction fails. Squashfs has no checksum, so
    flipped bytes inside a block's payload may instead extract silently as wrong content:
    the sha256 checked after download is what guards integrity, not unsquashfs."""
    archive = build_squashfs_to(compressible_tree(tmp_path), tmp_path / "a.sqsh")
    image = bytearray(archive.read_bytes())
    frames = [m.start() for m in re.finditer(re.escape(ZSTD_FRAME), image)]
    middle = min(frames[1:], key=lambda at: abs(at - len(image) // 2))
    for at in range(middle, middle + 64):
        image[at] ^= 0xFF
    archive.write_bytes(image)

    with pytest.raises(ExtractFailed, match=r"(?s)unsquashfs exited 1: .*uncompress"):
        extract(archive, place / "checkout")

    assert os.listdir(place) == []  # the staging directory, partly written, is gone


def test_a_truncated_archive_fails_in_the_listing(tmp_path: Path, place: Path) -> None:
    """A truncated image loses its tables (they sit at the end): the listing fails, so no
    staging directory is ever made."""
    archive = build_squashfs_to(compressible_tree(tmp_path), tmp_path / "a.sqsh")
    image = archive.read_bytes()
    archive.write_bytes(image[: len(image) // 2])

    with pytest.raises(ExtractFailed, match=r"(?s)unsquashfs exited 1: .*EOF"):
        extract(archive, place / "checkout")

    assert os.listdir(place) == []


@pytest.mark.parametrize("kind", ["full", "empty", "dangling-symlink", "file"])
def test_an_existing_target_is_refused_untouched(
    tmp_path: Path, place: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    target = place / "checkout"
    if kind == "full":
        target.mkdir()
        (target / "work").write_text("unpublished\n")
    elif kind == "empty":
        target.mkdir()
    elif kind == "dangling-symlink":
        target.symlink_to(tmp_path / "nowhere")
    else:
        target.write_text("a file\n")
    before = snapshot(place)
    source = tmp_path / "source"
    source.mkdir()
    (source / "work").write_text("from the archive\n")
    archive = build_squashfs_to(source, tmp_path / "a.sqsh")
    log = install_fake_unsquashfs(tmp_path, monkeypatch, "")

    with pytest.raises(FileExistsError):
        extract(archive, target)

    assert snapshot(place) == before
    assert not log.exists()  # unsquashfs was never run


def test_a_target_appearing_during_extraction_is_not_replaced(
    tmp_path: Path, place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.rename would silently replace an empty directory; the rename must not."""
    target = place / "checkout"
    source = tmp_path / "source"
    source.mkdir()
    (source / "work").write_text("from the archive\n")
    archive = build_squashfs_to(source, tmp_path / "a.sqsh")
    install_fake_unsquashfs(
        tmp_path,
        monkeypatch,
        f"if '-ls' not in argv:\n    os.mkdir({str(target)!r})\n",
    )

    with pytest.raises(FileExistsError):
        extract(archive, target)

    assert os.listdir(place) == ["checkout"]
    assert os.listdir(target) == []


def test_missing_unsquashfs_is_reported(
    tmp_path: Path, place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    archive = build_squashfs_to(source, tmp_path / "a.sqsh")
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-bin"))

    with pytest.raises(ExtractFailed, match="not installed"):
        extract(archive, place / "checkout")


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="processors"):
        extract(tmp_path / "a.sqsh", tmp_path / "t", processors=0)
    with pytest.raises(ValueError, match="names no directory entry"):
        extract(tmp_path / "a.sqsh", Path("/"))


# ---------------------------------------------------------------- sweeping


def test_sweep_staging_removes_only_staging_leftovers(tmp_path: Path, place: Path) -> None:
    hexes = "0123456789abcdef"
    first = place / f".checkout.staging-{hexes}"
    (first / ".git" / "objects").mkdir(parents=True)
    (first / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    frozen = first / "frozen"
    frozen.mkdir()
    (frozen / "module.go").write_text("package frozen\n")
    frozen.chmod(0o555)
    second = place / f".deps.staging-{hexes[::-1]}"
    second.mkdir()
    (second / "escape").symlink_to(tmp_path / "outside-dir")  # not followed
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    (outside / "keep").write_text("keep\n")

    kept = {
        "checkout": "dir",  # the real target
        f"checkout.staging-{hexes}": "dir",  # not hidden
        ".checkout.staging-xyz": "dir",  # not our random part
        f".checkout.staging-{hexes}0": "dir",
        f".file.staging-{hexes}": "file",  # not a directory
        f".link.staging-{hexes}": "link",  # a symlink to a directory: left alone
    }
    for name, kind in kept.items():
        if kind == "dir":
            (place / name).mkdir()
            (place / name / "inside").write_text("keep\n")
        elif kind == "file":
            (place / name).write_text("keep\n")
        else:
            (place / name).symlink_to(outside)
    before_kept = {name: snapshot(place / name) for name in kept if kept[name] == "dir"}
    before_outside = snapshot(outside)

    removed = sweep_staging(place)

    assert removed == sorted([first, second])
    assert sorted(os.listdir(place)) == sorted(kept)
    assert {name: snapshot(place / name) for name in before_kept} == before_kept
    assert snapshot(outside) == before_outside
    assert sweep_staging(place) == []


def test_staging_left_by_an_interrupted_attempt_is_swept(tmp_path: Path, place: Path) -> None:
    """A killed task leaves its staging directory; the next attempt sweeps it first."""
    source = make_checkout(tmp_path)
    archive = build_squashfs_to(source, tmp_path / "checkout.sqsh")
    leftover = place / ".checkout.staging-00112233445566ff"
    leftover.mkdir()
    subprocess.run(
        ["unsquashfs", "-quiet", "-no-progress", "-d", str(leftover), str(archive)], check=True
    )

    assert sweep_staging(place) == [leftover]
    extract(archive, place / "checkout")
    assert os.listdir(place) == ["checkout"]


# ---------------------------------------------------------------- pure checks


def test_listed_paths_keeps_names_whole() -> None:
    prefix = b"seedkeeper-0f0f"
    listing = b"".join(
        prefix + line + b"\n"
        for line in [
            b"",
            b"/a name",
            b"/x -> y",
            b"/two\nlines",
            b"/trailing\n",
            b"/d/\xffbyte",
            b"/d/fake\nseedkeeper-other/../x",
        ]
    )
    whole = [
        b"a name",
        b"x -> y",
        b"two\nlines",
        b"trailing\n",
        b"d/\xffbyte",
        b"d/fake\nseedkeeper-other/../x",
    ]
    assert listed_paths(listing, prefix) == whole
    # Read as it arrives (never held whole): cut anywhere, even inside a separator.
    for size in (1, 2, 3, 5, 7, 16):
        chunks = [listing[at : at + size] for at in range(0, len(listing), size)]
        assert [path for batch in _listed(chunks, prefix) for path in batch] == whole


@pytest.mark.parametrize(
    "listing",
    [
        b"P\nP/a",  # no final newline
        b"Q\nP/a\n",  # no root line
        b"P\n\nP/a\n",  # a root line that is not exactly the prefix
        b"P\nPa\n",  # an entry not under the prefix
    ],
)
def test_listed_paths_refuses_what_it_cannot_read(listing: bytes) -> None:
    with pytest.raises(UnsafeArchive, match="malformed"):
        listed_paths(listing, b"P")


@pytest.mark.parametrize(
    "path",
    [b"..", b"../x", b"a/../../x", b"a/..", b"/etc", b"a//b", b"a/", b".", b"a/./b"],
)
def test_check_listing_refuses_hostile_paths(path: bytes) -> None:
    with pytest.raises(UnsafeArchive, match="absolute or has"):
        check_listing([b"fine", path])


def test_check_listing_accepts_odd_but_harmless_names() -> None:
    check_listing([b"...", b"..a", b".git", b"a b", b"a..", b"n\n..", b"x -> ../y", b"\xff"])


@pytest.mark.parametrize(
    ("listing", "refused", "why"),
    [
        ([b"a", b"b", b"a"], b"a", "is out of the archive's order"),
        ([b"a", b"a"], b"a", "appears twice"),
        ([b"a", b"a/x", b"b", b"a/y"], b"a/y", "is out of the archive's order"),  # reopened
        ([b"a/x", b"a"], b"a", "is out of the archive's order"),  # a folder after its tree
        ([b"d", b"d/x", b"d/x"], b"d/x", "appears twice"),
    ],
)
def test_check_listing_refuses_entries_out_of_the_archive_order(
    listing: list[bytes], refused: bytes, why: str
) -> None:
    """A second entry of one name (a symlink, then a folder through it) cannot come in
    the order mksquashfs writes and unsquashfs lists; nothing else is kept to find it."""
    with pytest.raises(UnsafeArchive, match=re.escape(f"{refused.decode()!r} {why}")):
        check_listing(listing)


_NAME = st.binary(min_size=1, max_size=4).filter(
    lambda name: b"/" not in name and b"\0" not in name and name not in (b".", b"..")
)


@given(st.lists(st.lists(_NAME, min_size=1, max_size=4), max_size=60))
def test_check_listing_accepts_every_tree_listed_in_the_archive_order(
    paths: list[list[bytes]],
) -> None:
    """Each folder's entries sorted by name, each folder's tree right after it: accepted,
    in any batch size, and refused once any entry is listed twice."""
    tree = {tuple(path[:depth]) for path in paths for depth in range(1, len(path) + 1)}
    listing = [b"/".join(path) for path in sorted(tree)]
    check_listing(listing)
    if listing:
        with pytest.raises(UnsafeArchive, match=r"appears twice|out of the archive's order"):
            check_listing([*listing, listing[len(listing) // 2]])


def test_what_mksquashfs_writes_is_in_the_order_the_check_wants(
    tmp_path: Path, place: Path
) -> None:
    """Names that sort differently by component than as whole paths (`a/b` before `a-b`
    and `a.b`, a high byte last) are listed by unsquashfs in the order the check expects."""
    source = tmp_path / "source"
    for name in ("a", "a b", "a-b", "a.b", "A", "a\nb", "\udcff"):
        (source / name / "a").mkdir(parents=True)
        (source / name / "a" / "b").write_text("x\n")
        (source / name / "a.b").write_text("y\n")
        (source / name / "a-b").symlink_to("a/b")
    archive = build_squashfs_to(source, tmp_path / "names.sqsh")

    extract(archive, place / "checkout")

    assert len(list((place / "checkout").rglob("*"))) == 7 * 5


@pytest.mark.parametrize(
    ("link", "target", "escapes"),
    [
        ("a", "b", False),
        ("a", "./b/c", False),
        ("a", ".", False),
        ("a", "..", True),
        ("a", "../x", True),
        ("a", "/etc/passwd", True),
        ("a", "//x", True),
        ("d/a", "..", False),
        ("d/a", "../x", False),
        ("d/a", "../..", True),
        ("d/e/a", "../../x", False),
        ("d/e/a", "../../../x", True),
        ("d/a", "../d/../x", False),
        ("d/a", "x/../../y", False),
        ("d/a", "x/../../../y", True),
        ("a", "x/y/../../..", True),
        ("a", "x//y/", False),
        ("a", "...", False),
        ("a", "..x/y", False),
        ("evil", "../../outside", True),
        ("a", "", False),
    ],
)
def test_symlink_escapes_lexically(link: str, target: str, escapes: bool) -> None:
    assert symlink_escapes(PurePosixPath(link), target) is escapes


@pytest.mark.parametrize(
    ("links", "link", "escapes"),
    [
        # `up` points at the root; climbing from there leaves it
        ({"a/b/up": "../..", "x": "a/b/up/../y"}, "x", True),
        ({"a/b/up": "../..", "x": "a/b/up/y"}, "x", False),
        # `deep` points far down; `..` from there stays inside, though lexically it is fine
        ({"deep": "a/b/c", "x": "deep/../../y"}, "x", False),
        # a chain through a symlink to an absolute path
        ({"hop": "/etc", "x": "hop/passwd"}, "x", True),
        # chains resolved relative to each link's own directory
        ({"d/hop": "../e", "e/out": "..", "x": "d/hop/out/.."}, "x", True),
        ({"d/hop": "../e", "e/in": "f", "x": "d/hop/in/.."}, "x", False),
        # loops and over-long chains cannot be shown to stay inside
        ({"a": "b", "b": "a"}, "a", True),
        ({"a": "a/x"}, "a", True),
        ({f"l{n}": f"l{n + 1}" for n in range(45)}, "l0", True),
        ({f"l{n}": f"l{n + 1}" for n in range(30)}, "l0", False),
    ],
)
def test_symlink_escapes_through_other_symlinks(
    links: dict[str, str], link: str, escapes: bool
) -> None:
    tree = {PurePosixPath(name): target for name, target in links.items()}
    assert symlink_escapes(PurePosixPath(link), links[link], tree) is escapes


# ---------------------------------------------------------------- owners and privilege

root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="archive owners are only restored, and dropped to, by root"
)


def foreign_privileged_archive(tmp_path: Path) -> Path:
    """An archive whose entries belong to uid 1234/gid 4321, with a setuid+setgid file and
    a setgid directory."""
    source = tmp_path / "source"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "tool").write_text("#!/bin/sh\n")
    (source / "bin" / "tool").chmod(0o755)
    (source / "link").symlink_to("bin/tool")
    foreign = ("-force-uid", "1234", "-force-gid", "4321")
    privileged = ("-p", "bin/tool m 6755 1234 4321", "-p", "bin m 2775 1234 4321")
    return squash(source, tmp_path / "foreign.sqsh", *foreign, *privileged)


def owners_and_privileged(root: Path) -> tuple[set[tuple[int, int]], list[str]]:
    entries = [root, *root.rglob("*")]
    owners = {(path.lstat().st_uid, path.lstat().st_gid) for path in entries}
    privileged = [
        str(path.relative_to(root))
        for path in entries
        if not path.is_symlink() and path.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    ]
    return owners, privileged


@root_only
def test_a_root_extraction_keeps_neither_the_archives_owners_nor_setuid_bits(
    tmp_path: Path, place: Path
) -> None:
    archive = foreign_privileged_archive(tmp_path)

    extract(archive, place / "checkout")

    assert owners_and_privileged(place / "checkout") == ({(0, 0)}, [])
    assert (place / "checkout" / "bin" / "tool").stat().st_mode & 0o111 == 0o111


@root_only
def test_the_slot_user_extracts_and_owns_the_tree(tmp_path: Path, place: Path) -> None:
    archive = foreign_privileged_archive(tmp_path)
    let_slot_user_reach(place)

    extract(archive, place / "checkout", owner=SlotUser(uid=65534, gid=65534))

    assert owners_and_privileged(place / "checkout") == ({(65534, 65534)}, [])
    assert place.stat().st_uid == 0  # the parent stays the supervisor's
    assert (place / "checkout" / "bin" / "tool").read_text() == "#!/bin/sh\n"


@root_only
def test_every_part_of_a_shared_walk_is_checked(tmp_path: Path, place: Path) -> None:
    """The walk is split between finds below folders it opened: a foreign owner or a
    setuid or setgid bit is taken away wherever it is, in an opened folder or in any
    find's part."""
    source = venv_like(tmp_path / "source")
    site = "lib/python3.13/site-packages"
    privileged = [f"{site} m 2775 1234 4321", f"{site}/package00/data m 2755 1234 4321"]
    privileged += [f"{site}/package{index:02}/__init__.py m 6755 1234 4321" for index in (1, 59)]
    foreign = ["-force-uid", "1234", "-force-gid", "4321"]
    pseudo = [option for line in privileged for option in ("-p", line)]
    archive = squash(source, tmp_path / "venv.sqsh", *foreign, *pseudo)

    extract(archive, place / "deps")

    assert owners_and_privileged(place / "deps") == ({(0, 0)}, [])


@pytest.mark.parametrize("package", [0, 1, 30, 59])
def test_a_link_leading_outside_is_found_in_any_part_of_a_shared_walk(
    tmp_path: Path, place: Path, package: int
) -> None:
    source = venv_like(tmp_path / "source")
    evil = source / "lib" / "python3.13" / "site-packages" / f"package{package:02}" / "evil"
    evil.symlink_to("../../../../../..")
    archive = build_squashfs_to(source, tmp_path / "venv.sqsh")

    with pytest.raises(UnsafeArchive, match="leads outside"):
        extract(archive, place / "deps")

    assert os.listdir(place) == []


def test_a_checkpoint_keeps_the_worktree_links_its_run_made_but_never_one_in_git(
    tmp_path: Path, place: Path
) -> None:
    """A slot's own checkpoint restores a virtualenv's interpreter link as it was; a link in
    `.git` leading outside is refused, directly or through a worktree link."""
    source = tmp_path / "source"
    (source / ".venv" / "bin").mkdir(parents=True)
    (source / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    (source / "up").symlink_to("../..")
    (source / ".git").mkdir()
    (source / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    archive = build_squashfs_to(source, tmp_path / "work.sqsh")
    with pytest.raises(UnsafeArchive):  # a snapshot's archive: refused as ever
        extract(archive, place / "seeded")

    extract(archive, place / "resumed", worktree_links_may_leave=True)
    assert os.readlink(place / "resumed" / ".venv" / "bin" / "python") == "/usr/bin/python3"
    assert os.readlink(place / "resumed" / "up") == "../.."

    for name, link_target in (("hooks", "/etc"), ("objects", "../up/x")):
        (source / ".git" / name).symlink_to(link_target)
        evil = build_squashfs_to(source, tmp_path / f"evil-{name}.sqsh")
        with pytest.raises(UnsafeArchive, match="leads outside"):
            extract(evil, place / f"evil-{name}", worktree_links_may_leave=True)
        assert not (place / f"evil-{name}").exists()
        (source / ".git" / name).unlink()
