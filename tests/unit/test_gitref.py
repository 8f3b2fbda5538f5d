"""Unit tests for seedkeeper.domain.gitref (expected answers measured with git 2.39.5)."""

from __future__ import annotations

import pytest

from seedkeeper.domain.gitref import is_valid_branch_name

VALID = [
    "main",
    "feature/x",
    "a+b",
    "a-",
    "a/-b",
    "é",
    "ü/日本",
    "\x85",  # C1 control character: git only rejects ASCII controls
    "\x80\x9f",
    "@",
    "@x",
    "a@",
    "a/@",
    "@/a",
    "a@}",
    "@}",
    "{",
    "a{b}",
    "refs/heads/x",
    "refs/heads/HEAD",
    "x/HEAD",
    "HEAD/x",
    "HEADx",
    "head",
    "lock",
    "a.lockb",
    "x.locks/y.lockx",
    "a.LOCK",
    "a.b",
    "a/b.c",
    "a_b,c;d'e\"f<g>h|i=j%k!l#m$n&o(p)q",
]

INVALID = [
    "",
    "HEAD",
    "-",
    "-a",
    "--",
    "a..b",
    "..",
    "...",
    "a/..",
    "a/..b",
    "@{",
    "@{-1}",
    "a@{u}",
    "@@{",
    "a.@{",
    "\x00",
    "a\x01b",
    "a\tb",
    "a\nb",
    "a\x1fb",
    "a\x7fb",
    "a b",
    " ",
    "a~b",
    "a^b",
    "a:b",
    "a?b",
    "a*b",
    "*",
    "a/*",
    "a[b",
    "a\\b",
    ".",
    ".a",
    "a/.",
    "a/.b",
    ".lock",
    "a/.lock",
    "a.lock",
    "a.lock/b",
    "a/b.lock",
    "x.lock.lock",
    "a.",
    "a/b.",
    "a/",
    "/",
    "/a",
    "a//b",
    "\udcff",  # lone surrogate: not encodable as UTF-8
    "a\ud800",
]


@pytest.mark.parametrize("name", VALID, ids=ascii)
def test_valid_branch_names(name: str) -> None:
    assert is_valid_branch_name(name)


@pytest.mark.parametrize("name", INVALID, ids=ascii)
def test_invalid_branch_names(name: str) -> None:
    assert not is_valid_branch_name(name)
