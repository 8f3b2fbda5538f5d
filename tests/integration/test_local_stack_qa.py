"""What an external QA pass found wrong with `seedkeeper local`, each held to account over
the stack as a user runs it: the gateway never rewrites a body's bytes, authenticates every
method (an unknown one too) and answers a path no function serves in the functions' one
error body; the idle sweep's log lines are its own, beside the functions' invocations; a
data directory is one stack's at a time; a sweep interval of (almost) no time is refused."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from conftest import running_local_stack
from seedkeeper.config import StoreSettings
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.observability import logger
from seedkeeper.services.sweep import Report
from seedkeeper_client import Cold, SeedkeeperClient
from seedkeeper_tools.local import stack as stack_module
from seedkeeper_tools.local.gateway import REQUEST_TIMEOUT
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.stack import REGION, LocalStack, LocalStackRefused

SEEDKEEPER = str(Path(sys.executable).with_name("seedkeeper"))
NOT_FOUND: dict[str, Any] = {"error": "not-found", "detail": None, "fields": []}
UNKNOWN_METHODS = ["TRACE", "CONNECT", "FOO", "PROPFIND"]


@pytest.fixture
def stack(tmp_path: Path, aws_credentials: None) -> Iterator[LocalStack]:
    with running_local_stack(tmp_path) as local:
        yield local


def signed(stack: LocalStack, method: str, path: str, body: bytes = b"") -> list[tuple[str, str]]:
    """The headers an executor signs for this request (SigV4, service lambda)."""
    request = AWSRequest(method=method, url=stack.url + path, data=body)
    if body:
        request.headers["Content-Type"] = "application/json"
    credentials = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    SigV4Auth(credentials, "lambda", REGION).add_auth(request)
    host = stack.url.removeprefix("http://")
    return [("Host", host), *request.headers.items(), ("Content-Length", str(len(body)))]


def exchange(
    stack: LocalStack, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """The request written as given to a raw socket (no client library tidies it up), and
    the answer read until the gateway closes: status, headers (lower-cased), body."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{name}: {value}" for name, value in headers)]
    request = "\r\n".join([*lines, "Connection: close", "", ""]).encode("latin-1") + body
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT + 5) as connection:
        connection.sendall(request)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    head, _, answer = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    answered = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in header_lines)
    }
    return int(status_line.split()[1]), answered, answer


def records() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (
        StoreSettings().table_resource().scan(ConsistentRead=True)["Items"]
    )
    return items


# 1. A body that is not UTF-8 reaches the function as Lambda delivers it (base64), and the
# function refuses it: never rewritten, so two byte strings never become one owner claim.


@pytest.mark.parametrize("run", [b"\xff", b"\xfe", b"r\xc3", b"\xed\xa0\x80"])
def test_a_claim_that_is_not_utf8_is_refused_as_the_body_and_writes_nothing(
    stack: LocalStack, run: bytes
) -> None:
    claim = {
        "run": "RUN",
        "requester": "someone",
        "thread": "t-1",
        "repository": "acme/widgets",
        "ref": "main",
        "head": "3f786850e387550fdab836ed7e6dc881de23001b",
    }
    text = json.dumps({"slot": "slot-1", "seed": None, "claim": claim})
    body = text.encode().replace(b"RUN", run)
    sent = signed(stack, "POST", "/seed", body)
    status, headers, answer = exchange(stack, "POST", "/seed", sent, body)
    assert status == 400, answer
    assert headers["content-type"] == "application/json"
    refused = json.loads(answer)
    assert refused["error"] == "invalid-request"
    assert [field["field"] for field in refused["fields"]] == ["body"]
    assert records() == []


# 2. Every method is authenticated first; signed, an unknown one is the function's 405.


@pytest.mark.parametrize("method", UNKNOWN_METHODS)
def test_an_unknown_method_unsigned_is_refused_by_authentication_in_json(
    stack: LocalStack, method: str
) -> None:
    host = stack.url.removeprefix("http://")
    status, headers, body = exchange(stack, method, "/seed", [("Host", host)])
    assert (status, headers.get("content-type")) == (403, "application/json"), body
    assert json.loads(body) == {"message": "Forbidden"}


@pytest.mark.parametrize("method", UNKNOWN_METHODS)
def test_an_unknown_method_signed_is_the_functions_405_naming_what_the_path_serves(
    stack: LocalStack, method: str
) -> None:
    status, headers, body = exchange(stack, method, "/seed", signed(stack, method, "/seed"))
    assert (status, headers.get("allow")) == (405, "POST"), body
    assert headers.get("content-type") == "application/json"
    assert json.loads(body)["error"] == "method-not-allowed"


# 3. A path no function serves: the 404 a function gives a path it does not serve.


