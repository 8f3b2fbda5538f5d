"""The seed function's pure decisions: who may attach (the table's TOUCH), and what each
state answers (with its status from the answer table)."""

from __future__ import annotations

from typing import Any

import pytest

from builders import ORIGIN, owner, record_in, seed
from seedkeeper.api.answers import OUTCOMES
from seedkeeper.domain.outcomes import Cold, NotSeeded, Seeded, Seeding
from seedkeeper.domain.record import SlotRecord, State
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.transitions import TOUCH, Change, Poll
from seedkeeper.services.seed import SeedRequest, outcome_of


def request(**changes: Any) -> SeedRequest:
    fields: dict[str, Any] = {
        "slot": "slot-1",
        "seed": seed(),
        "claim": owner(),
        "origin": ORIGIN,
    }
    return SeedRequest(**(fields | changes))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"claim": owner(run="run-2")}, "claim-mismatch"),
        ({"claim": owner(head="b" * 40)}, "claim-mismatch"),
        ({"claim": None}, "claim-mismatch"),
        ({"seed": seed(sha="c" * 40)}, "seed-mismatch"),
        ({"seed": None}, "seed-mismatch"),
        ({"origin": None}, "origin-mismatch"),
        ({"origin": "https://git.example.com/other.git"}, "origin-mismatch"),
        ({}, None),
    ],
)
def test_only_the_same_owner_seed_and_origin_may_attach(
    changes: dict[str, Any], reason: str | None
) -> None:
    assert refusal(request(**changes), record_in(State.SEEDED)) == reason


def test_a_closed_slot_refuses_even_its_owner() -> None:
    cold = request(seed=None, claim=None, origin=None)
    for state in (State.CLOSING, State.RETIRED):
        assert refusal(cold, record_in(state)) == "slot-closed"


def test_another_caller_learns_nothing_of_a_closed_slot() -> None:
    """The binding is checked before the state: a mismatch never says "closed"."""
    assert refusal(request(), record_in(State.CLOSING)) == "claim-mismatch"


def refusal(request: SeedRequest, record: SlotRecord) -> str | None:
    decision = TOUCH.decide(record, Poll(request.binding, now=1, idle_deadline=2))
    if isinstance(decision, Refused):
        return decision.reason
    assert isinstance(decision, Change)
    return None


@pytest.mark.parametrize(
    ("state", "status", "answer"),
    [
        (State.SEEDING, 202, Seeding),
        (State.SEEDED, 200, Seeded),
        (State.SEED_FAILED, 200, NotSeeded),
        (State.UNSEEDED, 200, Cold),
    ],
)
def test_each_state_has_its_answer(state: State, status: int, answer: type) -> None:
    body = outcome_of(record_in(state))
    assert isinstance(body, answer)
    assert OUTCOMES[answer.__name__].of(body) == status


def test_the_seeded_answer_uses_the_wire_names() -> None:
    body = outcome_of(record_in(State.SEEDED))
    wire = body.model_dump(mode="json")
    assert wire["from"] == "checkout-0001"
    assert wire["seeded"] is True
    assert wire["cached"] is True
    assert wire["claim"] == owner().model_dump()
    assert "from_" not in wire


def test_a_request_refuses_unknown_fields_and_credentials_in_the_origin() -> None:
    with pytest.raises(ValueError, match="bearer"):
        SeedRequest.model_validate({"slot": "s", "seed": None, "bearer": "token"})
    with pytest.raises(ValueError, match="user-info"):
        request(origin="https://user:token@git.example.com/r.git")
    with pytest.raises(ValueError, match="seed"):
        SeedRequest.model_validate({"slot": "s"})
