"""The one answer table: every outcome a service returns, every refusal and every error,
to an HTTP status and (for refusals and errors) a reason token in one error body,
`ErrorAnswer`. Handlers are one call: `answer(service.call(request))`; routes document
what they may answer with `documented(...)`, from this same table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel

from seedkeeper.domain.models import Model
from seedkeeper.domain.refused import Refused
from seedkeeper.errors import (
    MalformedRecord,
    R2Unavailable,
    R2Unconfigured,
    ResourceNotFound,
    RotationConflict,
    RuntimeUnavailable,
    SeedkeeperError,
    SnapshotRefused,
    StoreUnavailable,
)
from seedkeeper.observability import logger


class FieldError(Model):
    field: str
    message: str


class ErrorAnswer(Model):
    """The one error body: a reason token, a detail where it helps, the fields at fault."""

    error: str
    detail: str | None = None
    fields: tuple[FieldError, ...] = ()


class Health(Model):
    ok: bool
    build: str
    backupTransfer: str


@dataclass(frozen=True)
class Status:
    """The statuses an outcome may have (documented), and which one a value has."""

    may_be: tuple[HTTPStatus, ...]
    of: Callable[[Any], HTTPStatus]


def always(status: HTTPStatus) -> Status:
    return Status((status,), lambda _: status)


# By the outcome's class name (`seedkeeper.domain.outcomes`, and `Health`): the table needs
# no outcome class, so a function imports only the outcomes it answers with (cold starts).
OUTCOMES: Mapping[str, Status] = {
    "Seeded": always(HTTPStatus.OK),
    "NotSeeded": always(HTTPStatus.OK),
    "Cold": always(HTTPStatus.OK),
    "Seeding": always(HTTPStatus.ACCEPTED),  # poll again
    "KeptAlive": always(HTTPStatus.OK),
    "Receipt": always(HTTPStatus.OK),
    "RestoreGrant": always(HTTPStatus.OK),
    "UploadGrant": always(HTTPStatus.OK),
    "CheckpointRecorded": always(HTTPStatus.OK),
    "CheckpointNotTaken": always(HTTPStatus.OK),
    "TaskRecord": always(HTTPStatus.OK),
    "TaskWrite": always(HTTPStatus.OK),  # how the task's transition went, refused included
    "StandbyAnswer": always(HTTPStatus.OK),
    "Evidence": always(HTTPStatus.OK),
    "SnapshotStatus": always(HTTPStatus.OK),
    "Health": always(HTTPStatus.OK),
    "Recorded": Status(  # 201 rotated, 200 the current snapshot again
        (HTTPStatus.OK, HTTPStatus.CREATED),
        lambda recorded: HTTPStatus.CREATED if recorded.rotated else HTTPStatus.OK,
    ),
    "Payment": Status(  # 503 while R2 still owes a deletion: retry
        (HTTPStatus.OK, HTTPStatus.SERVICE_UNAVAILABLE),
        lambda payment: HTTPStatus.SERVICE_UNAVAILABLE if payment.pending else HTTPStatus.OK,
    ),
}

REFUSALS: Mapping[str, HTTPStatus] = {
    # the request
    "invalid-request": HTTPStatus.BAD_REQUEST,
    "not-found": HTTPStatus.NOT_FOUND,
    "method-not-allowed": HTTPStatus.METHOD_NOT_ALLOWED,
    "unsupported-media-type": HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    # a slot: the same answer for an absent slot and any mismatch (no existence oracle)
    "no-match": HTTPStatus.NOT_FOUND,
    "claim-mismatch": HTTPStatus.CONFLICT,
    "seed-mismatch": HTTPStatus.CONFLICT,
    "origin-mismatch": HTTPStatus.CONFLICT,
    "slot-closed": HTTPStatus.CONFLICT,
    "record-unsupported": HTTPStatus.CONFLICT,
    # every operation of the slot unsettled: nothing more may start until one settles
    "window-full": HTTPStatus.SERVICE_UNAVAILABLE,
    # the slot task's calls: a call its signer's task did not make, or about a slot that
    # names another task (or none); the same whichever it is
    "not-this-task": HTTPStatus.FORBIDDEN,
    # a checkpoint (the slot task's calls)
    "checkpoint-not-open": HTTPStatus.CONFLICT,
    "checkpoint-unverified": HTTPStatus.CONFLICT,
    # a task's start: its seed's archives are no longer recorded (rotated out since launch)
    "seed-missing": HTTPStatus.CONFLICT,
    # a resource's snapshots
    "resource-not-found": HTTPStatus.NOT_FOUND,
    "rotation-conflict": HTTPStatus.CONFLICT,
    "backup-id-owned": HTTPStatus.CONFLICT,
    "backup-id-reused": HTTPStatus.CONFLICT,
    "backup-id-pending-deletion": HTTPStatus.CONFLICT,
    # ours
    "retry-later": HTTPStatus.SERVICE_UNAVAILABLE,
    "r2-unconfigured": HTTPStatus.SERVICE_UNAVAILABLE,
    "record-malformed": HTTPStatus.INTERNAL_SERVER_ERROR,
    "internal-error": HTTPStatus.INTERNAL_SERVER_ERROR,
}


def refusal_of(error: SeedkeeperError) -> Refused:
    """The reason token of an error a service raised (its message is never the answer)."""
    if isinstance(error, ResourceNotFound):
        return Refused("resource-not-found")
    if isinstance(error, RotationConflict):
        return Refused("rotation-conflict")
    if isinstance(error, SnapshotRefused):
        return Refused(error.reason, error.detail)
    if isinstance(error, R2Unconfigured):
        return Refused("r2-unconfigured", ", ".join(error.missing))
    if isinstance(error, StoreUnavailable | R2Unavailable):
        return Refused("retry-later")
    if isinstance(error, RuntimeUnavailable) and error.retryable:
        return Refused("retry-later")
    if isinstance(error, MalformedRecord):
        return Refused("record-malformed")
    return Refused("internal-error")


def answer(
    outcome: BaseModel | Refused,
    fields: Iterable[FieldError] = (),
    headers: Mapping[str, str] | None = None,
) -> Response[str]:
    """The HTTP answer of a service's outcome or refusal, as the tables say."""
    if isinstance(outcome, Refused):
        status = REFUSALS[outcome.reason]
        error = ErrorAnswer(error=outcome.reason, detail=outcome.detail, fields=tuple(fields))
        # A failure is logged where it is caught, with its cause (`api/http.py`).
        if status < HTTPStatus.INTERNAL_SERVER_ERROR:
            logger.info("request refused", reason=outcome.reason, fields=len(error.fields))
        body: BaseModel = error
    else:
        status, body = OUTCOMES[type(outcome).__name__].of(outcome), outcome
    return Response(
        status,
        content_types.APPLICATION_JSON,
        body.model_dump_json(),
        headers=dict(headers or {}),
    )


# What every route that takes input may answer besides its own outcomes.
REQUEST_REFUSALS = ("invalid-request", "unsupported-media-type", "internal-error", "retry-later")


def documented(
    outcomes: Iterable[type[BaseModel]], refusals: Iterable[str] = REQUEST_REFUSALS
) -> dict[int, OpenAPIResponse]:
    """A route's `responses=`: the statuses its outcomes and refusals may have, each with
    its bodies (a union where one status has several). The handlers return `Response[str]`,
    which Powertools would otherwise document as one 200 string."""
    bodies: dict[int, Any] = {}
    for model in outcomes:
        for status in OUTCOMES[model.__name__].may_be:
            bodies[status] = bodies[status] | model if status in bodies else model
    for reason in refusals:
        status = REFUSALS[reason]
        bodies[status] = bodies[status] | ErrorAnswer if status in bodies else ErrorAnswer
    return {
        int(status): {
            "description": HTTPStatus(status).phrase,
            "content": {content_types.APPLICATION_JSON: {"model": body}},
        }
        for status, body in sorted(bodies.items())
    }
