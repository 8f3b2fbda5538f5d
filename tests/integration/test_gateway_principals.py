"""The local gateway takes two kinds of principal, as a deployment does: the slot tasks, each
with keys of its own (its session of the task role), may invoke only the checkpoint function
(template.yaml's SlotTaskRole), and the executor every other function but that one. A
request signed by the other principal is refused exactly as a bad signature is, and the
event names the principal that signed: a task by its own session, as Lambda names an ECS
task's.

The gateway here serves stub handlers (what each route reached, and whom the event named),
so these tests hold the gateway's routing and authentication to account, not the functions.
"""

from __future__ import annotations

import http.client
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from seedkeeper.domain.caller import task_id
from seedkeeper_tools.local import gateway as gateway_module
from seedkeeper_tools.local.gateway import ROUTES, FunctionUrlGateway, Handler
from seedkeeper_tools.local.principals import LocalCredentials, TaskKeys, task_session_arn

REGION = "us-east-1"
EXECUTOR = LocalCredentials("executor-key", secrets.token_hex(16))
STRANGER = LocalCredentials("stranger-key", secrets.token_hex(16))
INCARNATION = "local:slot-1:1"
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


def serve(monkeypatch: pytest.MonkeyPatch, task_keys: TaskKeys | None) -> FunctionUrlGateway:
    monkeypatch.setattr(gateway_module, "load_handler", stub)
    return FunctionUrlGateway("127.0.0.1", 0, EXECUTOR, task_keys=task_keys, region=REGION)


@pytest.fixture
def keys(tmp_path: Path) -> TaskKeys:
    return TaskKeys(tmp_path / "data")


@pytest.fixture
def task(keys: TaskKeys) -> LocalCredentials:
    """The keys a local runtime gave the task `INCARNATION`."""
    return keys.issue(INCARNATION)


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch, keys: TaskKeys) -> Iterator[FunctionUrlGateway]:
    served = serve(monkeypatch, keys).start()
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
def test_a_task_reaches_the_checkpoint_function_and_is_named_in_the_event_by_its_session(
    gateway: FunctionUrlGateway, task: LocalCredentials, method: str, path: str
) -> None:
    status, body = send(gateway, method, path, task)
    assert status == 200, body
    answer = json.loads(body)
    assert (answer["function"], answer["path"]) == ("checkpoint", path)
    assert answer["iam"]["accessKey"] == task.access_key
    assert answer["iam"]["userArn"] == task_session_arn(task_id(INCARNATION))
    assert answer["iam"]["userId"] == f"AROALOCALSLOTTASK:{task_id(INCARNATION)}"
    assert answer["iam"]["accountId"] == "000000000000"


def test_each_task_signs_as_its_own_session_and_a_revoked_one_as_nobody(
    gateway: FunctionUrlGateway, keys: TaskKeys
) -> None:
    """Two tasks, two sessions: the checkpoint function tells them apart. A stopped task's
    keys are revoked, as its session's credentials stop being served."""
    first, second = keys.issue("local:slot-1:1"), keys.issue("local:slot-2:1")
    named = {
        json.loads(send(gateway, "POST", "/tasks/start", credentials)[1])["iam"]["userArn"]
        for credentials in (first, second)
    }
    assert named == {task_session_arn(task_id(f"local:slot-{n}:1")) for n in (1, 2)}
    keys.revoke("local:slot-1:1")
    assert send(gateway, "POST", "/tasks/start", first) == send(
        gateway, "POST", "/tasks/start", STRANGER
    )
    assert send(gateway, "POST", "/tasks/start", first)[0] == 403
    # Its keys are its own: the same access key with another secret is a bad signature.
    forged = LocalCredentials(second.access_key, secrets.token_urlsafe(32))
    assert send(gateway, "POST", "/tasks/start", forged)[0] == 403


@pytest.mark.parametrize(("method", "path"), EXECUTOR_ROUTES)
def test_the_executor_reaches_every_other_function_and_is_named_in_the_event(
    gateway: FunctionUrlGateway, method: str, path: str
) -> None:
    status, body = send(gateway, method, path, EXECUTOR)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["function"] != "checkpoint"
    assert answer["iam"]["accessKey"] == EXECUTOR.access_key
    assert ":assumed-role/" not in answer["iam"]["userArn"]


@pytest.mark.parametrize(("method", "path"), EXECUTOR_ROUTES)
def test_the_task_role_is_refused_everywhere_else_as_a_bad_signature(
    gateway: FunctionUrlGateway, task: LocalCredentials, method: str, path: str
) -> None:
    refused = send(gateway, method, path, task)
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
    gateway: FunctionUrlGateway, task: LocalCredentials
) -> None:
    assert send(gateway, "GET", "/nowhere", EXECUTOR)[0] == 404
    assert send(gateway, "GET", "/nowhere", task)[0] == 403
    # A prefix of a route is not the route.
    assert send(gateway, "POST", "/checkpointsx", task)[0] == 403
    assert send(gateway, "POST", "/tasksx/start", task)[0] == 403


def test_without_task_keys_no_one_may_call_the_checkpoint_function(
    monkeypatch: pytest.MonkeyPatch, task: LocalCredentials
) -> None:
    served = serve(monkeypatch, None).start()
    try:
        for credentials in (EXECUTOR, task):
            assert send(served, "POST", "/checkpoints/upload", credentials)[0] == 403
        assert send(served, "POST", "/seed", EXECUTOR)[0] == 200
    finally:
        served.stop()
