"""Hostile input at every function URL, invoked in-process as Lambda would: ids with path
separators, `..`, control characters, Unicode look-alikes and 10 KB strings; origins with
credentials or the wrong scheme; bodies that are not JSON objects; wrong content types.

Every answer is a clear 4xx naming the offending field where it is knowable, never a 5xx,
and nothing is written: the table stays empty and the snapshot is never recorded. Bodies
over 256 KiB are refused by the function-URL gateway (413), checked over HTTP at the end.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from pydantic import BaseModel

from conftest import Stack, running_local_stack
from functions import Context, event, invoke, load_function
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.config import StoreSettings
from seedkeeper.domain.snapshots import NewSnapshot
from seedkeeper.services.receipts import EvidenceRequest, ReceiptRequest
from seedkeeper.services.seed import SeedRequest
from seedkeeper_tools.local.gateway import MAX_BODY
from seedkeeper_tools.local.stack import LocalStack

HANDLERS = {name: load_function(name) for name in ("seed", "receipt", "slot_evidence", "rotation")}

TEN_KB = 10 * 1024

# Names that become keys, object names and folders (slot, resource, backup ids).
HOSTILE_IDS: list[Any] = [
    "",
    ".",
    "..",
    "../etc/passwd",
    "a/b",
    "/abs",
    "a\\b",
    "..\\x",
    "-rf",
    ".hidden",
    "a b",
    "a%2Fb",
    "a\x00b",
    "a\nb",
    "a\rb",
    "a\tb",
    "a\x1b[31m",
    "a\x7f",
    "a\u200bb",  # zero-width space
    "a\u202eb",  # right-to-left override
    "\u0455lot",  # Cyrillic s
    "slot\uff0f1",  # fullwidth solidus
    "slot\u22151",  # division slash
    "\uff53\uff4c\uff4f\uff54",  # fullwidth "slot"
    "x" * 129,
    "x" * TEN_KB,
    7,
    True,
    [],
    {},
]

# Commit object names (sha, head, fetch_sha).
GOOD_SHA = "3f786850e387550fdab836ed7e6dc881de23001b"
HOSTILE_SHAS: list[Any] = [
    "",
    "..",
    GOOD_SHA.upper(),
    GOOD_SHA[:12],
    GOOD_SHA + "0",
    "g" * 40,
    GOOD_SHA + "\n",
    "../" + GOOD_SHA[3:],
    "\u0430" + GOOD_SHA[1:],  # Cyrillic a
    "\uff13" + GOOD_SHA[1:],  # fullwidth 3
    "x" * TEN_KB,
    7,
]

# Branch names (ref, fetch_ref, claim.ref).
HOSTILE_REFS: list[Any] = [
    "",
    "..",
    "a..b",
    "../main",
    "/main",
    "main/",
    "a//b",
    "a\\b",
    "main.lock",
    "-main",
    ".main",
    "a/.b",
    "HEAD",
    "a\x00b",
    "a\nb",
    "a\x7fb",
    "a b",
    "a~b",
    "a^b",
    "a:b",
    "a?b",
    "a*b",
    "a[b",
    "a@{b",
    "main.",
    "x" * TEN_KB,
    7,
]

# The owner claim's free text (run, requester, thread, repository): one printable line.
HOSTILE_TEXT: list[Any] = [
    "",
    "a\x00b",
    "a\nb",
    "a\rb",
    "a\tb",
    "\x1b[31mred",
    "a\x7f",
    "a\x85b",  # NEL, a C1 control
    "a\u2028b",  # line and paragraph separators: a second line
    "a\u2029b",
    "run-1\u202e1-nur",  # bidi overrides, isolates and marks: text that reads as other text
    "a\u2066b\u2069",
    "a\u200fb",
    "x" * 257,
    "x" * TEN_KB,
    7,
    None,
    [],
]

HOSTILE_ORIGINS: list[Any] = [
    "https://u:p@h/r.git",
    "https://u@h/r.git",
    "https://:p@h/r.git",
    "file:///etc",
    "file:///etc/passwd",
    "ssh://git@h/r",
    "git@h:r.git",
    "http://h/r",
    "ftp://h/r",
    "javascript:alert(1)",
    "https://h/r?token=x",
    "https://h/r#f",
    "https:///r",
    "https://h:99999/r",
    "https://h/r\n",
    "https://h/r\x00",
    "https://h/ r",
    "https://h\\@evil/r",
    "https://h/" + "x" * TEN_KB,
    "",
    "..",
    "/etc/passwd",
    7,
]

HOSTILE_INCARNATIONS: list[Any] = [
    "",
    "local:",
    "local:../x",
    "local:a/b",
    "local:a\nb",
    "local:\u0455",
    "arn:aws:ecs:us-east-1:123:task/x",
    "arn:aws:ecs:us-east-1:123456789012:task/../x",
    "local:" + "x" * TEN_KB,
    7,
]

HOSTILE_SHA256: list[Any] = [
    "",
    "..",
    "A" * 64,
    "a" * 63,
    "a" * 65,
    "a" * 63 + "\n",
    "\u0430" * 64,
    "x" * TEN_KB,
    7,
]

# Past the year 9999 (no time a clock or a table can show), and past R2's largest object.
HOSTILE_EPOCHS: list[Any] = [
    -1,
    "1795950000",
    1795950000.5,
    None,
    [],
    "x" * TEN_KB,
    253_402_300_800,
    99_999_999_999_999_999_999,
]
HOSTILE_SIZES: list[Any] = [0, -1, "1", 1.5, None, "x" * TEN_KB, 5 * 1024**4, 10**20 - 1]

CLAIM_FIELDS = [
    ("claim.run", HOSTILE_TEXT),
    ("claim.requester", HOSTILE_TEXT),
    ("claim.thread", HOSTILE_TEXT),
    ("claim.repository", HOSTILE_TEXT),
    ("claim.ref", HOSTILE_REFS),
    ("claim.head", HOSTILE_SHAS),
]
SEED_FIELDS = [
    ("seed.resource", HOSTILE_IDS),
    ("seed.ref", HOSTILE_REFS),
    ("seed.sha", HOSTILE_SHAS),
    ("seed.checkout_backup_id", HOSTILE_IDS),
    ("seed.deps_backup_id", HOSTILE_IDS),
    ("seed.fetch_ref", HOSTILE_REFS),
    ("seed.fetch_sha", HOSTILE_SHAS),
]

# (function, event file, the request model, the hostile fields of its body)
ROUTES: list[tuple[str, str, type[BaseModel], list[tuple[str, list[Any]]]]] = [
    (
        "seed",
        "seed-new",
        SeedRequest,
        [("slot", HOSTILE_IDS), *SEED_FIELDS, *CLAIM_FIELDS, ("origin", HOSTILE_ORIGINS)],
    ),
    (
        "receipt",
        "receipt",
        ReceiptRequest,
        [
            ("slot", HOSTILE_IDS),
            *SEED_FIELDS,
            *CLAIM_FIELDS,
            ("incarnation", HOSTILE_INCARNATIONS),
        ],
    ),
    ("slot_evidence", "slot-evidence", EvidenceRequest, [("slot", HOSTILE_IDS), *CLAIM_FIELDS]),
    (
        "rotation",
        "rotation-post",
        NewSnapshot,
        [
            ("resource", HOSTILE_IDS),
            ("ref", HOSTILE_REFS),
            ("sha", HOSTILE_SHAS),
            ("created_at", HOSTILE_EPOCHS),
            ("checkout.backup_id", HOSTILE_IDS),
            ("checkout.size", HOSTILE_SIZES),
            ("checkout.sha256", HOSTILE_SHA256),
            ("deps.backup_id", HOSTILE_IDS),
            ("deps.sha256", HOSTILE_SHA256),
            ("lockfile_hash", HOSTILE_IDS),
        ],
    ),
]

FIELD_CASES = [
    pytest.param(function, name, dotted, values, id=f"{function}-{dotted}")
    for function, name, _, fields in ROUTES
    for dotted, values in fields
]

NOT_OBJECTS = [
    "",
    "not json",
    "{",
    '{"slot": ',
    "[]",
    "[{}]",
    '"slot-1"',
    "1",
    "1.5",
    "true",
    "null",
    '{"slot": "s"} trailing',
    '{"a": 1}{"b": 2}',
    '\ufeff{"slot": "s"}',
]
# JSON and only JSON, in UTF-8 (RFC 8259): a form is not parsed as one, nor a body said to
# be in another charset decoded as UTF-8.
WRONG_CONTENT_TYPES = [
    "text/plain",
    "text/html",
    "application/xml",
    "application/octet-stream",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
    "application/json;charset=utf-16",
]


def base_body(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(event(name)["body"])
    if name in ("seed-new", "receipt"):  # every optional seed field present, to be replaced
        body["seed"] |= {"fetch_ref": "main", "fetch_sha": GOOD_SHA}
    return body


def replaced(body: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    *parents, leaf = dotted.split(".")
    target = changed
    for part in parents:
        target = target[part]
    target[leaf] = value
    return changed


def post(function: str, name: str, body: str | None, content_type: str | None) -> tuple[int, Any]:
    headers = {"host": "abcdefghij.lambda-url.us-east-1.on.aws"}
    if content_type is not None:
        headers["content-type"] = content_type
    return invoke(HANDLERS[function], event(name, body=body, headers=headers))


def by_path(method: str, path: str) -> tuple[int, Any]:
    request = event("rotation-get", rawPath=path)
    request["requestContext"]["http"] |= {"method": method, "path": path}
    return invoke(HANDLERS["rotation"], request)


def put_archives(stack: Stack) -> None:
    """The base snapshot's archives exist, so only the hostile field can refuse it."""
    body = base_body("rotation-post")
    s3 = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
    for part in ("checkout", "deps"):
        s3.put_object(
            Bucket=stack.r2_settings.bucket or "",
            Key=backup_key(body[part]["backup_id"]),
            Body=b"x" * body[part]["size"],
        )


