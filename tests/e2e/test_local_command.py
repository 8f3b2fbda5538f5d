"""`seedkeeper local` as a user runs it: its idle window as asked, where its store is, and
an environment to paste for the operator tools, which then reach its table and bucket."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from botocore.credentials import Credentials

from seedkeeper_client import Cold, SeedkeeperClient

SEEDKEEPER = str(Path(sys.executable).with_name("seedkeeper"))


def test_the_local_command_takes_an_idle_window_and_prints_where_its_store_is(
    tmp_path: Path,
) -> None:
    # The caller's own SEEDKEEPER_* and AWS settings must not leak in: a user's shell.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDKEEPER_", "AWS_"))}
    gateway = {
        "SEEDKEEPER_LOCAL_ACCESS_KEY_ID": "local-cli",
        "SEEDKEEPER_LOCAL_SECRET_ACCESS_KEY": "s",
    }
    command = [SEEDKEEPER, "local", "--port", "0", "--idle-window", "7"]
    command += ["--data-dir", str(tmp_path / "data"), "--sweep-interval", "3600"]
    stack = subprocess.Popen(
        command,
        env=clean | gateway | {"COLUMNS": "1000"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert stack.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any(line.startswith("export ") for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(stack.stdout.readline())
        text = "".join(lines)
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
        assert url is not None, text
        assert "idle window 7 s" in text
        exports = next(line for line in lines if line.startswith("export "))
        pasted = dict(word.split("=", 1) for word in shlex.split(exports)[1:])
        assert set(pasted) >= {
            "SEEDKEEPER_TABLE",
            "SEEDKEEPER_DYNAMODB_ENDPOINT",
            "SEEDKEEPER_R2_BUCKET",
        }
        assert pasted["SEEDKEEPER_DYNAMODB_ENDPOINT"] in text

        client = SeedkeeperClient(url.group(1), credentials=Credentials("local-cli", "s"))
        assert isinstance(client.seed("cold-1", None), Cold)
        # The pasted environment reaches the stack's table.
        shown = subprocess.run(
            [SEEDKEEPER, "slot", "cold-1"],
            env=clean | pasted | {"COLUMNS": "1000"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "unseeded" in shown.stdout
        # The idle window as asked: a touch moves the deadline 7 s on.
        asked_at = int(time.time())
        kept = client.keepalive("cold-1", None)
        assert asked_at + 7 <= kept.idle_deadline <= int(time.time()) + 7
    finally:
        stack.send_signal(signal.SIGINT)
        stack.wait(timeout=60)
    assert stack.returncode == 0
