"""Differential test: is_valid_branch_name versus the real ``git check-ref-format``."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from seedkeeper.domain.gitref import is_valid_branch_name

SEED = 20240531
GENERATED_COUNT = 2500
WORKERS = 4

# (token, weight): weighted towards the characters and sequences git treats specially.
TOKENS: list[tuple[str, int]] = [
    (".", 12),
    ("/", 12),
    ("@", 8),
    ("{", 6),
    ("}", 2),
    ("-", 6),
    ("lock", 5),
    (".lock", 4),
    ("HEAD", 4),
    ("..", 3),
    ("@{", 2),
    ("~", 1),
    ("^", 1),
    (":", 1),
    ("?", 1),
    ("*", 1),
    ("[", 1),
    ("\\", 1),
    (" ", 1),
    ("\t", 1),
    ("\x7f", 1),
    ("\x01", 1),
    ("\x1f", 1),
    ("+", 2),
    ("é", 2),
    ("ü", 2),
    ("日", 2),
    ("\x85", 1),
    ("a", 10),
    ("b", 6),
    ("Z", 3),
    ("0", 3),
    ("9", 2),
    ("_", 2),
]

EDGE_CASES = [
    "", "@", "@@", "@x", "a@", "a/@", "@/a", "@}", "a@}", "{", "@{", "@{-1}", "a@{u}",
    "HEAD", "HEAD/x", "x/HEAD", "refs/heads/x", "refs/heads/HEAD", "heads/HEAD",
    "-", "-a", "a-", "a/-b", "a+b", "é", "ü/日本", "\x85", ".", "..", "...", ".a",
    "a.", "a/.", "a/..", "a..b", "a/.b", "lock", ".lock", "a.lock", "a/.lock",
    "a.lock/b", "x.lock.lock", "a.LOCK", "a.lockb", "/", "/a", "a/", "a//b",
    "a b", " ", "a\tb", "a\nb", "\x01", "a\x1fb", "a\x7fb", "a~b", "a^b", "a:b",
    "a?b", "a*b", "*", "a/*", "a[b", "a\\b",
]  # fmt: skip


def generate_names(count: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)  # noqa: S311 - deterministic test data, not crypto
    tokens = [token for token, _ in TOKENS]
    weights = [weight for _, weight in TOKENS]
    for _ in range(count):
        yield "".join(rng.choices(tokens, weights, k=rng.randint(1, 8)))


@pytest.fixture
def git_sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A cwd and environment in which git cannot discover any repository."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env["GIT_CEILING_DIRECTORIES"] = str(tmp_path.parent)
    return tmp_path, env


def git_accepts(name: str, cwd: Path, env: dict[str, str]) -> bool:
    result = subprocess.run(
        ["git", "check-ref-format", "--branch", name],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def test_sandbox_is_outside_any_repository(git_sandbox: tuple[Path, dict[str, str]]) -> None:
    cwd, env = git_sandbox
    result = subprocess.run(
        ["git", "rev-parse", "--git-dir"], cwd=cwd, env=env, capture_output=True, check=False
    )
    assert result.returncode != 0, result.stdout


def test_matches_git_check_ref_format(git_sandbox: tuple[Path, dict[str, str]]) -> None:
    cwd, env = git_sandbox
    # NUL cannot be carried in argv, so it is left out (the unit tests cover it).
    names = list(dict.fromkeys([*EDGE_CASES, *generate_names(GENERATED_COUNT, SEED)]))
    assert len(names) >= 2000
    assert not any("\x00" in name for name in names)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        git_answers = list(pool.map(lambda name: git_accepts(name, cwd, env), names))

    disagreements = [
        (name, git_answer)
        for name, git_answer in zip(names, git_answers, strict=True)
        if is_valid_branch_name(name) != git_answer
    ]
    # Guard against a degenerate generator: both outcomes must be well represented.
    assert sum(git_answers) >= 200
    assert len(names) - sum(git_answers) >= 200
    assert not disagreements, f"{len(disagreements)}/{len(names)} disagreements:\n" + "\n".join(
        f"  {name!r}: git={git}, is_valid_branch_name={not git}" for name, git in disagreements[:20]
    )