def assert_nothing_written(stack: Stack) -> None:
    assert stack.table.scan(ConsistentRead=True)["Items"] == []
    status, _ = by_path("GET", "/snapshots/acme-widgets")
    assert status == 404


def names_field(answer: Any, dotted: str) -> bool:
    if not isinstance(answer, dict) or answer.get("error") != "invalid-request":
        return False
    expected = f"body.{dotted}"
    return any(
        field["field"] == expected or field["field"].startswith(expected + ".")
        for field in answer["fields"]
    )


@pytest.mark.parametrize(
    ("model", "name"),
    [pytest.param(model, name, id=function) for function, name, model, _ in ROUTES],
)
def test_every_base_body_is_valid(model: type[BaseModel], name: str) -> None:
    """The control: each base body passes validation, so a refusal is the hostile field's."""
    model.model_validate_json(json.dumps(base_body(name)))


@pytest.mark.parametrize(("function", "name", "dotted", "values"), FIELD_CASES)
def test_hostile_field_is_refused_by_name_and_writes_nothing(
    stack: Stack, function: str, name: str, dotted: str, values: list[Any]
) -> None:
    if function == "rotation":
        put_archives(stack)
    wrong = []
    for value in values:
        body = json.dumps(replaced(base_body(name), dotted, value))
        status, answer = post(function, name, body, "application/json")
        if status != 400 or not names_field(answer, dotted):
            wrong.append((repr(value)[:60], status, answer))
    assert wrong == []
    assert_nothing_written(stack)


