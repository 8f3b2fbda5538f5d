"""A local stand-in for Lambda function URLs with `AWS_IAM` auth: checks each request's
SigV4 signature, builds the event Lambda would build (payload format 2.0), and hands it
to the same handler module that runs in AWS."""

from __future__ import annotations

import base64
import http.server
import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from seedkeeper.infra import FUNCTIONS
from seedkeeper.local.sigv4 import verify
from seedkeeper.observability import logger

# Lambda function URLs take up to 6 MB; Seedkeeper's bodies are small JSON documents.
MAX_BODY = 256 * 1024
# Which function answers which path, as each has its own URL in AWS.
ROUTES = (
    ("/seed", "seed"),
    ("/receipt", "receipt"),
    ("/slot-evidence", "slot_evidence"),
    ("/snapshots", "rotation"),
    ("/healthz", "seed"),
)
ACCOUNT = "000000000000"

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass(frozen=True)
class LocalCredentials:
    access_key: str
    secret_key: str


@dataclass(frozen=True)
class _Context:
    """What a handler reads of the Lambda context."""

    function_name: str
    aws_request_id: str
    function_version: str = "$LATEST"
    invoked_function_arn: str = f"arn:aws:lambda:local:{ACCOUNT}:function:seedkeeper"
    memory_limit_in_mb: int = 512
    log_group_name: str = "/aws/lambda/seedkeeper-local"
    log_stream_name: str = "local"


def load_handler(name: str) -> Handler:
    """functions/<name>/app.py's `lambda_handler`, loaded under its own module name."""
    spec = importlib.util.spec_from_file_location(
        f"seedkeeper_functions.{name}", FUNCTIONS / name / "app.py"
    )
    if spec is None or spec.loader is None:
        raise FileNotFoundError(FUNCTIONS / name / "app.py")
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    handler: Handler = module.lambda_handler
    return handler


class FunctionUrlGateway(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many executors at once: the default backlog of 5 resets them

    def __init__(self, host: str, port: int, credentials: LocalCredentials) -> None:
        self.credentials = credentials
        self.handlers = {name: load_handler(name) for _, name in ROUTES}
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
        self.shutdown()
        self.server_close()
        self._thread.join()

    def route(self, path: str) -> str | None:
        for prefix, name in ROUTES:
            if path == prefix or path.startswith(prefix + "/"):
                return name
        return None


class _Request(http.server.BaseHTTPRequestHandler):
    server: FunctionUrlGateway
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: Any) -> None:
        """No request lines: a query string could carry anything."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._answer(413, {"message": "Request Entity Too Large"})
            self.close_connection = True
            return
        body = self.rfile.read(length)
        url = f"http://{self.headers.get('Host', '')}{self.path}"
        refused = verify(
            method=self.command,
            url=url,
            headers=dict(self.headers.items()),
            body=body,
            access_key=self.server.credentials.access_key,
            secret_key=self.server.credentials.secret_key,
            now=datetime.now(UTC),
        )
        if refused is not None:
            logger.info("local gateway refused a request", why=refused)
            self._answer(403, {"message": "Forbidden"})
            return
        path = urlsplit(self.path).path
        function = self.server.route(path)
        if function is None:
            self._answer(404, {"message": "Not Found"})
            return
        event = self._event(path, body)
        context = _Context(
            function_name=f"seedkeeper-{function}",
            aws_request_id=event["requestContext"]["requestId"],
        )
        response = self.server.handlers[function](event, context)
        payload = response.get("body") or ""
        raw = base64.b64decode(payload) if response.get("isBase64Encoded") else payload.encode()
        self._send(response.get("statusCode", 200), response.get("headers", {}), raw)

    def _event(self, path: str, body: bytes) -> dict[str, Any]:
        """The function URL event Lambda builds (payload format 2.0), credentials removed."""
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
                "authorizer": {
                    "iam": {
                        "accessKey": self.server.credentials.access_key,
                        "accountId": ACCOUNT,
                        "callerId": "local",
                        "userArn": f"arn:aws:iam::{ACCOUNT}:user/local",
                        "userId": "local",
                    }
                },
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
            "body": body.decode("utf-8", errors="replace") if body else None,
            "isBase64Encoded": False,
        }

    def _answer(self, status: int, body: dict[str, str]) -> None:
        self._send(status, {"Content-Type": "application/json"}, json.dumps(body).encode())

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
