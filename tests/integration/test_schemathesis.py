"""Schemathesis against the OpenAPI documents Powertools generates from the handlers' own
resolvers: every answer a handler gives must be one its document declares, with the
declared content type and a body that conforms to the declared schema.

Two ways in. Generated: positive and negative cases for every route, derandomized, each
turned into the function-URL event Lambda builds and handed to the very handler, in
process; no 5xx, ever, and every answer conforms. Real: the stack brought to each answer a
route can give (recorded, seeded, cold, refused, missing, owed, misconfigured) and every
one of them checked against the same document.

The slot runtime is a stand-in that launches nothing (a cold or seeded slot would otherwise
start a process or an ECS task per case); everything else is the real stack: moto for
DynamoDB and R2.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.transport import Response
from schemathesis.generation import GenerationMode
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from builders import NOW, ORIGIN, owner, seed, stored_in
from conftest import Stack
from functions import Context, as_task, event
from seedkeeper import config
from seedkeeper.adapters.runtime import RuntimeSettings, SlotRuntime
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import State
from seedkeeper.domain.runtime import RUNNING, Launch, TaskState, TaskStatus
from seedkeeper.domain.standby import Standby, StandbyPlan, StandbyState
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper.store.standbys import StandbyStore
from seedkeeper_task.capture import upload
from seedkeeper_tools.local.gateway import load_function_module

# Cases per route (positive and negative together). About 12 ms a case on a 2-core
# machine: 11 routes x 1,000 cases take about 130 s.
CASES_PER_ROUTE = 1000

# (function, path, method)
ROUTES = [
    ("seed", "/seed", "POST"),
    ("seed", "/keepalive", "POST"),
    ("receipt", "/receipt", "POST"),
    ("slot_evidence", "/slot-evidence", "POST"),
    ("rotation", "/snapshots", "POST"),
    ("rotation", "/snapshots/{resource}", "GET"),
    ("rotation", "/snapshots/{resource}", "DELETE"),
    ("checkpoint", "/checkpoints/upload", "POST"),
    ("checkpoint", "/checkpoints/record", "POST"),
    ("checkpoint", "/checkpoints/failed", "POST"),
    ("checkpoint", "/tasks/start", "POST"),
    ("checkpoint", "/tasks/record", "POST"),
    ("checkpoint", "/tasks/settle", "POST"),
    ("checkpoint", "/tasks/freeze", "POST"),
    ("checkpoint", "/tasks/thaw", "POST"),
    ("checkpoint", "/tasks/checkpoint-on-stop", "POST"),
    ("checkpoint", "/tasks/park-on-stop", "POST"),
    ("checkpoint", "/tasks/lose", "POST"),
    ("checkpoint", "/tasks/standby", "POST"),
]
# The slot task's record routes (the checkpoint function, its API): each the task's own.
TASK_RECORD_ROUTES = [
    path for function, path, _ in ROUTES if path.startswith("/tasks/") and path != "/tasks/start"
]

# The answer is declared for its route: its status, its content type, its body.
CONFORMANCE = [status_code_conformance, content_type_conformance, response_schema_conformance]


MODULES = {name: load_function_module(name) for name in {function for function, _, _ in ROUTES}}
# Each function's document exactly as Powertools generates it, nothing patched.
DOCUMENTS = {
    name: schemathesis.openapi.from_dict(json.loads(module.app.get_openapi_json_schema()))
    for name, module in MODULES.items()
}


class NoLaunches:
    """A slot runtime that starts nothing: every launch is a running local incarnation."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)

    def launch(self, plan: SlotPlan) -> str:
        return f"local:fuzz:{plan.slot}:{next(self._numbers)}"

    def launch_standby(self, standby: StandbyPlan) -> str:
        return f"local:_standby-{standby.standby}:1"

    def status(self, incarnation: str) -> TaskStatus:
        return TaskStatus.RUNNING

    def statuses(self, incarnations: Sequence[str]) -> dict[str, TaskState]:
        return dict.fromkeys(incarnations, RUNNING)

    def launched_for(self, incarnation: str) -> Launch | None:
        return None  # it launched nothing

    def stop(self, incarnation: str) -> None:
        return None


@pytest.fixture
def no_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = NoLaunches()

    def no_launches(settings: RuntimeSettings) -> SlotRuntime:
        return runtime

    monkeypatch.setattr(config, "runtime_from", no_launches)


