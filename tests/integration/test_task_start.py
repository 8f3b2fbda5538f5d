"""A slot task's start: RunTask carries no URL, and the task fetches its URLs itself from
the checkpoint function (`POST /tasks/start`), which answers only the attempt's task.

The seed function launches on ECS as moto plays it (every RunTask request is captured as
botocore sends it); the checkpoint function is invoked as Lambda does; a real slot task
that is not its attempt's is run to show it touches nothing.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pytest

from builders import NOW, ORIGIN, owner, stored_in, written
from conftest import Stack
from fargate import fargate_cluster
from functions import event, invoke, load_function
from seedkeeper import config
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.adapters.runtime import EcsRuntime, SlotRuntime
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding, SeedIdentity
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.record import SlotRecord, State
from seedkeeper.domain.snapshots import Archive, NewSnapshot
from seedkeeper.services.seed import SeedRequest, SeedService, SeedSettings
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_task.settings import ECS_METADATA_VARIABLE, TaskSettings
from seedkeeper_tools.local.runtime import LOCAL_TASK_ENVIRONMENT

checkpoint_function = load_function("checkpoint")

SLOT = "slot-1"
RESOURCE = "acme-widgets"
SEED = SeedIdentity(
    resource=RESOURCE,
    ref="main",
    sha="a" * 40,
    checkout_backup_id="checkout-0001",
    deps_backup_id="deps-0001",
)
TASK_ARN = "arn:aws:ecs:us-east-1:000000000000:task/seedkeeper/0123456789abcdef"
OTHER_ARN = "arn:aws:ecs:us-east-1:000000000000:task/seedkeeper/fedcba9876543210"
NO_MATCH: tuple[int, Any] = (
    404,
    {"error": "no-match", "detail": None, "fields": []},
)  # nothing more said


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "epoch_seconds", lambda: NOW + 10)


def record_snapshot(stack: Stack) -> None:
    stack.snapshots.record(
        NewSnapshot(
            resource=RESOURCE,
            ref=SEED.ref,
            sha=SEED.sha,
            created_at=NOW,
            checkout=Archive(backup_id="checkout-0001", size=10, sha256="0" * 64),
            deps=Archive(backup_id="deps-0001", size=10, sha256="1" * 64),
            lockfile_hash="lock-1",
        )
    )


def born(stack: Stack, slot: str = SLOT) -> SlotRecord:
    """A seeding record whose launch is not yet recorded (the seed function's birth)."""
    binding = Binding(owner=owner(), seed=SEED, origin=ORIGIN)
    return written(stack.store.lifecycle().birth(slot, binding, now=NOW, idle_deadline=NOW + 600))


def start(record: SlotRecord, incarnation: str, **changes: Any) -> tuple[int, Any]:
    op = record.window.entries[-1]
    body = {
        "slot": record.slot,
        "attempt": record.attempt,
        "incarnation": incarnation,
        "op": {"ordinal": op.ordinal, "generation": op.generation},
    } | changes
    request = event("checkpoint-upload", body=body, rawPath="/tasks/start")
    return invoke(checkpoint_function, request)


def read(stack: Stack, slot: str = SLOT) -> SlotRecord:
    classified = stack.store.lifecycle().read(slot)
    assert hasattr(classified, "record"), classified
    record: SlotRecord = classified.record
    return record


# -- RunTask -------------------------------------------------------------------------------


class Launches:
    """The ECS runtime on the moto server, each RunTask request kept as botocore sends it;
    `die_after_launch` plays a seed handler that dies between RunTask and its record."""

    def __init__(self, stack: Stack) -> None:
        client = boto3.client("ecs", endpoint_url=stack.endpoint, region_name="us-east-1")
        ec2 = boto3.client("ec2", endpoint_url=stack.endpoint, region_name="us-east-1")
        self.runtime = EcsRuntime(client, fargate_cluster(ec2, client))
        self.requests: list[dict[str, Any]] = []
        self.die_after_launch = False
        client.meta.events.register("provide-client-params.ecs.RunTask", self._keep)

    def _keep(self, params: dict[str, Any], **_: Any) -> None:
        self.requests.append(json.loads(json.dumps(params)))

    def __call__(self) -> SlotRuntime:
        return self

    def launch(self, plan: SlotPlan) -> str:
        incarnation = self.runtime.launch(plan)
        if self.die_after_launch:
            raise TimeoutError("the handler died after RunTask")
        return incarnation

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)


