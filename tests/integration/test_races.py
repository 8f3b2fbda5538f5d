"""Races over HTTP: real threads, real requests, against a moto server on 127.0.0.1."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import boto3
import pytest
from botocore.config import Config

from builders import IDLE, NOW, ORIGIN, owner, seed
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.opwindow import WINDOW_SIZE, Actor, OpKind, OpRef
from seedkeeper.domain.record import Supported
from seedkeeper.domain.refused import Refused
from seedkeeper.store.lifecycle import Conflict, Lifecycle, Written
from seedkeeper_tools.infra import create_table, load_template

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

THREADS = 16
T = TypeVar("T")


@pytest.fixture
def http_table(moto_endpoint: str, aws_credentials: None) -> Table:
    name = f"race-{uuid.uuid4().hex}"  # ids of live objects recur within a process
    config = Config(max_pool_connections=THREADS * 2, retries={"mode": "standard"})
    create_table(
        boto3.client("dynamodb", endpoint_url=moto_endpoint, config=config), name, load_template()
    )
    return boto3.resource("dynamodb", endpoint_url=moto_endpoint, config=config).Table(name)


def all_at_once(work: Callable[[int], T]) -> list[T]:
    """Run `work(i)` on THREADS threads released together by a barrier."""
    barrier = threading.Barrier(THREADS)

    def released(index: int) -> T:
        barrier.wait()
        return work(index)

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(released, range(THREADS)))


def test_sixteen_births_of_one_slot_have_exactly_one_winner(http_table: Table) -> None:
    lifecycle = Lifecycle(http_table)
    outcomes = all_at_once(
        lambda index: lifecycle.birth(
            "contested",
            Binding(owner=owner(run=f"run-{index}"), seed=seed(), origin=ORIGIN),
            now=NOW,
            idle_deadline=NOW + IDLE,
        )
    )
    winners = [outcome for outcome in outcomes if isinstance(outcome, Written)]
    assert len(winners) == 1
    (winner,) = winners
    stored = lifecycle.read("contested")
    assert stored == Supported(winner.record)
    losers = [outcome for outcome in outcomes if not isinstance(outcome, Written)]
    assert all(loser == Conflict(stored) for loser in losers)


def test_sixteen_reservations_in_one_window_never_share_an_ordinal(http_table: Table) -> None:
    lifecycle = Lifecycle(http_table)
    birth = lifecycle.birth(
        "window", Binding(owner=None, seed=None, origin=None), now=NOW, idle_deadline=NOW + IDLE
    )
    assert isinstance(birth, Written)
    launch = OpRef(ordinal=1, actor=Actor.SEED_FN, generation=1)
    launched = lifecycle.write(
        transitions.RECORD_INCARNATION,
        birth.record,
        transitions.Launched(incarnation="local:window", launch=launch, now=NOW),
    )
    assert isinstance(launched, Written)

    def reserve_until_decided(_: int) -> int | None:
        """Reserve; on a lost race, re-decide on the record the conflict carries."""
        classified = lifecycle.read("window")
        while isinstance(classified, Supported):
            outcome = lifecycle.write(
                transitions.RESERVE,
                classified.record,
                transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SLOT_TASK, now=NOW),
            )
            if isinstance(outcome, Written):
                assert outcome.entry is not None
                return outcome.entry.ordinal
            if isinstance(outcome, Refused):
                return None
            assert isinstance(outcome, Conflict)
            classified = outcome.current
        raise AssertionError(classified)

    ordinals = all_at_once(reserve_until_decided)
    granted = [ordinal for ordinal in ordinals if ordinal is not None]
    assert len(granted) == len(set(granted)) == THREADS == WINDOW_SIZE
    final = lifecycle.read("window")
    assert isinstance(final, Supported)
    assert final.record.window.unsettled == WINDOW_SIZE
    assert sorted(entry.ordinal for entry in final.record.window.entries) == sorted(granted)