BASE_URL = "https://abcdefghij.lambda-url.us-east-1.on.aws"
REQUEST_ARGUMENTS = {"method", "url", "headers", "files", "data", "params", "cookies", "json"}


def prepared(case: Case[Any]) -> requests.PreparedRequest:
    """The HTTP request schemathesis would send for `case`, bytes and all."""
    kwargs = case.as_transport_kwargs(base_url=BASE_URL)
    return requests.Request(
        **{name: value for name, value in kwargs.items() if name in REQUEST_ARGUMENTS}
    ).prepare()


def function_url_event(request: requests.PreparedRequest) -> dict[str, Any]:
    """The payload-2.0 event the function URL builds for `request` (as the local gateway
    builds it: the body decoded as UTF-8, undecodable bytes replaced)."""
    parts = urlsplit(request.url or "")
    body = request.body.encode() if isinstance(request.body, str) else request.body
    assert body is None or isinstance(body, bytes)
    headers = {name.lower(): value for name, value in request.headers.items()}
    headers["host"] = parts.netloc
    built = event(
        "rotation-get",
        rawPath=parts.path,
        rawQueryString=parts.query,
        headers=headers,
        queryStringParameters=dict(parse_qsl(parts.query)) or None,
        body=body.decode("utf-8", errors="replace") if body else None,
    )
    built["requestContext"]["http"] |= {"method": request.method, "path": parts.path}
    return built


def answered(function: str, case: Case[Any]) -> Response:
    """`case` sent to the function's handler as its function URL sends it, and the HTTP
    response the function URL makes of the handler's answer."""
    request = prepared(case)
    started = time.monotonic()
    sent = function_url_event(request)
    if function == "checkpoint":  # signed by the task the body names, as a task signs
        named = case.body.get("incarnation") if isinstance(case.body, dict) else None
        sent = as_task(sent, named if isinstance(named, str) else "local:fuzz:1")
    answer = MODULES[function].lambda_handler(sent, Context())
    status = int(answer["statusCode"])
    return Response(
        status_code=status,
        headers={name: [str(value)] for name, value in (answer.get("headers") or {}).items()},
        content=(answer.get("body") or "").encode(),
        request=request,
        elapsed=time.monotonic() - started,
        verify=True,
        message=HTTPStatus(status).phrase,
    )


