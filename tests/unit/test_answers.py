"""The answer table: every outcome a service returns and every refusal it makes has a row,
and each row names a real outcome."""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from seedkeeper.api import answers
from seedkeeper.api.answers import answer
from seedkeeper.domain import outcomes, task_api
from seedkeeper.domain.record import State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions import KEEPALIVE, RESUME, TOUCH, InState, Transition
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


LAYER = Path(answers.__file__).parents[1]


def written_refusals(function: Callable[..., Any]) -> set[str]:
    """Each `Refused("token")` in `function`'s code and in the code of the layer's functions
    it calls, transitively (a token the test cannot read fails it)."""
    tokens: set[str] = set()
    seen: set[object] = set()

    def visit(function: Callable[..., Any]) -> None:
        code = function.__code__
        if code in seen or not code.co_filename.startswith(str(LAYER)):
            return
        seen.add(code)
        tree = ast.parse(Path(code.co_filename).read_text())
        bodies = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.Lambda) and node.lineno == code.co_firstlineno
        ]
        for call in (n for body in bodies for n in ast.walk(body) if isinstance(n, ast.Call)):
            name = call.func
            if isinstance(name, ast.Name) and name.id == "Refused":
                (token, *_) = call.args
                value = token.value if isinstance(token, ast.Constant) else None
                assert isinstance(value, str), f"{code.co_name}: {ast.unparse(call)}"
                tokens.add(value)
                continue
            called: object = None
            if isinstance(name, ast.Name):
                called = function.__globals__.get(name.id)
            elif isinstance(name, ast.Attribute) and isinstance(name.value, ast.Name):
                called = getattr(function.__globals__.get(name.value.id), name.attr, None)
            if inspect.isfunction(called):
                visit(called)

    visit(function)
    return tokens


def refusals(transition: Transition[Any]) -> set[str]:
    """Every token `transition` may refuse with: its checks' (an `InState` without a reason:
    `state-<state>` of each state it does not leave), and its effect's."""
    checks = set()
    for check in transition.checks:
        if isinstance(check, InState) and check.reason is None:
            checks |= {f"state-{state}" for state in State if state not in check.states}
        else:
            assert check.reason is not None
            checks.add(check.reason)
    return checks | written_refusals(transition.effect)


def test_the_refusals_of_a_transition_are_read_from_its_checks_and_its_effect() -> None:
    assert refusals(RESUME) == {
        "claim-mismatch",
        "seed-mismatch",
        "origin-mismatch",
        "slot-closed",
        "checkpoint-not-counted",
        "window-full",
    }


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
    reason a rotation's transaction can be lost for, every refusal of the transitions the
    seed function answers (a poll's, a keepalive's, a resume's as the seed service turns
    it), and every error's token: a token without a row would be a 500."""
    written = {
        node.args[0].value
        for path in [
            *(LAYER / "services").glob("*.py"),
            *(LAYER / "api").glob("*.py"),
            LAYER / "domain" / "snapshots.py",  # a rotation plan's refusals: SnapshotRefused
        ]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Refused"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    resumes = {
        refused.reason
        for token in refusals(RESUME)
        if isinstance(refused := SeedService._not_resumed(Refused(token)), Refused)
    }
    answered = refusals(TOUCH) | refusals(KEEPALIVE) | resumes
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
    assert written | answered | errors | declared <= set(answers.REFUSALS)


def test_a_resume_is_answered_whatever_it_refuses_with() -> None:
    """Each refusal of a resume is an outcome (a checkpoint that no longer counts) or a
    token with its status: never an unhandled error, never a 500."""
    for token in refusals(RESUME):
        answered = answer(SeedService._not_resumed(Refused(token)))
        assert answered.status_code != HTTPStatus.INTERNAL_SERVER_ERROR, token
