"""Resume on the seed function's side (DESIGN §10, step 6): the owner's `POST /seed` on its
parked slot. A slot is seeded for real (the local runtime running the real slot task), its
checkout captured for real into moto's R2, and its record taken to `parked` by the store's
own transitions; the seed function is invoked as Lambda would. Only the owner resumes, and
only from a checkpoint R2 still holds as recorded: anything else writes nothing.

One test runs the whole loop with the real resumed task. The others hold it at its entry
(a sitecustomize first on its PYTHONPATH, as in test_task_faults.py), so what it was
launched with can be read from it and what it would do next (restore the checkpoint: the
task's side) never races the seed function's side checked here."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pytest

from conftest import Stack
from repos import git
from seedkeeper.config import task_starts_from_env
from seedkeeper.domain import transitions
from seedkeeper.domain.caller import Caller, task_id
from seedkeeper.domain.checkpoints import RetentionSettings, checkpoint_key, new_checkpoint
from seedkeeper.domain.opwindow import OpKind, OpStatus
from seedkeeper.domain.outcomes import RestoreGrant
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.record import Loss, SeedSucceeded, SlotRecord, State
from seedkeeper.domain.transitions import Acknowledged
from seedkeeper.services.task_start import StartedOp, TaskStart
from seedkeeper.store.lifecycle import Outcome, Written
from seedkeeper_client import ClaimNotEchoed, OwnerClaim, SeedkeeperClient
from seedkeeper_task.capture import capture
from seedkeeper_task.supervisor import CHECKOUT
from sessions import injected_session, operations
from slots import Slots, wait_for

SLOT = "slot-1"
# Every slot task launched while TASK_HELD is set stops at the entry of its `main`, having
# created the file `<TASK_HELD>/<its incarnation>`: it has read nothing and written nothing.
SITECUSTOMIZE = """
import os
import sys
import time

def _hold(frame, event, arg):
    code = frame.f_code
    if (event, code.co_qualname) == ("call", "main") and code.co_filename.endswith(
        "seedkeeper_task/launch.py"
    ):
        held = os.path.join(os.environ["TASK_HELD"], os.environ["SEEDKEEPER_INCARNATION"])
        open(held, "x").close()
        time.sleep(600)

if "TASK_HELD" in os.environ:
    sys.setprofile(_hold)
