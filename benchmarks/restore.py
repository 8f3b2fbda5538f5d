"""The restore benchmark (`make bench`): our slot task's restore against the shell.

Every baseline does the task's work (download, verify, extract, check out) on the same
link, disk and CPU.

Inputs, generated once per size (deterministic: the same trees and commit every time) and
cached in the work dir: a snapshot of two archives, built with the project's own
`build_squashfs` (zstd) and `measure`, whose sizes add up to the size's label:

- the checkout: a repository with history. A synthetic source tree committed over 300
  commits by `git fast-import` (most files in the first; each later one adds a few files and
  makes small edits to a few, so the pack holds deltas), an `origin` remote, repacked into
  one pack (`git repack -a -d`) and checked out as a clone is, plus a few ignored build
  outputs.
- the deps: a node_modules-like tree (packages as folders with package.json, README.md,
  LICENSE, index.js, lib/**/*.js, some .d.ts and .js.map, nested node_modules, a .bin of
  links; file sizes lognormal, median about 2 KB), recorded as the snapshot's deps archive
  and restored by the task at the plan's deps path (`node_modules`, ignored by the
  checkout's .gitignore).

About 120,000 files at "300 MB" (20,000 in the checkout, 100,000 in the deps); a larger
size holds more files, not only bigger ones: "1 GB" has three times as many.

Cells: every link of `links.LINKS` (`--links`: 50 MiB/s per connection over HTTP; 1
Gbit/s in all with 30 ms of round trip over HTTPS, the certificate trusted by every client;
unlimited loopback) at every CPU shape (`--cpus`: 1 and 2 vCPU, each a CFS quota on a
cgroup of its own, as ECS gives a task its CPU), for every size. Each cell runs `--rounds`
rounds (at least 5) of the five methods below (above `--plain-up-to`, of ours, the shell
and the floor), each round's order drawn at random
(`links.shuffled`, `random.Random(--seed)`) and recorded; one untimed run of ours and of
the shell comes first on each link. Every run writes into a fresh journaled ext4 of its own
(a loop-mounted sparse image, made before the run and removed whole after it: as root;
otherwise the work dir, and the report says so): this machine's root filesystem is ext4
without a journal, where creating files right after deleting many is quadratic. The disk
is synced before every timed run. Every timed command runs inside the cell's CPU shape
(`CpuShape.wrap`: it and all it starts); nginx, moto and the checkpoint function (served in
this process) stay outside, as R2 and AWS's side are not the task's.

- ours: the real slot task (`python -m seedkeeper_task`) started as the local runtime
  starts it, against a moto lifecycle table holding a record born for it. As in a
  deployment its plan carries no URL: it starts at the real checkpoint function (served in
  this process by the local function-URL gateway, `POST /tasks/start` signed with the
  task's keys), which answers presigned GETs of the archives' R2 keys pointing at the
  link's nginx (path-style, `/<bucket>/<key>`, laid out as links to the archives). Then it
  downloads both archives at once (`download_parts`: 8 ranges each, hashed as they come),
  checks each listing, extracts both (the checkout first fixed up by git, the deps tree
  staged beside it), checks the trees, writes its marker and settles. Timed as its whole
  process from its spawn to its settled record (interpreter start, imports and the start
  call are part of what a task costs; the slot is usable once settled, so the sandbox
  command, which starts then, writes the time), as the task records its restore
  (`result.ms`, `result.steps`), and until it is reaped (in the JSON), with its CPU seconds
  (user + system, the task and its children). Its sandbox command also writes the task's
  peak RSS (VmHWM), and exits.
- shell, the strongest baseline a shell user writes (`Bench.strongest`, one bash script):
  both archives at once, each by `aria2c -x8 -s8` (as many connections as the task), each
  verified (`openssl dgst -sha256`, the digest compared) and extracted (`unsquashfs`, the
  task's own flags: the same bounded caches, the same strictness) as soon as it has landed,
  while the other still comes; the deps tree moved into the checkout; then `git -c
  core.checkStat=minimal -c core.trustctime=false checkout -B` (the index's stat data
  trusted on size and mtime, which unsquashfs restores, as the task adopts it). OpenSSL
  uses the CPU's SHA extensions as the task's hashlib does (coreutils' `sha256sum` does
  not and takes 3.5 times as long).
- aria2c and curl, the plain ones, each step a subprocess one after the other: `aria2c
  -x4 -s4` of both archives at once (from one input file), or `curl -s -f -o` of one, then
  the other; `openssl dgst -sha256` of both; `unsquashfs` of the checkout into `checkout/`
  and of the deps into `checkout/node_modules`; `git checkout -q -B main <commit>`.
- floor: `unsquashfs` of both archives at once from the page cache, nothing else: the CPU
  floor. Each cell prints the floor as this plus the link's floor (`LinkSpec.floor_s` of
  the archives over 8 connections each): what no restore that downloads, then extracts,
  can beat on that link and CPU.

Every baseline's digests and HEAD are checked. The report gives, per cell, medians and
paired ratios (each of ours' runs against the same round's run of each method) as median
(min-max), CPU seconds, where the time goes, and the targets of issue 31 (ours <= 1.0x the
shell, <= 1.1x the floor; the task's peak RSS <= 150 MB and flat in size) as met or NOT
met. It never fails on a target (exit 1 only when the benchmark itself breaks, such as a
restore that does not seed). Inputs are cached in the work dir (default
`$TMPDIR/seedkeeper-bench`); every run, each cell's orders and the seed are written there
as restore-results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

import boto3
from rich.console import Console
from rich.table import Table

from seedkeeper.adapters.r2 import backup_key
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding, OwnerClaim, SeedIdentity
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.plan import DEPS_PATH, PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.record import SeedSucceeded, SlotRecord, State, Supported
from seedkeeper.domain.snapshots import Archive, NewSnapshot
from seedkeeper.services.rotation import Snapshots
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_task.restore.extract import UNSQUASHFS_COMMAND
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.gateway import FunctionUrlGateway
from seedkeeper_tools.local.motoserver import AtomicMotoServer
from seedkeeper_tools.local.principals import TASK_ROLE_ARN, LocalCredentials, TaskKeys
from seedkeeper_tools.publish import build_squashfs, measure

if TYPE_CHECKING:
    from benchmarks import links
else:
    import links  # the script's own folder is on sys.path

GENERATOR_VERSION = 4  # bump when the generator changes: cached inputs are rebuilt
SEED = 20_240_601
MB = 1_000_000
TABLE = "seedkeeper-bench"
BUCKET = "seedkeeper-bench"  # the R2 bucket the checkpoint function presigns for
REGION = "us-east-1"
REF = "main"
ORIGIN = "https://git.example.com/bench/synthetic.git"
# Targets (issue 31), each on the paired median of the whole task process, in every cell.
STRONGEST_TARGET = 1.0  # against the strongest baseline
FLOOR_TARGET = 1.1  # against the CPU floor (unsquashfs of both alone) plus the link floor
RSS_TARGET_MB = 150.0
# "Not growing with size": the larger archive's peak is within this of the smaller's.
RSS_FLAT_MB = 10.0
RUN_TIMEOUT = 900.0
# The baselines' verification: OpenSSL's sha256, as fast as the task's (CPU extensions);
# `-r` prints "<digest> *<file>", as sha256sum does.
SHA256_COMMAND = ("openssl", "dgst", "-sha256", "-r")
TASK_PARTS: int = TaskSettings.model_fields["download_parts"].default  # ranges per archive


def task_unsquashfs(shape: links.CpuShape) -> list[str]:
    """unsquashfs as the task runs it at `shape`: its flags, and as many threads as the
    template's CPU gives it (`TaskSettings.processors`). Every baseline extracts with it."""
    cpu_units = int(shape.task_environment["SEEDKEEPER_CPU_UNITS"])
    processors = TaskSettings(cpu_units=cpu_units).processors()
    return [*UNSQUASHFS_COMMAND, "-processors", str(processors)]


# The strongest baseline a shell user writes (`Bench.strongest`): both archives at once,
# each over as many connections as the task opens, each extracted as soon as it has landed
# and verified, then git trusting the restored stat data as far as git can.
STRONGEST = "shell"
STRONGEST_GIT = ("-c", "core.checkStat=minimal", "-c", "core.trustctime=false")
# The plain ones: one step after another, git as it comes.
ARIA2C_CONNECTIONS = 4
PLAIN = ("aria2c", "curl")
BASELINES = (STRONGEST, *PLAIN)
FLOOR = "floor"  # unsquashfs of both archives at once, nothing else: the CPU floor
DESCRIPTIONS = {
    "ours": "the slot task, its whole process",
    STRONGEST: f"aria2c -x{TASK_PARTS} per archive, both at once, each verified and "
    "extracted as it lands; git checkout with core.checkStat=minimal, trustctime=false",
    "aria2c": f"aria2c -x{ARIA2C_CONNECTIONS} of both; then sha256, unsquashfs each, git checkout",
    "curl": "curl of one archive, then the other; then sha256, unsquashfs each, git checkout",
    FLOOR: "unsquashfs of both archives at once from the page cache, nothing else",
}
# The commands every run needs, and the Debian packages holding them.
TOOLS = {
    "git": "git",
    "mksquashfs": "squashfs-tools",
    "unsquashfs": "squashfs-tools",
    "openssl": "openssl",
    "curl": "curl",
    "aria2c": "aria2",
}
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
# No developer's git configuration while generating: the same inputs give the same commit.
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
HISTORY_START = 1_717_200_000  # 2024-06-01: the first commit's date; one hour per commit


