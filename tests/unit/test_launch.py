"""The slot task's launch starts its downloads before the heavy part of the task is loaded:
importing it loads none of the stores, the supervisor, the capture or git's hardening."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFERRED = (
    "seedkeeper_task.supervisor",
    "seedkeeper_task.watch",
    "seedkeeper_task.capture",
    "seedkeeper_task.restore.extract",
    "seedkeeper_task.restore.repository",
    "seedkeeper.store.lifecycle",
    "seedkeeper.store.snapshots",
    "seedkeeper.config",
    # the executor's client: the task signs with its transport alone
    "seedkeeper_client.client",
    "seedkeeper_client.models",
)


def test_the_launch_loads_nothing_the_downloads_do_not_need() -> None:
    probe = (
        "import json, sys; import seedkeeper_task.launch; print(json.dumps(sorted(sys.modules)))"
    )
    path = os.pathsep.join(str(ROOT / part) for part in ("shared", "task"))
    done = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": path},
    )
    loaded = set(json.loads(done.stdout))
    assert "seedkeeper_task.restore.download" in loaded
    assert [name for name in DEFERRED if name in loaded] == []
