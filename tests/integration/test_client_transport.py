"""The signed transport the executor's client and the slot task share, against a hostile
or broken endpoint: a signed request never goes anywhere but where it was signed for, and
an answer that is not one is refused, naming no URL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.credentials import Credentials

from seedkeeper_client import BadAnswer, SeedkeeperClient, SeedkeeperError, SeedkeeperRefused
from seedkeeper_client.transport import MAX_ANSWER_BYTES, AnswerTooLarge, signed_call

CREDENTIALS = Credentials("AKIDEXAMPLE", "secret", "session-token-never-forwarded")


class Recorder(ThreadingHTTPServer):
    def __init__(self, answer: tuple[int, dict[str, str], bytes]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answer = answer
        self.seen: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def _answer(self) -> None:
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})
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


def serving(answer: tuple[int, dict[str, str], bytes]) -> Iterator[Recorder]:
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
    yield from serving((200, {"Content-Type": "application/json"}, b"{}"))


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_redirect_is_refused_and_the_signed_headers_go_nowhere(
    elsewhere: Recorder, status: int, method: str
) -> None:
    for redirecting in serving((status, {"Location": elsewhere.url + "/collect"}, b"")):
        answered, _ = signed_call(
            method,
            redirecting.url + "/seed",
            {"slot": "s"} if method == "POST" else None,
            credentials=CREDENTIALS,
            region="us-east-1",
            timeout=5,
        )
        assert answered == status  # the redirect itself is the answer: a refusal
        assert len(redirecting.seen) == 1
    assert elsewhere.seen == []


def test_a_redirected_call_is_a_refusal_to_the_client(elsewhere: Recorder) -> None:
    for redirecting in serving((302, {"Location": elsewhere.url}, b"")):
        client = SeedkeeperClient(redirecting.url, credentials=CREDENTIALS, timeout=5)
        with pytest.raises(SeedkeeperRefused) as refused:
            client.snapshot_status("widgets")
        assert refused.value.status == 302
        assert redirecting.url not in str(refused.value)
    assert elsewhere.seen == []


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
    for server in serving((200, {"Content-Type": "application/json"}, body)):
        client = SeedkeeperClient(server.url, credentials=CREDENTIALS, timeout=5)
        with pytest.raises(BadAnswer, match=said):
            client.seed("slot-1", None)


@pytest.mark.parametrize("status", [200, 500])
def test_an_answer_longer_than_a_function_url_sends_is_not_read_whole(status: int) -> None:
    for server in serving((status, {}, b"x" * (MAX_ANSWER_BYTES + 1))):
        with pytest.raises(AnswerTooLarge):
            signed_call(
                "GET", server.url, None, credentials=CREDENTIALS, region="us-east-1", timeout=5
            )


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "data:,{}"])
def test_only_an_http_url_is_called(url: str) -> None:
    with pytest.raises(ValueError, match="https://"):
        signed_call("GET", url, None, credentials=CREDENTIALS, region="us-east-1", timeout=5)


def test_a_call_to_a_function_given_no_url_says_which() -> None:
    client = SeedkeeperClient({"seed": "https://seed.example"}, credentials=CREDENTIALS)
    with pytest.raises(SeedkeeperError, match="no URL given for the rotation function"):
        client.snapshot_status("widgets")
