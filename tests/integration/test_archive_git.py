"""The archive's `.git` is data (DESIGN §9): attacks planted in a snapshot's repository,
seeded end to end through the seed function and the real slot task.

Every planted command is a script that writes a canary file outside the workspace and one
inside it. Each test asserts no canary ever appears, that a sibling "victim" repository is
byte-identical afterwards, and that the seed ends `seeded` with the scrubbed config or
`seed_failed` with `unsafe-archive`. Hostile archives are built with mksquashfs directly:
`publish` would read (and now refuse) the planted config itself."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from repos import git, new_repository, tree
from seedkeeper.domain.record import State
from seedkeeper_task.supervisor import CHECKOUT
from slots import ORIGIN, Slots, assert_no_half_tree, record_archive, squashfs_of, verdict

TOKEN = "ghp_SeedkeeperTestSecret0123456789"  # noqa: S105 - a planted credential, not a real one
SCRUBBED = [
    "core.repositoryformatversion=0",
    "core.bare=false",
    f"remote.origin.url={ORIGIN}",
    "remote.origin.fetch=+refs/heads/*:refs/remotes/origin/*",
    "branch.main.remote=origin",
    "branch.main.merge=refs/heads/main",
]


@dataclass
class Attacker:
    """What an attack needs: the canaries, the victim beside the slot, and the archive."""

    slots: Slots
    root: Path
    repo: Path
    victim: Path

    @property
    def canaries(self) -> Path:
        return self.root / "canaries"

    def command(self, name: str, slot: str) -> str:
        """An executable script that writes canary `name` outside and inside the workspace."""
        script = self.root / "attacker" / f"{name}.sh"
        script.parent.mkdir(exist_ok=True)
        inside = self.slots.workspace(slot) / f"canary-{name}"
        script.write_text(f"#!/bin/sh\ntouch {self.canaries}/{name} {inside}\n")
        script.chmod(0o755)
        return str(script)

    def seed(self, slot: str, head: str | None = None, **seed: str) -> dict[str, Any]:
        """The planted repository as a recorded snapshot at `head` (default: its HEAD),
        and the body that seeds it."""
        image = squashfs_of(self.repo, self.root / f"{slot}.sqsh")
        recorded = record_archive(
            self.slots,
            f"widgets-{slot}",
            image,
            size=len(image),
            sha256=hashlib.sha256(image).hexdigest(),
            sha=head or self.head,
        )
        return self.slots.body(recorded | seed, slot=slot)

    @property
    def head(self) -> str:
        return git(self.repo, "rev-parse", "HEAD")

    def settle(self, body: dict[str, Any]) -> dict[str, Any]:
        victim_before = tree(self.victim)
        status, _ = self.slots.seed(body)
        assert status == 202
        answer: dict[str, Any] = self.slots.settle(body)[1]
        assert tree(self.victim) == victim_before, "the victim repository changed"
        return answer

    def assert_no_canary(self, slot: str) -> None:
        assert list(self.canaries.iterdir()) == []
        assert list(self.slots.workspace(slot).parent.rglob("canary-*")) == []


@pytest.fixture
def attacker(slots: Slots, repo: Path, tmp_path: Path) -> Attacker:
    victim = new_repository(tmp_path / "victim")
    git(victim, "add", "-A")
    git(victim, "commit", "--quiet", "-m", "the victim's own work")
    git(victim, "remote", "add", "origin", "https://git.example.com/victim.git")
    # Writable by anyone: git runs as the slot user, and a command it ran must leave a mark.
    (tmp_path / "canaries").mkdir(mode=0o777)
    (tmp_path / "canaries").chmod(0o777)
    return Attacker(slots, tmp_path, repo, victim)


def assert_seeded_and_scrubbed(attacker: Attacker, answer: dict[str, Any], slot: str) -> Path:
    assert answer["seeded"] is True, attacker.slots.log(slot)
    checkout = attacker.slots.workspace(slot) / CHECKOUT
    listed = git(checkout, "config", "--file", ".git/config", "--list").splitlines()
    assert listed == SCRUBBED
    assert not (checkout / ".git" / "hooks").exists()
    return checkout


def assert_unsafe_archive(attacker: Attacker, answer: dict[str, Any], slot: str) -> None:
    assert verdict(answer) == (False, "unsafe-archive", "fixup"), attacker.slots.log(slot)
    assert attacker.slots.record(slot).state is State.SEED_FAILED
    assert_no_half_tree(attacker.slots, slot)


def run_git(checkout: Path, *args: str) -> None:
    """git as the run would run it: as the checkout's owner (the slot user), with the
    run's own empty HOME."""
    owner = checkout.stat()
    with tempfile.TemporaryDirectory() as home:
        os.chown(home, owner.st_uid, owner.st_gid)
        subprocess.run(
            ["git", "-C", str(checkout), *args],
            env={"PATH": os.environ["PATH"], "HOME": home},
            user=owner.st_uid,
            group=owner.st_gid,
            check=True,
            capture_output=True,
        )


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", message)


