"""A stopped task's cause, as a runtime names it, becomes the token a lost record keeps."""

from __future__ import annotations

import pytest

from seedkeeper.domain.record import Loss
from seedkeeper.domain.runtime import TASK_STOPPED, TaskState, TaskStatus, stop_token


@pytest.mark.parametrize(
    ("cause", "token"),
    [
        # ECS's stop codes (TaskStopCode)
        ("SpotInterruption", "spot-interruption"),
        ("TaskFailedToStart", "task-failed-to-start"),
        ("EssentialContainerExited", "essential-container-exited"),
        ("UserInitiated", "user-initiated"),
        ("ServiceSchedulerInitiated", "service-scheduler-initiated"),
        ("TerminationNotice", "termination-notice"),
        ("InfrastructureHealth", "infrastructure-health"),
        # Docker's
        ("OOMKilled", "oom-killed"),
        # nothing a token can hold
        (None, TASK_STOPPED),
        ("", TASK_STOPPED),
        ("9Lives", TASK_STOPPED),
        ("Ünïcode", TASK_STOPPED),
        ("A" + "b" * 100, "a" + "b" * 63),
    ],
)
def test_a_stop_cause_becomes_a_token_a_loss_keeps(cause: str | None, token: str) -> None:
    assert stop_token(cause) == token
    stopped = TaskState.stopped(cause, "said")
    assert (stopped.status, stopped.reason) == (TaskStatus.STOPPED, token)
    assert Loss(reason=stopped.reason, detail=stopped.detail, at=0).reason == token


def test_what_the_runtime_said_is_cut_to_what_a_record_keeps() -> None:
    stopped = TaskState.stopped("SpotInterruption", "x" * 2000)
    assert Loss(reason=stopped.reason, detail=stopped.detail, at=0).detail == "x" * 512
