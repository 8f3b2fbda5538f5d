"""A handler's imports run without garbage collection, and collection resumes after them,
with what they built frozen; only in a process's first handler import, and whatever the
imports do. Each case runs in an interpreter of its own: freezing is for the whole process."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = sorted((ROOT / "functions").glob("*/app.py"))

# Builds cycles inside `handler_imports` (and, given `raise`, fails there, as an import
# could), counting the collections that ran inside; prints what it saw as JSON.
PROBE = """
import gc, json, sys
from seedkeeper.coldstart import handler_imports

if sys.argv[1] == "disabled":
    gc.disable()
if sys.argv[1] == "frozen":
    gc.freeze()
frozen_before = gc.get_freeze_count()
inside = []
gc.callbacks.append(lambda phase, info: inside.append(phase) if building else None)
building = False
try:
    with handler_imports():
        building = True
        enabled_inside = gc.isenabled()
        for _ in range(100_000):  # far past every threshold, were collection on
            cycle = []
            cycle.append(cycle)
        building = False
        if sys.argv[1] == "raise":
            raise ImportError("an import failed")
except ImportError:
    pass
print(json.dumps({
    "collections_inside": len(inside),
    "enabled_inside": enabled_inside,
    "enabled_after": gc.isenabled(),
    "frozen_by_it": gc.get_freeze_count() - frozen_before,
}))
"""


def probe(case: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE), case],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "shared"), "PATH": "/usr/bin:/bin"},
    )
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def test_the_first_handler_imports_run_without_collection_then_freeze_and_resume() -> None:
    seen = probe("first")
    assert seen["collections_inside"] == 0
    assert seen["enabled_inside"] is False
    assert seen["enabled_after"] is True
    assert seen["frozen_by_it"] > 100_000  # the cycles built inside, and what was before


def test_a_failing_import_still_resumes_collection() -> None:
    seen = probe("raise")
    assert seen["enabled_after"] is True
    assert seen["collections_inside"] == 0


def test_a_process_that_froze_before_is_left_as_it_is() -> None:
    """A later handler import (the gateway's second, a test's) freezes nothing again."""
    seen = probe("frozen")
    assert seen["enabled_inside"] is True
    assert seen["collections_inside"] > 0
    assert seen["frozen_by_it"] == 0


def test_collection_paused_by_the_process_stays_paused() -> None:
    seen = probe("disabled")
    assert (seen["enabled_inside"], seen["enabled_after"], seen["frozen_by_it"]) == (
        False,
        False,
        0,
    )


def test_every_handler_imports_inside_handler_imports() -> None:
    for handler in HANDLERS:
        body = ast.parse(handler.read_text()).body
        imports_outside = [
            ast.unparse(node)
            for node in body
            if isinstance(node, ast.Import)
            or (
                isinstance(node, ast.ImportFrom)
                and node.module not in {"__future__", "seedkeeper.coldstart"}
            )
        ]
        assert imports_outside == [], handler
        quiet = [
            node
            for node in body
            if isinstance(node, ast.With)
            and ast.unparse(node.items[0].context_expr) == "handler_imports()"
        ]
        assert len(quiet) == 1, handler
        assert all(isinstance(node, ast.Import | ast.ImportFrom) for node in quiet[0].body)
