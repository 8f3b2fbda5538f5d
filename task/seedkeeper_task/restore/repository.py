"""An archive's `.git` is data, not configuration (DESIGN §9).

Before the slot task runs any git command in a restored checkout, `make_safe` checks the
repository's layout (nothing in it may point at another repository or another work tree)
and replaces `.git/config` with a subset we write: the format, the extensions needed to
read the repository, `origin` = the birth's credential-free URL, the branch's tracking.
Hooks, FETCH_HEAD and legacy remote files go. The scrubbed config stays in the slot, so
the run's own git commands run nothing the archive named.

`SafeGit` runs git with an environment built from scratch (no system or global config,
an empty read-only HOME, no prompt, https only, discovery fenced at the workspace).

`credential_findings` is the one place that says what a credential in a git config is:
the restore logs what it dropped, `seedkeeper publish` refuses or scrubs a checkout.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from seedkeeper.errors import SeedkeeperError
from seedkeeper_task.slot_user import SlotUser

# (key as `git config --list` prints it, value); None: a key written without `=`.
ConfigEntry = tuple[str, str | None]

# Command-scope config: it outranks any file git might still read. Hooks and the
# fsmonitor never run; git may reach a remote only over https (no ssh, git://, file or
# ext transport, whatever URL a rewrite produces).
HARDENING = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "protocol.allow=never",
    "-c",
    "protocol.https.allow=always",
)
FETCH_REFSPEC = "+refs/heads/*:refs/remotes/origin/*"
_FORMAT_VERSIONS = frozenset({"0", "1"})
# The extensions a repository may need to be read, with the values git defines.
_READ_EXTENSIONS: Mapping[str, frozenset[str]] = {
    "objectformat": frozenset({"sha1", "sha256"}),
    "refstorage": frozenset({"files", "reftable"}),
}
_DROPPED_EXTENSIONS = frozenset({"worktreeconfig"})  # per-worktree config: removed, not read
# Files that carry pointers elsewhere: another object store, another common directory.
_POINTERS = ("commondir", "objects/info/alternates", "objects/info/http-alternates")
# Nested git directories, refused when not empty: a submodule's git directory always
# carries core.worktree, and a linked worktree's a gitdir file naming a path on the
# resident's host. Rewriting their configs would mean trusting those pointers, and
# `git status` in the checkout recurses into a populated submodule: one repository per
# archive is what a seed needs.
_NESTED = ("modules", "worktrees")
FETCH_HEAD = "FETCH_HEAD"
# Removed outright: hooks; FETCH_HEAD (its lines name the fetched URL, credentials and
# all); per-worktree config; legacy remote definitions, read when the config names none.
_LEGACY_REMOTES = ("remotes", "branches")
_REMOVED = ("hooks", FETCH_HEAD, "config.worktree", *_LEGACY_REMOTES)
_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")


class UnsafeRepository(SeedkeeperError):
    """The archive's repository points outside itself or needs what we do not write: the
    message names the layout or key, never a value."""


@dataclass(frozen=True)
class RepositoryFormat:
    version: str
    extensions: tuple[ConfigEntry, ...] = ()


@dataclass(frozen=True)
class SafeGit:
    """Runs git for one checkout with an environment built from scratch: the caller's
    environment holds presigned URLs and credentials, and git must read no config but
    the repository's own (scrubbed) one."""

    checkout: Path
    ceiling: Path  # discovery never climbs above it
    home: Path  # an empty directory nobody can write
    user: SlotUser | None = None  # who runs git; None: this process's own user
    timeout: float | None = None

    def __call__(self, *args: str) -> str:
        """Run `git -C <checkout> <hardening> args` on the checkout's own `.git`, named
        explicitly so git never discovers another; raises CalledProcessError or
        TimeoutExpired with the output captured."""
        env = self._environment(self.ceiling) | {
            "GIT_DIR": str(self.checkout / ".git"),
            "GIT_WORK_TREE": str(self.checkout),
        }
        return self._run(["git", "-C", str(self.checkout), *HARDENING, *args], env).strip()

    def config_entries(self, path: Path) -> list[ConfigEntry]:
        """The entries of one config file, its includes never followed. Run from the empty
        HOME with no repository in sight: only that file is read."""
        env = self._environment(self.home)
        argv = ["git", "-C", str(self.home), "config", "--file", str(path)]
        return parse_config_list(self._run([*argv, "--no-includes", "--null", "--list"], env))

    def _environment(self, ceiling: Path) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": "C",
            "HOME": str(self.home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CEILING_DIRECTORIES": str(ceiling),
        }

    def _run(self, argv: list[str], env: dict[str, str]) -> str:
        done = subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            check=True,
            capture_output=True,
            text=True,
            timeout=self.timeout,
            **(self.user.subprocess_kwargs() if self.user is not None else {}),
        )
        return str(done.stdout)


