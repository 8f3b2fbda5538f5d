"""The local stack's store in a process of its own: moto, standing in for DynamoDB and R2
(`seedkeeper_tools.local.motoserver`), signed-only, atomic per request, its TTL enforced.

moto costs more CPU per request than the handlers that call it; sharing the stack's
interpreter, it held the gateway to one core. In its own process it has a core of its own,
and the stack's process does not load it at all.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from typing import IO

from seedkeeper_tools.local.principals import LocalCredentials

# How often the store deletes the items whose TTL has passed (DynamoDB takes up to two days;
# promptly is as good, and a pass over a day's records takes milliseconds).
EXPIRE_EVERY = 1.0
# A store that takes longer to start is broken; a stopped one exits at once.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


class StoreProcess:
    def __init__(
        self,
        credentials: LocalCredentials,
        *,
        region: str,
        read_only: LocalCredentials | None = None,
    ) -> None:
        """`read_only`: an R2 token that reads objects and nothing else (see motoserver)."""
        self._settings: dict[str, object] = {
            "access_key": credentials.access_key,
            "secret_key": credentials.secret_key,
            "region": region,
            "expire_every": EXPIRE_EVERY,
        }
        if read_only is not None:
            self._settings["read_only"] = {
                "access_key": read_only.access_key,
                "secret_key": read_only.secret_key,
            }
        self._process: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def start(self) -> StoreProcess:
        """Starts the store and returns once it answers; its keys go through a pipe."""
        ready, told = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "seedkeeper_tools.local.motoserver", str(told)],
                stdin=subprocess.PIPE,
                pass_fds=(told,),
            )
        finally:
            os.close(told)
        with os.fdopen(ready) as answer:
            self._stdin().write(json.dumps(self._settings).encode() + b"\n")
            self._stdin().flush()
            if select.select([answer], [], [], START_TIMEOUT)[0]:
                self.endpoint = answer.read()  # written, then closed; or closed as it died
        if not self.endpoint:
            self.stop()
            raise RuntimeError("the local store did not start")
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        self._stdin().close()  # the store's signal to stop
        try:
            self._process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _stdin(self) -> IO[bytes]:
        assert self._process is not None
        assert self._process.stdin is not None
        return self._process.stdin
