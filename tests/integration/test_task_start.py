"""A slot task's start: RunTask carries no URL, and the task fetches its URLs itself from
the checkpoint function (`POST /tasks/start`), which answers only the attempt's task: the one
whose session of the task role signed the call, and which RunTask launched for this attempt
(read back with DescribeTasks) when the record names no task yet.

The seed function launches on ECS as moto plays it (every RunTask request is captured as
botocore sends it); the checkpoint function is invoked as Lambda does, its runtime that same
ECS; a real slot task that is not its attempt's is run to show it touches nothing.
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
from functions import as_task, event, invoke, load_function, signed_by
from seedkeeper import config
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.adapters.runtime import EcsRuntime, SlotRuntime
from seedkeeper.domain import transitions
from seedkeeper.domain.caller import task_id
from seedkeeper.domain.models import Binding, SeedIdentity
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.record import SlotRecord, State
from seedkeeper.domain.runtime import Launch
from seedkeeper.domain.snapshots import Archive, NewSnapshot
from seedkeeper.services.seed import SeedRequest, SeedService, SeedSettings
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_task.settings import ECS_METADATA_VARIABLE, TaskSettings
from seedkeeper_tools.local.principals import TaskKeys
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
TASK_ARN = "arn:aws:ecs:us-east-1:000000000000:task/seedkeeper/0123456789abcdef0123456789abcdef"
NOT_THIS_TASK: tuple[int, Any] = (
    403,
    {"error": "not-this-task", "detail": None, "fields": []},
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


def start(
    record: SlotRecord, incarnation: str, *, signer: str | None = None, **changes: Any
) -> tuple[int, Any]:
    """`/tasks/start` as the task `incarnation` asks it, signed by that task (or by the
    task `signer`)."""
    op = record.window.entries[-1]
    body = {
        "slot": record.slot,
        "attempt": record.attempt,
        "incarnation": incarnation,
        "op": {"ordinal": op.ordinal, "generation": op.generation},
    } | changes
    request = event("checkpoint-upload", body=body, rawPath="/tasks/start")
    return invoke(checkpoint_function, as_task(request, signer or incarnation))


def read(stack: Stack, slot: str = SLOT) -> SlotRecord:
    classified = stack.store.lifecycle().read(slot)
    assert hasattr(classified, "record"), classified
    record: SlotRecord = classified.record
    return record


# -- RunTask -------------------------------------------------------------------------------


class Launches:
    """The ECS runtime on the moto server, each RunTask request kept as botocore sends it;
    `die_after_launch` plays a seed handler that dies between RunTask and its record. The
    checkpoint function asks it what a task was launched for."""

    def __init__(self, stack: Stack) -> None:
        client = boto3.client("ecs", endpoint_url=stack.endpoint, region_name="us-east-1")
        ec2 = boto3.client("ec2", endpoint_url=stack.endpoint, region_name="us-east-1")
        self.runtime = EcsRuntime(client, fargate_cluster(ec2, client))
        self.requests: list[dict[str, Any]] = []
        self.die_after_launch = False
        client.meta.events.register("provide-client-params.ecs.RunTask", self._keep)

    def _keep(self, params: dict[str, Any], **_: Any) -> None:
        self.requests.append(json.loads(json.dumps(params)))

    def __call__(self, settings: Any = None) -> SlotRuntime:
        return self

    def launch(self, plan: SlotPlan) -> str:
        incarnation = self.runtime.launch(plan)
        if self.die_after_launch:
            raise TimeoutError("the handler died after RunTask")
        return incarnation

    def launched(self, record: SlotRecord, slot: str | None = None) -> str:
        """A task RunTask starts for `record`'s attempt (of `slot`, when given): its ARN."""
        plan = SlotPlan.of(record, record.window.entries[-1].ref)
        return self.runtime.launch(plan.model_copy(update={"slot": slot or record.slot}))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)