@pytest.mark.parametrize(("function", "name"), [pytest.param(f, n, id=f) for f, n, _, _ in ROUTES])
def test_bodies_that_are_not_json_objects_are_refused(
    stack: Stack, function: str, name: str
) -> None:
    wrong = []
    for body in NOT_OBJECTS:
        status, answer = post(function, name, body, "application/json")
        refused = status == 400 and answer["error"] == "invalid-request"
        if not (refused and [f["field"] for f in answer["fields"]] == ["body"]):
            wrong.append((body, status, answer))
    assert wrong == []
    assert_nothing_written(stack)


@pytest.mark.filterwarnings("ignore:Received multipart/form-data without base64")
@pytest.mark.parametrize(("function", "name"), [pytest.param(f, n, id=f) for f, n, _, _ in ROUTES])
def test_wrong_content_types_are_refused(stack: Stack, function: str, name: str) -> None:
    """A valid body under a content type that is not JSON is never processed."""
    if function == "rotation":
        put_archives(stack)
    body = json.dumps(base_body(name))
    wrong = []
    for content_type in WRONG_CONTENT_TYPES:
        status, answer = post(function, name, body, content_type)
        if (status, answer.get("error")) != (415, "unsupported-media-type"):
            wrong.append((content_type, status, answer))
    assert wrong == []
    assert_nothing_written(stack)


@pytest.mark.parametrize("content_type", ["application/jsonx", None])
def test_a_not_quite_json_content_type_records_nothing(
    stack: Stack, content_type: str | None
) -> None:
    put_archives(stack)
    status, answer = post(
        "rotation", "rotation-post", json.dumps(base_body("rotation-post")), content_type
    )
    assert (status, answer["error"]) == (415, "unsupported-media-type")
    assert_nothing_written(stack)


