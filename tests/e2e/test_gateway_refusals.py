"""The local gateway refuses what an `AWS_IAM` function URL refuses: a signature scoped to
another region or service, duplicated credential or framing headers, a Content-Length that
is not one decimal number matching the body that arrives, chunked bodies, and any method
before authentication; and it never answers with an HTML page or hangs. Requests are
written to raw sockets, as an HTTP client library would normalise these attacks away, and
every read is bounded so that a hanging gateway fails the test instead of hanging it."""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
from dataclasses import dataclass
from http import HTTPStatus

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from seedkeeper_tools.local.gateway import REQUEST_TIMEOUT, FunctionUrlGateway
from seedkeeper_tools.local.stack import REGION, LocalStack

READ_TIMEOUT = REQUEST_TIMEOUT + 5  # the gateway answers a stalled request before this
SEED_BODY = json.dumps({"slot": "slot-x", "seed": None}).encode()

Headers = list[tuple[str, str]]


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def message(self) -> object:
        assert self.headers.get("content-type") == "application/json", self
        return json.loads(self.body)["message"]


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def exchange(url: str, request: bytes, *, half_close: bool = False) -> Answer:
    """Sends `request` as written and reads the answer until the gateway closes."""
    with socket.create_connection(address(url), timeout=READ_TIMEOUT) as connection:
        connection.sendall(request)
        if half_close:
            connection.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except ConnectionResetError:
            if not received:
                raise
    assert received, "the gateway closed the connection without an answer"
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


def signed(
    stack: LocalStack,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    region: str = REGION,
    service: str = "lambda",
    token: str | None = None,
) -> Headers:
    """The headers botocore signs for this request, Host first, as an executor sends them."""
    url = stack.url + path
    request = AWSRequest(method=method, url=url, data=body)
    if body:
        request.headers["Content-Type"] = "application/json"
    credentials = Credentials(stack.credentials.access_key, stack.credentials.secret_key, token)
    SigV4Auth(credentials, service, region).add_auth(request)
    return [("Host", url.removeprefix("http://").split("/")[0]), *request.headers.items()]


def raw(method: str, path: str, headers: Headers, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join([*lines, "Connection: close", "", ""])).encode("latin-1") + body


def with_length(headers: Headers, body: bytes) -> Headers:
    return [*headers, ("Content-Length", str(len(body)))]


def test_the_genuine_requests_the_attacks_alter_go_through(stack: LocalStack) -> None:
    get = exchange(stack.url, raw("GET", "/healthz", signed(stack, "GET", "/healthz")))
    assert get.status == 200, get
    post = exchange(stack.url, raw("POST", "/seed", signed_post(stack), SEED_BODY))
    assert post.status == 200, post


@pytest.mark.parametrize(
    ("region", "service"),
    [("eu-west-1", "lambda"), ("us-east-2", "lambda"), (REGION, "execute-api"), (REGION, "s3")],
)
def test_a_signature_scoped_to_another_region_or_service_is_refused(
    stack: LocalStack, region: str, service: str
) -> None:
    headers = signed(stack, "GET", "/healthz", region=region, service=service)
    answer = exchange(stack.url, raw("GET", "/healthz", headers))
    assert answer.status == 403, answer
    assert answer.message() == "Forbidden"


def signed_post(stack: LocalStack, content_length: str = str(len(SEED_BODY))) -> Headers:
    """A POST /seed as a careful client sends it, each credential header present once: the
    body's digest and a session token too."""
    headers = signed(stack, "POST", "/seed", SEED_BODY, token=secrets.token_hex(8))
    digest = ("X-Amz-Content-Sha256", hashlib.sha256(SEED_BODY).hexdigest())
    return [*headers, digest, ("Content-Length", content_length)]


def forged_first(headers: Headers, name: str, forged: str) -> Headers:
    """A forged copy of header `name` just before the genuine one: a last-wins parser sees
    only the genuine value, a first-wins parser only the forgery."""
    position = next(i for i, (key, _) in enumerate(headers) if key.lower() == name.lower())
    return [*headers[:position], (name, forged), *headers[position:]]


@pytest.mark.parametrize(
    ("name", "forged"),
    [
        ("Authorization", "AWS4-HMAC-SHA256 Credential=someone-else/20200101/us-east-1/lambda"),
        ("X-Amz-Date", "20200101T000000Z"),
        ("X-Amz-Content-Sha256", hashlib.sha256(b"another body").hexdigest()),
        ("X-Amz-Security-Token", "a-token-nobody-signed"),
    ],
)
def test_a_duplicated_credential_header_is_refused(
    stack: LocalStack, name: str, forged: str
) -> None:
    headers = forged_first(signed_post(stack), name, forged)
    answer = exchange(stack.url, raw("POST", "/seed", headers, SEED_BODY))
    assert answer.status == 403, answer
    assert answer.message() == "Forbidden"