@dataclass(frozen=True)
class Size:
    label: str
    checkout_files: int  # tracked at the head commit; a few ignored outputs come on top
    deps_files: int  # in the deps tree, about (whole packages)
    scale: float  # multiplies every file's size
    commits: int = 300

    @property
    def megabytes(self) -> int:
        number, unit = self.label.split()
        return int(number) * (1000 if unit == "GB" else 1)

    @property
    def key(self) -> str:
        return (
            f"v{GENERATOR_VERSION}-{self.checkout_files}-{self.deps_files}-{self.scale:g}"
            f"-{self.commits}"
        )


# Their archives add up to about the label. "1 GB" holds 3x the files of "300 MB", each
# 11% bigger: file creation grows with the size, as it does in real trees.
SIZES = (
    Size("1 GB", 60_000, 300_000, 1.11),
    Size("300 MB", 20_000, 100_000, 1.0),
    Size("100 MB", 6_700, 33_000, 1.0),
)
_SIZE_LABEL = re.compile(r"\s*([1-9][0-9]*)\s*(MB|GB)\s*", re.IGNORECASE)


def size_of(megabytes: int) -> Size:
    """The size of that many MB: one of SIZES, else the "300 MB" layout with its file
    counts scaled (the files' own sizes kept)."""
    for size in SIZES:
        if size.megabytes == megabytes:
            return size
    base = next(size for size in SIZES if size.label == "300 MB")
    factor = megabytes / base.megabytes
    label = f"{megabytes // 1000} GB" if megabytes % 1000 == 0 else f"{megabytes} MB"
    return Size(
        label,
        max(100, round(base.checkout_files * factor)),
        max(100, round(base.deps_files * factor)),
        base.scale,
        base.commits,
    )


def size_for(label: str) -> Size:
    """A size from its label, "300 MB" or "1 GB" (argparse's type)."""
    matched = _SIZE_LABEL.fullmatch(label)
    if matched is None:
        raise argparse.ArgumentTypeError(f"{label!r}: a size is like '300 MB' or '1 GB'")
    unit = 1000 if matched.group(2).upper() == "GB" else 1
    return size_of(int(matched.group(1)) * unit)


# -- the synthetic trees --------------------------------------------------------------------

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["ing", "er", "ex", "on"]
_KEYWORDS = [
    "def",
    "return",
    "if",
    "else",
    "for",
    "in",
    "while",
    "class",
    "import",
    "from",
    "with",
    "as",
    "try",
    "except",
    "raise",
    "yield",
    "await",
    "async",
    "lambda",
    "not",
    "and",
    "or",
    "None",
    "True",
    "False",
    "self",
    "const",
    "let",
    "func",
    "struct",
    "impl",
    "pub",
]
_PUNCTUATION = "=+-*/<>(),.:[]{}"
_CODE = (".py", ".ts", ".go", ".rs", ".java", ".c")
_ASSETS = (".png", ".woff2", ".jar", ".gz")
_TEXT = ("code", "prose", "data")
_BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_LICENSE = """MIT License

Copyright (c) {year} {author}

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.
"""


def _vocabulary(rng: random.Random, count: int) -> list[str]:
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def _code_lines(rng: random.Random, words: list[str], count: int) -> list[str]:
    """Source-like lines: indentation, keywords, identifiers, literals, comments."""
    lines: list[str] = []
    for _ in range(count):
        indent = "    " * rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
        kind = rng.random()
        if kind < 0.08:
            lines.append(indent + "# " + " ".join(rng.choices(words, k=rng.randint(3, 12))))
        elif kind < 0.12:
            lines.append("")
        elif kind < 0.30:
            first, second = rng.choices(words, k=2)
            arguments = ", ".join(rng.choices(words, k=rng.randint(0, 4)))
            lines.append(f"{indent}{first}_{second} = {rng.choice(words)}({arguments})")
        elif kind < 0.45:
            call = f"{rng.choice(words)}.{rng.choice(words)}"
            text = "_".join(rng.choices(words, k=2))
            lines.append(
                f'{indent}{rng.choice(_KEYWORDS)} {call}({rng.randint(0, 99999)}, "{text}"):'
            )
        elif kind < 0.60:
            lines.append(
                f"{indent}return {rng.choice(words)}[{rng.randint(0, 64)}]"
                f" + 0x{rng.getrandbits(32):08x}"
            )
        else:
            tokens = (
                rng.choice((rng.choice(words), rng.choice(_KEYWORDS), rng.choice(_PUNCTUATION)))
                for _ in range(rng.randint(3, 10))
            )
            lines.append(indent + " ".join(tokens))
    return lines


def _prose_lines(rng: random.Random, words: list[str], count: int) -> list[str]:
    lines: list[str] = []
    for _ in range(count):
        sentence = " ".join(rng.choices(words, k=rng.randint(6, 16)))
        lines.append(rng.choice(("", "", "- ", "## ", "> ")) + sentence.capitalize() + ".")
    return lines


def _data_lines(rng: random.Random, words: list[str], count: int) -> list[str]:
    lines: list[str] = []
    for _ in range(count):
        key = "_".join(rng.choices(words, k=rng.randint(1, 3)))
        value = rng.choice(
            (
                str(rng.randint(0, 10**6)),
                f'"{rng.choice(words)}"',
                "true",
                "null",
                f"{rng.random():.6f}",
            )
        )
        lines.append(f'{"  " * rng.randint(1, 4)}"{key}": {value},')
    return lines


def _type_lines(rng: random.Random, words: list[str], count: int) -> list[str]:
    """TypeScript declarations, as a package's .d.ts files hold."""
    types = ("string", "number", "boolean", "void", "unknown", "Buffer", "Promise<void>")
    lines: list[str] = []
    for _ in range(count):
        name, argument = rng.choices(words, k=2)
        kind = rng.random()
        if kind < 0.5:
            lines.append(
                f"export declare function {name}({argument}: {rng.choice(types)}, options?: "
                f"{name.capitalize()}Options): {rng.choice(types)};"
            )
        elif kind < 0.8:
            lines.append(f"    {argument}{rng.choice(('', '?'))}: {rng.choice(types)};")
        else:
            lines.append(f"export interface {name.capitalize()}Options {{")
    return lines


def _map_segments(rng: random.Random, count: int) -> list[str]:
    """Source-map `mappings` segments (base64 VLQ-like)."""
    return [
        "".join(rng.choices(_BASE64[:32], k=rng.randint(4, 8))) + rng.choice((",", ",", ",", ";"))
        for _ in range(count)
    ]


def _directories(rng: random.Random, words: list[str], count: int) -> list[PurePosixPath]:
    tops = ("src", "lib", "tests", "docs", "tools", "vendor", "assets", "config")
    found = [PurePosixPath(top) for top in tops]
    seen = set(found)
    while len(found) < count:
        child = rng.choice(found) / rng.choice(words)
        if len(child.parts) <= 7 and child not in seen:
            seen.add(child)
            found.append(child)
    return found