"""


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], Path]:
    """Call it to hold every slot task launched from then on; it answers the folder where
    each held task says so."""
    hooks, folder = tmp_path / "hooks", tmp_path / "held"
    hooks.mkdir()
    folder.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(hooks), prepend=os.pathsep)
    monkeypatch.setenv("SEEDKEEPER_LOCAL_TASK_PASSTHROUGH", '["TASK_HELD"]')

    def hold() -> Path:
        monkeypatch.setenv("TASK_HELD", str(folder))
        return folder

    return hold


def plan_of(slots: Slots, held: Path, incarnation: str) -> SlotPlan:
    """The plan a held task was launched with, read from its environment."""
    wait_for((held / incarnation).exists, f"{incarnation} to be held")
    _, slot, attempt = incarnation.split(":")
    launched = slots.workspace(slot).parent / f"attempt-{attempt}.json"
    pid = json.loads(launched.read_text())["pid"]
    environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    prefix = f"{PLAN_VARIABLE}=".encode()
    value = next(entry for entry in environment if entry.startswith(prefix))
    return SlotPlan.from_env(value.removeprefix(prefix).decode())


def granted(plan: SlotPlan, incarnation: str) -> RestoreGrant:
    """What the held task is answered when it starts, asked as it would."""
    answer = task_starts_from_env().start(
        TaskStart(
            slot=plan.slot,
            attempt=plan.attempt,
            incarnation=incarnation,
            op=StartedOp(ordinal=plan.op.ordinal, generation=plan.op.generation),
        ),
        Caller(task_id(incarnation)),  # signed by that task
    )
    assert isinstance(answer, RestoreGrant), answer
    return answer


def changed(outcome: Outcome) -> Written:
    assert isinstance(outcome, Written), outcome
    return outcome


def park(
    slots: Slots,
    body: dict[str, Any],
    tmp_path: Path,
    *,
    retention: int | None = None,
    work: Callable[[Path], None] | None = None,
) -> SlotRecord:
    """Seed `body`'s slot for real, do the run's `work` in its checkout, capture it into R2,
    and take its record through the checkpoint protocol to `parked` (the sweep's and the
    task's writes, made here). The task goes first (SIGKILL, as the sweep's stop ends it
    once fenced): nothing of it writes meanwhile. `retention`: seconds the checkpoint counts
    for (None: the default's)."""
    slot = body["slot"]
    assert slots.seed(body)[0] == 202
    status, answer = slots.settle(body)
    assert (status, answer["seeded"]) == (200, True), slots.log(slot)
    record = slots.record(slot)
    incarnation = record.incarnation
    assert incarnation is not None
    if work is not None:
        work(slots.workspace(slot) / CHECKOUT)
    captured = capture(
        slots.workspace(slot) / CHECKOUT, tmp_path / f"{slot}.sqsh", user=None, timeout=60
    )
    slots.kill(incarnation)

    lifecycle = slots.stack.store.lifecycle()
    now = record.idle_deadline + 1  # idle
    requested = changed(lifecycle.apply(slot, transitions.REQUEST_CHECKPOINT, transitions.At(now)))
    assert requested.entry is not None
    op = requested.entry.ref
    freezing = transitions.Freezing(attempt=record.attempt, op=op, now=now)
    changed(lifecycle.apply(slot, transitions.FREEZE, freezing))
    key = checkpoint_key(slot, incarnation, op.ordinal)
    the_store(slots.stack).put_object(
        Bucket=bucket(slots.stack), Key=key, Body=captured.path.read_bytes()
    )
    checkpoint = new_checkpoint(
        RetentionSettings(),
        key=key,
        size=captured.size,
        etag=captured.md5,
        sha256=captured.sha256,
        owner=record.owner,
        incarnation=incarnation,
        now=now,
    )
    if retention is not None:
        checkpoint = checkpoint.model_copy(update={"expires_at": now + retention})
    uploaded = transitions.Uploaded(checkpoint=checkpoint, upload=op, now=now)
    changed(lifecycle.apply(slot, transitions.RECORD_CHECKPOINT, uploaded))
    fenced = changed(lifecycle.apply(slot, transitions.FENCE_PARK, transitions.At(now)))
    assert fenced.entry is not None
    parked = transitions.Parked(stop=fenced.entry.ref, now=now, expires_at=checkpoint.expires_at)
    record = changed(lifecycle.apply(slot, transitions.PARK, parked)).record
    assert record.state is State.PARKED
    return record


def the_store(stack: Stack) -> Any:
    return boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")


def bucket(stack: Stack) -> str:
    return stack.r2_settings.bucket or ""


Calls = dict[str, list[str]]


@contextmanager
def observed(stack: Stack) -> Iterator[Calls]:
    """The DynamoDB and S3 calls the seed function makes inside the block, and the keys of
    the GETs it presigns (a presigned URL sends nothing: only its signature is seen)."""
    with injected_session() as session:
        signed: list[tuple[str, str]] = []

        def sign(operation_name: str, request: Any, **_: Any) -> None:
            signed.append((operation_name, unquote(urlsplit(request.url).path)))

        session.events.register("before-sign.s3", sign)
        calls = {"dynamodb": operations(session, "dynamodb"), "s3": operations(session, "s3")}
        presigned: list[str] = []
        calls["presigned"] = presigned
        yield calls
    prefix = f"/{bucket(stack)}/"
    # Every call made is signed too: only the GETs never made are presigned URLs.
    presigned += [
        path.removeprefix(prefix)
        for operation, path in signed
        if operation == "GetObject" and operation not in calls["s3"]
    ]


def unchanged(slots: Slots, send: Callable[[], tuple[int, Any]]) -> tuple[int, Any, Calls]:
    """`send`'s answer and calls, having checked that it wrote nothing (the item byte for
    byte), launched nothing and presigned nothing."""
    before, attempts = slots.stack.wire_item(SLOT), slots.attempts()
    with observed(slots.stack) as calls:
        status, answer = send()
    assert slots.stack.wire_item(SLOT) == before
    assert slots.attempts() == attempts
    assert calls["presigned"] == []
    assert "UpdateItem" not in calls["dynamodb"][1:]  # the refused touch only
    return status, answer, calls


def test_the_owner_resumes_its_parked_slot_from_its_checkpoint(
    slots: Slots, repo: Path, tmp_path: Path, held: Callable[[], Path]
) -> None:
    body = slots.body(slots.publish(repo))
    parked = park(slots, body, tmp_path)
    checkpoint = parked.checkpoint
    assert checkpoint is not None
    holding = held()

    asked = int(time.time())
    with observed(slots.stack) as calls:
        status, answer = slots.seed(body)

    assert status == 202, answer
    assert answer == {
        "state": "seeding",
        "slot": SLOT,
        "attempt": 2,
        "incarnation": "local:slot-1:2",
        "claim": body["claim"],
        "resumed": True,
    }
    # The refused touch, the resume, the incarnation; one HEAD of the checkpoint; no URL:
    # the task is granted one when it starts (below).
    assert calls["dynamodb"] == ["UpdateItem", "UpdateItem", "UpdateItem"]
    assert calls["s3"] == ["HeadObject"]
    assert calls["presigned"] == []
    record = slots.record()
    assert record.resuming
    assert (record.state, record.attempt, record.incarnation) == (
        State.SEEDING,
        2,
        "local:slot-1:2",
    )
    assert record.checkpoint == checkpoint  # named until the resumed attempt is seeded
    assert (record.result, record.expires_at, record.loss) == (None, None, None)
    assert record.binding == parked.binding
    assert record.idle_deadline >= asked + 1800  # the idle window from now, as a poll's
    restore = record.window.entries[-1]
    assert (restore.kind, restore.generation, restore.status) == (
        OpKind.RESTORE,
        2,
        OpStatus.DETACHED,
    )
    assert slots.attempts() == ["attempt-1.json", "attempt-2.json"]

    plan = plan_of(slots, holding, "local:slot-1:2")
    assert (plan.attempt, plan.op, plan.binding) == (2, restore.ref, parked.binding)
    # The one URL the task is granted is the checkpoint's, never a snapshot archive's.
    grant = granted(plan, "local:slot-1:2")
    assert (grant.checkout, grant.deps) == (None, None)
    assert grant.resume is not None
    url = grant.resume.url
    assert unquote(urlsplit(url).path) == f"/{bucket(slots.stack)}/{checkpoint.key}"
    assert "X-Amz-Signature=" in url
    assert (grant.resume.size, grant.resume.sha256) == (checkpoint.size, checkpoint.sha256)

    # Polled again while the task is held: the same attempt, still resumed, no new task.
    assert slots.seed(body) == (202, answer)
    assert slots.attempts() == ["attempt-1.json", "attempt-2.json"]

    # The resumed answer passes the client's claimed-answer checks; for another claim, not.
    text = json.dumps(answer).encode()
    assert parked.owner is not None
    claim = OwnerClaim.model_validate(parked.owner.model_dump())  # as the executor holds it
    slot = answer["slot"]
    assert SeedkeeperClient._seed_answer(text, claim, slot).model_dump(mode="json") == answer
    with pytest.raises(ClaimNotEchoed):
        SeedkeeperClient._seed_answer(text, claim.model_copy(update={"run": "run-2"}), slot)


def test_the_resumed_task_restores_the_checkpoint_with_the_work_intact(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    """The whole loop with the real task: the owner's uncommitted work comes back from the
    checkpoint into a fresh workspace, `git status` as it was, answered `from: checkpoint`."""
    body = slots.body(slots.publish(repo))

    frozen: list[str] = []

    def work(checkout: Path) -> None:
        (checkout / "README.md").write_text("edited, never committed\n")
        (checkout / "notes.txt").write_text("untracked work\n")
        frozen.append(git(checkout, "status", "--porcelain", "--ignored"))

    parked = park(slots, body, tmp_path, work=work)
    checkpoint = parked.checkpoint
    assert checkpoint is not None
    assert slots.seed(body)[0] == 202
    status, answer = slots.settle(body)
    assert (status, answer["seeded"], answer["resumed"]) == (200, True, True), slots.log(SLOT)
    assert (answer["from"], answer["incarnation"]) == ("checkpoint", "local:slot-1:2")
    checkout = slots.workspace() / CHECKOUT
    assert (checkout / "README.md").read_text() == "edited, never committed\n"
    assert (checkout / "notes.txt").read_text() == "untracked work\n"
    assert git(checkout, "status", "--porcelain", "--ignored") == frozen[0]
    record = slots.record()
    assert (record.state, record.checkpoint) == (State.SEEDED, None)
    assert slots.stack.store.lifecycle().debts(SLOT) == [checkpoint.key]


def test_a_settled_resume_answers_resumed_from_the_checkpoint_and_owes_it(
    slots: Slots, repo: Path, tmp_path: Path, held: Callable[[], Path]
) -> None:
    """The resumed attempt's verdict, written as its task writes it: the poll answers
    `resumed` and `from: checkpoint`, and the superseded checkpoint is an owed deletion."""
    body = slots.body(slots.publish(repo))
    parked = park(slots, body, tmp_path)
    checkpoint, before = parked.checkpoint, parked.result
    assert checkpoint is not None
    assert isinstance(before, SeedSucceeded)
    held()
    assert slots.seed(body)[0] == 202
    record = slots.record()
    restore = record.window.entries[-1].ref
    verdict = transitions.Verdict(
        attempt=2,
        restore=restore,
        result=before.model_copy(update={"resumed": True, "steps": {"download": 1}, "ms": 7}),
        now=int(time.time()),
    )
    changed(slots.stack.store.lifecycle().apply(SLOT, transitions.SETTLE_SEED, verdict))

    status, answer = slots.seed(body)
    assert (status, answer) == (
        200,
        {
            "seeded": True,
            "cached": True,
            "ref": before.ref,
            "sha": before.head,
            "from": "checkpoint",
            "steps": {"download": 1},
            "ms": 7,
            "incarnation": "local:slot-1:2",
            "claim": body["claim"],
            "frozen": False,
            "resumed": True,
        },
    )
    record = slots.record()
    assert (record.state, record.checkpoint) == (State.SEEDED, None)
    assert slots.stack.store.lifecycle().debts(SLOT) == [checkpoint.key]


def test_anyone_else_gets_the_refusal_of_any_mismatch_and_the_parked_slot_is_untouched(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    body = slots.body(slots.publish(repo))
    park(slots, body, tmp_path)
    for change, reason in [
        ({"claim": body["claim"] | {"run": "run-2", "requester": "mallory"}}, "claim-mismatch"),
        ({"claim": None}, "claim-mismatch"),
        ({"seed": body["seed"] | {"ref": "other-branch"}}, "seed-mismatch"),
        ({"seed": None}, "seed-mismatch"),
        ({"origin": "https://git.example.com/acme/fork.git"}, "origin-mismatch"),
        ({"origin": None}, "origin-mismatch"),
    ]:
        status, answer, calls = unchanged(slots, functools.partial(slots.seed, body | change))
        assert (status, answer) == (409, {"error": reason, "detail": None, "fields": []})
        assert calls["s3"] == []  # not even a HEAD: nothing of the slot is looked at


def test_a_checkpoint_deleted_behind_the_records_back_is_seed_missing_and_nothing_is_written(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    body = slots.body(slots.publish(repo))
    checkpoint = park(slots, body, tmp_path).checkpoint
    assert checkpoint is not None
    the_store(slots.stack).delete_object(Bucket=bucket(slots.stack), Key=checkpoint.key)
    gone = {
        "seeded": False,
        "reason": "seed-missing",
        "step": "resume",
        "detail": "checkpoint lost",
    }
    for _ in range(2):  # asked again: the same answer, still nothing written
        status, answer, calls = unchanged(slots, lambda: slots.seed(body))
        assert (status, answer) == (200, gone)
        assert calls["s3"] == ["HeadObject", "HeadBucket"]
    assert slots.record().state is State.PARKED


def test_a_checkpoint_replaced_by_other_bytes_is_not_restored(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    body = slots.body(slots.publish(repo))
    checkpoint = park(slots, body, tmp_path).checkpoint
    assert checkpoint is not None
    the_store(slots.stack).put_object(
        Bucket=bucket(slots.stack), Key=checkpoint.key, Body=b"x" * checkpoint.size
    )
    status, answer, _ = unchanged(slots, lambda: slots.seed(body))
    assert (status, answer["reason"], answer["step"], answer["detail"]) == (
        200,
        "seed-missing",
        "resume",
        "checkpoint changed",
    )


def test_a_checkpoint_past_its_retention_is_not_restored(
    slots: Slots, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It no longer counts (R2's lifecycle rule deletes it soon after): its owner hears that
    the work is gone, as for a deleted one, and nothing is asked of R2."""
    monkeypatch.setenv("SEEDKEEPER_IDLE_WINDOW", "1")
    body = slots.body(slots.publish(repo))
    checkpoint = park(slots, body, tmp_path, retention=1).checkpoint
    assert checkpoint is not None
    wait_for(lambda: time.time() > checkpoint.expires_at + 1, "the checkpoint to expire")
    status, answer, calls = unchanged(slots, lambda: slots.seed(body))
    assert (status, answer["reason"], answer["step"], answer["detail"]) == (
        200,
        "seed-missing",
        "resume",
        "checkpoint expired",
    )
    assert calls["s3"] == []


@pytest.mark.parametrize("fault", ["r2-unreachable", "bucket-missing"])
def test_r2_not_answering_for_the_checkpoint_is_503_and_nothing_is_written(
    slots: Slots, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    body = slots.body(slots.publish(repo))
    park(slots, body, tmp_path)
    if fault == "r2-unreachable":
        monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    else:  # a bare 404 for the object too: never taken for a lost checkpoint
        monkeypatch.setenv("SEEDKEEPER_R2_BUCKET", f"{bucket(slots.stack)}-gone")
    status, answer, _ = unchanged(slots, lambda: slots.seed(body))
    assert (status, answer) == (503, {"error": "retry-later", "detail": None, "fields": []})


def test_a_resume_whose_task_died_is_relaunched_as_a_resume_and_counted_from_it(
    slots: Slots, repo: Path, tmp_path: Path, held: Callable[[], Path]
) -> None:
    """A new attempt restores the checkpoint again, never the snapshot. Its attempts are
    counted from the resume (every resume advances `attempt` too): a slot that was seeded
    and resumed still gets `max_attempts` (3) of them."""
    body = slots.body(slots.publish(repo))
    checkpoint = park(slots, body, tmp_path).checkpoint
    assert checkpoint is not None
    holding = held()
    assert slots.seed(body)[0] == 202
    for attempt in (2, 3):
        slots.kill(f"local:{SLOT}:{attempt}")
        with observed(slots.stack) as calls:
            status, answer = slots.seed(body)
        assert (status, answer["attempt"], answer["resumed"]) == (202, attempt + 1, True)
        assert calls["presigned"] == []
        plan = plan_of(slots, holding, f"local:{SLOT}:{attempt + 1}")
        grant = granted(plan, f"local:{SLOT}:{attempt + 1}")
        assert (grant.resume is not None, grant.checkout, plan.attempt) == (True, None, attempt + 1)
        record = slots.record()
        assert (record.attempt, record.checkpoint, record.resuming) == (
            attempt + 1,
            checkpoint,
            True,
        )
    slots.kill(f"local:{SLOT}:4")
    status, answer = slots.seed(body)
    assert (status, answer["reason"], answer["step"]) == (200, "seed-failed", "task-lost")
    record = slots.record()
    assert (record.state, record.attempt, record.checkpoint) == (State.SEEDING, 4, checkpoint)


def test_a_lost_attempt_of_a_resume_whose_checkpoint_is_gone_is_not_relaunched(
    slots: Slots, repo: Path, tmp_path: Path, held: Callable[[], Path]
) -> None:
    body = slots.body(slots.publish(repo))
    checkpoint = park(slots, body, tmp_path).checkpoint
    assert checkpoint is not None
    held()
    assert slots.seed(body)[0] == 202
    slots.kill(f"local:{SLOT}:2")
    the_store(slots.stack).delete_object(Bucket=bucket(slots.stack), Key=checkpoint.key)
    with observed(slots.stack) as calls:
        status, answer = slots.seed(body)
    assert (status, answer["reason"], answer["step"]) == (200, "seed-missing", "resume")
    assert calls["presigned"] == []
    assert slots.attempts() == ["attempt-1.json", "attempt-2.json"]
    record = slots.record()
    assert record.resuming  # retained: its restore open, the checkpoint still named
    assert record.window.unsettled >= 1


def test_a_lost_slot_answers_its_owner_the_loss_and_anyone_else_the_usual_refusal(
    slots: Slots, repo: Path
) -> None:
    body = slots.body(slots.publish(repo))
    assert slots.seed(body)[0] == 202
    assert slots.settle(body)[1]["seeded"] is True
    record = slots.record()
    assert record.incarnation is not None
    slots.kill(record.incarnation)
    now = int(time.time())
    lost = transitions.Lost(
        incarnation=record.incarnation,
        loss=Loss(reason="task-stopped", detail="exit code -9", at=now),
        expires_at=now + 86_400,
    )
    outcome = slots.stack.store.lifecycle().apply(SLOT, transitions.LOSE, lost)
    assert isinstance(outcome, Written | Acknowledged)
    status, answer, _ = unchanged(slots, lambda: slots.seed(body))
    assert (status, answer) == (
        200,
        {"seeded": False, "reason": "lost", "step": "task-stopped", "detail": "exit code -9"},
    )
    other = body | {"claim": body["claim"] | {"run": "run-2"}}
    status, answer, _ = unchanged(slots, lambda: slots.seed(other))
    assert (status, answer) == (409, {"error": "claim-mismatch", "detail": None, "fields": []})
