"""The checkpoint function, the slot task's own: its start (the URLs it restores from, for
the attempt's task only) and the upload and record of its frozen checkout."""

from __future__ import annotations

from seedkeeper.coldstart import handler_imports

with handler_imports():  # no collection over what lives as long as the process
    from aws_lambda_powertools.event_handler import Response

    from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
    from seedkeeper.api.http import entrypoint, function_url_app
    from seedkeeper.config import checkpoint_service_from_env, task_starts_from_env
    from seedkeeper.domain.outcomes import (
        CheckpointNotTaken,
        CheckpointRecorded,
        RestoreGrant,
        UploadGrant,
    )
    from seedkeeper.services import task_start
    from seedkeeper.services.checkpoints import REFUSALS, Captured, NotTaken
    from seedkeeper.services.task_start import TaskStart

app = function_url_app()


@app.post(
    "/tasks/start",
    responses=documented([RestoreGrant], (*REQUEST_REFUSALS, *task_start.REFUSALS)),
)
def start(started: TaskStart) -> Response[str]:
    """The attempt's task, started: its incarnation recorded, its restore's URLs answered."""
    return answer(task_starts_from_env().start(started))


@app.post(
    "/checkpoints/upload", responses=documented([UploadGrant], (*REQUEST_REFUSALS, *REFUSALS))
)
def upload(captured: Captured) -> Response[str]:
    """A presigned PUT for the op's checkpoint, carrying its length, MD5 and SHA-256."""
    return answer(checkpoint_service_from_env().upload(captured))


@app.post(
    "/checkpoints/record",
    responses=documented([CheckpointRecorded], (*REQUEST_REFUSALS, *REFUSALS)),
)
def record(captured: Captured) -> Response[str]:
    """HEAD the object, compare it with what was captured, record it conditionally."""
    return answer(checkpoint_service_from_env().record(captured))


@app.post(
    "/checkpoints/failed",
    responses=documented([CheckpointNotTaken], (*REQUEST_REFUSALS, *REFUSALS)),
)
def failed(not_taken: NotTaken) -> Response[str]:
    """No checkpoint this time: the slot is seeded again and asked again after a backoff."""
    return answer(checkpoint_service_from_env().not_taken(not_taken))


lambda_handler = entrypoint(app)
