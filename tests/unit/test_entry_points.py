"""What the distributions declare (pyproject.toml's console scripts and entry points) loads:
a command that names a function that is not there fails only when a user runs it."""

from __future__ import annotations

import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def declared() -> list[EntryPoint]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"console_scripts": project["scripts"], **project["entry-points"]}
    return [
        EntryPoint(name=name, value=value, group=group)
        for group, entries in groups.items()
        for name, value in entries.items()
    ]


@pytest.mark.parametrize("entry_point", declared(), ids=lambda e: f"{e.group}:{e.name}")
def test_every_declared_entry_point_loads(entry_point: EntryPoint) -> None:
    assert callable(entry_point.load())
