"""What every function URL shares: the resolver, `GET /healthz`, and the refusals made
before a route runs; every answer goes through the answer table (`api/answers.py`).
Handlers stay thin: parse, one call, `answer(...)`.

Bodies are parsed here, once, under limits, before any validation (`parse_body`): at most
32 levels of nesting, at most 20 digits in a number, no duplicate key, JSON's own values
only (no NaN or Infinity), Unicode text (UTF-8, no lone surrogate), a top-level object.
Each is a 400 `ErrorAnswer(error="invalid-request")` whose one field, `body`, names the
limit. A method a path does not serve is a 405 naming the ones it does (`Allow`); a path
no route serves, a 404; HEAD is GET without the body.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import threading
from collections.abc import Callable
from functools import cached_property
from http import HTTPStatus
from itertools import accumulate
from typing import TYPE_CHECKING, Any, NoReturn

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response, content_types
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.event_handler.middlewares.openapi_validation import (
    OpenAPIRequestValidationMiddleware,
)
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.utilities.data_classes import LambdaFunctionUrlEvent
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from seedkeeper import __version__
from seedkeeper.adapters.r2 import R2Settings, transfer_mode
from seedkeeper.api.answers import REFUSALS, FieldError, Health, answer, documented, refusal_of
from seedkeeper.domain.refused import Refused
from seedkeeper.errors import (
    SeedkeeperError,
)
from seedkeeper.observability import logger

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.openapi.models import OpenAPI

Handler = Callable[[dict[str, Any], LambdaContext], dict[str, Any]]
_FIELD_CHARS = 120
_MAX_FIELDS = 20
# Powertools keeps the event being resolved on a class attribute every resolver in the
# process shares (`BaseRouter.current_event`), and the logger's keys are the process's
# too. Lambda gives an environment one invocation at a time; where handlers run on threads
# (the local gateway answering a slot task while a test invokes another function), one
# resolves at a time, or one would read the other's request.
_ONE_RESOLVING = threading.Lock()


class _Resolver(LambdaFunctionUrlResolver):
    def __init__(self) -> None:
        super().__init__(enable_validation=True, json_body_deserializer=parse_body)
        # Powertools validates a request (parsing its body as its content type says: a form
        # as a form) before any middleware a resolver adds runs; the refusals that come
        # before a body is parsed run first, in its place (its own attribute, which __init__
        # sets when validation is on).
        self._request_validation_middleware = _RefusalsFirst()  # type: ignore[no-untyped-call]

    def _to_proxy_event(self, event: dict[str, Any]) -> _FunctionUrlEvent:
        """Every body is read as UTF-8 or refused (Powertools would raise from inside the
        validation middleware, a 500)."""
        return _FunctionUrlEvent(event, self._json_body_deserializer)

    def get_openapi_schema(self, *args: Any, **kwargs: Any) -> OpenAPI:
        """The generated document without the 422 `HTTPValidationError` (and its schemas)
        Powertools adds to every route once validation is on: invalid input gets a 400
        `ErrorAnswer` here (`invalid`), never a 422, and Powertools 3.37 has no way to leave
        it out (aws-powertools/powertools-lambda-python#4928)."""
        document = super().get_openapi_schema(*args, **kwargs)
        for item in (document.paths or {}).values():
            for operation in (item.get, item.put, item.post, item.delete, item.patch, item.head):
                if operation is not None and operation.responses:
                    operation.responses.pop(HTTPStatus.UNPROCESSABLE_ENTITY, None)
        if document.components and document.components.schemas:
            for unused in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
                document.components.schemas.pop(unused, None)
        return document


def function_url_app() -> LambdaFunctionUrlResolver:
    app = _Resolver()

    @app.get("/healthz", responses=documented([Health], refusals=["unsupported-media-type"]))
    def healthz() -> Response[str]:
        build = os.environ.get("SEEDKEEPER_BUILD", __version__)
        mode = transfer_mode(R2Settings()).mode
        return answer(Health(ok=True, build=build, backupTransfer=mode))

    @app.exception_handler(RequestValidationError)  # type: ignore[untyped-decorator]
    def invalid(error: RequestValidationError) -> Response[str]:
        # Bounded: a form-encoded body's keys become "fields", and they are the caller's bytes.
        fields = tuple(
            FieldError(
                field=".".join(str(part) for part in issue["loc"])[:_FIELD_CHARS],
                message=str(issue["msg"])[:_FIELD_CHARS],
            )
            for issue in error.errors()[:_MAX_FIELDS]
        )
        return answer(Refused("invalid-request"), fields=fields)

    @app.exception_handler(RequestUnsupportedContentType)  # type: ignore[untyped-decorator]
    def unsupported(_: RequestUnsupportedContentType) -> Response[str]:
        return _unsupported_media_type()

    @app.exception_handler(ValidationError)  # type: ignore[untyped-decorator]
    def misconfigured(error: ValidationError) -> Response[str]:
        # Bodies are validated before a route runs (`invalid`); what fails inside one is the
        # deployment's settings. Named for the operator, their values never logged.
        names = [".".join(str(part) for part in issue["loc"]) for issue in error.errors()]
        logger.error("settings invalid", model=error.title, fields=names[:_MAX_FIELDS])
        return answer(Refused("internal-error"))

    @app.exception_handler(SeedkeeperError)  # type: ignore[untyped-decorator]
    def domain(error: SeedkeeperError) -> Response[str]:
        refused = refusal_of(error)
        if REFUSALS[refused.reason] >= HTTPStatus.INTERNAL_SERVER_ERROR:
            logger.exception("request failed", reason=refused.reason)
        return answer(refused)

    return app


class _RefusalsFirst(OpenAPIRequestValidationMiddleware):
    """Before a body is parsed or validated: a path no route serves is a 404, a method its
    routes do not serve a 405 naming the ones they do (Powertools' own answer to either is a
    404 of another shape); then a body is JSON and says so, `application/json` exactly, in
    UTF-8 (RFC 8259: a `charset` parameter may say so and nothing else), or a 415.
    Powertools would also parse `application/jsonx` or a body with no content type as
    JSON, and a form or multipart body as a form."""

    def handler(self, app: Any, next_middleware: NextMiddleware) -> Response[str]:
        event = app.current_event
        allowed = _methods_serving(app, event.path)
        if event.http_method not in allowed:
            if not allowed:
                return answer(Refused("not-found"))
            return answer(Refused("method-not-allowed"), headers={"Allow": ", ".join(allowed)})
        if event.body and not _declares_json(
            event.headers.get("content-type") or event.headers.get("Content-Type") or ""
        ):
            return _unsupported_media_type()
        answered: Response[str] = super().handler(app, next_middleware)
        return answered


def _methods_serving(app: LambdaFunctionUrlResolver, path: str) -> list[str]:
    """The methods some route serves at `path`, matched as the resolver matches (its
    route tables are not public)."""
    routes = app._static_routes + app._dynamic_routes
    methods = {route.method for route in routes if route.rule.match(path)}
    if "GET" in methods:
        methods.add("HEAD")  # answered by `entrypoint` as GET without the body
    return sorted(methods)


def _declares_json(content_type: str) -> bool:
    media, *parameters = (part.strip().lower() for part in content_type.split(";"))
    charsets = [
        value.strip('"')
        for name, _, value in (p.partition("=") for p in parameters)
        if name.strip() == "charset"
    ]
    return media == content_types.APPLICATION_JSON and all(c == "utf-8" for c in charsets)


# Limits on a body, checked before it is parsed (depth) and while it is (the rest).
MAX_DEPTH = 32
MAX_DIGITS = 20
_KEY_CHARS = 40
# A string, escapes and all, to its closing quote or to the end of the text (an unterminated
# one, or one ending in a lone backslash): every character is in at most one match, so the
# scan is one pass however many quotes the text holds.
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}
_DIGIT = re.compile(r"[0-9]")


