"""The synthetic trees of the benchmarks' snapshot (`workload.py` sizes, archives and caches
them): a repository with history and a node_modules-like deps tree, deterministic.

- the checkout: a synthetic source tree committed over its commits by `git fast-import`
  (most files in the first; each later one adds a few files and makes small edits to a few,
  so the pack holds deltas), an `origin` remote, repacked into one pack (`git repack -a
  -d`) and checked out as a clone is, plus a few ignored build outputs.
- the deps: a node_modules-like tree (packages as folders with package.json, README.md,
  LICENSE, index.js, lib/**/*.js, some .d.ts and .js.map, nested node_modules, a .bin of
  links; file sizes lognormal, median about 2 KB), restored by the task at the plan's deps
  path (`node_modules`, ignored by the checkout's .gitignore).

Layout (names, counts, sizes) comes from one random stream, content from another, each
seeded: the same parameters give the same trees and the same commit every time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from harness import GIT_ENV, MB, BenchError
from seedkeeper.domain.plan import DEPS_PATH

GENERATOR_VERSION = 4  # bump when the generator changes: cached inputs are rebuilt
SEED = 20_240_601
HISTORY_START = 1_717_200_000  # 2024-06-01: the first commit's date; one hour per commit


# -- the text the files are made of ----------------------------------------------------------

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


def _tracked_files(
    layout: random.Random, words: list[str], files: int, scale: float
) -> list[_Tracked]:
    directories = _directories(layout, words, max(8, files // 16))
    tracked: list[_Tracked] = []
    for index in range(files):
        folder = layout.choice(directories)
        top = folder.parts[0]
        stem = f"{layout.choice(words)}_{index}"
        if layout.random() < (0.25 if top == "assets" else 0.015):
            name, kind, mode = stem + layout.choice(_ASSETS), "binary", "100644"
            length = int(min(8 * MB, layout.lognormvariate(9.1, 1.0)) * scale)
        else:
            kind = {"docs": "prose", "config": "data"}.get(top, "code")
            executable = top == "tools" and layout.random() < 0.5
            extension = {"prose": ".md", "data": ".json"}.get(kind, layout.choice(_CODE))
            name = stem + (".sh" if executable else extension)
            mode = "100755" if executable else "100644"
            length = int(min(2 * MB, layout.lognormvariate(7.9, 1.0)) * scale)
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


def generate_checkout(
    repo: Path, *, files: int, commits: int, scale: float, ref: str, origin: str
) -> str:
    """The repository (`files` tracked at its head, `commits` of history, every file's size
    times `scale`, its branch `ref`, its remote `origin`), deterministic, checked out:
    answers its head. Layout and history come from one random stream, content from
    another."""
    layout = random.Random(SEED)  # noqa: S311 - reproducible test data, not secrets
    content = random.Random(SEED + 1)  # noqa: S311
    words = _vocabulary(layout, 3000)
    pools = {
        "code": _code_lines(layout, words, 60_000),
        "prose": _prose_lines(layout, words, 20_000),
        "data": _data_lines(layout, words, 20_000),
    }
    tracked = _tracked_files(layout, words, files, scale)
    history = _history(layout, tracked, commits)
    messages = [" ".join(layout.choices(words, k=5)).capitalize() for _ in history]
    _git(repo, "init", "-q", "-b", ref)
    importer = subprocess.Popen(
        ["git", "-C", str(repo), "fast-import", "--quiet", "--done"],
        stdin=subprocess.PIPE,
        env=os.environ | GIT_ENV,
    )
    assert importer.stdin is not None
    try:
        _History(importer.stdin, content, pools, ref).write(tracked, history, messages)
    finally:
        importer.stdin.close()
        if importer.wait() != 0:
            raise BenchError(f"git fast-import exited {importer.returncode}")
    _git(repo, "checkout", "-q", "-f", ref)  # the index and the work tree
    _git(repo, "remote", "add", "origin", origin)  # a clone's remote and its branch
    _git(repo, "update-ref", f"refs/remotes/origin/{ref}", "HEAD")
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
    ref: str

    def write(
        self, tracked: list[_Tracked], history: list[tuple[range, list[int]]], messages: list[str]
    ) -> None:
        edited = {index for _, edits in history for index in edits}
        kept: dict[int, list[str]] = {}  # the lines of the files edited later
        for number, ((added, edits), message) in enumerate(zip(history, messages, strict=True)):
            self.stream.write(b"commit refs/heads/%s\n" % self.ref.encode())
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


def generate_deps(root: Path, *, files: int, scale: float) -> str:
    """A node_modules-like tree (deterministic) in `root`, about `files` files (whole
    packages), every file's size times `scale`: answers its lockfile's hash."""
    tree = _DepsTree(root, scale)
    words = tree.words
    packages: list[PurePosixPath] = []
    locked: dict[str, dict[str, str]] = {}
    while tree.files < files:
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
