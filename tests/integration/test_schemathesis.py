"""Schemathesis against the OpenAPI documents Powertools generates from the handlers' own
resolvers: positive and negative cases for every route, derandomized, each turned into the
function-URL event Lambda builds and handed to the very handler, in process.

Checks: no 5xx, ever; every refusal the document declares (400, the `ErrorAnswer` every
handler answers for invalid input) conforms to its schema. The slot runtime is a stand-in
that launches nothing (a cold or seeded slot would otherwise start a process or an ECS
task per case); everything else is the real stack: moto for DynamoDB and R2.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import time
from http import HTTPStatus
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
from schemathesis.specs.openapi.checks import response_schema_conformance

from conftest import Stack
from functions import Context, event
from seedkeeper import config
from seedkeeper.http import ErrorAnswer
from seedkeeper.infra import FUNCTIONS
from seedkeeper.plan import SlotPlan
from seedkeeper.runtime import RuntimeSettings, SlotRuntime, TaskStatus

# Cases per route (positive and negative together). About 12 ms a case on a 2-core
# machine: 6 routes x 1,000 cases take about 75 s.
CASES_PER_ROUTE = 1000

# (function, path, method)
ROUTES = [
    ("seed", "/seed", "POST"),
    ("receipt", "/receipt", "POST"),
    ("slot_evidence", "/slot-evidence", "POST"),
    ("rotation", "/snapshots", "POST"),
    ("rotation", "/snapshots/{resource}", "GET"),
    ("rotation", "/snapshots/{resource}", "DELETE"),
]


def load_app(name: str) -> Any:
    """functions/<name>/app.py's resolver, loaded as the local gateway loads the module."""
    spec = importlib.util.spec_from_file_location(
        f"seedkeeper_functions.{name}", FUNCTIONS / name / "app.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULES = {name: load_app(name) for name in {function for function, _, _ in ROUTES}}


def declared_document(name: str) -> dict[str, Any]:
    """The generated document, its responses replaced by what every handler declares for
    invalid input: 400 with an `ErrorAnswer`. Powertools documents each 200 as a string
    (the handlers return `Response[str]`) and a 422 nobody answers: see
    `test_the_generated_document_misdescribes_every_answer`."""
    document: dict[str, Any] = json.loads(MODULES[name].app.get_openapi_json_schema())
    error = ErrorAnswer.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(error.pop("$defs", {}))
    schemas["ErrorAnswer"] = error
    refusal = {
        "description": "invalid request",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorAnswer"}}},
    }
    for operations in document["paths"].values():
        for operation in operations.values():
            operation["responses"] = {"400": refusal}
    return document


class NoLaunches:
    """A slot runtime that starts nothing: every launch is a running local incarnation."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)

    def launch(self, plan: SlotPlan) -> str:
        return f"local:fuzz:{plan.slot}:{next(self._numbers)}"

    def status(self, incarnation: str) -> TaskStatus:
        return TaskStatus.RUNNING

    def stop(self, incarnation: str) -> None:
        return None


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


def as_response(
    request: requests.PreparedRequest, answer: dict[str, Any], elapsed: float
) -> Response:
    """The handler's answer as the HTTP response the function URL sends."""
    status = int(answer["statusCode"])
    return Response(
        status_code=status,
        headers={name: [str(value)] for name, value in (answer.get("headers") or {}).items()},
        content=(answer.get("body") or "").encode(),
        request=request,
        elapsed=elapsed,
        verify=True,
        message=HTTPStatus(status).phrase,
    )


@pytest.mark.parametrize(
    ("function", "path", "method"),
    [pytest.param(f, p, m, id=f"{m} {p}") for f, p, m in ROUTES],
)
def test_no_server_errors_and_declared_refusals(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, function: str, path: str, method: str
) -> None:
    runtime = NoLaunches()

    def no_launches(settings: RuntimeSettings) -> SlotRuntime:
        return runtime

    monkeypatch.setattr(config, "runtime_from", no_launches)
    schema = schemathesis.openapi.from_dict(declared_document(function))
    operation = schema[path][method]
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )
    handler = MODULES[function].lambda_handler
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
        request = prepared(case)
        started = time.monotonic()
        answer = handler(function_url_event(request), Context())
        response = as_response(request, answer, time.monotonic() - started)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    fuzz()
    print(f"{method} {path}: {sum(statuses.values())} cases, statuses {sorted(statuses.items())}")
    assert sum(statuses.values()) >= CASES_PER_ROUTE
    assert not any(status >= 500 for status in statuses)


@pytest.mark.xfail(
    strict=True,
    reason="Powertools documents every 200 as {'type': 'string'} (handlers return "
    "Response[str]) and a 422 HTTPValidationError no handler answers; every real 200 "
    "answer (a JSON object) violates the generated document",
)
def test_the_generated_document_misdescribes_every_answer(stack: Stack) -> None:
    schema = schemathesis.openapi.from_dict(
        json.loads(MODULES["rotation"].app.get_openapi_json_schema())
    )
    case = schema["/healthz"]["GET"].Case()
    request = prepared(case)
    answer = MODULES["rotation"].lambda_handler(function_url_event(request), Context())
    assert answer["statusCode"] == 200
    case.validate_response(as_response(request, answer, 0.0), checks=[response_schema_conformance])
