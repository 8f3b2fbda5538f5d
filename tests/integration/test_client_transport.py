"""The signed transport the executor's client and the slot task share, against a hostile
or broken endpoint: a signed request never goes anywhere but where it was signed for, and
an answer that is not one is refused, naming no URL."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.credentials import Credentials

from seedkeeper_client import BadAnswer, SeedkeeperClient, SeedkeeperError, SeedkeeperRefused
from seedkeeper_client.transport import (
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    Unreachable,
    signed_call,
)

# What a server answers: its status, headers and body.
Answer = tuple[int, dict[str, str], bytes]
CREDENTIALS = Credentials("AKIDEXAMPLE", "secret", "session-token-never-forwarded")


class Recorder(ThreadingHTTPServer):
    def __init__(self, answer: Answer) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answer = answer
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def _answer(self) -> None:
        self.server.paths.append(self.path)
        status, headers, body = self.server.answer
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def serving(answer: Answer) -> Iterator[Recorder]:
    server = Recorder(answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def elsewhere() -> Iterator[Recorder]:
    with serving((200, {"Content-Type": "application/json"}, b"{}")) as server:
        yield server


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_redirect_is_refused_and_the_signed_headers_go_nowhere(
    elsewhere: Recorder, status: int, method: str
) -> None:
    with serving((status, {"Location": elsewhere.url + "/collect"}, b"")) as redirecting:
        answered, _ = signed_call(
            method,
            redirecting.url + "/seed",
            {"slot": "s"} if method == "POST" else None,
            credentials=CREDENTIALS,
            region="us-east-1",
            timeout=5,
        )
        assert answered == status  # the redirect itself is the answer: a refusal
        assert len(redirecting.paths) == 1
    assert elsewhere.paths == []


def test_a_redirected_call_is_a_refusal_to_the_client(elsewhere: Recorder) -> None:
    # A redirect's body names where it points, as servers write them.
    page = json.dumps({"message": f"moved to {elsewhere.url}"}).encode()
    with serving((302, {"Location": elsewhere.url}, page)) as redirecting:
        client = SeedkeeperClient(redirecting.url, credentials=CREDENTIALS, timeout=5)
        with pytest.raises(SeedkeeperRefused) as refused:
            client.snapshot_status("widgets")
        assert refused.value.status == 302
        assert elsewhere.url not in str(refused.value)
    assert elsewhere.paths == []


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"seeded": "yes"}).encode(), "seeded"),
        (json.dumps({"state": "unseeded", "slot": "slot-1"}).encode(), "attempt"),
    ],
)
def test_a_seed_answer_that_is_not_one_is_a_bad_answer_naming_why(body: bytes, said: str) -> None:
    with serving((200, {"Content-Type": "application/json"}, body)) as server:
        client = SeedkeeperClient(server.url, credentials=CREDENTIALS, timeout=5)
        with pytest.raises(BadAnswer, match=said):
            client.seed("slot-1", None)


@pytest.mark.parametrize("status", [200, 500])
def test_an_answer_longer_than_a_function_url_sends_is_not_read_whole(status: int) -> None:
    too_long: Answer = (status, {}, b"x" * (MAX_ANSWER_BYTES + 1))
    with serving(too_long) as server, pytest.raises(AnswerTooLarge):
        signed_call("GET", server.url, None, credentials=CREDENTIALS, region="us-east-1", timeout=5)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "data:,{}"])
def test_only_an_http_url_is_called(url: str) -> None:
    with pytest.raises(ValueError, match="https://"):
        signed_call("GET", url, None, credentials=CREDENTIALS, region="us-east-1", timeout=5)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://user:s3cret@seed.example", "user name or password"),
        ("https://seed.example/?", "query or a fragment"),
        ("https://seed.example/#", "query or a fragment"),
        ("https:///seed", "names no host"),
        ("https://seed.example:port", "not a URL"),
        ("https://seed.example/a b", "control character"),
        ("https://seed.example/\x07", "control character"),
    ],
)
def test_a_base_url_a_signed_call_must_not_go_to_is_refused_naming_the_option(
    url: str, said: str
) -> None:
    for given, named in ((url, "base_url"), ({"rotation": url}, "base_url['rotation']")):
        with pytest.raises(ValueError, match=said) as refused:
            SeedkeeperClient(given, credentials=CREDENTIALS)
        assert str(refused.value).startswith(named)
        assert "s3cret" not in str(refused.value)


def test_a_base_url_key_that_names_no_function_is_refused() -> None:
    with pytest.raises(ValueError, match="names no function: 'slot-evidence'"):
        SeedkeeperClient({"slot-evidence": "https://seed.example"}, credentials=CREDENTIALS)


def test_a_resource_name_never_changes_the_route() -> None:
    with serving((200, {}, b"{}")) as server:
        client = SeedkeeperClient(server.url, credentials=CREDENTIALS, timeout=5)
        client.delete_snapshots("../receipt")
        assert server.paths == ["/snapshots/..%2Freceipt"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (json.dumps({"error": "e" * 10_000}).encode(), "e" * 64),
        (json.dumps({"error": "claim-\nmismatch\x1b[2J"}).encode(), "claim-mismatch[2J"),
        (json.dumps({"error": 7, "message": "a message"}).encode(), "a message"),
        (json.dumps({"error": "\x00\x07", "message": 7}).encode(), "unknown"),
        (b"<html><body>502 Bad Gateway from https://proxy.example</body></html>", "unknown"),
    ],
)
def test_a_refusal_carries_a_short_printable_reason(body: bytes, reason: str) -> None:
    """A refusal may come from a proxy and say anything: its text is not an error message."""
    with serving((502, {}, body)) as server:
        client = SeedkeeperClient(server.url, credentials=CREDENTIALS, timeout=5)
        with pytest.raises(SeedkeeperRefused) as refused:
            client.snapshot_status("widgets")
        assert refused.value.reason == reason
        assert str(refused.value) == f"502 {reason}"


@contextmanager
def answering_raw(answer: bytes) -> Iterator[str]:
    """A server that reads a request and writes `answer` as it is: an answer no HTTP server
    library would write, as a broken proxy might."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_one() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(answer)

    thread = threading.Thread(target=answer_one, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        thread.join(5)


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        (b"NOT-HTTP nonsense\r\n\r\n", "BadStatusLine"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "LineTooLong"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", "IncompleteRead"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "IncompleteRead"),
    ],
)
def test_a_broken_answer_is_no_answer(answer: bytes, cause: str) -> None:
    """Unreachable, as the slot task's retries and the executor expect, not an exception
    of http.client's that no caller handles."""
    with answering_raw(answer) as url, pytest.raises(Unreachable, match=cause):
        signed_call("GET", url, None, credentials=CREDENTIALS, region="us-east-1", timeout=5)


def test_the_credentials_chain_is_resolved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each resolution may be an STS call or a metadata request; botocore's credentials
    refresh themselves."""
    resolved: list[object] = []

    class Session:
        def get_credentials(self) -> Credentials:
            resolved.append(self)
            return CREDENTIALS

    monkeypatch.setattr("seedkeeper_client.client.get_session", Session)
    with serving((200, {}, b"{}")) as server:
        client = SeedkeeperClient(server.url, timeout=5)
        client.healthz()
        client.healthz()
    assert len(resolved) == 1


def test_a_call_to_a_function_given_no_url_says_which() -> None:
    client = SeedkeeperClient({"seed": "https://seed.example"}, credentials=CREDENTIALS)
    with pytest.raises(SeedkeeperError, match="no URL given for the rotation function"):
        client.snapshot_status("widgets")
