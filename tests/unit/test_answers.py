"""The answer table: every outcome a service returns and every refusal it makes has a row,
and each row names a real outcome."""

from __future__ import annotations

import ast
import inspect
import typing
from http import HTTPStatus
from pathlib import Path

from pydantic import BaseModel

from seedkeeper.api import answers
from seedkeeper.api.answers import answer
from seedkeeper.domain import outcomes, task_api
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions import TOUCH
from seedkeeper.errors import (
    MalformedRecord,
    R2Unconfigured,
    ResourceNotFound,
    RotationConflict,
    SeedkeeperError,
    StoreUnavailable,
)
from seedkeeper.services.receipts import NO_MATCH, Witness
from seedkeeper.services.rotation import RECORD_REFUSALS, Snapshots
from seedkeeper.services.seed import KEEPALIVE_REFUSALS, REFUSALS, SeedService
from seedkeeper.store.snapshots import Lost


def returned(method: object) -> set[str]:
    """The outcome classes a service method is annotated to return."""
    annotation = typing.get_type_hints(method)["return"]
    members = typing.get_args(annotation) or (annotation,)
    return {member.__name__ for member in members if issubclass(member, BaseModel)}


def test_every_outcome_a_service_returns_has_a_status() -> None:
    services = [
        SeedService.seed,
        SeedService.keepalive,
        Witness.receipt,
        Witness.evidence,
        Snapshots.record,
        Snapshots.status,
        Snapshots.delete,
    ]
    named = set().union(*(returned(method) for method in services))
    assert named <= set(answers.OUTCOMES)


def test_every_row_names_an_outcome() -> None:
    models = {
        name
        for module in (outcomes, task_api)
        for name, member in inspect.getmembers(module, inspect.isclass)
        if issubclass(member, BaseModel) and member.__module__ == module.__name__
    }
    nested = {"ObjectCounts", "GrantedArchive"}  # parts of answers, never answers of their own
    calls = {
        "StandbyCall",
        "TaskOp",
        "TaskCall",
        "RecordRead",
        "AttemptCall",
        "SettleSeed",
        "Freeze",
        "Thaw",
        "Lose",
    }
    assert set(answers.OUTCOMES) == (models - nested - calls) | {"Health"}


def test_every_refusal_a_service_makes_has_a_status() -> None:
    """Every `Refused("token")` the services, the API and the rotation plan write, every
    reason a rotation's transaction can be lost for, the seed's TOUCH refusals (a poll that
    is not the slot's own), and every error's token: a token without a row would be a 500."""
    layer = Path(answers.__file__).parents[1]
    written = {
        node.args[0].value
        for path in [
            *(layer / "services").glob("*.py"),
            *(layer / "api").glob("*.py"),
            layer / "domain" / "snapshots.py",  # a rotation plan's refusals: SnapshotRefused
        ]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Refused"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    touch = {check.reason for check in TOUCH.checks if check.reason is not None}
    errors = {
        answers.refusal_of(error).reason
        for error in (
            ResourceNotFound("r"),
            RotationConflict("r"),
            R2Unconfigured(("bucket",)),
            StoreUnavailable("ThrottlingException"),
            MalformedRecord("m"),
            SeedkeeperError("other"),
        )
    }
    assert {"retry-later", "record-unsupported", "invalid-request"} <= written
    # A rotation's transaction lost on a condition: SnapshotRefused but for "conflict".
    lost = set(typing.get_args(typing.get_type_hints(Lost)["why"])) - {"conflict"}
    assert lost | {"backup-id-reused"} == set(RECORD_REFUSALS)
    declared = {NO_MATCH, *REFUSALS, *KEEPALIVE_REFUSALS, *RECORD_REFUSALS}
    assert written | touch | errors | declared <= set(answers.REFUSALS)


def test_a_resume_the_op_window_cannot_hold_is_a_retry_not_a_crash() -> None:
    """A parked record whose op window is full cannot reserve the resume's restore: the
    owner is told to come back (503), never answered by an unhandled error."""
    refused = SeedService._not_resumed(Refused("window-full"))
    assert isinstance(refused, Refused)
    assert answer(refused).status_code == HTTPStatus.SERVICE_UNAVAILABLE