@contextmanager
def empty_home() -> Iterator[Path]:
    """A fresh empty directory for git's HOME: readable by the slot user, writable by
    nobody, so nothing can be planted in it."""
    with tempfile.TemporaryDirectory(prefix="seedkeeper-git-home-") as home:
        os.chmod(home, 0o555)  # noqa: S103 - readable, never writable: nothing to plant
        yield Path(home)


def make_safe(
    git: SafeGit, *, origin: str | None, branch: str, owner: SlotUser | None
) -> list[str]:
    """Check the checkout's repository and replace its config with the safe subset; remove
    hooks and the rest of `_REMOVED`. Returns the credentials the archive's config held
    (names only, for the log). Raises UnsafeRepository before changing anything."""
    dot_git = git.checkout / ".git"
    check_layout(git.checkout)
    entries = read_config(git, dot_git / "config")
    repository = repository_format(entries)
    text = render_config(safe_config(repository, origin=origin, branch=branch))
    replace_file(dot_git / "config", text, owner)
    for name in _REMOVED:
        _remove(dot_git / name)
    return credential_findings(entries)


def check_layout(checkout: Path) -> None:
    """`.git` is a real directory with nothing in it that points anywhere else; its config,
    when present, a regular file. Never follows a symlink."""
    dot_git = checkout / ".git"
    try:
        mode = dot_git.lstat().st_mode
    except FileNotFoundError:
        raise UnsafeRepository("the archive has no .git directory") from None
    if not stat.S_ISDIR(mode):
        raise UnsafeRepository(".git is not a directory (a gitfile or a symlink)")
    for pointer in _POINTERS:
        if os.path.lexists(dot_git / pointer):
            raise UnsafeRepository(f".git/{pointer} points at another repository")
    for nested in _NESTED:
        path = dot_git / nested
        if os.path.lexists(path) and (
            path.is_symlink() or not path.is_dir() or any(path.iterdir())
        ):
            raise UnsafeRepository(f".git/{nested} holds another git directory")
    config = dot_git / "config"
    if os.path.lexists(config) and not stat.S_ISREG(config.lstat().st_mode):
        raise UnsafeRepository(".git/config is not a regular file")


def read_config(git: SafeGit, config: Path) -> list[ConfigEntry]:
    """The archive's config entries (none when it has no config file)."""
    if not os.path.lexists(config):
        return []
    try:
        return git.config_entries(config)
    except subprocess.CalledProcessError as failed:
        raise UnsafeRepository(".git/config does not parse") from failed


def parse_config_list(output: str) -> list[ConfigEntry]:
    """`git config --null --list` output: `key\\nvalue\\0`, or `key\\0` for a bare key."""
    entries: list[ConfigEntry] = []
    for record in output.split("\0")[:-1]:
        key, newline, value = record.partition("\n")
        entries.append((key, value if newline else None))
    return entries


def repository_format(entries: Iterable[ConfigEntry]) -> RepositoryFormat:
    """What of the archive's config a repository needs to be read; refuses a config that
    points at another work tree, includes another file, or needs an extension we do not
    know."""
    version = "0"
    extensions: list[ConfigEntry] = []
    for key, value in entries:
        section, _, name = _split(key)
        if key == "core.worktree":
            raise UnsafeRepository("core.worktree names another work tree")
        if section in ("include", "includeif"):
            raise UnsafeRepository(f"{section}.* includes another config file")
        if key == "core.repositoryformatversion":
            if value not in _FORMAT_VERSIONS:
                raise UnsafeRepository("core.repositoryformatversion is not 0 or 1")
            version = value
        elif section == "extensions" and name not in _DROPPED_EXTENSIONS:
            allowed = _READ_EXTENSIONS.get(name)
            if allowed is None or (value or "").lower() not in allowed:
                raise UnsafeRepository(f"extensions.{_redact(name)} is not one we can honour")
            extensions.append((key, (value or "").lower()))
    return RepositoryFormat(version, tuple(extensions))


def safe_config(
    repository: RepositoryFormat, *, origin: str | None, branch: str
) -> list[ConfigEntry]:
    """Everything the slot's `.git/config` holds. No origin: no remote, no tracking."""
    entries: list[ConfigEntry] = [
        ("core.repositoryformatversion", repository.version),
        ("core.bare", "false"),
        *repository.extensions,
    ]
    if origin is not None:
        entries += [
            ("remote.origin.url", origin),
            ("remote.origin.fetch", FETCH_REFSPEC),
            (f"branch.{branch}.remote", "origin"),
            (f"branch.{branch}.merge", f"refs/heads/{branch}"),
        ]
    return entries


