"""A slot task acting for another slot, on the local stack with slot tasks as processes
(tests/cross_slot.py; tests/container has the same with the Docker runtime)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import running_local_stack
from cross_slot import assert_a_task_cannot_act_for_another, seed_two
from executor import client_for, publish
from repos import make_repository
from seedkeeper_tools.local.stack import LocalStack


@pytest.fixture
def stack(
    tmp_path: Path, aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalStack]:
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(["sleep", "600"]))
    # The tasks look at their records rarely: a checkpoint request stays open meanwhile.
    with running_local_stack(tmp_path, idle_window=2, watch_interval=600) as local:
        yield local


def test_a_slot_task_cannot_act_for_another_slot(stack: LocalStack, tmp_path: Path) -> None:
    client = client_for(stack)
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    assert_a_task_cannot_act_for_another(stack, seed_two(stack, client, seed))