@pytest.fixture
def launches(stack: Stack) -> Launches:
    record_snapshot(stack)
    return Launches(stack)


def seed_service(stack: Stack, launches: Launches) -> SeedService:
    table = stack.store.table_resource()
    return SeedService(
        lifecycle=stack.store.lifecycle(),
        snapshots=SnapshotStore(table),
        r2=stack.r2,
        runtime=launches,
        settings=SeedSettings(),
        clock=lambda: NOW + 10,
    )


def request() -> SeedRequest:
    return SeedRequest(slot=SLOT, seed=SEED, claim=owner(), origin=ORIGIN)


def test_no_runtask_request_carries_a_url_or_a_signature(stack: Stack, launches: Launches) -> None:
    """A launch, a relaunch after a handler died, a new attempt after the task died: what
    DescribeTasks readers and CloudTrail see of each holds no bearer URL."""
    service = seed_service(stack, launches)
    launches.die_after_launch = True
    with pytest.raises(TimeoutError):
        service.seed(request())
    launches.die_after_launch = False
    service.seed(request())  # the poll: relaunches the attempt, records it
    launches.runtime.stop(read(stack).incarnation or "")
    service.seed(request())  # the task died: a new attempt

    assert len(launches.requests) == 3
    for sent in launches.requests:
        text = json.dumps(sent)
        r2 = (stack.endpoint, stack.r2_settings.bucket or "")  # R2's address and bucket
        for secret in ("X-Amz-", "Signature", "Credential", "Expires", *r2):
            assert secret not in text
        (override,) = sent["overrides"]["containerOverrides"]
        (variable,) = override["environment"]
        assert variable["name"] == PLAN_VARIABLE
        assert set(json.loads(variable["value"])) <= set(SlotPlan.model_fields)


def test_a_relaunch_sends_runtask_exactly_what_the_first_launch_sent(
    stack: Stack, launches: Launches
) -> None:
    """The client token's other parameters never change within an attempt, so ECS answers
    the first launch's task (a changed one would be a ConflictException); a new attempt has
    a token of its own."""
    service = seed_service(stack, launches)
    launches.die_after_launch = True
    with pytest.raises(TimeoutError):
        service.seed(request())
    launches.die_after_launch = False
    service.seed(request())
    first, relaunch = launches.requests
    assert relaunch == first
    assert read(stack).state is State.SEEDING

    launches.runtime.stop(read(stack).incarnation or "")
    service.seed(request())
    new_attempt = launches.requests[-1]
    assert new_attempt["clientToken"] != first["clientToken"]
    assert read(stack).attempt == 2


# -- POST /tasks/start --------------------------------------------------------------------


def test_the_attempts_task_is_granted_its_archives_and_recorded_as_its_incarnation(
    stack: Stack,
) -> None:
    record_snapshot(stack)
    record = born(stack)

    status, answer = start(record, TASK_ARN)

    assert status == 200, answer
    bucket = stack.r2_settings.bucket
    checkout, deps = answer["checkout"], answer["deps"]
    assert unquote(urlsplit(checkout["url"]).path) == f"/{bucket}/{backup_key('checkout-0001')}"
    assert unquote(urlsplit(deps["url"]).path) == f"/{bucket}/{backup_key('deps-0001')}"
    # What the records name for each, which the task verifies its download against.
    assert (checkout["size"], checkout["sha256"]) == (10, "0" * 64)
    assert (deps["size"], deps["sha256"]) == (10, "1" * 64)
    assert answer["resume"] is None
    assert "X-Amz-Signature=" in checkout["url"]
    after = read(stack)
    assert after.incarnation == TASK_ARN
    assert after.state is State.SEEDING
    # Asked again (its answer was lost): the same grant, nothing written.
    item = stack.wire_item(SLOT)
    assert start(record, TASK_ARN)[0] == 200
    assert stack.wire_item(SLOT) == item