def render_config(entries: Iterable[ConfigEntry]) -> str:
    """A config file holding exactly `entries`, in order: a section header wherever the
    section changes; every value quoted and escaped, so no value can end its line,
    start a comment or open a section."""
    lines: list[str] = []
    current: tuple[str, str | None] | None = None
    for key, value in entries:
        section, subsection, name = _split(key)
        if (section, subsection) != current:
            current = (section, subsection)
            header = section if subsection is None else f"{section} {_subsection(subsection)}"
            lines.append(f"[{header}]")
        lines.append(f"\t{name}" if value is None else f"\t{name} = {_quote(value)}")
    return "".join(f"{line}\n" for line in lines)


def credential_findings(entries: Iterable[ConfigEntry]) -> list[str]:
    """The keys (user-info redacted) whose entry is or names a credential: an extra HTTP
    header, any `credential.*`, user-info in a URL in the key (`url.<base>.insteadOf`,
    `http.<url>.*`) or in the value (`remote.*.url`, `pushurl`...). Never a value."""
    return [_redact(key) for key, value in entries if _is_credential(key, value)]


def checkout_credentials(checkout: Path, entries: Iterable[ConfigEntry]) -> list[str]:
    """The credentials a checkout's repository would carry into an archive: those of its
    config `entries`, then the files beside it (`credential_files`)."""
    return [*credential_findings(entries), *credential_files(checkout)]


def credential_files(checkout: Path) -> list[str]:
    """Files of the checkout's `.git` (paths relative to it) that name a URL with user-info:
    FETCH_HEAD's lines, legacy remote definitions (`remotes/*`, `branches/*`)."""
    dot_git = checkout / ".git"
    candidates = [dot_git / FETCH_HEAD]
    for legacy in _LEGACY_REMOTES:
        if (dot_git / legacy).is_dir() and not (dot_git / legacy).is_symlink():
            candidates += sorted((dot_git / legacy).iterdir())
    return [
        path.relative_to(dot_git).as_posix()
        for path in candidates
        if path.is_file()
        and not path.is_symlink()
        and has_user_info(path.read_text(errors="replace"))
    ]


def without_credentials(entries: Iterable[ConfigEntry]) -> list[ConfigEntry]:
    """`entries` without credentials: entries whose key is or names one are dropped, a
    URL value keeps its address without its user-info."""
    kept: list[ConfigEntry] = []
    for key, value in entries:
        if _is_credential(key, None):
            continue
        kept.append((key, None if value is None else _USER_INFO.sub(r"\g<scheme>", value)))
    return kept


def has_user_info(text: str) -> bool:
    return _USER_INFO.search(text) is not None


def _is_credential(key: str, value: str | None) -> bool:
    section, _, name = _split(key)
    return (
        section == "credential"
        or (section == "http" and name == "extraheader")
        or has_user_info(key)
        or (value is not None and has_user_info(value))
    )


def _redact(text: str) -> str:
    return _USER_INFO.sub(r"\g<scheme>***@", text)


def _split(key: str) -> tuple[str, str | None, str]:
    """section, subsection (None when absent), name: git splits at the first and the last
    dot, the subsection keeps its dots and case."""
    section, _, rest = key.partition(".")
    subsection, _, name = rest.rpartition(".")
    return section.lower(), (subsection if "." in rest else None), name.lower()


def _subsection(name: str) -> str:
    """A quoted subsection name: git reads only `\\` and `\"` as escapes there."""
    if "\n" in name or "\0" in name:
        raise ValueError("a config subsection cannot hold a newline or a NUL")
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quote(text: str) -> str:
    if "\0" in text:
        raise ValueError("a config value cannot hold a NUL")
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\b", "\\b")
    )
    return f'"{escaped}"'


def replace_file(target: Path, content: str | bytes | bytearray, owner: SlotUser | None) -> None:
    """Write a sibling, then rename it over `target`: a planted symlink is replaced, never
    followed."""
    staged = target.with_name(f".{target.name}.seedkeeper-{secrets.token_hex(8)}")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(descriptor, "wb") as staged_file:
            staged_file.write(content.encode() if isinstance(content, str) else content)
            if owner is not None:
                os.fchown(staged_file.fileno(), owner.uid, owner.gid)
        os.replace(staged, target)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def _remove(path: Path) -> None:
    """Remove a file, a symlink (not its target) or a whole tree (rmtree never follows a
    symlink)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
