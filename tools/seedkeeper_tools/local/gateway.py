"""A local stand-in for Lambda function URLs with `AWS_IAM` auth: checks each request's
SigV4 signature, builds the event Lambda would build (payload format 2.0), and hands it
to the same handler module that runs in AWS.

Two kinds of principal sign, as in a deployment: the executor, whose credentials are accepted
on every route but the checkpoint function's, and the slot tasks, each with keys of its own
(`principals.TaskKeys`: a session of the slot task role each), accepted on that route alone
(template.yaml lets the role invoke that one function). The event names the session that
signed, as Lambda names an ECS task's (the role, then the task's id), and the checkpoint
function acts only for that task. A request signed by anyone else is refused like any bad
signature.

It refuses what a function URL refuses, and answers every refusal in JSON: a body framed
any way but one decimal Content-Length that arrives in full, a repeated Host, any method
(one http.server does not know too) before its signature is checked, and whatever Python's
HTTP parser rejects. A path no function serves is the 404 a function gives a path it does
not serve, in the functions' one error body. A body that is not UTF-8 reaches the function
base64-encoded, as Lambda delivers it, never rewritten: the function refuses it.

Requests are read, checked and answered by a thread each, but the functions run one
invocation at a time, as in a Lambda execution environment: the handlers keep the invocation
in process-wide state (Powertools' resolvers share the current event), so two at once could
answer each other's requests. Their entrypoint takes a process-wide lock for that (a test
invoking a handler beside the gateway is kept out too); the gateway's own lets a stop wait
for the invocation under way."""

from __future__ import annotations

import base64
import http.server
import importlib.util
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from seedkeeper.api.answers import ErrorAnswer
from seedkeeper.observability import logger
from seedkeeper_tools.infra import FUNCTIONS
from seedkeeper_tools.local.principals import (
    ACCOUNT,
    EXECUTOR_ARN,
    LocalCredentials,
    TaskKeys,
    acting_as,
    task_session_arn,
)
from seedkeeper_tools.local.sigv4 import signing_key_id, verify

# Lambda function URLs take up to 6 MB; Seedkeeper's bodies are small JSON documents.
MAX_BODY = 256 * 1024
# Which function answers which path, as each has its own URL in AWS.
ROUTES = (
    ("/seed", "seed"),
    ("/keepalive", "seed"),
    ("/receipt", "receipt"),
    ("/slot-evidence", "slot_evidence"),
    ("/snapshots", "rotation"),
    ("/checkpoints", "checkpoint"),
    ("/tasks", "checkpoint"),
    ("/healthz", "seed"),
)
# The functions only the slot task role may invoke, and it no other.
TASK_FUNCTIONS = frozenset({"checkpoint"})
# A client that stops sending for this long gets its answer (or its connection closed).
REQUEST_TIMEOUT = 10.0
# Digits only (no sign, `_` or base prefix that int() would take), few enough that int()
# is cheap: no body has more than 18 digits of length.
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")

# What a function answers for a path it does not serve (`seedkeeper.api.http`).
NOT_FOUND = ErrorAnswer(error="not-found").model_dump_json().encode()

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass(frozen=True)
class Principal:
    """Whose signature a route takes, and how the event names them
    (`requestContext.authorizer.iam`, as Lambda fills it in for a function URL)."""

    credentials: LocalCredentials
    user_arn: str
    user_id: str

    def iam(self) -> dict[str, str]:
        return {
            "accessKey": self.credentials.access_key,
            "accountId": ACCOUNT,
            "callerId": self.user_id,
            "userArn": self.user_arn,
            "userId": self.user_id,
        }


@dataclass(frozen=True)
class LocalContext:
    """What a handler (and Powertools' logger) reads of the Lambda context."""

    function_name: str
    aws_request_id: str
    function_version: str = "$LATEST"
    invoked_function_arn: str = f"arn:aws:lambda:local:{ACCOUNT}:function:seedkeeper"
    memory_limit_in_mb: int = 512
    log_group_name: str = "/aws/lambda/seedkeeper-local"
    log_stream_name: str = "local"