PATH_RESOURCES = [
    "..",
    ".",
    "%2e%2e",
    "..%2F..%2Fetc",
    "a%2Fb",
    "a%5Cb",
    "a\\b",
    "-rf",
    ".hidden",
    "a%00b",
    "a%0Ab",
    "a%7F",
    "\u0455lot",
    "slot\uff0f1",
    "slot\u22151",
    "a%E2%80%AEb",
    "x" * TEN_KB,
]


ROUTER_MISS: dict[str, Any] = {"error": "not-found", "detail": None, "fields": []}


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_hostile_resources_in_the_path_are_refused(stack: Stack, method: str) -> None:
    """400 naming `path.resource`; or, for characters the router's path pattern does not
    take (a backslash, U+FF0F, U+2215) and for separators that split the path, the
    router's 404 `not-found`."""
    wrong = []
    for resource in PATH_RESOURCES:
        status, answer = by_path(method, f"/snapshots/{resource}")
        fields = [f["field"] for f in answer.get("fields", [])] if status == 400 else []
        if fields != ["path.resource"] and answer != ROUTER_MISS:
            wrong.append((resource[:40], status, answer))
    for path in ["/snapshots/a/b", "/snapshots/../x", "/snapshots/", "/snapshots//x"]:
        status, answer = by_path(method, path)
        if answer != ROUTER_MISS:
            wrong.append((path, status, answer))
    assert wrong == []
    assert_nothing_written(stack)


# Bodies are parsed under limits before validation, on every POST route.

KB = 1024
VALID_SEED = json.loads(event("seed-new")["body"])

HOSTILE_BODIES: dict[str, dict[str, Any]] = {
    "10000-levels": {"body": "[" * 10_000 + "]" * 10_000},
    "deep-inside-an-object": {"body": '{"slot": ' + "[" * 33 + "]" * 33 + "}"},
    "5001-digits": {"body": '{"slot": ' + "1" * 5001 + "}"},
    "21-digits": {"body": '{"slot": "slot-1", "created_at": ' + "9" * 21 + "}"},
    "duplicate-key": {"body": '{"slot": "../x", "slot": "ok"}'},
    "duplicate-key-hidden-by-a-valid-one": {
        "body": json.dumps(VALID_SEED)[:-1] + ', "slot": "thread-42-slot"}'
    },
    "array-of-a-valid-body": {"body": json.dumps([VALID_SEED])},
    "nan": {"body": '{"slot": NaN}'},
    "infinity": {"body": '{"slot": Infinity}'},
    "lone-surrogate": {"body": json.dumps(VALID_SEED | {"slot": "\ud800"}, ensure_ascii=True)},
    "not-utf8": {"body": base64.b64encode(b'{"slot": "\xff"}').decode(), "isBase64Encoded": True},
    "not-base64": {"body": "{not base64}", "isBase64Encoded": True},
    "not-json": {"body": "slot=1"},
}


@pytest.mark.parametrize(("function", "name"), [pytest.param(f, n, id=f) for f, n, _, _ in ROUTES])
def test_bodies_over_a_parsing_limit_are_refused_before_validation(
    stack: Stack, function: str, name: str
) -> None:
    """Never a 5xx or an escaped exception: a 400 on `body`, and nothing written."""
    if function == "rotation":
        put_archives(stack)
    wrong: list[tuple[str, object, object]] = []
    for case, changes in HOSTILE_BODIES.items():
        headers = {"host": "abcdefghij.lambda-url.us-east-1.on.aws"}
        try:
            status, answer = invoke(
                HANDLERS[function],
                event(name, headers=headers | {"content-type": "application/json"}, **changes),
            )
        except Exception as escaped:  # the attack: an exception escapes the handler
            wrong.append((case, "raised", type(escaped).__name__))
            continue
        fields = [f["field"] for f in answer.get("fields", [])] if status == 400 else []
        if answer.get("error") != "invalid-request" or not fields[0].startswith("body"):
            wrong.append((case, status, answer))
    assert wrong == []
    assert_nothing_written(stack)


# Methods a route does not serve, paths no route serves: answered by the handler itself.

