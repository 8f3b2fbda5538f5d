"""The rotation function: record, inspect and delete a resource's snapshots."""

from __future__ import annotations

from seedkeeper.coldstart import handler_imports

with handler_imports():  # no collection over what lives as long as the process
    from typing import Annotated

    from aws_lambda_powertools.event_handler import Response
    from aws_lambda_powertools.event_handler.openapi.params import Path

    from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
    from seedkeeper.api.http import entrypoint, function_url_app
    from seedkeeper.config import snapshots_from_env
    from seedkeeper.domain.models import ResourceName
    from seedkeeper.domain.outcomes import Payment, Recorded, SnapshotStatus
    from seedkeeper.domain.snapshots import NewSnapshot
    from seedkeeper.services.rotation import RECORD_REFUSALS

app = function_url_app()


@app.post(
    "/snapshots",
    responses=documented([Recorded], (*REQUEST_REFUSALS, *RECORD_REFUSALS, "rotation-conflict")),
)
def record(snapshot: NewSnapshot) -> Response[str]:
    """201 rotated, 200 the current snapshot again; 409 `backup-id-owned` when an id was
    first recorded by another resource (nothing is written), `rotation-conflict` when
    another rotation of the resource committed first (publish again), or another reason
    token."""
    return answer(snapshots_from_env().record(snapshot))


@app.get(
    "/snapshots/<resource>",
    responses=documented([SnapshotStatus], (*REQUEST_REFUSALS, "resource-not-found")),
)
def status(resource: Annotated[ResourceName, Path()]) -> Response[str]:
    return answer(snapshots_from_env().status(resource))


@app.delete(
    "/snapshots/<resource>",
    responses=documented([Payment], (*REQUEST_REFUSALS, "resource-not-found", "rotation-conflict")),
)
def delete(resource: Annotated[ResourceName, Path()]) -> Response[str]:
    """200 once every object is gone; 503 while R2 still owes some (retry the DELETE)."""
    return answer(snapshots_from_env().delete(resource))


lambda_handler = entrypoint(app)
