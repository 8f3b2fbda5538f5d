"""The local stack over HTTP, as the executor would call it: signed requests through the
function-URL gateway to the real handlers, real slot processes, moto for DynamoDB and R2."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from conftest import running_local_stack
from executor import ORIGIN, claim_for, client_for, publish
from repos import git, make_repository
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper_client import (
    ClaimNotEchoed,
    Cold,
    NotSeeded,
    OwnerClaim,
    Seeded,
    SeedIdentity,
    SeedkeeperClient,
    SeedkeeperRefused,
)
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.local.stack import LocalStack


@pytest.fixture
def stack(tmp_path: Path, aws_credentials: None) -> Iterator[LocalStack]:
    with running_local_stack(tmp_path, idle_window=2) as local:
        yield local


@pytest.fixture
def client(stack: LocalStack) -> SeedkeeperClient:
    return client_for(stack)


def test_the_demo_scenario_over_signed_http(
    stack: LocalStack, client: SeedkeeperClient, tmp_path: Path
) -> None:
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    claim = claim_for(seed)
    seeded = client.seed("slot-1", seed, claim=claim, origin=ORIGIN, wait=True, timeout=60)
    assert isinstance(seeded, Seeded)
    assert seeded.claim == claim
    cold = client.seed("cold-1", None, wait=True)
    assert isinstance(cold, Cold)

    incarnation = seeded.incarnation or ""
    receipt = client.receipt("slot-1", claim=claim, seed=seed, incarnation=incarnation)
    assert (receipt.checkpoint, receipt.why) == ("unknown", "no-checkpoint")
    evidence = client.slot_evidence("slot-1", claim=claim)
    assert (evidence.state, evidence.disposition) == ("seeded", "retained")
    with pytest.raises(SeedkeeperRefused) as refused:
        client.slot_evidence("slot-1", claim=claim_for(seed, run="run-2"))
    assert (refused.value.status, refused.value.reason) == (404, "no-match")
    with pytest.raises(SeedkeeperRefused) as taken:
        client.seed("slot-1", seed, claim=claim_for(seed, requester="mallory"), origin=ORIGIN)
    assert (taken.value.status, taken.value.reason) == (409, "claim-mismatch")

    checkout = stack.workspace("slot-1") / CHECKOUT
    (checkout / "WORK.md").write_text("unpublished\n")
    time.sleep(3)  # the idle window (2 s) passes
    report = stack.sweep()
    assert report.stopped == ["cold-1"]
    assert stack.runtime.status("local:cold-1:1") is TaskStatus.STOPPED
    assert stack.runtime.status(incarnation) is TaskStatus.RUNNING
    assert (checkout / "WORK.md").read_text() == "unpublished\n"

    repo = tmp_path / "widgets"
    for n in (2, 3):
        (repo / f"change-{n}").write_text(str(n))
        git(repo, "add", "-A")
        git(repo, "-c", "user.email=a@b.c", "-c", "user.name=n", "commit", "-qm", str(n))
        publish(client, repo, tmp_path / "scratch")
    status = client.snapshot_status("widgets")
    assert status.current is not None
    assert status.retired is not None
    assert (status.current.generation, status.retired.generation) == (3, 2)
    assert client.delete_snapshots("widgets").pending == ()
    with pytest.raises(SeedkeeperRefused) as gone:
        client.snapshot_status("widgets")
    assert gone.value.status == 404


def test_a_seed_missing_answer_is_not_a_claim_echo(client: SeedkeeperClient) -> None:
    seed = SeedIdentity(
        resource="widgets", ref="main", sha="a" * 40, checkout_backup_id="nothing-recorded"
    )
    answer = client.seed("slot-9", seed, claim=claim_for(seed), origin=ORIGIN)
    assert isinstance(answer, NotSeeded)
    assert answer.reason == "seed-missing"


def test_a_cold_answer_about_another_slot_or_without_the_claim_raises() -> None:
    """A claimed slot is never taken for cold, nor one slot for another: a cold answer must
    name the slot asked about and echo the claim, with an incarnation when claimed."""
    claim = OwnerClaim(
        run="r", requester="q", thread="t", repository="a/b", ref="main", head="a" * 40
    )
    cold = {"state": "unseeded", "seeded": False, "slot": "s", "attempt": 1}
    echoed = cold | {"incarnation": "local:s:1", "claim": claim.model_dump()}
    assert SeedkeeperClient._seed_answer(json.dumps(echoed).encode(), claim, "s") == Cold(
        slot="s", attempt=1, incarnation="local:s:1", claim=claim
    )
    unclaimed = cold | {"incarnation": "local:s:1", "claim": None}
    assert isinstance(
        SeedkeeperClient._seed_answer(json.dumps(unclaimed).encode(), None, "s"), Cold
    )
    for answer, asked, slot in (
        (unclaimed, claim, "s"),  # the claim not echoed
        (echoed | {"incarnation": None}, claim, "s"),  # no incarnation
        (echoed | {"claim": claim.model_copy(update={"run": "r2"}).model_dump()}, claim, "s"),
        (echoed, claim, "other-slot"),  # about another slot
        (unclaimed, None, "other-slot"),
        (echoed, None, "s"),  # a claimed slot answering an unclaimed caller
    ):
        with pytest.raises(ClaimNotEchoed):
            SeedkeeperClient._seed_answer(json.dumps(answer).encode(), asked, slot)


def test_a_claimed_cold_seed_is_answered_with_its_claim(client: SeedkeeperClient) -> None:
    claim = OwnerClaim(
        run="r", requester="q", thread="t", repository="a/b", ref="main", head="a" * 40
    )
    answer = client.seed("claimed-cold", None, claim=claim)
    assert isinstance(answer, Cold)
    assert (answer.slot, answer.claim) == ("claimed-cold", claim)
    assert answer.incarnation


def test_a_claimed_answer_that_does_not_echo_the_claim_raises() -> None:
    claim = OwnerClaim(
        run="r", requester="q", thread="t", repository="a/b", ref="main", head="a" * 40
    )
    other = claim.model_copy(update={"run": "someone-else"})
    seeding = {"state": "seeding", "slot": "s", "attempt": 1, "incarnation": "local:s:1"}
    with pytest.raises(ClaimNotEchoed):
        SeedkeeperClient._seed_answer(json.dumps(seeding | {"claim": None}).encode(), claim, "s")
    with pytest.raises(ClaimNotEchoed):
        SeedkeeperClient._seed_answer(
            json.dumps(seeding | {"claim": other.model_dump()}).encode(), claim, "s"
        )
    with pytest.raises(ClaimNotEchoed):
        SeedkeeperClient._seed_answer(
            json.dumps(seeding | {"claim": claim.model_dump(), "incarnation": None}).encode(),
            claim,
            "s",
        )


def send(url: str, method: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body or None, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def signed(url: str, body: bytes, key: str, secret: str) -> dict[str, str]:
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"Content-Type": "application/json"}
    )
    SigV4Auth(Credentials(key, secret), "lambda", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def test_unsigned_wrongly_signed_and_tampered_requests_get_403(stack: LocalStack) -> None:
    url = stack.url + "/seed"
    body = json.dumps({"slot": "slot-x", "seed": None}).encode()
    key, secret = stack.credentials.access_key, stack.credentials.secret_key
    assert send(url, "POST", body, {"Content-Type": "application/json"}) == 403
    assert send(url, "POST", body, signed(url, body, key, "not-the-secret")) == 403
    assert send(url, "POST", body, signed(url, body, "someone-else", secret)) == 403
    headers = signed(url, body, key, secret)
    changed = json.dumps({"slot": "slot-y", "seed": None}).encode()
    assert send(url, "POST", changed, headers) == 403  # replayed with a changed body
    assert send(stack.url + "/receipt", "POST", body, headers) == 403  # another path
    assert send(url, "POST", body, headers) == 200  # the genuine request goes through
    oversized = b"x" * (256 * 1024 + 1)
    assert send(url, "POST", oversized, signed(url, oversized, key, secret)) == 413