def test_a_second_task_of_the_attempt_is_refused_and_learns_nothing(stack: Stack) -> None:
    record_snapshot(stack)
    record = born(stack)
    assert start(record, TASK_ARN)[0] == 200
    item = stack.wire_item(SLOT)

    assert start(record, OTHER_ARN) == NO_MATCH
    assert stack.wire_item(SLOT) == item


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"slot": "slot-nobody-has"}, id="absent-slot"),
        pytest.param({"attempt": 2}, id="another-attempt"),
        pytest.param({"op": {"ordinal": 9, "generation": 1}}, id="other-op"),
        pytest.param({"op": {"ordinal": 1, "generation": 2}}, id="other-generation"),
    ],
)
def test_a_start_that_names_anything_but_the_live_attempt_is_one_refusal(
    stack: Stack, changes: dict[str, Any]
) -> None:
    record_snapshot(stack)
    record = born(stack)
    item = stack.wire_item(SLOT)

    assert start(record, TASK_ARN, **changes) == NO_MATCH
    assert stack.wire_item(SLOT) == item


@pytest.mark.parametrize(
    "state", [State.SEEDED, State.SEED_FAILED, State.CHECKPOINTING, State.PARKED, State.LOST]
)
def test_a_settled_attempts_task_is_granted_nothing(stack: Stack, state: State) -> None:
    """Its restore settled: a task starting late (or again) restores nothing."""
    record = stored_in(stack.store.lifecycle(), SLOT, state, incarnation=TASK_ARN)

    assert start(record, TASK_ARN) == NO_MATCH


def test_a_cold_slots_task_is_recorded_and_granted_no_url(stack: Stack) -> None:
    cold = Binding(owner=None, seed=None, origin=None)
    record = written(stack.store.lifecycle().birth(SLOT, cold, now=NOW, idle_deadline=NOW + 600))

    status, answer = start(record, TASK_ARN)

    assert status == 200, answer
    assert (answer["checkout"], answer["deps"], answer["resume"]) == (None, None, None)
    assert read(stack).incarnation == TASK_ARN
    assert start(record, OTHER_ARN) == NO_MATCH


def test_a_seed_rotated_out_since_the_launch_is_granted_no_url(stack: Stack) -> None:
    """Nothing unrecorded is presigned: the record names the seed, no generation does."""
    record = born(stack)  # no snapshot recorded

    status, answer = start(record, TASK_ARN)

    assert (status, answer["error"]) == (409, "seed-missing")
    assert read(stack).incarnation == TASK_ARN  # the attempt's task: it records the failure


def test_a_resumed_attempt_is_granted_its_checkpoint_only(stack: Stack) -> None:
    lifecycle = stack.store.lifecycle()
    parked = stored_in(lifecycle, SLOT, State.PARKED, incarnation=TASK_ARN)
    poll = transitions.Poll(binding=parked.binding, now=NOW + 10, idle_deadline=NOW + 900)
    resumed = written(lifecycle.apply(SLOT, transitions.RESUME, poll))
    assert resumed.checkpoint is not None

    status, answer = start(resumed, OTHER_ARN)

    assert status == 200, answer
    assert (answer["checkout"], answer["deps"]) == (None, None)
    path = unquote(urlsplit(answer["resume"]["url"]).path)
    assert path == f"/{stack.r2_settings.bucket}/{resumed.checkpoint.key}"
    granted = (answer["resume"]["size"], answer["resume"]["sha256"])
    assert granted == (resumed.checkpoint.size, resumed.checkpoint.sha256)


