"""The local gateway takes two principals, as a deployment does: the slot task role may
invoke only the checkpoint function (template.yaml's SlotTaskRole), and the executor every
other function but that one. A request signed by the other principal is refused exactly as
a bad signature is, and the event names the principal that signed.

The gateway here serves stub handlers (what each route reached, and whom the event named),
so these tests hold the gateway's routing and authentication to account, not the functions.
"""

from __future__ import annotations

import http.client
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from seedkeeper_tools.local import gateway as gateway_module
from seedkeeper_tools.local.gateway import (
    ROUTES,
    TASK_ROLE_ARN,
    FunctionUrlGateway,
    Handler,
    LocalCredentials,
)

REGION = "us-east-1"
EXECUTOR = LocalCredentials("executor-key", secrets.token_hex(16))
TASK = LocalCredentials("store-key", secrets.token_hex(16))
STRANGER = LocalCredentials("stranger-key", secrets.token_hex(16))
EXECUTOR_ROUTES = [
    ("POST", "/seed"),
    ("POST", "/keepalive"),
    ("POST", "/receipt"),
    ("POST", "/slot-evidence"),
    ("POST", "/snapshots"),
    ("GET", "/snapshots/resource-1"),
    ("GET", "/healthz"),
]
TASK_ROUTES = [
    ("POST", "/tasks/start"),
    ("POST", "/checkpoints/upload"),
    ("POST", "/checkpoints/record"),
    ("POST", "/checkpoints/failed"),
]
BODY = json.dumps({"slot": "slot-1"}).encode()


def stub(name: str) -> Handler:
    """Answers which function the request reached and whom the event named as its signer."""

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        answer = {
            "function": name,
            "path": event["rawPath"],
            "iam": event["requestContext"]["authorizer"]["iam"],
        }
        return {"statusCode": 200, "body": json.dumps(answer)}

    return handler


def serve(monkeypatch: pytest.MonkeyPatch, task: LocalCredentials | None) -> FunctionUrlGateway:
    monkeypatch.setattr(gateway_module, "load_handler", stub)
    return FunctionUrlGateway("127.0.0.1", 0, EXECUTOR, task_credentials=task, region=REGION)


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[FunctionUrlGateway]:
    served = serve(monkeypatch, TASK).start()
    try:
        yield served
    finally:
        served.stop()


def send(
    gateway: FunctionUrlGateway, method: str, path: str, credentials: LocalCredentials
) -> tuple[int, bytes]:
    body = BODY if method == "POST" else b""
    request = AWSRequest(method=method, url=gateway.url + path, data=body)
    if body:
        request.headers["Content-Type"] = "application/json"
    key = Credentials(credentials.access_key, credentials.secret_key)
    SigV4Auth(key, "lambda", REGION).add_auth(request)
    host, port = gateway.server_address[:2]
    connection = http.client.HTTPConnection(str(host), int(port), timeout=10)
    try:
        connection.request(method, path, body=body, headers=dict(request.headers.items()))
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_the_checkpoint_function_has_a_route() -> None:
    assert ("/checkpoints", "checkpoint") in ROUTES


@pytest.mark.parametrize(("method", "path"), TASK_ROUTES)
def test_the_task_role_reaches_the_checkpoint_function_and_is_named_in_the_event(
    gateway: FunctionUrlGateway, method: str, path: str
) -> None:
    status, body = send(gateway, method, path, TASK)
    assert status == 200, body
    answer = json.loads(body)
    assert (answer["function"], answer["path"]) == ("checkpoint", path)
    assert answer["iam"]["accessKey"] == TASK.access_key
    assert answer["iam"]["userArn"] == TASK_ROLE_ARN
    assert answer["iam"]["accountId"] == "000000000000"


@pytest.mark.parametrize(("method", "path"), EXECUTOR_ROUTES)
def test_the_executor_reaches_every_other_function_and_is_named_in_the_event(
    gateway: FunctionUrlGateway, method: str, path: str
) -> None:
    status, body = send(gateway, method, path, EXECUTOR)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["function"] != "checkpoint"
    assert answer["iam"]["accessKey"] == EXECUTOR.access_key
    assert answer["iam"]["userArn"] != TASK_ROLE_ARN


@pytest.mark.parametrize(("method", "path"), EXECUTOR_ROUTES)
def test_the_task_role_is_refused_everywhere_else_as_a_bad_signature(
    gateway: FunctionUrlGateway, method: str, path: str
) -> None:
    refused = send(gateway, method, path, TASK)
    assert refused == send(gateway, method, path, STRANGER)
    assert refused == (403, json.dumps({"message": "Forbidden"}).encode())


@pytest.mark.parametrize(("method", "path"), TASK_ROUTES)
def test_the_executor_is_refused_on_the_checkpoint_function_as_a_bad_signature(
    gateway: FunctionUrlGateway, method: str, path: str
) -> None:
    refused = send(gateway, method, path, EXECUTOR)
    assert refused == send(gateway, method, path, STRANGER)
    assert refused == (403, json.dumps({"message": "Forbidden"}).encode())


def test_a_path_no_function_serves_is_found_missing_only_by_the_executor(
    gateway: FunctionUrlGateway,
) -> None:
    assert send(gateway, "GET", "/nowhere", EXECUTOR)[0] == 404
    assert send(gateway, "GET", "/nowhere", TASK)[0] == 403
    # A prefix of a route is not the route.
    assert send(gateway, "POST", "/checkpointsx", TASK)[0] == 403
    assert send(gateway, "POST", "/tasksx/start", TASK)[0] == 403


def test_without_task_credentials_no_one_may_call_the_checkpoint_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = serve(monkeypatch, None).start()
    try:
        for credentials in (EXECUTOR, TASK):
            assert send(served, "POST", "/checkpoints/upload", credentials)[0] == 403
        assert send(served, "POST", "/seed", EXECUTOR)[0] == 200
    finally:
        served.stop()
