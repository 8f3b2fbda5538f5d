"""An embedded moto server whose requests are atomic.

DynamoDB applies each conditional write atomically. moto's backends check a condition and
then write without taking a lock, so under threads that atomicity would rest on when the
interpreter happens to switch threads. This server handles one request at a time: requests
still interleave freely, and each one is atomic, the guarantee the lifecycle module relies on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server


class AtomicMotoServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = DomainDispatcherApplication(create_backend_app)
        one_at_a_time = threading.Lock()

        def atomic(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            with one_at_a_time:
                # Materialise the body inside the lock: the response is computed lazily.
                return list(app(environ, start_response))

        self._server: BaseWSGIServer = make_server(
            host, port, atomic, threaded=True, request_handler=MotoRequestHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> AtomicMotoServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