@pytest.fixture
def launches(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Launches:
    """The ECS that launches, and that the checkpoint function asks (DescribeTasks)."""
    record_snapshot(stack)
    launched = Launches(stack)
    monkeypatch.setattr(config, "runtime_from", launched)
    return launched


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
    stack: Stack, launches: Launches
) -> None:
    record = born(stack)
    task = launches.launched(record)

    status, answer = start(record, task)

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
    assert after.incarnation == task
    assert after.state is State.SEEDING
    # Asked again (its answer was lost): the same grant, nothing written.
    item = stack.wire_item(SLOT)
    assert start(record, task)[0] == 200
    assert stack.wire_item(SLOT) == item


def test_a_second_task_of_the_attempt_is_refused_and_learns_nothing(
    stack: Stack, launches: Launches
) -> None:
    record = born(stack)
    assert start(record, launches.launched(record))[0] == 200
    item = stack.wire_item(SLOT)

    assert start(record, launches.launched(record)) == NOT_THIS_TASK
    assert stack.wire_item(SLOT) == item


def test_another_slots_task_cannot_take_an_attempt_no_task_claimed_yet(
    stack: Stack, launches: Launches
) -> None:
    """Every slot task holds the one task role: one launched for slot B asks for slot A's
    start, before A's own task could, naming itself. RunTask launched it for B, so it is
    refused: A's record is unchanged, no URL is handed out, and A's own task still starts."""
    record = born(stack)
    other = born(stack, "slot-b")
    intruder = launches.launched(other)
    item = stack.wire_item(SLOT)

    assert start(record, intruder) == NOT_THIS_TASK
    assert stack.wire_item(SLOT) == item
    assert start(record, launches.launched(record))[0] == 200


def test_a_task_naming_another_tasks_incarnation_is_refused(
    stack: Stack, launches: Launches
) -> None:
    """A call names the task it is for; only that task's session may sign it."""
    record = born(stack)
    own, other = launches.launched(record), launches.launched(born(stack, "slot-b"))
    item = stack.wire_item(SLOT)

    assert start(record, own, signer=other) == NOT_THIS_TASK
    assert stack.wire_item(SLOT) == item


@pytest.mark.parametrize(
    "signer",
    [
        pytest.param("arn:aws:iam::123456789012:user/executor", id="a-user"),
        pytest.param("arn:aws:sts::123456789012:assumed-role/other-role/{id}", id="another-role"),
        pytest.param(
            "arn:aws:sts::210987654321:assumed-role/seedkeeper-slot-task/{id}",
            id="another-account",
        ),
        pytest.param("", id="nobody"),
    ],
)
def test_anyone_but_a_session_of_the_task_role_is_refused(
    stack: Stack, launches: Launches, signer: str
) -> None:
    record = born(stack)
    task = launches.launched(record)
    item = stack.wire_item(SLOT)
    body = {
        "slot": record.slot,
        "attempt": record.attempt,
        "incarnation": task,
        "op": {"ordinal": 1, "generation": 1},
    }
    request = event("checkpoint-upload", body=body, rawPath="/tasks/start")
    signed = signed_by(request, signer.format(id=task_id(task)))

    assert invoke(checkpoint_function, signed) == NOT_THIS_TASK
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
    stack: Stack, launches: Launches, changes: dict[str, Any]
) -> None:
    record = born(stack)
    item = stack.wire_item(SLOT)

    assert start(record, launches.launched(record), **changes) == NOT_THIS_TASK
    assert stack.wire_item(SLOT) == item


@pytest.mark.parametrize(
    "state", [State.SEEDED, State.SEED_FAILED, State.CHECKPOINTING, State.PARKED, State.LOST]
)
def test_a_settled_attempts_task_is_granted_nothing(stack: Stack, state: State) -> None:
    """Its restore settled: a task starting late (or again) restores nothing."""
    record = stored_in(stack.store.lifecycle(), SLOT, state, incarnation=TASK_ARN)

    assert start(record, TASK_ARN) == NOT_THIS_TASK


