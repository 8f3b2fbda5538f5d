"""What every function URL shares: the resolver, `GET /healthz`, the one mapping of
domain errors to HTTP answers, and how a route documents them. Handlers stay thin: parse,
one call, answer."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from http import HTTPStatus
from types import UnionType
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response, content_types
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ValidationError

from seedkeeper import __version__
from seedkeeper.errors import (
    MalformedRecord,
    R2Unavailable,
    R2Unconfigured,
    ResourceNotFound,
    RotationConflict,
    SeedkeeperError,
    SnapshotRefused,
    StoreUnavailable,
)
from seedkeeper.models import Model
from seedkeeper.observability import logger
from seedkeeper.r2 import R2Settings, transfer_mode

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.openapi.models import OpenAPI

Handler = Callable[[dict[str, Any], LambdaContext], dict[str, Any]]
_FIELD_CHARS = 120
_MAX_FIELDS = 20


class FieldError(Model):
    field: str
    message: str


class ErrorAnswer(Model):
    error: str  # a reason token
    detail: str | None = None
    fields: tuple[FieldError, ...] = ()


# The one refusal for an absent slot and for any mismatch: no existence oracle.
NO_MATCH = ErrorAnswer(error="no-match")


class Health(Model):
    ok: bool
    build: str
    backupTransfer: str


def json_response(status: int, body: BaseModel) -> Response[str]:
    return Response(status, content_types.APPLICATION_JSON, body.model_dump_json())


# A body model, or a union of them (`Seeded | Cold`) when one status has several bodies.
Body = type[BaseModel] | UnionType

# What a route may answer besides its own answers: any route, a body that is not JSON
# (`_json_bodies_only`); a route that takes input and reaches a store, also invalid input
# (`invalid`) and the domain errors `_answer` maps to 500 or 503.
_UNSUPPORTED: Mapping[int, Body] = {HTTPStatus.UNSUPPORTED_MEDIA_TYPE: ErrorAnswer}
_REFUSALS: Mapping[int, Body] = {
    **_UNSUPPORTED,
    HTTPStatus.BAD_REQUEST: ErrorAnswer,
    HTTPStatus.INTERNAL_SERVER_ERROR: ErrorAnswer,
    HTTPStatus.SERVICE_UNAVAILABLE: ErrorAnswer,
}


def responses(
    answers: Mapping[int, Body], refusals: Mapping[int, Body] = _REFUSALS
) -> dict[int, OpenAPIResponse]:
    """A route's documented answers (its `responses=`): its own and the refusals it shares.
    A status both give is documented with either body. The handlers return `Response[str]`,
    which Powertools would otherwise document as one 200 string."""
    bodies = dict(answers)
    for status, body in refusals.items():
        bodies[status] = bodies[status] | body if status in bodies else body
    return {
        int(status): {
            "description": HTTPStatus(status).phrase,
            "content": {content_types.APPLICATION_JSON: {"model": body}},
        }
        for status, body in sorted(bodies.items())
    }


class _Resolver(LambdaFunctionUrlResolver):
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
    app = _Resolver(enable_validation=True)
    app.use(middlewares=[_json_bodies_only])

    @app.get("/healthz", responses=responses({HTTPStatus.OK: Health}, refusals=_UNSUPPORTED))
    def healthz() -> Response[str]:
        build = os.environ.get("SEEDKEEPER_BUILD", __version__)
        mode = transfer_mode(R2Settings()).mode
        return json_response(HTTPStatus.OK, Health(ok=True, build=build, backupTransfer=mode))

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
        logger.info("request refused", reason="invalid-request", fields=len(fields))
        return json_response(
            HTTPStatus.BAD_REQUEST, ErrorAnswer(error="invalid-request", fields=fields)
        )

    @app.exception_handler(RequestUnsupportedContentType)  # type: ignore[untyped-decorator]
    def unsupported(_: RequestUnsupportedContentType) -> Response[str]:
        return _unsupported_media_type()

    @app.exception_handler(ValidationError)  # type: ignore[untyped-decorator]
    def misconfigured(error: ValidationError) -> Response[str]:
        # Bodies are validated before a route runs (`invalid`); what fails inside one is the
        # deployment's settings. Named for the operator, their values never logged.
        names = [".".join(str(part) for part in issue["loc"]) for issue in error.errors()]
        logger.error("settings invalid", model=error.title, fields=names[:_MAX_FIELDS])
        return json_response(HTTPStatus.INTERNAL_SERVER_ERROR, ErrorAnswer(error="internal-error"))

    @app.exception_handler(SeedkeeperError)  # type: ignore[untyped-decorator]
    def domain(error: SeedkeeperError) -> Response[str]:
        status, answer = _answer(error)
        if status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            logger.exception("request failed", reason=answer.error)
        else:
            logger.info("request refused", reason=answer.error)
        return json_response(status, answer)

    return app


def _json_bodies_only(
    app: LambdaFunctionUrlResolver, next_middleware: NextMiddleware
) -> Response[str]:
    """A body is JSON and says so: `application/json` exactly (a charset may follow).
    Powertools would also parse `application/jsonx`, or a body with no content type."""
    event = app.current_event
    if event.body:
        declared = event.headers.get("content-type") or event.headers.get("Content-Type") or ""
        if declared.split(";")[0].strip().lower() != content_types.APPLICATION_JSON:
            return _unsupported_media_type()
    answer: Response[str] = next_middleware(app)
    return answer


def _unsupported_media_type() -> Response[str]:
    logger.info("request refused", reason="unsupported-media-type")
    field = FieldError(field="header.content-type", message="must be application/json")
    answer = ErrorAnswer(error="unsupported-media-type", fields=(field,))
    return json_response(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, answer)


def _answer(error: SeedkeeperError) -> tuple[int, ErrorAnswer]:
    if isinstance(error, ResourceNotFound):
        return HTTPStatus.NOT_FOUND, ErrorAnswer(error="resource-not-found")
    if isinstance(error, RotationConflict):
        return HTTPStatus.CONFLICT, ErrorAnswer(error="rotation-conflict")
    if isinstance(error, SnapshotRefused):
        return HTTPStatus.CONFLICT, ErrorAnswer(error=error.reason, detail=error.detail)
    if isinstance(error, R2Unconfigured):
        return HTTPStatus.SERVICE_UNAVAILABLE, ErrorAnswer(
            error="r2-unconfigured", detail=", ".join(error.missing)
        )
    if isinstance(error, StoreUnavailable | R2Unavailable):
        return HTTPStatus.SERVICE_UNAVAILABLE, ErrorAnswer(error="retry-later")
    if isinstance(error, MalformedRecord):
        return HTTPStatus.INTERNAL_SERVER_ERROR, ErrorAnswer(error="record-malformed")
    return HTTPStatus.INTERNAL_SERVER_ERROR, ErrorAnswer(error="internal-error")


def entrypoint(app: LambdaFunctionUrlResolver) -> Handler:
    @logger.inject_lambda_context(clear_state=True)
    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        return app.resolve(event, context)

    return handler