class _OverLimit(Exception):
    """A body over a limit; the message names it."""


def parse_body(text: str) -> dict[str, Any]:
    """A request body as JSON, under the limits above, or a `RequestValidationError` on
    `body` (not JSON at all included, named by the parser's message). Linear in the
    body: depth is counted without recursing, before the parser (which recurses) runs."""
    try:
        if _depth(text) > MAX_DEPTH:
            raise _OverLimit(f"nested deeper than {MAX_DEPTH} levels")
        parsed = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_int=_bounded(int),
            parse_float=_bounded(float),
            parse_constant=_not_json,
        )
        if not isinstance(parsed, dict):
            raise _OverLimit("must be a JSON object")
        json.dumps(parsed, ensure_ascii=False).encode()  # a lone surrogate cannot encode
    except _OverLimit as refused:
        raise _body_refused(str(refused)) from None
    except json.JSONDecodeError as malformed:  # its message is the parser's, never the body
        raise _body_refused(f"not JSON: {malformed.msg} at {malformed.pos}") from None
    except UnicodeEncodeError:
        raise _body_refused("not Unicode: a lone surrogate") from None
    return parsed


def _depth(text: str) -> int:
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(_NESTING[bracket] for bracket in brackets), default=0)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _OverLimit(f"duplicate key {key[:_KEY_CHARS]!r}")
        seen.add(key)
    return dict(pairs)


def _bounded(number: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(token: str) -> Any:
        if len(_DIGIT.findall(token)) > MAX_DIGITS:
            raise _OverLimit(f"a number with more than {MAX_DIGITS} digits")
        return number(token)

    return parse


def _not_json(constant: str) -> NoReturn:
    raise _OverLimit(f"not JSON: {constant}")


def _body_refused(message: str) -> RequestValidationError:
    return RequestValidationError([{"type": "body_refused", "loc": ("body",), "msg": message}])


class _FunctionUrlEvent(LambdaFunctionUrlEvent):
    @cached_property
    def decoded_body(self) -> str | None:
        body: str | None = self.body
        if not (self.is_base64_encoded and body):
            return body
        try:
            return base64.b64decode(body.encode(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise _body_refused("not UTF-8") from None


def _unsupported_media_type() -> Response[str]:
    field = FieldError(field="header.content-type", message="must be application/json")
    return answer(Refused("unsupported-media-type"), fields=[field])


def entrypoint(app: LambdaFunctionUrlResolver) -> Handler:
    @logger.inject_lambda_context(clear_state=True)
    def resolve(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        http = event.get("requestContext", {}).get("http", {})
        if http.get("method") != "HEAD":
            return app.resolve(event, context)
        # HEAD is GET without the body: the same status and headers, the same refusals.
        as_get = event | {
            "requestContext": event["requestContext"] | {"http": http | {"method": "GET"}}
        }
        return app.resolve(as_get, context) | {"body": ""}

    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        with _ONE_RESOLVING:
            return resolve(event, context)

    return handler