@pytest.mark.parametrize(
    ("function", "path", "method"),
    [pytest.param(f, p, m, id=f"{m} {p}") for f, p, m in ROUTES],
)
@pytest.mark.usefixtures("no_launches")
def test_no_server_errors_and_every_answer_conforms(
    stack: Stack, function: str, path: str, method: str
) -> None:
    operation = DOCUMENTS[function][path][method]
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )
    statuses: dict[int, int] = {}

    @settings(
        max_examples=CASES_PER_ROUTE,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(case=cases)
    def fuzz(case: Case[Any]) -> None:
        response = answered(function, case)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        case.validate_response(response, checks=[not_a_server_error, *CONFORMANCE])

    fuzz()
    print(f"{method} {path}: {sum(statuses.values())} cases, statuses {sorted(statuses.items())}")
    assert sum(statuses.values()) >= CASES_PER_ROUTE
    assert not any(status >= 500 for status in statuses)


# One resource's snapshots.
NAMED = "/snapshots/{resource}"

# Declared, and real, but not brought about below: a throttled store (a 503 everywhere, see
# test_faults.py) and a teardown that loses to a concurrent rotation (a 409).
NOT_BROUGHT_ABOUT = {
    ("seed", "POST", "/keepalive", 503),
    ("receipt", "POST", "/receipt", 503),
    ("slot_evidence", "POST", "/slot-evidence", 503),
    ("rotation", "POST", "/snapshots", 503),
    ("rotation", "GET", NAMED, 503),
    ("rotation", "DELETE", NAMED, 409),
    ("checkpoint", "POST", "/checkpoints/failed", 503),  # it needs no R2: a throttled store
    *(("checkpoint", "POST", path, 503) for path in TASK_RECORD_ROUTES),  # the same
}


def task_record_requests(lifecycle: Lifecycle, incarnation: str) -> dict[str, dict[str, Any]]:
    """A request of each record route, by the task `incarnation` of a slot it names."""
    record = stored_in(lifecycle, "task-own", State.CHECKPOINTING, incarnation)
    (restore,) = [e for e in record.window.entries if e.kind is OpKind.RESTORE]
    (checkpoint,) = [e for e in record.window.entries if e.kind is OpKind.CHECKPOINT]
    own = {"slot": record.slot, "incarnation": incarnation}
    attempt = own | {"attempt": record.attempt}
    op = {"ordinal": checkpoint.ordinal, "generation": checkpoint.generation}
    failed = {"outcome": "failed", "reason": "seed-failed", "step": "extract", "detail": ""}
    return {
        "/tasks/record": own | {"consistent": True},
        "/tasks/settle": attempt
        | {"restore": {"ordinal": restore.ordinal, "generation": 1}, "result": failed},
        "/tasks/freeze": attempt | {"op": op},
        "/tasks/thaw": attempt | {"op": op},
        "/tasks/checkpoint-on-stop": attempt,
        "/tasks/park-on-stop": attempt,
        "/tasks/lose": own | {"reason": "task-stopped", "detail": "a test"},
    }


def body_of(name: str) -> Any:
    """The JSON body of events/<name>.json."""
    return json.loads(event(name)["body"])


@pytest.mark.usefixtures("no_launches")
def test_every_real_answer_conforms_to_the_generated_document(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The stack brought to each answer a route gives: every one conforms to the document,
    and the document declares nothing else (but what `NOT_BROUGHT_ABOUT` names)."""
    answers: set[tuple[str, str, str, int]] = set()

    def send(function: str, method: str, path: str, status: int, **request: Any) -> Any:
        case = DOCUMENTS[function][path][method].Case(**request)
        response = answered(function, case)
        assert response.status_code == status, response.content
        case.validate_response(response, checks=CONFORMANCE)
        answers.add((function, method, path, status))
        return response.json()

    not_json = {"body": "slot=1", "media_type": "text/plain"}
    for function in MODULES:
        send(function, "GET", "/healthz", 200)
        send(function, "GET", "/healthz", 415, **not_json)

    snapshot = body_of("rotation-post")
    resource = {"resource": snapshot["resource"]}
    impostor = snapshot | {"checkout": snapshot["checkout"] | {"size": 7}}
    send("rotation", "POST", "/snapshots", 201, body=snapshot)
    send("rotation", "POST", "/snapshots", 200, body=snapshot)
    send("rotation", "POST", "/snapshots", 409, body=impostor)
    send("rotation", "POST", "/snapshots", 400, body=snapshot | {"sha": "HEAD"})
    send("rotation", "POST", "/snapshots", 415, **not_json)
    send("rotation", "GET", NAMED, 200, path_parameters=resource)
    for method in ("GET", "DELETE"):
        send("rotation", method, NAMED, 400, path_parameters={"resource": ".git"})
        send("rotation", method, NAMED, 415, path_parameters=resource, **not_json)

    seeding = send("seed", "POST", "/seed", 202, body=body_of("seed-new"))
    send("seed", "POST", "/seed", 409, body=body_of("seed-other-owner"))
    send("seed", "POST", "/seed", 200, body=body_of("seed-cold"))
    unrecorded = body_of("seed-new") | {"slot": "unrecorded-slot"}
    unrecorded["seed"]["checkout_backup_id"] = "never-published"
    assert send("seed", "POST", "/seed", 200, body=unrecorded)["reason"] == "seed-missing"
    send("seed", "POST", "/seed", 400, body=body_of("seed-bad-ref"))
    send("seed", "POST", "/seed", 415, **not_json)
    seeded = stored_in(Lifecycle(stack.table), "seeded-slot", State.SEEDED)
    claim, identity = owner().model_dump(), seed().model_dump()
    again = {"slot": seeded.slot, "seed": identity, "claim": claim, "origin": ORIGIN}
    assert send("seed", "POST", "/seed", 200, body=again)["from"] == "checkout-0001"
    # A resume whose checkpoint R2 does not hold: the work is gone, said so (200).
    parked = stored_in(Lifecycle(stack.table), "parked-slot", State.PARKED)
    resume = again | {"slot": parked.slot}
    assert send("seed", "POST", "/seed", 200, body=resume)["step"] == "resume"

    kept = {"slot": seeded.slot, "claim": claim}
    assert send("seed", "POST", "/keepalive", 200, body=kept)["state"] == "seeded"
    send("seed", "POST", "/keepalive", 409, body=kept | {"claim": None})
    send("seed", "POST", "/keepalive", 400, body=kept | {"seed": identity})
    send("seed", "POST", "/keepalive", 415, **not_json)

    receipt = body_of("receipt") | {"incarnation": seeding["incarnation"]}
    send("receipt", "POST", "/receipt", 200, body=receipt)
    send("receipt", "POST", "/receipt", 404, body=body_of("receipt"))
    send("receipt", "POST", "/receipt", 400, body=receipt | {"incarnation": "pid:1"})
    send("receipt", "POST", "/receipt", 415, **not_json)

    send("slot_evidence", "POST", "/slot-evidence", 200, body=body_of("slot-evidence"))
    send("slot_evidence", "POST", "/slot-evidence", 404, body=body_of("slot-evidence-wrong-claim"))
    send("slot_evidence", "POST", "/slot-evidence", 400, body={"slot": "x"})
    send("slot_evidence", "POST", "/slot-evidence", 415, **not_json)

    # A slot task's checkpoint: nothing uploaded yet, the upload granted and made, recorded.
    lifecycle = stack.store.lifecycle()
    routes = ("/checkpoints/upload", "/checkpoints/record", "/checkpoints/failed")
    captured = body_of("checkpoint-upload") | {"slot": "checkpointing-1"}
    incarnation = captured["incarnation"]  # an ECS task ARN
    stored_in(lifecycle, "checkpointing-1", State.CHECKPOINTING, incarnation)
    send("checkpoint", "POST", "/checkpoints/record", 409, body=captured)  # no object yet
    grant = send("checkpoint", "POST", "/checkpoints/upload", 200, body=captured)
    body = tmp_path / "checkpoint.sqsh"
    body.write_bytes(bytes(captured["size"]))  # the event's sha256 and md5 are of these
    headers = {k: v for k, v in grant["headers"].items() if k.lower() != "content-length"}
    upload(grant["url"], body, headers, size=captured["size"], timeout=30)
    send("checkpoint", "POST", "/checkpoints/record", 200, body=captured)
    send("checkpoint", "POST", "/checkpoints/upload", 409, body=captured)  # recorded: closed
    not_taken = body_of("checkpoint-failed") | {"slot": "checkpointing-2"}
    stored_in(lifecycle, "checkpointing-2", State.CHECKPOINTING, incarnation)
    send("checkpoint", "POST", "/checkpoints/failed", 200, body=not_taken)
    send("checkpoint", "POST", "/checkpoints/failed", 409, body=not_taken)
    for path, request in zip(routes, (captured, captured, not_taken), strict=True):
        stranger = request | {"incarnation": incarnation.replace("0123", "9999")}
        send("checkpoint", "POST", path, 403, body=stranger)
        send("checkpoint", "POST", path, 400, body=request | {"op": {"ordinal": 0}})
        send("checkpoint", "POST", path, 415, **not_json)
    # A slot task's start: a cold slot's task (no URL), another task, a seed no generation
    # names any more (never presigned).
    started = body_of("task-start") | {"slot": "starting-1"}
    stored_in(lifecycle, "starting-1", State.UNSEEDED, started["incarnation"])
    send("checkpoint", "POST", "/tasks/start", 200, body=started)
    another_task = started | {"incarnation": incarnation.replace("0123", "9999")}
    send("checkpoint", "POST", "/tasks/start", 403, body=another_task)
    unrecorded = started | {"slot": "starting-2"}
    stored_in(lifecycle, "starting-2", State.SEEDING, started["incarnation"])
    send("checkpoint", "POST", "/tasks/start", 409, body=unrecorded)
    send("checkpoint", "POST", "/tasks/start", 400, body=started | {"attempt": 0})
    send("checkpoint", "POST", "/tasks/start", 415, **not_json)
    # The task's record, read and written through its API, for itself alone.
    tasks = task_record_requests(lifecycle, incarnation)
    for path, request in tasks.items():
        send("checkpoint", "POST", path, 200, body=request)
        stranger = request | {"incarnation": incarnation.replace("0123", "9999")}
        send("checkpoint", "POST", path, 403, body=stranger)
        send("checkpoint", "POST", path, 400, body=request | {"slot": "../x"})
        send("checkpoint", "POST", path, 415, **not_json)
    # A standby's ask: its own item (reported in: free), anyone else's refused.
    standby = Standby(
        standby="5" * 32, state=StandbyState.STARTING, launched_at=NOW, retire_at=NOW + 3600
    )
    standbys = StandbyStore(stack.table)
    assert standbys.register(standby)
    assert standbys.launched(standby, incarnation)
    asked = {"standby": standby.standby, "incarnation": incarnation}
    assert send("checkpoint", "POST", "/tasks/standby", 200, body=asked)["state"] == "free"
    stranger = asked | {"incarnation": incarnation.replace("0123", "9999")}
    send("checkpoint", "POST", "/tasks/standby", 403, body=stranger)
    send("checkpoint", "POST", "/tasks/standby", 400, body=asked | {"standby": "../x"})
    send("checkpoint", "POST", "/tasks/standby", 415, **not_json)
    unconfigured = captured | {"slot": "checkpointing-3"}
    stored_in(lifecycle, "checkpointing-3", State.CHECKPOINTING, incarnation)
    monkeypatch.delenv("SEEDKEEPER_R2_BUCKET")
    for path in routes[:2]:
        send("checkpoint", "POST", path, 503, body=unconfigured)
    send("checkpoint", "POST", "/tasks/start", 503, body=unrecorded)

    # R2 refuses every deletion: the records are gone, the objects owed, the DELETE retried.
    bucket = stack.r2_settings.bucket or ""
    monkeypatch.setenv("SEEDKEEPER_R2_BUCKET", f"{bucket}-gone")
    send("seed", "POST", "/seed", 503, body=resume)  # no bucket: never a lost checkpoint
    owed = send("rotation", "DELETE", NAMED, 503, path_parameters=resource)
    assert len(owed["pending"]) == 2
    monkeypatch.setenv("SEEDKEEPER_R2_BUCKET", bucket)
    send("rotation", "DELETE", NAMED, 200, path_parameters=resource)
    send("rotation", "DELETE", NAMED, 404, path_parameters=resource)
    send("rotation", "GET", NAMED, 404, path_parameters=resource)

    # A table that is not there: every store error is a 500 that says nothing more.
    monkeypatch.setenv("SEEDKEEPER_TABLE", "no-such-table")
    send("seed", "POST", "/seed", 500, body=body_of("seed-cold"))
    send("seed", "POST", "/keepalive", 500, body=kept)
    send("receipt", "POST", "/receipt", 500, body=receipt)
    send("slot_evidence", "POST", "/slot-evidence", 500, body=body_of("slot-evidence"))
    send("rotation", "POST", "/snapshots", 500, body=snapshot)
    send("rotation", "GET", NAMED, 500, path_parameters=resource)
    send("rotation", "DELETE", NAMED, 500, path_parameters=resource)
    for path, request in zip(routes, (captured, captured, not_taken), strict=True):
        send("checkpoint", "POST", path, 500, body=request)
    send("checkpoint", "POST", "/tasks/start", 500, body=started)
    for path, request in tasks.items():
        send("checkpoint", "POST", path, 500, body=request)
    send("checkpoint", "POST", "/tasks/standby", 500, body=asked)

    declared = {
        (function, method.upper(), path, int(status))
        for function, document in DOCUMENTS.items()
        for path, operations in document.raw_schema["paths"].items()
        for method, operation in operations.items()
        for status in operation["responses"]
    }
    assert declared - answers == NOT_BROUGHT_ABOUT


def test_no_document_declares_a_422_or_a_bare_string() -> None:
    """Invalid input is a 400 `ErrorAnswer`: no route answers Powertools' 422, and no body
    is a bare string (what `Response[str]` alone would document)."""
    unsent = {"HTTPValidationError", "ValidationError", "ResponseValidationError"}
    for document in DOCUMENTS.values():
        raw = document.raw_schema
        assert not unsent & set(raw["components"]["schemas"])
        for operations in raw["paths"].values():
            for operation in operations.values():
                assert "422" not in operation["responses"]
                for declared in operation["responses"].values():
                    schema = declared["content"]["application/json"]["schema"]
                    assert schema != {"type": "string"}
