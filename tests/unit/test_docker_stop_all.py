"""The Docker runtime's stop of a whole stack, with a `docker` on PATH that stops containers
as the CLI does: every container is sent SIGTERM before any has stopped, however many there
are. (One `docker stop` stops at most 50 at a time: given them all, the 51st was sent SIGTERM
only once one of the first 50 had stopped, a whole stop timeout later.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedkeeper_tools.local.docker import DockerRuntime
from slots import fake_docker

CONTAINERS = 120
# `ps` lists FAKE_DOCKER_COUNT containers. `stop` stops them as the CLI does, at most 50 at a
# time, each taking a second (a container that checkpoints takes its stop timeout), and
# notes when each was sent SIGTERM and when it had stopped. Every call is recorded.
FAKE_DOCKER = """#!/usr/bin/env python3
import json, os, sys, time
def note(what, name=""):
    with open(os.environ["FAKE_DOCKER_CALLS"], "a") as calls:
        calls.write(json.dumps({"what": what, "name": name, "argv": sys.argv[1:]}) + "\\n")
if sys.argv[1] == "ps":
    print("\\n".join(f"c{index:03d}" for index in range(int(os.environ["FAKE_DOCKER_COUNT"]))))
elif sys.argv[1] == "stop":
    names = sys.argv[4:]
    for start in range(0, len(names), 50):
        for name in names[start : start + 50]:
            note("term", name)
        time.sleep(1)
        for name in names[start : start + 50]:
            note("stopped", name)
else:
    note(sys.argv[1])
"""


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKE_DOCKER_COUNT", str(CONTAINERS))
    return fake_docker(tmp_path, monkeypatch, FAKE_DOCKER)


def test_a_stacks_containers_are_all_asked_to_stop_before_any_stop_is_done(
    calls: Path, tmp_path: Path
) -> None:
    # When the stack's exit stops its containers
    DockerRuntime(tmp_path).stop_all()
    recorded = [json.loads(line) for line in calls.read_text().splitlines()]
    events = [call["what"] for call in recorded]
    # Then each was sent SIGTERM once, with the task definition's stop timeout
    listed = [f"c{index:03d}" for index in range(CONTAINERS)]
    termed = [call for call in recorded if call["what"] == "term"]
    assert sorted(call["name"] for call in termed) == listed
    assert all(call["argv"][:3] == ["stop", "--time", "120"] for call in termed)
    # And every one before the first had stopped: one stop timeout for all of them
    last_term = max(index for index, event in enumerate(events) if event == "term")
    assert events.index("stopped") > last_term
    # And all were removed once stopped
    assert events[-1] == "rm"
    assert recorded[-1]["argv"] == ["rm", "--force", "--volumes", *listed]