@pytest.mark.parametrize(
    ("name", "forged"), [("Host", "evil.example.com"), ("Content-Length", "0")]
)
def test_a_duplicated_host_or_content_length_is_a_bad_request(
    stack: LocalStack, name: str, forged: str
) -> None:
    headers = forged_first(signed_post(stack), name, forged)
    answer = exchange(stack.url, raw("POST", "/seed", headers, SEED_BODY))
    assert answer.status == 400, answer
    assert answer.message() == "Bad Request"


@pytest.mark.parametrize(
    ("length", "status"),
    [
        ("abc", 400),
        ("-1", 400),
        (f"+{len(SEED_BODY)}", 400),
        (f"{len(SEED_BODY) // 10}_{len(SEED_BODY) % 10}", 400),
        (f"{len(SEED_BODY)}, {len(SEED_BODY)}", 400),
        (hex(len(SEED_BODY)), 400),
        ("", 400),
        ("9" * 18, 413),  # a number, just too large
        ("9" * 5000, 400),  # more digits than int() takes from a string
    ],
)
def test_a_malformed_content_length_is_a_prompt_bad_request(
    stack: LocalStack, length: str, status: int
) -> None:
    request = raw("POST", "/seed", signed_post(stack, content_length=length), SEED_BODY)
    answer = exchange(stack.url, request, half_close=True)
    assert answer.status == status, answer
    assert answer.message() == HTTPStatus(status).phrase


def test_a_body_shorter_than_its_content_length_is_a_bad_request(stack: LocalStack) -> None:
    headers = signed_post(stack, content_length="100")
    answer = exchange(stack.url, raw("POST", "/seed", headers, SEED_BODY), half_close=True)
    assert answer.status == 400, answer
    assert answer.message() == "Bad Request"


@pytest.mark.parametrize(
    ("part", "status"), [("body", HTTPStatus.BAD_REQUEST), ("headers", HTTPStatus.REQUEST_TIMEOUT)]
)
def test_a_client_that_stops_sending_gets_an_answer_not_a_hang(
    stack: LocalStack, part: str, status: HTTPStatus
) -> None:
    request = raw("POST", "/seed", signed_post(stack, content_length="100"), SEED_BODY)
    if part == "headers":
        request = request[: request.index(b"\r\n\r\n")]
    # A gateway of the stack's, with a request timeout short enough for a test.
    gateway = FunctionUrlGateway(
        "127.0.0.1", 0, stack.credentials, region=REGION, request_timeout=1.0
    ).start()
    try:
        answer = exchange(gateway.url, request)
    finally:
        gateway.stop()
    assert answer.status == status, answer
    assert answer.message() == status.phrase


def test_a_chunked_body_is_refused_not_read_as_the_next_request(stack: LocalStack) -> None:
    # Signed over an empty body: a gateway that ignores Transfer-Encoding accepts the
    # request and parses the chunks as a second, unsigned request.
    headers = [*signed(stack, "POST", "/seed"), ("Transfer-Encoding", "chunked")]
    chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SEED_BODY), SEED_BODY)
    answer = exchange(stack.url, raw("POST", "/seed", headers, chunks), half_close=True)
    assert answer.status == 411, answer
    assert answer.message() == "Length Required"


# Those http.server does not know too (it would answer them 501 before authenticating).
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "TRACE", "PROPFIND")


@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_authenticated_first(stack: LocalStack, method: str) -> None:
    unsigned = exchange(stack.url, raw(method, "/seed", [("Host", "localhost")]))
    assert unsigned.status == 403, unsigned
    if method == "HEAD":
        assert unsigned.headers.get("content-type") == "application/json", unsigned
        assert unsigned.body == b""
    else:
        assert unsigned.message() == "Forbidden"


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
def test_a_signed_method_a_route_does_not_serve_reaches_the_function_and_is_a_405(
    stack: LocalStack, method: str
) -> None:
    body = SEED_BODY if method in {"PUT", "PATCH"} else b""
    headers = with_length(signed(stack, method, "/seed", body), body)
    answer = exchange(stack.url, raw(method, "/seed", headers, body))
    assert answer.status == 405, answer  # authenticated, then refused by the function
    assert answer.headers.get("allow") == "POST", answer
    assert answer.headers.get("content-type") == "application/json", answer
    if method == "HEAD":
        assert answer.body == b""
    else:
        assert json.loads(answer.body)["error"] == "method-not-allowed"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /healthz\r\n\r\n", 400),
        (b"GET /healthz HTTP/2.0\r\nHost: localhost\r\n\r\n", 505),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414),
        (b"GET /healthz HTTP/1.1\r\n" + b"X-Filler: 1\r\n" * 101 + b"\r\n", 431),
    ],
    ids=[
        "request-line",
        "http-0.9",
        "version",
        "uri-too-long",
        "too-many-headers",
    ],
)
def test_a_request_the_http_parser_rejects_gets_json_not_an_html_page(
    stack: LocalStack, request_bytes: bytes, status: int
) -> None:
    answer = exchange(stack.url, request_bytes)
    assert answer.status == status, answer
    assert isinstance(answer.message(), str)
    assert b"<html" not in answer.body.lower()