SERVED = {
    "seed": ("/seed", ["POST"]),
    "receipt": ("/receipt", ["POST"]),
    "slot_evidence": ("/slot-evidence", ["POST"]),
    "rotation": ("/snapshots", ["POST"]),
}
JSON = "application/json"
OTHER_METHODS = ["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "TRACE", "CONNECT"]


def request(
    function: str, method: str, path: str, body: str | None = None, content_type: str = JSON
) -> dict[str, Any]:
    built = event("rotation-get", rawPath=path, body=body)
    built["headers"]["content-type"] = content_type
    built["requestContext"]["http"] |= {"method": method, "path": path}
    answer: dict[str, Any] = HANDLERS[function](built, Context())
    return answer


@pytest.mark.parametrize("function", list(SERVED))
def test_a_method_a_route_does_not_serve_is_a_405_naming_those_it_does(
    stack: Stack, function: str
) -> None:
    path, methods = SERVED[function]
    wrong = []
    unserved = [m for m in OTHER_METHODS if m not in methods]
    for method, content_type in itertools.product(unserved, [JSON, "text/plain"]):
        answer = request(function, method, path, json.dumps({"slot": "slot-1"}), content_type)
        body = json.loads(answer["body"]) if answer.get("body") else None
        expected_body = None if method == "HEAD" else {"error": "method-not-allowed"}
        if (
            answer["statusCode"] != 405
            or answer.get("headers", {}).get("Allow") != ", ".join(methods)
            or (body and {"error": body["error"]}) != expected_body
        ):
            wrong.append((method, content_type, answer))
    assert wrong == []
    assert_nothing_written(stack)


def test_the_rotation_paths_name_each_their_own_methods(stack: Stack) -> None:
    allowed = {
        "/snapshots/acme-widgets": "DELETE, GET, HEAD",
        "/healthz": "GET, HEAD",
        "/snapshots": "POST",
    }
    for path, methods in allowed.items():
        answer = request("rotation", "PUT", path)
        assert (answer["statusCode"], answer["headers"]["Allow"]) == (405, methods), path
    assert_nothing_written(stack)


@pytest.mark.parametrize("function", list(SERVED))
def test_a_path_no_route_serves_is_a_404_and_head_is_get_without_a_body(
    stack: Stack, function: str
) -> None:
    for method in ("GET", "POST", "PUT"):
        answer = request(function, method, "/nowhere")
        assert (answer["statusCode"], json.loads(answer["body"])) == (404, ROUTER_MISS)
    head = request(function, "HEAD", "/nowhere")
    assert (head["statusCode"], head["body"]) == (404, "")
    got, head = request(function, "GET", "/healthz"), request(function, "HEAD", "/healthz")
    assert (got["statusCode"], head["statusCode"]) == (200, 200)
    assert json.loads(got["body"])["ok"] is True
    assert head["body"] == ""
    assert head["headers"] == got["headers"]
    assert_nothing_written(stack)


# Over HTTP: the function-URL gateway's body limit and content types, signed as a client.


@pytest.fixture
def local_stack(tmp_path: Path, aws_credentials: None) -> Iterator[LocalStack]:
    with running_local_stack(tmp_path) as local:
        yield local


def send(stack: LocalStack, method: str, path: str, body: bytes, content_type: str) -> int:
    url = stack.url + path
    signed = AWSRequest(method=method, url=url, data=body, headers={"Content-Type": content_type})
    credentials = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    SigV4Auth(credentials, "lambda", "us-east-1").add_auth(signed)
    request = urllib.request.Request(  # noqa: S310 - loopback
        url, data=body or None, method=method, headers=dict(signed.headers.items())
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return refused.code


HTTP_ROUTES = [
    ("POST", "/seed"),
    ("POST", "/receipt"),
    ("POST", "/slot-evidence"),
    ("POST", "/snapshots"),
    ("DELETE", "/snapshots/acme-widgets"),
]


def test_over_http_oversized_bodies_get_413_and_wrong_content_types_a_4xx(
    local_stack: LocalStack,
) -> None:
    oversized = json.dumps({"slot": "x" * MAX_BODY}).encode()
    at_limit = b" " * (MAX_BODY - 2) + b"{}"
    answers = {}
    for method, path in HTTP_ROUTES:
        answers[(method, path, "oversized")] = send(
            local_stack, method, path, oversized, "application/json"
        )
        answers[(method, path, "at-limit")] = send(
            local_stack, method, path, at_limit, "application/json"
        )
        answers[(method, path, "text/plain")] = send(
            local_stack, method, path, b'{"slot": "slot-1"}', "text/plain"
        )
    for (method, path, case), status in answers.items():
        if case == "oversized":
            assert status == 413, (method, path)
        elif method == "POST":
            assert 400 <= status < 500, (method, path, case, status)
    assert StoreSettings().table_resource().scan(ConsistentRead=True)["Items"] == []
