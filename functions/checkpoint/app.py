"""The checkpoint function, the slot task's API: its start (the URLs it restores from, for
the attempt's task only), its record (read, and its own transitions: the task role holds no
table grant), and the upload and record of its frozen checkout. Every route acts only for
the task that signed the call (`caller()`)."""

from __future__ import annotations

from seedkeeper.coldstart import handler_imports

with handler_imports():  # no collection over what lives as long as the process
    from aws_lambda_powertools.event_handler import Response

    from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
    from seedkeeper.api.http import entrypoint, function_url_app
    from seedkeeper.config import (
        caller_from_env,
        checkpoint_service_from_env,
        standby_desk_from_env,
        task_records_from_env,
        task_starts_from_env,
    )
    from seedkeeper.domain.caller import Caller
    from seedkeeper.domain.outcomes import (
        CheckpointNotTaken,
        CheckpointRecorded,
        RestoreGrant,
        UploadGrant,
    )
    from seedkeeper.domain.task_api import StandbyAnswer, StandbyCall
    from seedkeeper.services import standbys, task_records, task_start
    from seedkeeper.services.checkpoints import REFUSALS, Captured, NotTaken
    from seedkeeper.services.task_records import (
        AttemptCall,
        Freeze,
        Lose,
        RecordRead,
        SettleSeed,
        TaskRecord,
        TaskWrite,
        Thaw,
    )
    from seedkeeper.services.task_start import TaskStart

app = function_url_app()
TASK_REFUSALS = (*REQUEST_REFUSALS, *task_records.REFUSALS)


def caller() -> Caller:
    """The slot task role session that signed this call (none: anyone else)."""
    return caller_from_env(app.current_event.request_context.authorizer.iam.user_arn)


@app.post(
    "/tasks/start",
    responses=documented([RestoreGrant], (*REQUEST_REFUSALS, *task_start.REFUSALS)),
)
def start(started: TaskStart) -> Response[str]:
    """The attempt's task, started: its incarnation recorded, its restore's URLs answered."""
    return answer(task_starts_from_env().start(started, caller()))


@app.post(
    "/tasks/standby",
    responses=documented([StandbyAnswer], (*REQUEST_REFUSALS, *standbys.REFUSALS)),
)
def standby(call: StandbyCall) -> Response[str]:
    """A standby's task, waiting: reported in, its generation's archives (pre-seeded), its
    assignment once a seed takes it, or told to leave."""
    return answer(standby_desk_from_env().call(call, caller()))


@app.post("/tasks/record", responses=documented([TaskRecord], TASK_REFUSALS))
def record_read(call: RecordRead) -> Response[str]:
    """The task's own record, as read now."""
    return answer(task_records_from_env().read(call, caller()))


@app.post("/tasks/settle", responses=documented([TaskWrite], TASK_REFUSALS))
def settle(call: SettleSeed) -> Response[str]:
    """The task's verdict on its attempt's restore: seeded, or seed_failed and why."""
    return answer(task_records_from_env().settle_seed(call, caller()))


@app.post("/tasks/freeze", responses=documented([TaskWrite], TASK_REFUSALS))
def freeze(call: Freeze) -> Response[str]:
    """Before the task stops its sandbox for the checkpoint: a poll says it may be frozen."""
    return answer(task_records_from_env().freeze(call, caller()))


@app.post("/tasks/thaw", responses=documented([TaskWrite], TASK_REFUSALS))
def thaw(call: Thaw) -> Response[str]:
    """After the task resumed its sandbox (a poll came back): the checkpoint abandoned."""
    return answer(task_records_from_env().thaw(call, caller()))


@app.post("/tasks/checkpoint-on-stop", responses=documented([TaskWrite], TASK_REFUSALS))
def checkpoint_on_stop(call: AttemptCall) -> Response[str]:
    """The platform is stopping the task: it asks itself for a checkpoint."""
    return answer(task_records_from_env().checkpoint_on_stop(call, caller()))


@app.post("/tasks/park-on-stop", responses=documented([TaskWrite], TASK_REFUSALS))
def park_on_stop(call: AttemptCall) -> Response[str]:
    """The stopping task's checkpoint is recorded and its sandbox frozen since: parked."""
    return answer(task_records_from_env().park_on_stop(call, caller()))


@app.post("/tasks/lose", responses=documented([TaskWrite], TASK_REFUSALS))
def lose(call: Lose) -> Response[str]:
    """The stopping task could not keep its slot's work: recorded lost, and why."""
    return answer(task_records_from_env().lose(call, caller()))


@app.post(
    "/checkpoints/upload", responses=documented([UploadGrant], (*REQUEST_REFUSALS, *REFUSALS))
)
def upload(captured: Captured) -> Response[str]:
    """A presigned PUT for the op's checkpoint, carrying its length, MD5 and SHA-256."""
    return answer(checkpoint_service_from_env().upload(captured, caller()))


@app.post(
    "/checkpoints/record",
    responses=documented([CheckpointRecorded], (*REQUEST_REFUSALS, *REFUSALS)),
)
def record(captured: Captured) -> Response[str]:
    """HEAD the object, compare it with what was captured, record it conditionally."""
    return answer(checkpoint_service_from_env().record(captured, caller()))


@app.post(
    "/checkpoints/failed",
    responses=documented([CheckpointNotTaken], (*REQUEST_REFUSALS, *REFUSALS)),
)
def failed(not_taken: NotTaken) -> Response[str]:
    """No checkpoint this time: the slot is seeded again and asked again after a backoff."""
    return answer(checkpoint_service_from_env().not_taken(not_taken, caller()))


lambda_handler = entrypoint(app)