def _joined(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


@dataclass(frozen=True)
class _Tracked:
    """A file of the checkout's head commit, in the order the history adds them."""

    path: str
    kind: str  # one of _TEXT, "binary" or "link"
    length: int  # bytes wanted (a link: its target)
    mode: str  # git's: 100644, 100755 or 120000


def _tracked_files(layout: random.Random, words: list[str], size: Size) -> list[_Tracked]:
    directories = _directories(layout, words, max(8, size.checkout_files // 16))
    tracked: list[_Tracked] = []
    for index in range(size.checkout_files):
        folder = layout.choice(directories)
        top = folder.parts[0]
        stem = f"{layout.choice(words)}_{index}"
        if layout.random() < (0.25 if top == "assets" else 0.015):
            name, kind, mode = stem + layout.choice(_ASSETS), "binary", "100644"
            length = int(min(8 * MB, layout.lognormvariate(9.1, 1.0)) * size.scale)
        else:
            kind = {"docs": "prose", "config": "data"}.get(top, "code")
            executable = top == "tools" and layout.random() < 0.5
            extension = {"prose": ".md", "data": ".json"}.get(kind, layout.choice(_CODE))
            name = stem + (".sh" if executable else extension)
            mode = "100755" if executable else "100644"
            length = int(min(2 * MB, layout.lognormvariate(7.9, 1.0)) * size.scale)
        tracked.append(_Tracked(str(folder / name), kind, max(1, length), mode))
        if index % 500 == 250:  # a relative link to a sibling, as repositories have a few
            link = PurePosixPath(tracked[-1].path).parent / f"link_{index}"
            tracked.append(_Tracked(str(link), "link", 0, "120000"))
    return tracked


def _history(
    layout: random.Random, tracked: list[_Tracked], commits: int
) -> list[tuple[range, list[int]]]:
    """Per commit: (the files it adds, the text files it edits). The first adds 80%; each
    later one adds a few and edits one to six, half of them among 200 often-edited ones."""
    base = len(tracked) * 4 // 5
    later = len(tracked) - base
    text = [index for index in range(base) if tracked[index].kind in _TEXT]
    often = layout.sample(text, k=min(200, len(text)))
    plan: list[tuple[range, list[int]]] = [(range(base), [])]
    for number in range(1, commits):
        added = range(
            base + later * (number - 1) // (commits - 1), base + later * number // (commits - 1)
        )
        edits = {
            layout.choice(often if layout.random() < 0.5 else text)
            for _ in range(layout.randint(1, 6))
        }
        plan.append((added, sorted(edits)))
        text.extend(index for index in added if tracked[index].kind in _TEXT)
    return plan


def generate_checkout(repo: Path, size: Size) -> str:
    """The repository with its history (deterministic), checked out: answers its head.
    Layout and history come from one random stream, content from another."""
    layout = random.Random(SEED)  # noqa: S311 - reproducible test data, not secrets
    content = random.Random(SEED + 1)  # noqa: S311
    words = _vocabulary(layout, 3000)
    pools = {
        "code": _code_lines(layout, words, 60_000),
        "prose": _prose_lines(layout, words, 20_000),
        "data": _data_lines(layout, words, 20_000),
    }
    tracked = _tracked_files(layout, words, size)
    history = _history(layout, tracked, size.commits)
    messages = [" ".join(layout.choices(words, k=5)).capitalize() for _ in history]
    _git(repo, "init", "-q", "-b", REF)
    importer = subprocess.Popen(
        ["git", "-C", str(repo), "fast-import", "--quiet", "--done"],
        stdin=subprocess.PIPE,
        env=os.environ | GIT_ENV,
    )
    assert importer.stdin is not None
    try:
        _History(importer.stdin, content, pools).write(tracked, history, messages)
    finally:
        importer.stdin.close()
        if importer.wait() != 0:
            raise links.BenchError(f"git fast-import exited {importer.returncode}")
    _git(repo, "checkout", "-q", "-f", REF)  # the index and the work tree
    _git(repo, "remote", "add", "origin", ORIGIN)  # a clone's remote and its branch
    _git(repo, "update-ref", f"refs/remotes/origin/{REF}", "HEAD")
    _git(repo, "repack", "-a", "-d", "-q")  # one pack, as a clone has
    _git(repo, "pack-refs", "--all")
    build = repo / "build"
    build.mkdir()
    for index in range(20):  # ignored build output: archived, never tracked
        (build / f"out_{index}.o").write_bytes(_joined(content.choices(pools["code"], k=200)))
    return _git(repo, "rev-parse", "HEAD")


@dataclass
class _History:
    """The history as a `git fast-import` stream, each file's content inline."""

    stream: IO[bytes]
    content: random.Random
    pools: dict[str, list[str]]

    def write(
        self, tracked: list[_Tracked], history: list[tuple[range, list[int]]], messages: list[str]
    ) -> None:
        edited = {index for _, edits in history for index in edits}
        kept: dict[int, list[str]] = {}  # the lines of the files edited later
        for number, ((added, edits), message) in enumerate(zip(history, messages, strict=True)):
            self.stream.write(b"commit refs/heads/%s\n" % REF.encode())
            when = HISTORY_START + 3600 * number
            for role in (b"author", b"committer"):
                self.stream.write(b"%s Bench <bench@example.com> %d +0000\n" % (role, when))
            self._data(message.encode())
            if number == 0:
                self._file(".gitignore", "100644", f"build/\n*.log\n/{DEPS_PATH}/\n".encode())
            for index in added:
                entry = tracked[index]
                if entry.kind == "link":  # to the file before it, its sibling
                    body = PurePosixPath(tracked[index - 1].path).name.encode()
                elif entry.kind == "binary":
                    body = self.content.randbytes(entry.length)
                else:
                    lines = self.content.choices(self.pools[entry.kind], k=entry.length // 38 + 1)
                    if index in edited:
                        kept[index] = lines
                    body = self._text(entry, lines)
                self._file(entry.path, entry.mode, body)
            for index in edits:  # a few lines replaced or added, somewhere in the file
                entry, lines = tracked[index], kept[index]
                at = self.content.randrange(len(lines) + 1)
                lines[at : at + self.content.randint(0, 3)] = self.content.choices(
                    self.pools[entry.kind], k=self.content.randint(1, 6)
                )
                self._file(entry.path, entry.mode, self._text(entry, lines))
        self.stream.write(b"done\n")

    def _file(self, path: str, mode: str, body: bytes) -> None:
        self.stream.write(f"M {mode} inline {path}\n".encode())
        self._data(body)

    def _data(self, body: bytes) -> None:
        self.stream.write(b"data %d\n%s\n" % (len(body), body))

    @staticmethod
    def _text(entry: _Tracked, lines: list[str]) -> bytes:
        body = _joined(lines)
        return b"#!/bin/sh\n" + body if entry.mode == "100755" else body


def generate_deps(root: Path, size: Size) -> str:
    """A node_modules-like tree (deterministic) in `root`: answers its lockfile's hash."""
    tree = _DepsTree(root, size.scale)
    words = tree.words
    packages: list[PurePosixPath] = []
    locked: dict[str, dict[str, str]] = {}
    while tree.files < size.deps_files:
        layout = tree.layout
        name = "-".join(layout.choices(words, k=layout.randint(1, 2)))
        if layout.random() < 0.12:
            name = f"@{layout.choice(words)}/{name}"
        nested = bool(packages) and layout.random() < 0.15  # another version, under a dependent
        package = (layout.choice(packages) / "node_modules" if nested else PurePosixPath()) / name
        if str(package) in locked:
            continue
        packages.append(package)
        locked[str(package)] = tree.package(package, name, command=not nested)
    lockfile = json.dumps({"lockfileVersion": 3, "packages": locked}, indent=2).encode()
    tree.write(PurePosixPath(".package-lock.json"), lockfile)
    return hashlib.sha256(lockfile).hexdigest()


class _DepsTree:
    """Writes packages as npm lays them out; layout (names, counts, sizes) from one random
    stream, content from another."""

    def __init__(self, root: Path, scale: float) -> None:
        self.root = root
        self.scale = scale
        self.layout = random.Random(SEED + 2)  # noqa: S311 - reproducible test data
        self.content = random.Random(SEED + 3)  # noqa: S311
        self.words = _vocabulary(self.layout, 4000)
        self.pools = {
            "code": _code_lines(self.layout, self.words, 30_000),
            "prose": _prose_lines(self.layout, self.words, 10_000),
            "types": _type_lines(self.layout, self.words, 10_000),
            "map": _map_segments(self.layout, 20_000),
        }
        self.files = 0
        self._made: set[Path] = set()

    def package(self, package: PurePosixPath, name: str, *, command: bool) -> dict[str, str]:
        """Write one package (about 16 files, lognormal); answer its lockfile entry."""
        layout, words = self.layout, self.words
        version = f"{layout.randint(0, 12)}.{layout.randint(0, 30)}.{layout.randint(0, 20)}"
        manifest = {
            "name": name,
            "version": version,
            "description": " ".join(layout.choices(words, k=8)),
            "main": "index.js",
            "license": "MIT",
            "dependencies": {
                layout.choice(words): f"^{layout.randint(0, 9)}.{layout.randint(0, 9)}.0"
                for _ in range(layout.randint(0, 6))
            },
        }
        author = " ".join(layout.choices(words, k=2))
        self.write(package / "package.json", json.dumps(manifest, indent=2).encode())
        self.write(package / "README.md", self._lines("prose", 3000))
        self.write(
            package / "LICENSE",
            _LICENSE.format(year=layout.randint(2012, 2024), author=author).encode(),
        )
        self.write(package / "index.js", self._lines("code", 800))
        count = max(4, min(3000, int(layout.lognormvariate(math.log(16), 1.3))))
        typed, mapped = layout.random() < 0.3, layout.random() < 0.2
        folders = [PurePosixPath("lib")]
        for _ in range(int(math.log2(count))):
            folders.append(layout.choice(folders) / layout.choice(words))
        sources: set[PurePosixPath] = set()
        while len(sources) < count - 4:
            source = package / layout.choice(folders) / f"{layout.choice(words)}.js"
            if source in sources:
                continue
            sources.add(source)
            self.write(source, self._lines("code", 2000))
            if typed:
                self.write(source.with_suffix(".d.ts"), self._lines("types", 600))
            if mapped:
                segments = self.content.choices(self.pools["map"], k=self._length(3000) // 6 + 1)
                mappings = "".join(segments)
                self.write(
                    PurePosixPath(f"{source}.map"),
                    f'{{"version":3,"mappings":"{mappings}"}}'.encode(),
                )
        if command and layout.random() < 0.08:  # bin/cli.js, linked from .bin
            self.write(package / "bin" / "cli.js", self._lines("code", 400), mode=0o755)
            link = self.root / ".bin" / name.rsplit("/", 1)[-1]
            if not os.path.lexists(link):
                link.parent.mkdir(exist_ok=True)
                link.symlink_to(f"../{package}/bin/cli.js")
                self.files += 1
        integrity = "".join(self.content.choices(_BASE64, k=86))
        return {
            "version": version,
            "resolved": f"https://registry.npmjs.org/{name}/-/{name}-{version}.tgz",
            "integrity": f"sha512-{integrity}==",
        }

    def write(self, relative: PurePosixPath, body: bytes, *, mode: int = 0o644) -> None:
        path = self.root / relative
        if path.parent not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(path.parent)
        path.write_bytes(body)
        if mode != 0o644:
            path.chmod(mode)
        self.files += 1

    def _length(self, median: float) -> int:
        """A file's size: lognormal around `median` bytes, scaled."""
        drawn = min(512_000.0, self.layout.lognormvariate(math.log(median), 1.1))
        return int(drawn * self.scale)

    def _lines(self, kind: str, median: float) -> bytes:
        return _joined(self.content.choices(self.pools[kind], k=self._length(median) // 40 + 1))


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "gc.auto=0", *args],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ | GIT_ENV,
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class Archived:
    """One archive of a snapshot, built and measured."""

    path: Path
    files: int  # regular files and links (a checkout's .git excluded)
    entries: int  # everything in the archive
    raw_bytes: int  # the files' bytes (a checkout's .git excluded)
    size: int
    sha256: str

    @property
    def backup_id(self) -> str:
        return self.path.stem

    @property
    def archive(self) -> Archive:
        return Archive(backup_id=self.backup_id, size=self.size, sha256=self.sha256)


@dataclass(frozen=True)
class Input:
    """A size's snapshot: its checkout and deps archives."""

    label: str
    commit: str
    commits: int
    lockfile_hash: str
    checkout: Archived
    deps: Archived

    @property
    def archives(self) -> tuple[Archived, Archived]:
        return self.checkout, self.deps

    @property
    def files(self) -> int:
        return self.checkout.files + self.deps.files

    @property
    def entries(self) -> int:
        return self.checkout.entries + self.deps.entries

    @property
    def raw_bytes(self) -> int:
        return self.checkout.raw_bytes + self.deps.raw_bytes

    @property
    def size(self) -> int:
        return self.checkout.size + self.deps.size


def build_input(size: Size, workdir: Path, console: Console) -> Input:
    """The snapshot's archives for `size`, built once and cached in the work dir."""
    archives = workdir / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    archives.chmod(0o755)  # nginx's workers read it as an unprivileged user
    paths = {kind: archives / f"{kind}-{size.key}.sqsh" for kind in ("checkout", "deps")}
    meta_path = archives / f"snapshot-{size.key}.json"
    if meta_path.exists():
        cached = json.loads(meta_path.read_text())
        if all(
            path.exists() and cached[kind]["size"] == path.stat().st_size
            for kind, path in paths.items()
        ):
            console.print(f"[dim]{size.label}: cached archives in {archives}[/dim]")
            return _input_from(size, paths, cached)
    console.print(
        f"{size.label}: generating {size.checkout_files:,} tracked files over {size.commits} "
        f"commits and {size.deps_files:,} deps files (once; cached in {archives})"
    )
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="generate-", dir=workdir))
    meta: dict[str, Any] = {}
    try:
        repo, deps = scratch / "synthetic", scratch / "node_modules"
        repo.mkdir()
        deps.mkdir()
        meta["commit"] = generate_checkout(repo, size)
        # mksquashfs archives the checkout while this process writes the deps tree.
        with ThreadPoolExecutor(max_workers=1) as background:
            archived = background.submit(_archive, repo, paths["checkout"])
            meta["lockfile_hash"] = generate_deps(deps, size)
            meta["checkout"] = archived.result()
        meta["deps"] = _archive(deps, paths["deps"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    meta_path.write_text(json.dumps(meta, indent=2))
    case = _input_from(size, paths, meta)
    console.print(
        f"{size.label}: checkout {case.checkout.files:,} files, {case.checkout.size / MB:.0f} "
        f"MB; deps {case.deps.files:,} files, {case.deps.size / MB:.0f} MB; built in "
        f"{time.monotonic() - started:.0f} s"
    )
    return case


def _archive(tree: Path, archive: Path) -> dict[str, int]:
    """`tree` archived (staged beside it, then renamed into place): its facts."""
    staged = tree.with_suffix(".sqsh")
    build_squashfs(tree, staged)
    staged.chmod(0o644)
    staged.replace(archive)
    return _counted(tree) | {"size": archive.stat().st_size}


def _counted(tree: Path) -> dict[str, int]:
    """Files (links among them) and their bytes outside .git, and every entry."""
    files = entries = raw = 0
    for folder, directories, names in os.walk(tree):
        entries += len(directories) + len(names)
        if Path(folder).relative_to(tree).parts[:1] != (".git",):
            files += len(names)  # links to folders are listed with the folders
            raw += sum(os.lstat(os.path.join(folder, name)).st_size for name in names)
    return {"files": files, "entries": entries, "raw_bytes": raw}


def _input_from(size: Size, paths: dict[str, Path], meta: dict[str, Any]) -> Input:
    archived = {}
    for kind, path in paths.items():
        # measure() also warms the page cache nginx serves from
        measured_size, sha256 = measure(path)
        facts = meta[kind]
        archived[kind] = Archived(
            path,
            int(facts["files"]),
            int(facts["entries"]),
            int(facts["raw_bytes"]),
            measured_size,
            sha256,
        )
    return Input(
        label=size.label,
        commit=str(meta["commit"]),
        commits=size.commits,
        lockfile_hash=str(meta["lockfile_hash"]),
        checkout=archived["checkout"],
        deps=archived["deps"],
    )


# -- the servers ----------------------------------------------------------------------------


def serve_object(root: Path, key: str, source: Path, *, bucket: str = BUCKET) -> None:
    """Lay `source` where an nginx serving `root` answers a presigned GET of `bucket`'s
    `key`: R2's URLs are path-style, `{endpoint}/{bucket}/{key}?X-Amz-...`, and nginx
    ignores the query. A hard link (no copy), laid afresh: a rebuilt `source` is a new file."""
    folder = root
    for part in (bucket, *PurePosixPath(key).parent.parts):
        folder /= part
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)  # nginx's workers read it as an unprivileged user
    target = root / bucket / key
    target.unlink(missing_ok=True)
    os.link(source, target)


def checkpoint_function(dynamodb_endpoint: str, keys: TaskKeys) -> FunctionUrlGateway:
    """The real checkpoint function, served (started) in this process by the local
    function-URL gateway, which takes each task's own keys (`keys`, as the local runtime
    issues them: its session of the task role). Its
    handler reads its settings from this process's environment when called: the lifecycle
    table at `dynamodb_endpoint` and R2's BUCKET with fake keys (nginx checks no signature);
    each run names the R2 endpoint, its nginx (`Bench.task`)."""
    for name in [name for name in os.environ if name.startswith("SEEDKEEPER_")]:
        del os.environ[name]  # nothing from a developer's settings, as for the task
    os.environ.update(
        {
            "SEEDKEEPER_TABLE": TABLE,
            "SEEDKEEPER_DYNAMODB_ENDPOINT": dynamodb_endpoint,
            "SEEDKEEPER_R2_BUCKET": BUCKET,
            "SEEDKEEPER_R2_ACCESS_KEY_ID": "bench",
            "SEEDKEEPER_R2_SECRET_ACCESS_KEY": "bench",
            "SEEDKEEPER_TASK_ROLE_ARN": TASK_ROLE_ARN,
        }
    )
    return FunctionUrlGateway(
        "127.0.0.1",
        0,
        LocalCredentials("bench-executor", secrets.token_hex(16)),  # no executor calls here
        task_keys=keys,
        region=REGION,
    ).start()


# -- one run of each ------------------------------------------------------------------------


@dataclass
class Timed:
    seconds: float
    max_rss_kb: int  # the process and its waited-for descendants (wait4)
    code: int
    started_at: float = 0.0  # time.time() just before the spawn
    cpu_s: float = 0.0  # user + system, the process and its waited-for descendants


def timed_run(argv: Sequence[str], *, env: dict[str, str], log: IO[bytes]) -> Timed:
    """Run argv to completion, its wall time measured around spawn and reap."""
    started_at = time.time()
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    killer = threading.Timer(RUN_TIMEOUT, _kill_group, (process.pid,))
    killer.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:  # interrupted: nothing of the run outlives the benchmark
        _kill_group(process.pid)
        os.waitpid(process.pid, 0)
        raise
    finally:
        killer.cancel()
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return Timed(seconds, usage.ru_maxrss, process.returncode, started_at, cpu)


def ready_s(timed: Timed, folder: Path, slot: str) -> float:
    """Seconds from the task's spawn to its settled record: its sandbox command, which
    starts right after the settle, wrote the time it started (`Bench.task`)."""
    try:
        return float((folder / "ready").read_text()) - timed.started_at
    except (OSError, ValueError) as unreadable:
        raise links.BenchError(f"{slot}: no start time from the sandbox command") from unreadable


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class OursRun:
    restore_s: float  # result.ms: as the task records it
    process_s: float  # the task's process, from its spawn to its settled record
    exit_s: float  # from its spawn until it is reaped (its sandbox command ran, it exited)
    steps_ms: dict[str, int]
    peak_rss_kb: int  # the task's own VmHWM
    tree_max_rss_kb: int  # the task and its children (unsquashfs, git)
    cpu_s: float = 0.0  # user + system, the task and its children, until it exited


@dataclass
class BaselineRun:
    total_s: float
    steps_s: dict[str, float]
    max_rss_kb: dict[str, int]
    cpu_s: float = 0.0  # user + system of every process it ran


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
        mount = folder / "fs"
        mount.mkdir()
        if not self.loop:
            yield mount
            return
        image = folder / "fs.img"
        with image.open("wb") as sparse:
            sparse.truncate(capacity)
        # Inode tables and journal written now: no lazy init thread writing during a run.
        links.run_checked(
            [self.mkfs, "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image)]
        )
        links.run_checked(["mount", "-o", "loop", str(image), str(mount)])
        try:
            yield mount
        finally:
            unmount(mount)
            image.unlink(missing_ok=True)


def capacity(case: Input) -> int:
    """A run's filesystem: room for the tree, its .git, an archive or capture beside it
    and ext4's overhead; the image is sparse, so the room costs nothing unused."""
    return 3 * case.raw_bytes + 2 * case.size + case.entries * 8192 + 512 * 1024**2


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


@dataclass
class Bench:
    workdir: Path
    nginx: links.Nginx
    endpoint: str
    checkpoint_url: str  # the checkpoint function the task starts at
    lifecycle: Lifecycle
    snapshots: SnapshotStore
    environment: dict[str, str]  # what every subprocess inherits: no SEEDKEEPER_*, fake AWS
    keys: TaskKeys  # each task's own, as the local runtime gives them
    shape: links.CpuShape  # the task's CPU: every timed command runs inside it
    # Each run extracts into a fresh journaled filesystem: this machine's root filesystem
    # (ext4 without a journal) makes creating files right after deleting many quadratic.
    disks: Disks = field(default_factory=Disks)
    slots: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def run_dir(self, name: str) -> Path:
        folder = self.workdir / "runs" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def record(self, case: Input) -> None:
        """The snapshot the task's seed names, and its archives where its grants point."""
        for archived in case.archives:
            serve_object(self.nginx.root, backup_key(archived.backup_id), archived.path)
        snapshot = NewSnapshot(
            resource=case.checkout.backup_id,
            ref=REF,
            sha=case.commit,
            created_at=int(time.time()),
            checkout=case.checkout.archive,
            deps=case.deps.archive,
            lockfile_hash=case.lockfile_hash,
        )
        Snapshots(self.snapshots, r2=None).record(snapshot)

    def ours(self, case: Input) -> OursRun:
        slot = f"bench-{next(self.slots)}"
        folder = self.run_dir(slot)
        record, op = self.launched(case, slot)
        assert record.incarnation is not None  # recorded by `launched`
        plan = SlotPlan.of(record, op)
        with self.disks.fresh(folder, capacity(case)) as root:
            workspace = root / "workspace"
            workspace.mkdir()
            timed = self.task(plan, record.incarnation, workspace, folder)
            result = self.seeded(slot, case, timed, workspace, folder)
        peak, ready = peak_rss_kb(folder, slot), ready_s(timed, folder, slot)
        shutil.rmtree(folder)
        return OursRun(
            restore_s=result.ms / 1000,
            process_s=ready,
            exit_s=timed.seconds,
            steps_ms=dict(result.steps),
            peak_rss_kb=peak,
            tree_max_rss_kb=timed.max_rss_kb,
            cpu_s=timed.cpu_s,
        )

    def launched(
        self, case: Input, slot: str, *, now: int | None = None
    ) -> tuple[SlotRecord, OpRef]:
        """A record born for `case`'s seed at `now` and its incarnation recorded, as the
        local runtime leaves it before the task starts: (the record, its restore op)."""
        seed = SeedIdentity(
            resource=case.checkout.backup_id,
            ref=REF,
            sha=case.commit,
            checkout_backup_id=case.checkout.backup_id,
            deps_backup_id=case.deps.backup_id,
        )
        owner = OwnerClaim(
            run=f"run-{slot}",
            requester="bench",
            thread="bench",
            repository="bench/synthetic",
            ref=REF,
            head=case.commit,
        )
        now = int(time.time()) if now is None else now
        born = self.lifecycle.birth(
            slot,
            Binding(owner=owner, seed=seed, origin=ORIGIN),
            now=now,
            idle_deadline=now + 3600,
            requires=self.snapshots.recorded_check(seed),
        )
        if not isinstance(born, Written) or born.entry is None:
            raise links.BenchError(f"{slot}: the birth was refused: {born}")
        incarnation = f"local:{slot}:{born.record.attempt}"
        recorded = self.lifecycle.write(
            transitions.RECORD_INCARNATION,
            born.record,
            transitions.Launched(incarnation=incarnation, launch=born.entry.ref, now=now),
        )
        if not isinstance(recorded, Written):
            raise links.BenchError(f"{slot}: the incarnation was not recorded: {recorded}")
        return recorded.record, born.entry.ref

    def task(self, plan: SlotPlan, incarnation: str, workspace: Path, folder: Path) -> Timed:
        """The real slot task of `plan` in `incarnation`, started as the local runtime starts
        it and timed whole, its start call included; its sandbox command, which starts once
        the record is settled, writes the time (`ready_s`) and the task's peak RSS (VmHWM)
        into `folder` and exits. Its log: `folder`/task.log."""
        hwm, ready = folder / "vmhwm", folder / "ready"
        keys = self.keys.issue(incarnation)
        probe = (
            f"date +%s.%N > {shlex.quote(str(ready))}; "
            f"grep VmHWM /proc/$PPID/status > {shlex.quote(str(hwm))}"
        )
        environment = (
            self.environment
            | self.nginx.client_environment()
            | {
                PLAN_VARIABLE: plan.to_env(),
                "SEEDKEEPER_WORKSPACE": str(workspace),
                "SEEDKEEPER_INCARNATION": incarnation,
                # Its own session of the task role, for its API alone (the checkpoint function).
                "AWS_ACCESS_KEY_ID": keys.access_key,
                "AWS_SECRET_ACCESS_KEY": keys.secret_key,
                "SEEDKEEPER_CHECKPOINT_URL": self.checkpoint_url,
                "SEEDKEEPER_SANDBOX_COMMAND": json.dumps(["sh", "-c", probe]),
            }
            | self.shape.task_environment
        )
        # The checkpoint function runs in this process: its grants point at this run's nginx.
        os.environ["SEEDKEEPER_R2_ENDPOINT"] = self.nginx.endpoint
        settle_disk()
        with (folder / "task.log").open("wb") as log:
            task = self.shape.wrap([sys.executable, "-m", "seedkeeper_task"])
            return timed_run(task, env=environment, log=log)

    def seeded(
        self,
        slot: str,
        case: Input,
        timed: Timed,
        workspace: Path,
        folder: Path,
        *,
        resumed: bool = False,
    ) -> SeedSucceeded:
        """The task's settled result, checked: exit 0, `seeded` with `case`'s commit (from
        the checkpoint when `resumed`), the checkout's HEAD on it, the deps tree in place."""
        classified = self.lifecycle.read(slot)
        record = classified.record if isinstance(classified, Supported) else None
        result = record.result if record is not None else None
        checkout = workspace / CHECKOUT
        if (
            timed.code != 0
            or record is None
            or record.state is not State.SEEDED
            or not isinstance(result, SeedSucceeded)
            or result.resumed != resumed
            or result.head != case.commit
            or _head(checkout) != case.commit
            or not (checkout / DEPS_PATH / ".package-lock.json").is_file()
        ):
            tail = (folder / "task.log").read_text(errors="replace")[-2000:]
            raise links.BenchError(f"{slot} did not seed (exit {timed.code}): {classified}\n{tail}")
        return result

    def baseline(self, case: Input, downloader: str) -> BaselineRun:
        """`downloader` (curl or aria2c) fetching both archives, `openssl dgst -sha256` (the task
        verifies too), `unsquashfs` with the task's own flags (the same bounded caches, the
        same strictness) of each, where the task puts it, and `git checkout -B`; each a
        subprocess, one after the other, into a fresh journaled filesystem; the digests and
        HEAD checked."""
        folder = self.run_dir(f"{downloader}-{next(self.slots)}")
        steps: dict[str, float] = {}
        rss: dict[str, int] = {}
        cpu = 0.0
        with self.disks.fresh(folder, capacity(case)) as root:
            checkout = root / "checkout"
            commands = {
                downloader: self._download(downloader, case, root, folder),
                "sha256": [*SHA256_COMMAND, *(str(root / a.path.name) for a in case.archives)],
            }
            for kind, archived, target in (
                ("checkout", case.checkout, checkout),
                ("deps", case.deps, checkout / DEPS_PATH),
            ):
                archive = str(root / archived.path.name)
                unsquashfs = task_unsquashfs(self.shape)
                commands[f"unsquashfs {kind}"] = [*unsquashfs, "-d", str(target), archive]
            git = ["git", "-C", str(checkout)]
            commands["git checkout"] = [*git, "checkout", "-q", "-B", REF, case.commit]
            settle_disk()
            for name, argv in commands.items():
                timed = self._step(name, argv, folder)
                steps[name], rss[name] = timed.seconds, timed.max_rss_kb
                cpu += timed.cpu_s
            listed = (folder / "sha256.log").read_text().splitlines()
            digests = [line.split()[0] for line in listed if line]
            if digests != [archived.sha256 for archived in case.archives]:
                raise links.BenchError(f"{downloader}: the archives' digests are wrong")
            if _head(checkout) != case.commit:
                raise links.BenchError(f"{downloader}: HEAD is not the snapshot's commit")
        shutil.rmtree(folder)
        return BaselineRun(total_s=sum(steps.values()), steps_s=steps, max_rss_kb=rss, cpu_s=cpu)

    def strongest(self, case: Input) -> BaselineRun:
        """The strongest restore a shell user writes, one bash script: both archives at once
        (aria2c, as many connections per archive as the task opens), each verified
        (`openssl dgst -sha256`, digest compared) and extracted (`unsquashfs`, the task's
        flags) as soon as it has landed while the other still comes, the deps tree moved
        into the checkout, then `git checkout` with `core.checkStat=minimal` and
        `core.trustctime=false` (the index's stat data trusted on size and mtime, which
        unsquashfs restores). Its steps: when each branch's download, verification and
        extraction ended, and git's time."""
        folder = self.run_dir(f"{STRONGEST}-{next(self.slots)}")
        marks = folder / "marks"
        with self.disks.fresh(folder, capacity(case)) as root:
            checkout, deps = root / "checkout", root / "deps"
            branches = [
                shlex.join(
                    [
                        "branch",
                        kind,
                        self.nginx.url(archived.path),
                        archived.path.name,
                        archived.sha256,
                        str(target),
                    ]
                )
                + " &"
                for kind, archived, target in (
                    ("checkout", case.checkout, checkout),
                    ("deps", case.deps, deps),
                )
            ]
            aria2c = shlex.join([*self._aria2c(TASK_PARTS), "-d", str(root)])
            unsquashfs = shlex.join(task_unsquashfs(self.shape))
            git = shlex.join(["git", *STRONGEST_GIT, "-C", str(checkout)])
            script = f"""set -eu
mark() {{ echo "$1 $(date +%s.%N)" >> {shlex.quote(str(marks))}; }}
branch() {{
    {aria2c} -o "$3" "$2"
    mark "$1 download"
    digest=$(openssl dgst -sha256 -r {shlex.quote(str(root))}/"$3")
    [ "${{digest%% *}}" = "$4" ] || {{ echo "$1: wrong digest" >&2; exit 1; }}
    mark "$1 verify"
    {unsquashfs} -d "$5" {shlex.quote(str(root))}/"$3"
    mark "$1 unsquashfs"
}}
mark start
{branches[0]}
checkout=$!
{branches[1]}
deps=$!
wait "$checkout"
wait "$deps"
mv {shlex.quote(str(deps))} {shlex.quote(str(checkout / DEPS_PATH))}
{git} checkout -q -B {REF} {case.commit}
mark git
"""
            settle_disk()
            timed = self._step(STRONGEST, ["bash", "-c", script], folder)
            if _head(checkout) != case.commit or not (checkout / DEPS_PATH).is_dir():
                raise links.BenchError(f"{STRONGEST}: HEAD is not the snapshot's commit")
        times = dict(line.rsplit(" ", 1) for line in marks.read_text().splitlines())
        start = float(times.pop("start"))
        git_s = float(times.pop("git")) - max(map(float, times.values()))
        steps = {name: float(at) - start for name, at in times.items()} | {"git checkout": git_s}
        shutil.rmtree(folder)
        return BaselineRun(
            total_s=timed.seconds,
            steps_s=steps,
            max_rss_kb={STRONGEST: timed.max_rss_kb},
            cpu_s=timed.cpu_s,
        )

    def floor(self, case: Input) -> BaselineRun:
        """The CPU floor: `unsquashfs` (the task's flags) of both archives at once, from the
        page cache into a fresh filesystem, nothing else."""
        folder = self.run_dir(f"{FLOOR}-{next(self.slots)}")
        with self.disks.fresh(folder, capacity(case)) as root:
            both = " & ".join(
                shlex.join(
                    [*task_unsquashfs(self.shape), "-d", str(root / kind), str(archived.path)]
                )
                for kind, archived in (("checkout", case.checkout), ("deps", case.deps))
            )
            settle_disk()
            timed = self._step(FLOOR, ["bash", "-c", f"set -e; {both} & wait %1; wait %2"], folder)
        shutil.rmtree(folder)
        return BaselineRun(
            total_s=timed.seconds,
            steps_s={"unsquashfs both": timed.seconds},
            max_rss_kb={FLOOR: timed.max_rss_kb},
            cpu_s=timed.cpu_s,
        )

    def _step(self, name: str, argv: Sequence[str], folder: Path) -> Timed:
        """One timed command inside the task's CPU shape, trusting the link; its output in
        `folder`/<name>.log, a failure raised with its tail."""
        log = folder / f"{name.replace(' ', '-')}.log"
        with log.open("wb") as output:
            timed = timed_run(
                self.shape.wrap(argv),
                env=self.environment | self.nginx.client_environment(),
                log=output,
            )
        if timed.code != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise links.BenchError(f"{name} exited {timed.code}:\n{tail}")
        return timed

    def _download(self, downloader: str, case: Input, root: Path, folder: Path) -> list[str]:
        """The download's command: both archives into `root`, under their own names."""
        if downloader == "curl":  # one stream at a time, one archive after the other
            argv = ["curl", "-s", "-f", *self.nginx.curl_options()]
            for archived in case.archives:
                argv += ["-o", str(root / archived.path.name), self.nginx.url(archived.path)]
            return argv
        # Both at once from one input file, its connections each.
        listing = folder / "aria2c.input"
        listing.write_text(
            "".join(
                f"{self.nginx.url(archived.path)}\n  out={archived.path.name}\n"
                for archived in case.archives
            )
        )
        return [*self._aria2c(ARIA2C_CONNECTIONS), "-d", str(root), "-i", str(listing)]

    def _aria2c(self, connections: int) -> list[str]:
        """aria2c with `connections` per file, every piece at least 1 MiB, the file written
        as it comes (no preallocation), no configuration file read, the link trusted."""
        return [
            "aria2c",
            "--no-conf",
            "-q",
            f"-x{connections}",
            f"-s{connections}",
            "-k1M",
            "--file-allocation=none",
            "--allow-overwrite=true",
            "--auto-file-renaming=false",
            *self.nginx.aria2c_options(),
        ]


def settle_disk() -> None:
    """Start each timed run with no dirty pages from the one before (untimed)."""
    os.sync()
    time.sleep(0.2)


def _head(checkout: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def peak_rss_kb(folder: Path, slot: str) -> int:
    """The task's own peak RSS, as its sandbox command wrote it."""
    try:
        return int((folder / "vmhwm").read_text().split()[1])  # "VmHWM:   123456 kB"
    except (OSError, IndexError, ValueError) as unreadable:
        raise links.BenchError(f"{slot}: no VmHWM from the sandbox command") from unreadable


def unpack(case: Input, checkout: Path) -> None:
    """Both archives extracted where the restore puts them (untimed set-up)."""
    links.run_checked(["unsquashfs", "-q", "-n", "-d", str(checkout), str(case.checkout.path)])
    links.run_checked(
        ["unsquashfs", "-q", "-n", "-d", str(checkout / DEPS_PATH), str(case.deps.path)]
    )


# -- rates, for the first-command benchmark's per-connection link ---------------------------

UNLIMITED = "none"


def parse_rates(rates: Sequence[str]) -> list[str | None]:
    """nginx rates ("50m": 50 MiB/s per connection), UNLIMITED as None."""
    parsed = [None if rate == UNLIMITED else rate for rate in rates]
    for rate in parsed:
        if rate is not None and not re.fullmatch(r"[1-9][0-9]*[km]?", rate):
            raise argparse.ArgumentTypeError(
                f"--rates: nginx rates like 50m or 800k, or {UNLIMITED!r}"
            )
    return parsed


def rate_label(rate: str | None) -> str:
    if rate is None:
        return "unlimited loopback"
    unit = {"k": " KiB", "m": " MiB"}.get(rate[-1], " B")  # nginx's units are binary
    return f"{rate.rstrip('km')}{unit}/s per connection"


def spread(values: Sequence[float], digits: int = 2) -> str:
    """Median (min-max)."""
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


# -- the report -----------------------------------------------------------------------------


@dataclass
class Result:
    case: Input
    link: links.LinkSpec
    shape: str  # the task's CPU, "1 vCPU"
    ours: list[OursRun] = field(default_factory=list)
    baselines: dict[str, list[BaselineRun]] = field(
        default_factory=lambda: {name: [] for name in (*BASELINES, FLOOR)}
    )
    orders: list[tuple[str, ...]] = field(default_factory=list)  # each round's
    plain: tuple[str, ...] = PLAIN  # the plain baselines run (`--plain`)

    @property
    def measured(self) -> tuple[str, ...]:
        """The baselines run, the strongest first."""
        return (STRONGEST, *self.plain)

    @property
    def where(self) -> str:
        return f"{self.link.name}, {self.case.label}, {self.shape}"

    @property
    def rounds(self) -> int:
        return len(self.ours)

    def median(self, method: str) -> float:
        """The median seconds of a baseline (or the floor's unsquashfs), or of ours' whole
        process."""
        if method == "ours":
            return statistics.median(run.process_s for run in self.ours)
        return statistics.median(run.total_s for run in self.baselines[method])

    def cpu_s(self, method: str) -> float:
        runs = self.ours if method == "ours" else self.baselines[method]
        return statistics.median(run.cpu_s for run in runs)

    @property
    def restore_s(self) -> float:
        return statistics.median(run.restore_s for run in self.ours)

    @property
    def link_floor_s(self) -> float:
        """The least time the link brings both archives, each over the task's ranges."""
        return self.link.floor_s([archived.size for archived in self.case.archives], TASK_PARTS)

    def floors(self) -> list[float]:
        """Each round's floor: its unsquashfs of both alone, plus the link floor."""
        return [run.total_s + self.link_floor_s for run in self.baselines[FLOOR]]

    @property
    def peak_rss_mb(self) -> float:
        return max(run.peak_rss_kb for run in self.ours) * 1024 / MB

    def paired(self, baseline: str, *, whole: bool = True) -> list[float]:
        """Each of ours' runs (its whole process, else its restore) against the `baseline`
        run of its round (FLOOR: the round's floor): their spread shows the noise."""
        against = (
            self.floors() if baseline == FLOOR else [r.total_s for r in self.baselines[baseline]]
        )
        return [
            (run.process_s if whole else run.restore_s) / base
            for run, base in zip(self.ours, against, strict=True)
        ]

    def ours_steps(self) -> dict[str, float]:
        """The task's steps (medians, s), what else its restore did, and its process's own
        cost around it."""
        names = sorted({name for run in self.ours for name in run.steps_ms})
        medians = {
            name: statistics.median(run.steps_ms.get(name, 0) for run in self.ours) / 1000
            for name in names
        }
        medians["other (preflight, cleanup)"] = statistics.median(
            run.restore_s - sum(run.steps_ms.values()) / 1000 for run in self.ours
        )
        medians["process (interpreter, imports, start call, settle)"] = statistics.median(
            run.process_s - run.restore_s for run in self.ours
        )
        return medians

    def baseline_steps(self, baseline: str) -> dict[str, float]:
        runs = self.baselines[baseline]
        return {
            name: statistics.median(run.steps_s[name] for run in runs) for name in runs[0].steps_s
        }

    def summary(self) -> dict[str, Any]:
        ratios = {
            f"paired_{'process' if whole else 'restore'}_to_{baseline}": self.paired(
                baseline, whole=whole
            )
            for baseline in (*self.measured, FLOOR)
            for whole in (True, False)
        }
        return {
            "size": self.case.label,
            "link": self.link.name,
            "link_label": self.link.label,
            "cpu": self.shape,
            "rounds": self.rounds,
            "link_floor_s": self.link_floor_s,
            "median_unsquashfs_plus_link_floor_s": statistics.median(self.floors()),
            "median_ours_process_s": self.median("ours"),
            "median_ours_restore_s": self.restore_s,
            **{f"median_{method}_s": self.median(method) for method in (*self.measured, FLOOR)},
            **{
                f"median_{method}_cpu_s": self.cpu_s(method)
                for method in ("ours", *self.measured, FLOOR)
            },
            **ratios,
            "peak_rss_mb": self.peak_rss_mb,
            "ours_steps_median_s": self.ours_steps(),
            **{
                f"{baseline}_steps_median_s": self.baseline_steps(baseline)
                for baseline in self.measured
            },
            "ours_tree_max_rss_mb": max(run.tree_max_rss_kb for run in self.ours) * 1024 / MB,
            "orders": self.orders,
            "runs": {
                "ours": [asdict(run) for run in self.ours],
                **{
                    method: [asdict(run) for run in self.baselines[method]]
                    for method in (*self.measured, FLOOR)
                },
            },
        }


def _input_summary(case: Input) -> dict[str, Any]:
    return {
        "size": case.label,
        "commit": case.commit,
        "commits": case.commits,
        **{
            kind: {
                "backup_id": archived.backup_id,
                "files": archived.files,
                "entries": archived.entries,
                "raw_mb": archived.raw_bytes / MB,
                "archive_mb": archived.size / MB,
            }
            for kind, archived in (("checkout", case.checkout), ("deps", case.deps))
        },
        "files": case.files,
        "archive_mb": case.size / MB,
    }


def report(
    console: Console,
    inputs: list[Input],
    results: list[Result],
    disks: Disks,
    workdir: Path,
    *,
    setting: dict[str, Any],
) -> None:
    console.print(_inputs_table(inputs))
    console.print(_results_table(results))
    console.print(_steps_table(results))
    console.print(
        "[dim]ours' steps are the task's own (result.steps, inside result.ms); whatever it "
        "does before its restore's clock starts (its downloads start with the process) falls "
        f"in 'process'. disk: {disks.description}; the archives in the page cache; "
        + "; ".join(f"{method}: {text}" for method, text in DESCRIPTIONS.items())
        + ".[/dim]"
    )
    _targets(console, inputs, results)
    figures = workdir / "restore-results.json"
    figures.write_text(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "disk": disks.description,
                **setting,
                "versions": {
                    tool: _version([tool, flag])
                    for tool, flag in (
                        ("unsquashfs", "-version"),
                        ("git", "--version"),
                        ("curl", "--version"),
                        ("aria2c", "--version"),
                        ("nginx", "-v"),
                    )
                },
                "task_download_parts": TASK_PARTS,
                "methods": DESCRIPTIONS,
                "targets": {
                    "process_to_strongest": STRONGEST_TARGET,
                    "process_to_floor": FLOOR_TARGET,
                    "peak_rss_mb": RSS_TARGET_MB,
                    "peak_rss_flat_mb": RSS_FLAT_MB,
                },
                "inputs": [_input_summary(case) for case in inputs],
                "results": [result.summary() for result in results],
            },
            indent=2,
        )
    )
    console.print(f"figures: {figures}")


def _inputs_table(inputs: list[Input]) -> Table:
    sizes = Table(title="Inputs: the snapshot's two archives (files: regular and links)")
    for column in (
        "size",
        "checkout files",
        "deps files",
        "files",
        "checkout MB",
        "deps MB",
        "archives MB",
        "tree MB",
        "commits",
    ):
        sizes.add_column(column, justify="left" if column == "size" else "right")
    for case in inputs:
        sizes.add_row(
            case.label,
            f"{case.checkout.files:,}",
            f"{case.deps.files:,}",
            f"{case.files:,}",
            f"{case.checkout.size / MB:.1f}",
            f"{case.deps.size / MB:.1f}",
            f"{case.size / MB:.1f}",
            f"{case.raw_bytes / MB:.0f}",
            str(case.commits),
        )
    return sizes


def _results_table(results: list[Result]) -> Table:
    table = Table(
        title="Restore: ours (the whole task process) vs the strongest shell baseline "
        f"({STRONGEST}), aria2c and curl; floor = unsquashfs of both alone + the link's floor "
        "(medians in s, CPU in s; paired ratios as median (min-max))"
    )
    for column in (
        "link",
        "size",
        "CPU",
        "rounds",
        "ours",
        STRONGEST,
        "aria2c",
        "curl",
        "link floor",
        "floor",
        "ours / shell",
        "ours / floor",
        "ours / aria2c",
        "ours / curl",
        "CPU: ours",
        "CPU: shell",
        "peak RSS MB",
    ):
        table.add_column(column, justify="left" if column in ("link", "size", "CPU") else "right")
    for result in results:
        table.add_row(
            result.link.name,
            result.case.label,
            result.shape,
            str(result.rounds),
            f"{result.median('ours'):.2f}",
            f"{result.median(STRONGEST):.2f}",
            *(f"{result.median(m):.2f}" if m in result.plain else "not run" for m in PLAIN),
            f"{result.link_floor_s:.2f}",
            f"{statistics.median(result.floors()):.2f}",
            spread(result.paired(STRONGEST)),
            spread(result.paired(FLOOR)),
            *(spread(result.paired(m)) if m in result.plain else "not run" for m in PLAIN),
            f"{result.cpu_s('ours'):.2f}",
            f"{result.cpu_s(STRONGEST):.2f}",
            f"{result.peak_rss_mb:.1f}",
        )
    return table


def _steps_table(results: list[Result]) -> Table:
    steps = Table(
        title="Where the time goes (medians, seconds; the shell's branches as times from its "
        "start, when each step ended)"
    )
    baselines = [heading for name in BASELINES for heading in (f"{name}: step", "s")]
    for heading in ("cell", "ours: step", "s", *baselines):
        steps.add_column(heading, justify="right" if heading == "s" else "left")
    for result in results:
        listed = [result.ours_steps()] + [
            result.baseline_steps(baseline) if baseline in result.measured else {}
            for baseline in BASELINES
        ]
        add_side_by_side(steps, result.where, listed)
    return steps


def add_side_by_side(table: Table, where: str, listed: Sequence[dict[str, float]]) -> None:
    """One cell's steps, each method's (name, seconds) in two columns of their own, side by
    side; `where` heads its first row, a line closes it."""
    rows = max(len(steps) for steps in listed)
    for index in range(rows):
        cells = [where if index == 0 else ""]
        for steps in listed:
            step, seconds = list(steps.items())[index] if index < len(steps) else ("", None)
            cells += [step, "" if seconds is None else f"{seconds:.2f}"]
        table.add_row(*cells, end_section=index == rows - 1)


def _targets(console: Console, inputs: list[Input], results: list[Result]) -> None:
    console.print("[bold]Targets[/bold] (paired medians of the whole task process)")
    for result in results:
        strongest = statistics.median(result.paired(STRONGEST))
        _verdict(
            console,
            strongest <= STRONGEST_TARGET,
            f"{result.where}: ours / {STRONGEST} {strongest:.2f}, target <= {STRONGEST_TARGET}",
        )
        floor = statistics.median(result.paired(FLOOR))
        _verdict(
            console,
            floor <= FLOOR_TARGET,
            f"{result.where}: ours / floor {floor:.2f} (floor "
            f"{statistics.median(result.floors()):.2f} s = unsquashfs "
            f"{result.median(FLOOR):.2f} + link {result.link_floor_s:.2f}), "
            f"target <= {FLOOR_TARGET}",
        )
    peaks: dict[str, float] = {}
    for result in results:
        peaks[result.case.label] = max(peaks.get(result.case.label, 0.0), result.peak_rss_mb)
    for label, peak in peaks.items():
        _verdict(
            console,
            peak <= RSS_TARGET_MB,
            f"{label}: task peak RSS {peak:.1f} MB, target <= {RSS_TARGET_MB:.0f} MB",
        )
    if len(peaks) >= 2:
        by_size = sorted(inputs, key=lambda case: case.size)
        small, large = by_size[0].label, by_size[-1].label
        growth = peaks[large] - peaks[small]
        _verdict(
            console,
            abs(growth) <= RSS_FLAT_MB,
            f"peak RSS {peaks[small]:.1f} MB at {small}, {peaks[large]:.1f} MB at {large}: "
            f"{growth:+.1f} MB (flat: within {RSS_FLAT_MB:.0f} MB)",
        )


def _verdict(console: Console, met: bool, text: str) -> None:
    console.print(f"  {'[green]met[/green]    ' if met else '[red]NOT met[/red]'} {text}")


def _version(argv: list[str]) -> str:
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    return (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else ""


# -- main -----------------------------------------------------------------------------------


def _environment(workdir: Path) -> dict[str, str]:
    """What the task and the baselines all run with: nothing from a developer's
    SEEDKEEPER_*, AWS_* or GIT_* settings nor their git configuration (a slot container has
    none), fake credentials."""
    keep = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SEEDKEEPER_", "AWS_", "GIT_"))
    }
    isolated_git = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return keep | FAKE_AWS | isolated_git | {"TMPDIR": str(workdir / "tmp")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=size_for,
        default=[size_for("1 GB"), size_for("300 MB")],
        metavar="SIZE",
        help='the snapshot\'s size: "1 GB", "300 MB", "100 MB" (a smoke run) or any "<N> MB"',
    )
    links.add_cell_options(parser)
    parser.add_argument(
        "--plain-up-to",
        type=size_for,
        metavar="SIZE",
        help="run the plain baselines (aria2c, curl) only at sizes up to this one; above it, "
        "ours, the shell and the floor (default: every method at every size)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "seedkeeper-bench",
        help="cached inputs, scratch runs and restore-results.json",
    )
    options = parser.parse_args(argv)
    links.unwind_on_sigterm()
    console = Console(width=max(Console().width, 200))  # the tables stay readable in a log
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            console.print(
                f"[red]{tool} is not installed: apt-get install {package} (make bench "
                "installs it as root)[/red]"
            )
            return 1
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    unmount_leftovers(workdir / "runs")
    shutil.rmtree(workdir / "runs", ignore_errors=True)
    os.environ.update(FAKE_AWS)
    disks = Disks()
    specs = [links.LINKS[name] for name in options.links]
    try:
        inputs = [build_input(size, workdir, console) for size in options.sizes]
        with links.cpu_shapes(options.cpus) as shapes:
            setting = {
                "links": {spec.name: asdict(spec) for spec in specs},
                "cpu_shapes": [shape.description for shape in shapes],
                "seed": options.seed,
                "plain_up_to": options.plain_up_to and options.plain_up_to.label,
            }
            results = measure_all(
                console,
                workdir,
                inputs,
                specs=specs,
                shapes=shapes,
                rounds=options.rounds,
                rng=random.Random(options.seed),  # noqa: S311 - orders, not secrets
                plain=(),
                plain_up_to=options.plain_up_to,
            )
    except links.BenchError as broken:
        console.print(f"[red]the benchmark could not measure:[/red] {broken}")
        return 1
    finally:
        unmount_leftovers(workdir / "runs")
        shutil.rmtree(workdir / "runs", ignore_errors=True)
    report(console, inputs, results, disks, workdir, setting=setting)
    return 0  # a report, not a gate


def measure_all(
    console: Console,
    workdir: Path,
    inputs: list[Input],
    *,
    specs: list[links.LinkSpec],
    shapes: list[links.CpuShape],
    rounds: int,
    rng: random.Random,
    plain: tuple[str, ...] = PLAIN,
    plain_up_to: Size | None = None,
) -> list[Result]:
    """Per link, CPU shape and size (a cell), `rounds` rounds of every method, each round in
    an order of its own; above `plain_up_to`, of the plain baselines only `plain`."""
    larger = [case for case in inputs if plain_up_to and case.size > plain_up_to.megabytes * MB]
    moto = AtomicMotoServer().start()
    keys = TaskKeys(workdir)
    gateway = checkpoint_function(moto.endpoint, keys)
    results: list[Result] = []
    try:
        dynamodb = boto3.client("dynamodb", endpoint_url=moto.endpoint, region_name=REGION)
        create_table(dynamodb, TABLE, load_template())
        table = boto3.resource("dynamodb", endpoint_url=moto.endpoint, region_name=REGION)
        slots = itertools.count(1)
        recorded = False
        for spec in specs:
            home = f"nginx-{spec.name}"
            with links.served(spec, workdir / "archives", workdir, home=home) as server:
                benches = [
                    Bench(
                        workdir=workdir,
                        nginx=server,
                        endpoint=moto.endpoint,
                        checkpoint_url=gateway.url,
                        lifecycle=Lifecycle(table.Table(TABLE)),
                        snapshots=SnapshotStore(table.Table(TABLE)),
                        environment=_environment(workdir),
                        keys=keys,
                        shape=shape,
                        slots=slots,
                    )
                    for shape in shapes
                ]
                if not recorded:  # the records the task reads its archives' sizes and sha256 from
                    for case in inputs:
                        benches[0].record(case)
                    recorded = True
                console.print(
                    f"{spec.label}: warming up (one untimed run of each, the smallest size)"
                )
                smallest = min(inputs, key=lambda case: case.size)
                benches[-1].ours(smallest)
                benches[-1].strongest(smallest)
                for bench in benches:
                    for case in inputs:
                        results.append(
                            measure_cell(
                                console,
                                bench,
                                spec=spec,
                                case=case,
                                rounds=rounds,
                                rng=rng,
                                plain=plain if case in larger else PLAIN,
                            )
                        )
        return results
    finally:
        gateway.stop()
        moto.stop()
        shutil.rmtree(workdir / "archives" / BUCKET, ignore_errors=True)  # links only


def measure_cell(
    console: Console,
    bench: Bench,
    *,
    spec: links.LinkSpec,
    case: Input,
    rounds: int,
    rng: random.Random,
    plain: tuple[str, ...] = PLAIN,
) -> Result:
    result = Result(case, spec, bench.shape.label, plain=plain)
    for index in range(rounds):
        result.orders.append(links.shuffled(("ours", *result.measured, FLOOR), rng))
        for method in result.orders[-1]:
            if method == "ours":
                result.ours.append(bench.ours(case))
            elif method == STRONGEST:
                result.baselines[method].append(bench.strongest(case))
            elif method == FLOOR:
                result.baselines[method].append(bench.floor(case))
            else:
                result.baselines[method].append(bench.baseline(case, method))
        ours = result.ours[-1]
        others = ", ".join(
            f"{method} {result.baselines[method][-1].total_s:.2f} s"
            for method in (*result.measured, FLOOR)
        )
        console.print(
            f"  {result.where} #{index + 1}: ours {ours.process_s:.2f} s (restore "
            f"{ours.restore_s:.2f} s, CPU {ours.cpu_s:.2f} s), {others}"
        )
    return result


if __name__ == "__main__":
    sys.exit(main())
