"""Bodies are parsed under limits before validation: nesting depth, digits in a number,
duplicate keys, JSON's own constants only, Unicode text, a top-level object. The parser
every function URL uses (`seedkeeper.api.http.parse_body`) on its own, then through each real
handler (the network is off here: a body that got past the parser would fail the test)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from functions import event, invoke, load_function
from seedkeeper.api.http import MAX_DEPTH, MAX_DIGITS, parse_body

KB = 1024


def arrays(depth: int) -> str:
    """`depth` levels: a top-level object, then arrays."""
    return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def objects(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def mixed(depth: int) -> str:
    """A top-level object, arrays of objects, an innermost array: `depth` levels."""
    pairs = (depth - 2) // 2
    return '{"a": ' + '[{"c": ' * pairs + "[1]" + "}]" * pairs + "}"


def refusal(text: str) -> str:
    with pytest.raises(RequestValidationError) as refused:
        parse_body(text)
    (error,) = refused.value.errors()
    assert error["loc"] == ("body",)
    return str(error["msg"])


WITHIN = [
    ("empty", "{}"),
    ("arrays-at-the-limit", arrays(MAX_DEPTH)),
    ("objects-at-the-limit", objects(MAX_DEPTH)),
    ("mixed-at-the-limit", mixed(MAX_DEPTH)),
    ("brackets-in-a-string", '{"a": "' + "[" * 10 * KB + '"}'),
    ("escapes", r'{"a": "\"[[[[\\", "b": [[1]], "c": "\u00e9\ud83d\ude00"}'),
    ("digits-at-the-limit", '{"n": ' + "9" * MAX_DIGITS + "}"),
    ("negative-at-the-limit", '{"n": -' + "9" * MAX_DIGITS + "}"),
    ("fraction-at-the-limit", '{"n": 1.' + "5" * (MAX_DIGITS - 1) + "}"),
    ("a-key-in-two-objects", '{"a": {"k": 1}, "b": {"k": 1}}'),
    ("a-256-kb-array", '{"a": [' + "1," * 128 * KB + "1]}"),
]


@pytest.mark.parametrize("text", [pytest.param(text, id=case) for case, text in WITHIN])
def test_bodies_within_the_limits_parse_as_json_does(text: str) -> None:
    assert parse_body(text) == json.loads(text)


OVER_A_LIMIT = [
    ("arrays", arrays(MAX_DEPTH + 1), "deeper than 32"),
    ("objects", objects(MAX_DEPTH + 1), "deeper than 32"),
    ("mixed", mixed(MAX_DEPTH + 2), "deeper than 32"),
    ("10000-levels", "[" * 10_000 + "]" * 10_000, "deeper than 32"),
    ("never-closed", '{"a": ' + "[" * 256 * KB, "deeper than 32"),
    ("5001-digits", '{"slot": ' + "1" * 5001 + "}", "more than 20 digits"),
    ("21-digits", '{"n": ' + "9" * (MAX_DIGITS + 1) + "}", "more than 20 digits"),
    ("exponent", '{"n": 1e' + "9" * MAX_DIGITS + "}", "more than 20 digits"),
    ("fraction", '{"n": 0.' + "0" * 10_000 + "1}", "more than 20 digits"),
    ("duplicate", '{"slot": "../x", "slot": "ok"}', "duplicate key 'slot'"),
    ("nested-duplicate", '{"a": {"b": [{"k": 1, "k": 1}]}}', "duplicate key 'k'"),
    ("nan", '{"n": NaN}', "not JSON: NaN"),
    ("infinity", '{"n": -Infinity}', "not JSON: -Infinity"),
    ("array", "[]", "must be a JSON object"),
    ("array-of-a-body", '[{"slot": "slot-1"}]', "must be a JSON object"),
    ("string", '"slot-1"', "must be a JSON object"),
    ("number", "1", "must be a JSON object"),
    ("null", "null", "must be a JSON object"),
    ("lone-surrogate", r'{"a": "\ud800"}', "not Unicode"),
    ("lone-surrogate-key", r'{"\udfff": 1}', "not Unicode"),
]


@pytest.mark.parametrize(
    ("text", "names"), [pytest.param(text, names, id=case) for case, text, names in OVER_A_LIMIT]
)
def test_bodies_over_a_limit_are_refused_naming_it(text: str, names: str) -> None:
    assert names in refusal(text)


PATHOLOGICAL = [
    # An unterminated string at every quote: a scan restarting at each would be quadratic.
    ("escaped-quotes", '{"a": ' + r"\"" * 128 * KB),
    ("quote-backslash", '{"a": ' + '"\\' * 128 * KB),
    ("backslashes", '{"a": "' + "\\" * 256 * KB),
    ("keys", "{" + '"a":' * 64 * KB),
]


@pytest.mark.parametrize("text", [pytest.param(text, id=case) for case, text in PATHOLOGICAL])
def test_a_256_kb_body_is_scanned_in_one_pass(text: str) -> None:
    """A scan that restarted at every quote would take minutes on these. None is JSON: a
    400 on `body`, named by the parser's message."""
    with pytest.raises(RequestValidationError) as refused:
        parse_body(text)
    assert [error["loc"] for error in refused.value.errors()] == [("body",)]
    assert refused.value.errors()[0]["msg"].startswith("not JSON: ")


# Through each real handler: a 400 before any route runs.

HANDLERS = {name: load_function(name) for name in ("seed", "receipt", "slot_evidence", "rotation")}
EVENTS = {
    "seed": "seed-new",
    "receipt": "receipt",
    "slot_evidence": "slot-evidence",
    "rotation": "rotation-post",
}

HOSTILE_BODIES: dict[str, dict[str, Any]] = {
    "deep": {"body": "[" * 10_000 + "]" * 10_000},
    "digits": {"body": '{"slot": ' + "1" * 5001 + "}"},
    "duplicate": {"body": '{"slot": "../x", "slot": "ok"}'},
    "array": {"body": "[{}]"},
    "nan": {"body": '{"slot": NaN}'},
    "surrogate": {"body": r'{"slot": "\ud800"}'},
    "not-utf8": {"body": base64.b64encode(b'{"slot": "\xff"}').decode(), "isBase64Encoded": True},
}


@pytest.mark.parametrize("function", list(HANDLERS))
@pytest.mark.parametrize("case", list(HOSTILE_BODIES))
def test_every_post_route_refuses_a_hostile_body_with_a_400(function: str, case: str) -> None:
    status, answer = invoke(HANDLERS[function], event(EVENTS[function], **HOSTILE_BODIES[case]))
    assert status == 400, answer
    assert answer["error"] == "invalid-request"
    assert [field["field"] for field in answer["fields"]] == ["body"]