@pytest.mark.parametrize("driver", ["clean", "smudge", "process"])
def test_a_filter_driver_the_archive_names_never_runs(attacker: Attacker, driver: str) -> None:
    slot = f"filter-{driver}"
    (attacker.repo / ".gitattributes").write_text("* filter=evil\n")
    commit_all(attacker.repo, "attributes")
    git(attacker.repo, "config", f"filter.evil.{driver}", attacker.command(driver, slot))
    answer = attacker.settle(attacker.seed(slot))
    attacker.assert_no_canary(slot)
    assert_seeded_and_scrubbed(attacker, answer, slot)


class Unauthorized(http.server.ThreadingHTTPServer):
    """An http server that asks every request for credentials: a git client answers it
    with its credential helper, then its askpass program."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Unauthorized)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _Unauthorized(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="attacker"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def unauthorized() -> Iterator[str]:
    server = Unauthorized()
    yield server.url
    server.shutdown()
    server.server_close()


# Each rewrites the origin with url.<base>.insteadOf so the fetch reaches a transport that
# runs the planted command: (command, the archive's repository, the 401 server's URL).
FETCH_VECTORS: dict[str, Callable[[str, Path, str], dict[str, str]]] = {
    "ssh-command": lambda command, _, __: {
        "url.ssh://attacker.example/.insteadOf": "https://git.example.com/",
        "core.sshCommand": command,
    },
    "upload-pack": lambda command, repo, _: {
        f"url.{repo}.insteadOf": ORIGIN,
        "remote.origin.uploadpack": command,
    },
    "git-proxy": lambda command, _, __: {
        "url.git://attacker.example/.insteadOf": "https://git.example.com/",
        "core.gitProxy": command,
    },
    "credential-helper": lambda command, _, unauthorized: {
        f"url.{unauthorized}.insteadOf": "https://git.example.com/",
        "credential.helper": f"!{command}",
    },
    "askpass": lambda command, _, unauthorized: {
        f"url.{unauthorized}.insteadOf": "https://git.example.com/",
        "core.askPass": command,
    },
}


@pytest.mark.parametrize("vector", list(FETCH_VECTORS))
def test_a_command_the_archive_names_for_a_fetch_never_runs(
    attacker: Attacker, unauthorized: str, vector: str
) -> None:
    """The origin is https and unreachable here: the fetch fails, whatever the verdict."""
    slot = f"fetch-{vector}"
    planted = FETCH_VECTORS[vector](attacker.command(vector, slot), attacker.repo, unauthorized)
    for key, value in planted.items():
        git(attacker.repo, "config", key, value)
    answer = attacker.settle(attacker.seed(slot, fetch_ref="feature"))
    attacker.assert_no_canary(slot)
    assert verdict(answer) == (False, "seed-failed", "fixup"), attacker.slots.log(slot)
    assert "origin" in answer["detail"] or "git.example.com" in answer["detail"]


def test_the_archives_fsmonitor_and_hooks_never_run_in_the_runs_own_git(
    attacker: Attacker,
) -> None:
    """The scrubbed config stays in the slot: the run's `git status` and `git commit` run
    nothing the archive named."""
    slot = "run-git"
    git(attacker.repo, "config", "core.fsmonitor", attacker.command("fsmonitor", slot))
    hooks = attacker.root / "planted-hooks"
    hooks.mkdir()
    for name in ("pre-commit", "post-commit", "post-checkout"):
        for folder in (attacker.repo / ".git" / "hooks", hooks):
            shutil.copy(attacker.command(name, slot), folder / name)
    git(attacker.repo, "config", "core.hooksPath", str(hooks))
    answer = attacker.settle(attacker.seed(slot))
    assert answer["seeded"] is True, attacker.slots.log(slot)
    checkout = attacker.slots.workspace(slot) / CHECKOUT
    run_git(checkout, "status", "--porcelain")
    author = ("-c", "user.email=run@example.com", "-c", "user.name=run")
    run_git(checkout, *author, "commit", "--quiet", "--allow-empty", "-m", "the run's work")
    attacker.assert_no_canary(slot)
    assert_seeded_and_scrubbed(attacker, answer, slot)


def _worktree_absolute(attacker: Attacker, _: str) -> None:
    git(attacker.repo, "config", "core.worktree", str(attacker.victim))


def _worktree_relative(attacker: Attacker, _: str) -> None:
    # From <data>/slots/<slot>/workspace/checkout/.git up to the test's root.
    git(attacker.repo, "config", "core.worktree", "../../../../../../victim")


def _worktree_in_the_workspace(attacker: Attacker, _: str) -> None:
    git(attacker.repo, "config", "core.worktree", "../..")


def _gitfile(attacker: Attacker, _: str) -> None:
    shutil.rmtree(attacker.repo / ".git")
    (attacker.repo / ".git").write_text(f"gitdir: {attacker.victim / '.git'}\n")


def _symlinked_git_directory(attacker: Attacker, _: str) -> None:
    (attacker.repo / ".git").rename(attacker.repo / ".real-git")
    (attacker.repo / ".git").symlink_to(".real-git")


def _commondir(attacker: Attacker, _: str) -> None:
    (attacker.repo / ".git" / "commondir").write_text(f"{attacker.victim / '.git'}\n")


def _alternates(attacker: Attacker, _: str) -> None:
    info = attacker.repo / ".git" / "objects" / "info"
    info.mkdir(exist_ok=True)
    (info / "alternates").write_text(f"{attacker.victim / '.git' / 'objects'}\n")


def _include(attacker: Attacker, slot: str) -> None:
    (attacker.repo / ".gitattributes").write_text("* filter=evil\n")
    commit_all(attacker.repo, "attributes")
    included = attacker.root / "included.config"
    included.write_text(f'[filter "evil"]\n\tclean = {attacker.command("include", slot)}\n')
    git(attacker.repo, "config", "include.path", str(included))


def _include_if(attacker: Attacker, _: str) -> None:
    git(attacker.repo, "config", "includeIf.gitdir:/.path", str(attacker.victim / ".git/config"))


def _symlinked_config(attacker: Attacker, slot: str) -> None:
    config = attacker.repo / ".git" / "config"
    planted = attacker.repo / "planted.config"
    planted.write_text(
        config.read_text() + f"[core]\n\tfsmonitor = {attacker.command('cfg', slot)}\n"
    )
    config.unlink()
    config.symlink_to("../planted.config")


def _unknown_extension(attacker: Attacker, _: str) -> None:
    git(attacker.repo, "config", "core.repositoryformatversion", "1")
    git(attacker.repo, "config", "extensions.seedkeeperUnknown", "true")


def _linked_worktree(attacker: Attacker, _: str) -> None:
    admin = attacker.repo / ".git" / "worktrees" / "elsewhere"
    admin.mkdir(parents=True)
    (admin / "gitdir").write_text(f"{attacker.victim / '.git'}\n")
    (admin / "commondir").write_text("../..\n")
    (admin / "HEAD").write_text(f"{attacker.head}\n")


def _submodule_git_directory(attacker: Attacker, _: str) -> None:
    module = attacker.repo / ".git" / "modules" / "sub"
    shutil.copytree(attacker.victim / ".git", module)
    git(module, "config", "core.worktree", str(attacker.victim))


LAYOUTS: dict[str, Callable[[Attacker, str], None]] = {
    "worktree-absolute": _worktree_absolute,
    "worktree-relative": _worktree_relative,
    "worktree-workspace": _worktree_in_the_workspace,
    "gitfile": _gitfile,
    "git-symlink": _symlinked_git_directory,
    "commondir": _commondir,
    "alternates": _alternates,
    "include": _include,
    "include-if": _include_if,
    "config-symlink": _symlinked_config,
    "unknown-extension": _unknown_extension,
    "linked-worktree": _linked_worktree,
    "submodule-gitdir": _submodule_git_directory,
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_repository_layout_that_points_anywhere_is_an_unsafe_archive(
    attacker: Attacker, layout: str
) -> None:
    slot = f"layout-{layout}"
    head = attacker.head  # read before a layout hides it
    LAYOUTS[layout](attacker, slot)
    answer = attacker.settle(attacker.seed(slot, head))
    attacker.assert_no_canary(slot)
    assert_unsafe_archive(attacker, answer, slot)
    assert not (attacker.slots.workspace(slot) / "README.md").exists()


def test_an_archive_without_git_inside_a_clone_leaves_the_clone_untouched(
    attacker: Attacker, tmp_path: Path
) -> None:
    """Git would climb from the checkout to the clone holding the data directory and fix
    up that repository instead, as root."""
    clone = tmp_path / "data"
    git(tmp_path, "clone", "--quiet", str(attacker.repo), str(clone))
    clone_before = tree(clone)
    head = attacker.head
    shutil.rmtree(attacker.repo / ".git")
    answer = attacker.settle(attacker.seed("no-git", head))
    assert_unsafe_archive(attacker, answer, "no-git")
    # The runtime's own (the slots, the tasks' keys) aside.
    ours = {"slots", "task-keys"}
    after = {path: entry for path, entry in tree(clone).items() if path.split("/")[0] not in ours}
    assert after == clone_before


def test_the_residents_credentials_never_reach_the_slot(attacker: Attacker) -> None:
    slot = "credentials"
    secret_url = f"https://resident:{TOKEN}@git.example.com/acme/widgets.git"
    for key, value in {
        "remote.origin.url": secret_url,
        "remote.origin.pushurl": secret_url,
        "http.extraheader": f"Authorization: Bearer {TOKEN}",
        "http.https://git.example.com/.extraheader": f"Authorization: Basic {TOKEN}",
        "credential.helper": f"store --file=/tmp/{TOKEN}",
        "credential.https://git.example.com.username": TOKEN,
        f"url.https://resident:{TOKEN}@git.example.com/.insteadOf": "https://git.example.com/",
    }.items():
        git(attacker.repo, "config", key, value)
    (attacker.repo / ".git" / "FETCH_HEAD").write_text(
        f"{attacker.head}\t\tbranch 'main' of {secret_url}\n"
    )
    legacy = attacker.repo / ".git" / "remotes"
    legacy.mkdir()
    (legacy / "upstream").write_text(f"URL: {secret_url}\n")
    answer = attacker.settle(attacker.seed(slot))
    checkout = assert_seeded_and_scrubbed(attacker, answer, slot)
    assert not (checkout / ".git" / "FETCH_HEAD").exists()
    for path in (checkout / ".git").rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert TOKEN.encode() not in path.read_bytes(), path
