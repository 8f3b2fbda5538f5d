"""What every function URL shares: the resolver, `GET /healthz`, and the one mapping of
domain errors to HTTP answers. Handlers stay thin: parse, one call, answer."""

from __future__ import annotations

import os
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel

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

Handler = Callable[[dict[str, Any], LambdaContext], dict[str, Any]]


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


def function_url_app() -> LambdaFunctionUrlResolver:
    app = LambdaFunctionUrlResolver(enable_validation=True)

    @app.get("/healthz")
    def healthz() -> Response[str]:
        build = os.environ.get("SEEDKEEPER_BUILD", __version__)
        mode = transfer_mode(R2Settings()).mode
        return json_response(HTTPStatus.OK, Health(ok=True, build=build, backupTransfer=mode))

    @app.exception_handler(RequestValidationError)  # type: ignore[untyped-decorator]
    def invalid(error: RequestValidationError) -> Response[str]:
        fields = tuple(
            FieldError(field=".".join(str(part) for part in issue["loc"]), message=issue["msg"])
            for issue in error.errors()
        )
        logger.info("request refused", reason="invalid-request", fields=[f.field for f in fields])
        return json_response(
            HTTPStatus.BAD_REQUEST, ErrorAnswer(error="invalid-request", fields=fields)
        )

    @app.exception_handler(SeedkeeperError)  # type: ignore[untyped-decorator]
    def domain(error: SeedkeeperError) -> Response[str]:
        status, answer = _answer(error)
        if status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            logger.exception("request failed", reason=answer.error)
        else:
            logger.info("request refused", reason=answer.error)
        return json_response(status, answer)

    return app


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
