"""An embedded moto server whose requests are atomic and, given credentials, signed.

DynamoDB applies each conditional write atomically. moto's backends check a condition and
then write without taking a lock, so under threads that atomicity would rest on when the
interpreter happens to switch threads. This server handles one request at a time: requests
still interleave freely, and each one is atomic, the guarantee the lifecycle module relies on.

moto itself takes any request. Given credentials, the server answers only what DynamoDB
and R2 would: requests SigV4-signed with them, in the Authorization header or as a
presigned URL (the local stack's store is on a loopback port its slot sandboxes can find).
The body is read and checked before the one-at-a-time lock is taken, so a client that
stalls or sends too much holds up only itself.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote, urlsplit

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wsgi import get_input_stream

from seedkeeper.observability import logger
from seedkeeper_tools.local.gateway import LocalCredentials
from seedkeeper_tools.local.sigv4 import (
    QUERY_CREDENTIALS,
    S3,
    signed_scope,
    verify,
    verify_presigned,
)

R2_REGION = "auto"  # R2 has one region, the one seedkeeper.adapters.r2 signs for
# The stack's R2 parts are 16 MiB, and DynamoDB takes requests of at most 16 MB.
MAX_BODY = 64 * 1024 * 1024
# A client that stops sending for this long has its connection closed.
REQUEST_TIMEOUT = 30.0
# What each refusal is called, as S3 names it.
_ERROR_CODES = {
    HTTPStatus.FORBIDDEN: "AccessDenied",
    HTTPStatus.BAD_REQUEST: "IncompleteBody",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "EntityTooLarge",
}
_RAW_HEADERS = "seedkeeper.raw_headers"

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class AtomicMotoServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        credentials: LocalCredentials | None = None,
        region: str = "us-east-1",
    ) -> None:
        """Without credentials any request is served (the test suite's own stores); with
        them only signed ones, DynamoDB's for `region` and R2's for its one region."""
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = DomainDispatcherApplication(create_backend_app)
        one_at_a_time = threading.Lock()

        def atomic(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            with one_at_a_time:
                # Materialise the body inside the lock: the response is computed lazily.
                return list(app(environ, start_response))

        wsgi: WsgiApp = atomic
        handler: type[MotoRequestHandler] = MotoRequestHandler
        if credentials is not None:
            wsgi = _SignedOnly(atomic, credentials, {"dynamodb": region, S3: R2_REGION})
            handler = _BoundedRequestHandler
        self._server: BaseWSGIServer = make_server(
            host, port, wsgi, threaded=True, request_handler=handler
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


class _BoundedRequestHandler(MotoRequestHandler):
    """Every socket read bounded; the headers kept as they arrived, since the WSGI environ
    folds repeated ones together and a signature check must see each copy."""

    timeout = REQUEST_TIMEOUT

    def make_environ(self) -> dict[str, Any]:
        environ = super().make_environ()
        environ[_RAW_HEADERS] = list(self.headers.items())
        return environ


class _SignedOnly:
    """WSGI middleware: passes on only requests signed with `credentials`, for a service
    in `regions` (service → the one region its signatures may name); refuses the rest."""

    def __init__(
        self, app: WsgiApp, credentials: LocalCredentials, regions: Mapping[str, str]
    ) -> None:
        self._app = app
        self._credentials = credentials
        self._regions = dict(regions)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        refused = self._refusal(environ)
        if refused is not None:
            status, why = refused
            logger.info("local store refused a request", why=why)
            return _refuse(environ, start_response, status)
        return self._app(environ, start_response)

    def _refusal(self, environ: dict[str, Any]) -> tuple[HTTPStatus, str] | None:
        """Why the request is refused, or None with its body read into the environ."""
        # The target exactly as sent: the decoded PATH_INFO is not what the client signed.
        target: str = environ.get("RAW_URI", "")
        if not target.startswith("/"):
            return HTTPStatus.BAD_REQUEST, "not-origin-form"
        headers: list[tuple[str, str]] = environ[_RAW_HEADERS]
        host = next((value for name, value in headers if name.lower() == "host"), "")
        url = f"http://{host}{target}"
        now = datetime.now(UTC)
        credentials = self._credentials
        query_names = {
            unquote(pair.partition("=")[0]) for pair in urlsplit(target).query.split("&")
        }
        authorization = environ.get("HTTP_AUTHORIZATION")
        if query_names & QUERY_CREDENTIALS:
            if authorization is not None:
                return HTTPStatus.FORBIDDEN, "two-signatures"  # which one counts?
            why = verify_presigned(
                method=environ["REQUEST_METHOD"],
                url=url,
                headers=headers,
                access_key=credentials.access_key,
                secret_key=credentials.secret_key,
                region=self._regions[S3],
                now=now,
            )
            if why is not None:
                return HTTPStatus.FORBIDDEN, why
            body = _read_body(environ)
            return body if isinstance(body, tuple) else None
        scope = signed_scope(authorization or "")
        if scope is None:
            return HTTPStatus.FORBIDDEN, "unsigned"
        service, _ = scope
        if service not in self._regions:
            return HTTPStatus.FORBIDDEN, "wrong-scope"
        body = _read_body(environ)
        if isinstance(body, tuple):
            return body
        why = verify(
            method=environ["REQUEST_METHOD"],
            url=url,
            headers=headers,
            body=body,
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            region=self._regions[service],
            now=now,
            service=service,
        )
        return (HTTPStatus.FORBIDDEN, why) if why else None


def _read_body(environ: dict[str, Any]) -> bytes | tuple[HTTPStatus, str]:
    """The whole body (at most MAX_BODY), put back in the environ for moto to read again;
    or why it could not be read."""
    try:
        body = get_input_stream(environ, max_content_length=MAX_BODY).read()
    except HTTPException as framing:  # too large, or the client went away mid-body
        if framing.code == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body-too-large"
        return HTTPStatus.BAD_REQUEST, "incomplete-body"
    except OSError:  # the client stalled past the timeout
        return HTTPStatus.BAD_REQUEST, "incomplete-body"
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    return body


def _refuse(
    environ: dict[str, Any], start_response: Callable[..., Any], status: HTTPStatus
) -> list[bytes]:
    """A refusal in the protocol of the service asked: DynamoDB's JSON, else S3's XML."""
    code = _ERROR_CODES[status]
    if "HTTP_X_AMZ_TARGET" in environ:
        content_type = "application/x-amz-json-1.0"
        body = json.dumps({"__type": code, "message": status.phrase}).encode()
    else:
        content_type = "application/xml"
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{status.phrase}</Message></Error>"
        ).encode()
    start_response(
        f"{status.value} {status.phrase}",
        [("Content-Type", content_type), ("Content-Length", str(len(body)))],
    )
    return [] if environ["REQUEST_METHOD"] == "HEAD" else [body]
