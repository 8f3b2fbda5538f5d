"""The rotation function: record, inspect and delete a resource's snapshots."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Path

from seedkeeper.api.http import ErrorAnswer, entrypoint, function_url_app, json_response, responses
from seedkeeper.config import snapshots_from_env
from seedkeeper.domain.models import ResourceName
from seedkeeper.domain.snapshots import NewSnapshot
from seedkeeper.services.rotation import Payment, Recorded, SnapshotStatus

app = function_url_app()


@app.post(
    "/snapshots",
    responses=responses(
        {HTTPStatus.OK: Recorded, HTTPStatus.CREATED: Recorded, HTTPStatus.CONFLICT: ErrorAnswer}
    ),
)
def record(snapshot: NewSnapshot) -> Response[str]:
    """201 rotated, 200 the current snapshot again; 409 `backup-id-owned` when an id was
    first recorded by another resource (nothing is written), or another reason token."""
    recorded = snapshots_from_env().record(snapshot)
    return json_response(HTTPStatus.CREATED if recorded.rotated else HTTPStatus.OK, recorded)


@app.get(
    "/snapshots/<resource>",
    responses=responses({HTTPStatus.OK: SnapshotStatus, HTTPStatus.NOT_FOUND: ErrorAnswer}),
)
def status(resource: Annotated[ResourceName, Path()]) -> Response[str]:
    return json_response(HTTPStatus.OK, snapshots_from_env().status(resource))


@app.delete(
    "/snapshots/<resource>",
    responses=responses(
        {
            HTTPStatus.OK: Payment,
            HTTPStatus.NOT_FOUND: ErrorAnswer,
            HTTPStatus.CONFLICT: ErrorAnswer,
            HTTPStatus.SERVICE_UNAVAILABLE: Payment,
        }
    ),
)
def delete(resource: Annotated[ResourceName, Path()]) -> Response[str]:
    """200 once every object is gone; 503 while R2 still owes some (retry the DELETE)."""
    payment = snapshots_from_env().delete(resource)
    done = not payment.pending
    return json_response(HTTPStatus.OK if done else HTTPStatus.SERVICE_UNAVAILABLE, payment)


lambda_handler = entrypoint(app)