def test_a_cold_slots_task_is_recorded_and_granted_no_url(stack: Stack, launches: Launches) -> None:
    cold = Binding(owner=None, seed=None, origin=None)
    record = written(stack.store.lifecycle().birth(SLOT, cold, now=NOW, idle_deadline=NOW + 600))
    task = launches.launched(record)

    status, answer = start(record, task)

    assert status == 200, answer
    assert (answer["checkout"], answer["deps"], answer["resume"]) == (None, None, None)
    assert read(stack).incarnation == task
    assert start(record, launches.launched(record)) == NOT_THIS_TASK


def test_a_seed_rotated_out_since_the_launch_is_granted_no_url(
    stack: Stack, launches: Launches
) -> None:
    """Nothing unrecorded is presigned: the record names the seed, no generation does."""
    rotated = SeedIdentity(**(SEED.model_dump() | {"checkout_backup_id": "checkout-9999"}))
    record = written(
        stack.store.lifecycle().birth(
            "slot-unrecorded",
            Binding(owner=owner(), seed=rotated, origin=ORIGIN),
            now=NOW,
            idle_deadline=NOW + 600,
        )
    )
    task = launches.launched(record)

    status, answer = start(record, task)

    assert (status, answer["error"]) == (409, "seed-missing")
    # The attempt's task: it records the failure.
    assert read(stack, "slot-unrecorded").incarnation == task


def test_a_resumed_attempt_is_granted_its_checkpoint_only(stack: Stack, launches: Launches) -> None:
    lifecycle = stack.store.lifecycle()
    parked = stored_in(lifecycle, SLOT, State.PARKED, incarnation=TASK_ARN)
    poll = transitions.Poll(binding=parked.binding, now=NOW + 10, idle_deadline=NOW + 900)
    resumed = written(lifecycle.apply(SLOT, transitions.RESUME, poll))
    assert resumed.checkpoint is not None

    status, answer = start(resumed, launches.launched(resumed))

    assert status == 200, answer
    assert (answer["checkout"], answer["deps"]) == (None, None)
    path = unquote(urlsplit(answer["resume"]["url"]).path)
    assert path == f"/{stack.r2_settings.bucket}/{resumed.checkpoint.key}"
    granted = (answer["resume"]["size"], answer["resume"]["sha256"])
    assert granted == (resumed.checkpoint.size, resumed.checkpoint.sha256)
    # The parked attempt's own task, restarted, is not the resumed attempt's.
    assert start(resumed, TASK_ARN) == NOT_THIS_TASK


def test_ecs_says_what_a_task_was_launched_for(stack: Stack, launches: Launches) -> None:
    """DescribeTasks reads back the plan RunTask's override carried; a task it does not
    know, or not an ARN at all, was launched for nothing."""
    record = born(stack)
    task = launches.launched(record)

    assert launches.runtime.launched_for(task) == Launch(SLOT, 1)
    assert launches.runtime.launched_for(task.replace(task[-4:], "0000")) is None
    assert launches.runtime.launched_for("local:slot-1:1") is None


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
    record = born(stack)
    launch = record.window.entries[-1].ref
    first = transitions.Launched(incarnation="local:slot-1:first", launch=launch, now=NOW + 5)
    written(stack.store.lifecycle().apply(SLOT, transitions.RECORD_INCARNATION, first))
    item = stack.wire_item(SLOT)
    workspace = tmp_path / "workspace"
    (workspace / "checkout").mkdir(parents=True)
    (workspace / "checkout" / "work.txt").write_text("the first task's\n")
    plan = SlotPlan.of(record, launch)
    keys = TaskKeys(tmp_path / "data").issue("local:slot-1:second")
    environment = {name: os.environ[name] for name in LOCAL_TASK_ENVIRONMENT if name in os.environ}
    environment |= {
        PLAN_VARIABLE: plan.to_env(),
        "SEEDKEEPER_WORKSPACE": str(workspace),
        "SEEDKEEPER_INCARNATION": "local:slot-1:second",
        "AWS_ACCESS_KEY_ID": keys.access_key,
        "AWS_SECRET_ACCESS_KEY": keys.secret_key,
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