@pytest.mark.parametrize("path", ["/nope", "/SEED", "/seed;x", "/seed%00", "/seedx"])
def test_a_path_no_function_serves_is_the_functions_own_404(stack: LocalStack, path: str) -> None:
    # What a function answers for a path it does not serve, reached through its route.
    served = exchange(stack, "GET", "/seed/nope", signed(stack, "GET", "/seed/nope"))
    assert (served[0], json.loads(served[2])) == (404, NOT_FOUND)
    status, headers, body = exchange(stack, "GET", path, signed(stack, "GET", path))
    assert (status, headers.get("content-type"), json.loads(body)) == (
        404,
        "application/json",
        NOT_FOUND,
    )


# 5. The idle sweep's log lines are its own, however the functions' invocations interleave
# with it (Powertools' logger keys are process-wide).


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What Seedkeeper's logger writes from now on (its handler keeps the stream it was
    built with, which no capture fixture replaces)."""
    handler = logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    written = io.StringIO()
    monkeypatch.setattr(handler, "stream", written)
    return written


def test_the_sweeps_log_lines_name_the_idle_sweep_function(
    stack: LocalStack, logged: io.StringIO
) -> None:
    # Given a function invoked just before (Powertools' logger keys are process-wide)
    status, _, body = exchange(stack, "GET", "/healthz", signed(stack, "GET", "/healthz"))
    assert status == 200, body
    logged.truncate(0)
    logged.seek(0)
    # When the stack sweeps
    stack.sweep()
    # Then every line the sweep logs names the idle sweep, none the function before it
    lines = [json.loads(line) for line in logged.getvalue().splitlines()]
    done = [line for line in lines if line["message"] == "sweep done"]
    assert len(done) == 1, lines
    assert {line.get("function_name") for line in lines} == {"seedkeeper-idle_sweep"}


def test_an_invocation_during_a_sweep_logs_as_its_function_and_the_sweep_as_its_own(
    stack: LocalStack, logged: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a sweep that a function's invocation interrupts (in AWS each runs in its own
    # execution environment: they may overlap), then logs
    class Sweeper:
        def sweep(self) -> Report:
            status, _, body = exchange(
                stack, "GET", "/seed/nope", signed(stack, "GET", "/seed/nope")
            )
            assert status == 404, body
            logger.info("swept")
            return Report()

    monkeypatch.setattr(stack_module, "sweeper_from_env", Sweeper)
    # When the stack sweeps
    stack.sweep()
    # Then the function's lines name it, and the sweep's, after it, still the idle sweep
    lines = {
        line["message"]: line.get("function_name")
        for line in map(json.loads, logged.getvalue().splitlines())
    }
    assert lines == {"request refused": "seedkeeper-seed", "swept": "seedkeeper-idle_sweep"}


# 6. A data directory is one stack's at a time.


def local_command(data_dir: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """`seedkeeper local` as a user runs it, expected to refuse at once."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDKEEPER_", "AWS_"))}
    command = [SEEDKEEPER, "local", "--port", "0", "--data-dir", str(data_dir), *arguments]
    return subprocess.run(
        command,
        env=clean | {"COLUMNS": "1000"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_second_stack_on_a_data_directory_refuses_to_start_and_leaves_the_first_alone(
    stack: LocalStack,
) -> None:
    # Given a stack with a slot task running
    credentials = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    client = SeedkeeperClient(stack.url, credentials=credentials)
    assert isinstance(client.seed("cold-1", None), Cold)
    incarnation = "local:cold-1:1"
    assert stack.runtime.status(incarnation) is TaskStatus.RUNNING
    # When another stack is started on its data directory, in this process or as a command
    with pytest.raises(LocalStackRefused, match="another") as refused:
        LocalStack(data_dir=stack.data_dir, port=0, credentials=stack.credentials).start()
    assert str(stack.data_dir) in str(refused.value)
    ran = local_command(stack.data_dir, "--sweep-interval", "3600")
    # Then each refuses at once, naming the folder, without a traceback
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert str(stack.data_dir) in ran.stdout
    assert "Traceback" not in ran.stdout + ran.stderr
    # And the first stack's task and workspace are as they were
    assert stack.runtime.status(incarnation) is TaskStatus.RUNNING
    assert stack.workspace("cold-1").is_dir()


def test_a_stopped_stack_leaves_its_data_directory_to_the_next(
    tmp_path: Path, aws_credentials: None
) -> None:
    with running_local_stack(tmp_path):
        pass
    with running_local_stack(tmp_path) as again:
        assert again.url.startswith("http://")


# 7. A sweep interval of (almost) no time would sweep back to back: refused.


@pytest.mark.parametrize("interval", [0.0, -1.0, 0.5, float("nan"), float("inf")])
def test_a_sweep_interval_below_a_second_is_refused_naming_the_option(
    tmp_path: Path, interval: float
) -> None:
    with pytest.raises(LocalStackRefused, match="--sweep-interval"):
        LocalStack(
            data_dir=tmp_path / "data",
            credentials=LocalCredentials("k", "s"),
            sweep_interval=interval,
        )


def test_the_local_command_refuses_a_sweep_interval_of_zero_without_a_traceback(
    tmp_path: Path,
) -> None:
    ran = local_command(tmp_path / "data", "--sweep-interval", "0")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "--sweep-interval" in ran.stdout
    assert "Traceback" not in ran.stdout + ran.stderr