def load_function_module(name: str) -> ModuleType:
    """functions/<name>/app.py, loaded as `seedkeeper_functions.<name>`: every function's
    module is called app, so `import app` would give them all the first one found."""
    spec = importlib.util.spec_from_file_location(
        f"seedkeeper_functions.{name}", FUNCTIONS / name / "app.py"
    )
    if spec is None or spec.loader is None:
        raise FileNotFoundError(FUNCTIONS / name / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_handler(name: str) -> Handler:
    """functions/<name>/app.py's `lambda_handler`; each invocation acting as that function
    (`principals.acting_as`: what its role must allow)."""
    handler: Handler = load_function_module(name).lambda_handler

    def as_its_role(event: dict[str, Any], context: Any) -> dict[str, Any]:
        with acting_as(name):
            return handler(event, context)

    return as_its_role


class FunctionUrlGateway(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many executors at once: the default backlog of 5 resets them

    def __init__(
        self,
        host: str,
        port: int,
        credentials: LocalCredentials,
        *,
        task_keys: TaskKeys | None = None,
        region: str,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        """`credentials` are the executor's; `task_keys` the slot tasks' (None: no one may
        call the checkpoint function)."""
        self.credentials = credentials
        self.task_keys = task_keys
        self._executor = Principal(credentials, EXECUTOR_ARN, "local")
        self.region = region  # a signature scoped to any other region is refused
        self.request_timeout = request_timeout
        self.handlers = {name: load_handler(name) for _, name in ROUTES}
        self._one_invocation_at_a_time = threading.Lock()
        self._stopping = False
        super().__init__((host, port), _Request)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FunctionUrlGateway:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Takes no more requests, then waits for the invocation under way: it may be
        starting a slot task, which whoever stops the tasks next must find."""
        self.shutdown()
        self.server_close()
        self._thread.join()
        with self._one_invocation_at_a_time:
            self._stopping = True

    def invoke(self, function: str, event: dict[str, Any], context: Any) -> dict[str, Any] | None:
        """The function's answer; None once the gateway is stopping."""
        with self._one_invocation_at_a_time:
            return None if self._stopping else self.handlers[function](event, context)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away before its answer is one line, not a traceback."""
        gone = sys.exception()
        if isinstance(gone, ConnectionError):
            logger.info(
                "local gateway: a client went away before its answer", why=type(gone).__name__
            )
            return
        super().handle_error(request, client_address)

    def route(self, path: str) -> str | None:
        for prefix, name in ROUTES:
            if path == prefix or path.startswith(prefix + "/"):
                return name
        return None

    def principal(self, function: str | None, authorization: str) -> Principal | None:
        """Whose signature `function` takes (a path no function serves takes the executor's,
        as every other route does): a slot task's, the one whose keys `authorization` names;
        None when no one may call it so."""
        if function not in TASK_FUNCTIONS:
            return self._executor
        key = signing_key_id(authorization)
        found = self.task_keys.find(key) if self.task_keys is not None and key else None
        if found is None:
            return None
        keys, session = found
        return Principal(keys, task_session_arn(session), f"AROALOCALSLOTTASK:{session}")


class _Request(http.server.BaseHTTPRequestHandler):
    server: FunctionUrlGateway
    protocol_version = "HTTP/1.1"
    # Every answer, the parser's early refusals included, has an HTTP/1.1 status line.
    default_request_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)

    def log_message(self, *_: Any) -> None:
        """No request lines: a query string could carry anything."""

    def parse_request(self) -> bool:
        try:
            if not super().parse_request():
                return False
        except TimeoutError:  # a request line, then the headers stopped coming
            self.send_error(HTTPStatus.REQUEST_TIMEOUT)
            return False
        if len(self.requestline.split()) == 2:  # HTTP/0.9: a request line with no version
            self.send_error(HTTPStatus.BAD_REQUEST)
            return False
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The parser's refusals (request line, version, sizes, unknown method) in JSON like
        every other answer, never its HTML page; its detail is not echoed back."""
        self._refuse(HTTPStatus(code))

    def _serve(self) -> None:
        body = self._body()
        if isinstance(body, HTTPStatus):
            self._refuse(body)
            return
        path = urlsplit(self.path).path
        function = self.server.route(path)
        # Each route takes one principal's signature: another's is a wrong credential.
        principal = self.server.principal(function, self.headers.get("Authorization", ""))
        refused = "no-principal" if principal is None else self._refusal(principal, body)
        if principal is None or refused is not None:
            logger.info("local gateway refused a request", why=refused, function=function)
            self._answer(HTTPStatus.FORBIDDEN)
            return
        if function is None:
            self._send(HTTPStatus.NOT_FOUND, {"Content-Type": "application/json"}, NOT_FOUND)
            return
        event = self._event(path, body, principal)
        context = LocalContext(
            function_name=f"seedkeeper-{function}",
            aws_request_id=event["requestContext"]["requestId"],
        )
        response = self.server.invoke(function, event, context)
        if response is None:
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE)
            return
        payload = response.get("body") or ""
        raw = base64.b64decode(payload) if response.get("isBase64Encoded") else payload.encode()
        self._send(response.get("statusCode", 200), response.get("headers", {}), raw)

    def _refusal(self, principal: Principal, body: bytes) -> str | None:
        """None when `principal` signed this request; otherwise why not."""
        return verify(
            method=self.command,
            url=f"http://{self.headers['Host']}{self.path}",
            headers=self.headers.items(),
            body=body,
            access_key=principal.credentials.access_key,
            secret_key=principal.credentials.secret_key,
            region=self.server.region,
            now=datetime.now(UTC),
        )

    def __getattr__(self, name: str) -> Callable[[], None]:
        """Every method is authenticated first, then the function decides (a method its
        path does not serve is its 405): http.server answers one it finds no `do_` method
        for with 501, before anything is checked."""
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def _body(self) -> bytes | HTTPStatus:
        """The body as its one Content-Length frames it, or why the request is refused (and
        its connection closed: where the next request would start is unknown)."""
        if "Transfer-Encoding" in self.headers:
            return HTTPStatus.LENGTH_REQUIRED
        if len(self.headers.get_all("Host", [])) != 1:
            return HTTPStatus.BAD_REQUEST  # RFC 9112 §3.2: exactly one Host
        lengths = [value.strip(" \t") for value in self.headers.get_all("Content-Length", [])]
        if len(lengths) > 1 or (lengths and _CONTENT_LENGTH.fullmatch(lengths[0]) is None):
            return HTTPStatus.BAD_REQUEST  # RFC 9112 §6.3: the framing cannot be trusted
        length = int(lengths[0]) if lengths else 0
        if length > MAX_BODY:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            body = b""
        if len(body) != length:  # the client stopped sending, or closed, before the end
            return HTTPStatus.BAD_REQUEST
        return body

    def _refuse(self, status: HTTPStatus) -> None:
        self.close_connection = True
        self._answer(status)

    def _event(self, path: str, body: bytes, principal: Principal) -> dict[str, Any]:
        """The function URL event Lambda builds (payload format 2.0), credentials removed,
        naming the principal that signed."""
        query = urlsplit(self.path).query
        headers = {
            name.lower(): value
            for name, value in self.headers.items()
            if name.lower() not in {"authorization", "x-amz-security-token"}
        }
        now = time.time()
        return {
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": path,
            "rawQueryString": query,
            "headers": headers,
            "queryStringParameters": dict(parse_qsl(query)) or None,
            "requestContext": {
                "accountId": ACCOUNT,
                "apiId": "local",
                "authorizer": {"iam": principal.iam()},
                "domainName": self.headers.get("Host", "localhost"),
                "domainPrefix": "local",
                "http": {
                    "method": self.command,
                    "path": path,
                    "protocol": "HTTP/1.1",
                    "sourceIp": self.client_address[0],
                    "userAgent": self.headers.get("User-Agent", ""),
                },
                "requestId": str(uuid.uuid4()),
                "routeKey": "$default",
                "stage": "$default",
                "time": datetime.fromtimestamp(now, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
                "timeEpoch": int(now * 1000),
            },
            **_lambda_body(body),
        }

    def _answer(self, status: HTTPStatus) -> None:
        body = json.dumps({"message": status.phrase}).encode()
        headers = {"Content-Type": "application/json"}
        if self.close_connection:
            headers["Connection"] = "close"
        self._send(status, headers, body)

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer says how long the body is, without it
            self.wfile.write(body)


def _lambda_body(body: bytes) -> dict[str, Any]:
    """The event's body as Lambda delivers it: text when it is UTF-8, else base64 (for the
    function to decode or refuse: a byte replaced would make two bodies one)."""
    try:
        return {"body": body.decode() if body else None, "isBase64Encoded": False}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "isBase64Encoded": True}