@pytest.mark.parametrize("field", ["slot", "attempt", "incarnation", "op"])
def test_a_start_missing_a_field_is_refused_naming_it(stack: Stack, field: str) -> None:
    body = {
        "slot": SLOT,
        "attempt": 1,
        "incarnation": TASK_ARN,
        "op": {"ordinal": 1, "generation": 1},
    }
    del body[field]
    status, answer = invoke(
        checkpoint_function, event("checkpoint-upload", body=body, rawPath="/tasks/start")
    )
    assert status == 400
    assert field in json.dumps(answer)


# -- the task -----------------------------------------------------------------------------


def test_a_task_that_is_not_its_attempts_touches_nothing_and_exits(
    stack: Stack, checkpoint_function: str, tmp_path: Path
) -> None:
    """A second task of one attempt (a client token aged out): refused at its start, it
    removes nothing, restores nothing, writes nothing, and ends with no error."""
    record_snapshot(stack)
    record = born(stack)
    assert start(record, "local:slot-1:first")[0] == 200
    item = stack.wire_item(SLOT)
    workspace = tmp_path / "workspace"
    (workspace / "checkout").mkdir(parents=True)
    (workspace / "checkout" / "work.txt").write_text("the first task's\n")
    plan = SlotPlan.of(record, record.window.entries[-1].ref)
    environment = {name: os.environ[name] for name in LOCAL_TASK_ENVIRONMENT if name in os.environ}
    environment |= {
        PLAN_VARIABLE: plan.to_env(),
        "SEEDKEEPER_WORKSPACE": str(workspace),
        "SEEDKEEPER_INCARNATION": "local:slot-1:second",
    }

    ended = subprocess.run(
        [sys.executable, "-m", "seedkeeper_task"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert ended.returncode == 0, ended.stderr
    assert "not the attempt's" in ended.stdout + ended.stderr
    assert stack.wire_item(SLOT) == item
    assert (workspace / "checkout" / "work.txt").read_text() == "the first task's\n"


class _Metadata(http.server.BaseHTTPRequestHandler):
    """The ECS task metadata endpoint (v4) as Fargate serves it to the task: `/task`."""

    answer: bytes

    def do_GET(self) -> None:
        found = self.path == "/task"
        self.send_response(200 if found else 404)
        self.end_headers()
        self.wfile.write(self.answer if found else b"")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("answer", "incarnation"),
    [
        pytest.param({"TaskARN": TASK_ARN, "Family": "slot"}, TASK_ARN, id="its-task-arn"),
        pytest.param({"TaskARN": "not-an-arn"}, None, id="not-an-arn"),
        pytest.param({"Family": "slot"}, None, id="no-arn"),
        pytest.param("[]", None, id="not-an-object"),
    ],
)
def test_on_fargate_a_task_is_the_task_arn_its_metadata_endpoint_names(
    monkeypatch: pytest.MonkeyPatch, answer: Any, incarnation: str | None
) -> None:
    """No incarnation means no start: the task ends without a verdict rather than claim
    its attempt under a name ECS does not know it by."""
    body = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
    handler = type("Metadata", (_Metadata,), {"answer": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(ECS_METADATA_VARIABLE, f"http://127.0.0.1:{server.server_address[1]}")
        assert TaskSettings().own_incarnation() == incarnation
    finally:
        server.shutdown()
        server.server_close()


def test_a_runtime_named_incarnation_wins_and_no_endpoint_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ECS_METADATA_VARIABLE, raising=False)
    assert TaskSettings().own_incarnation() is None
    monkeypatch.setenv(ECS_METADATA_VARIABLE, "http://127.0.0.1:9")  # nothing answers
    assert TaskSettings().own_incarnation() is None
    assert TaskSettings(incarnation="local:slot-1:1").own_incarnation() == "local:slot-1:1"
