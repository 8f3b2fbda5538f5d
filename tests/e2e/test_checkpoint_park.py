"""Checkpoint and park with real slot tasks (DESIGN §10): the local stack over signed HTTP,
the real supervisor freezing a real sandbox, real mksquashfs, the checkpoint function
through the gateway, moto standing in for DynamoDB and R2. A touch at each point of the
protocol never parks the slot and always resumes its sandbox."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest

from conftest import running_local_stack
from executor import ORIGIN, claim_for, client_for, publish
from repos import git, make_repository
from seedkeeper.config import StoreSettings
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.record import SlotRecord, State, Supported
from seedkeeper.domain.runtime import TaskState, TaskStatus
from seedkeeper_client import NotSeeded, OwnerClaim, Seeded, SeedIdentity, SeedkeeperClient
from seedkeeper_task.sandbox import user_processes
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.stack import LocalStack

IDLE = 2
# The sandbox: a heartbeat in the checkout ten times a second, and a child that left its
# session (setsid), which a process-group signal would miss.
SANDBOX = [
    "sh",
    "-c",
    "setsid sh -c 'while :; do date +%s%N > .escaped; sleep 0.1; done' &"
    " while :; do date +%s%N > .heartbeat; sleep 0.1; done",
]


@pytest.fixture
def stack(
    tmp_path: Path, aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalStack]:
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(SANDBOX))
    with running_local_stack(tmp_path, idle_window=IDLE, watch_interval=0.5) as local:
        yield local


@pytest.fixture
def client(stack: LocalStack) -> SeedkeeperClient:
    return client_for(stack)


class Slot:
    """One seeded slot of the stack, as its owner and the operator see it."""

    def __init__(self, stack: LocalStack, client: SeedkeeperClient, tmp_path: Path) -> None:
        self.stack, self.client, self.name = stack, client, "slot-1"
        repo = make_repository(tmp_path)
        self.seed: SeedIdentity = publish(client, repo, tmp_path / "scratch")
        self.claim: OwnerClaim = claim_for(self.seed)
        seeded = self.poll(wait=True)
        assert isinstance(seeded, Seeded)
        self.incarnation = seeded.incarnation or ""
        self.checkout = stack.workspace(self.name) / CHECKOUT
        runtime = stack.runtime
        assert isinstance(runtime, LocalRuntime)
        uid = runtime.slot_uid(self.name)
        assert uid is not None, "the suite runs as root: the sandbox has its own user"
        self.uid = uid
        wait_for((self.checkout / ".heartbeat").exists, "the sandbox runs")
        # The run's unpublished work: an edit, a new file, an ignored one.
        (self.checkout / "README.md").write_text("edited, never committed\n")
        (self.checkout / "notes.txt").write_text("untracked work\n")
        (self.checkout / "build.log").write_text("ignored output\n")
        (self.checkout / ".gitignore").write_text("*.log\n.heartbeat\n.escaped\n")
        for path in ("README.md", "notes.txt", "build.log", ".gitignore"):
            os.chown(self.checkout / path, self.uid, self.uid)

    def poll(self, *, wait: bool = False) -> Any:
        return self.client.seed(
            self.name, self.seed, claim=self.claim, origin=ORIGIN, wait=wait, timeout=60
        )

    def record(self) -> SlotRecord:
        classified = StoreSettings().lifecycle().read(self.name)
        assert isinstance(classified, Supported)
        return classified.record

    def wait_for_state(self, *states: State) -> SlotRecord:
        wait_for(lambda: self.record().state in states, f"the slot becomes {states}")
        return self.record()

    def processes(self) -> dict[int, str]:
        """The slot user's live processes and their state letters (T: stopped)."""
        return dict(user_processes(self.uid))

    def frozen(self) -> bool:
        states = self.processes().values()
        return bool(states) and all(state == "T" for state in states)

    def running(self) -> bool:
        states = self.processes().values()
        return len(states) >= 2 and "T" not in states  # the sandbox and its escaped child

    def status_porcelain(self, checkout: Path) -> str:
        return git(checkout, "status", "--porcelain", "--ignored")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


@pytest.fixture
def slot(stack: LocalStack, client: SeedkeeperClient, tmp_path: Path) -> Slot:
    return Slot(stack, client, tmp_path)


def idle_then_sweep(slot: Slot) -> Any:
    time.sleep(IDLE + 1)
    return slot.stack.sweep()


def the_store() -> Any:
    """The stack's R2 (moto), as an operator would reach it with its keys."""
    return boto3.client(
        "s3",
        endpoint_url=os.environ["SEEDKEEPER_R2_ENDPOINT"],
        aws_access_key_id=os.environ["SEEDKEEPER_R2_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["SEEDKEEPER_R2_SECRET_ACCESS_KEY"],
        region_name="auto",
    )


def the_object(key: str) -> bytes:
    got = the_store().get_object(Bucket=os.environ["SEEDKEEPER_R2_BUCKET"], Key=key)
    body: bytes = got["Body"].read()
    return body


def s3_delete(key: str) -> None:
    the_store().delete_object(Bucket=os.environ["SEEDKEEPER_R2_BUCKET"], Key=key)


def test_an_idle_seeded_slot_is_checkpointed_then_parked_with_its_work_intact(
    slot: Slot, tmp_path: Path
) -> None:
    before = slot.status_porcelain(slot.checkout)
    assert "notes.txt" in before
    assert "README.md" in before
    assert "build.log" in before

    report = idle_then_sweep(slot)
    assert report.checkpoints_requested == [slot.name]
    assert report.stopped == []
    assert report.parked == []

    record = slot.wait_for_state(State.CHECKPOINTED)
    assert slot.frozen(), "the sandbox stays frozen once its work is captured"
    heartbeat = (slot.checkout / ".heartbeat").read_text()
    time.sleep(0.5)
    assert (slot.checkout / ".heartbeat").read_text() == heartbeat
    checkpoint = record.checkpoint
    assert checkpoint is not None
    assert checkpoint.incarnation == slot.incarnation
    assert checkpoint.owner is not None
    assert checkpoint.owner.model_dump() == slot.claim.model_dump()
    receipt = slot.client.receipt(
        slot.name, claim=slot.claim, seed=slot.seed, incarnation=slot.incarnation
    )
    assert (receipt.checkpoint, receipt.parked, receipt.sha256) == (
        "present",
        False,
        checkpoint.sha256,
    )

    report = slot.stack.sweep()
    assert report.parked == [slot.name]
    parked = slot.record()
    assert parked.state is State.PARKED
    assert parked.expires_at is not None
    assert parked.expires_at >= checkpoint.expires_at
    assert parked.frozen_at is None
    assert slot.stack.runtime.status(slot.incarnation) is TaskStatus.STOPPED
    assert slot.processes() == {}
    receipt = slot.client.receipt(
        slot.name, claim=slot.claim, seed=slot.seed, incarnation=slot.incarnation
    )
    assert receipt.checkpoint == "present"
    assert receipt.parked
    assert receipt.retention_expires_at == checkpoint.expires_at
    evidence = slot.client.slot_evidence(slot.name, claim=slot.claim)
    assert (evidence.state, evidence.disposition) == ("parked", "parked")

    # The work, as R2 holds it: verified by its sha256, then unpacked and compared.
    body = the_object(checkpoint.key)
    assert len(body) == checkpoint.size
    assert hashlib.sha256(body).hexdigest() == checkpoint.sha256
    archive = tmp_path / "checkpoint.sqsh"
    archive.write_bytes(body)
    restored = tmp_path / "restored"
    subprocess.run(["unsquashfs", "-q", "-d", str(restored), str(archive)], check=True)
    assert (restored / "README.md").read_text() == "edited, never committed\n"
    assert (restored / "notes.txt").read_text() == "untracked work\n"
    assert (restored / "build.log").read_text() == "ignored output\n"
    assert (restored / ".heartbeat").read_text() == heartbeat
    assert slot.status_porcelain(restored) == before
    # Deleted behind its back: the receipt says so, never "present".
    s3_delete(checkpoint.key)
    receipt = slot.client.receipt(
        slot.name, claim=slot.claim, seed=slot.seed, incarnation=slot.incarnation
    )
    assert receipt.checkpoint == "lost"
    # Its owner's poll would resume it: with the checkpoint gone it says so, and writes nothing.
    gone = slot.poll()
    assert isinstance(gone, NotSeeded)
    assert (gone.reason, gone.step, gone.detail) == ("seed-missing", "resume", "checkpoint lost")
    assert slot.record().state is State.PARKED


def test_a_poll_while_capturing_abandons_the_checkpoint_and_resumes_the_sandbox(
    slot: Slot,
) -> None:
    # A capture that takes a while: 40 MB that zstd cannot shrink.
    big = slot.checkout / "big.bin"
    big.write_bytes(os.urandom(40 * 1024 * 1024))
    os.chown(big, slot.uid, slot.uid)
    idle_then_sweep(slot)
    wait_for(lambda: slot.record().frozen_at is not None, "the task freezes")
    answer = slot.poll()
    assert isinstance(answer, Seeded)
    assert answer.frozen, "the poll says honestly that the sandbox is still frozen"
    report = slot.stack.sweep()  # within the new idle window: nothing to do
    assert slot.name not in report.parked + report.checkpoints_requested
    wait_for(slot.running, "the sandbox is resumed")
    wait_for(lambda: slot.record().frozen_at is None, "the record says it is resumed")
    again = slot.poll()
    assert isinstance(again, Seeded)
    assert not again.frozen
    record = slot.record()
    assert record.state is State.SEEDED
    ops = [e for e in record.window.entries if e.kind is OpKind.CHECKPOINT]
    assert ops[-1].settled
    assert ops[-1].outcome in {"abandoned", "uploaded"}


def test_a_poll_after_the_checkpoint_is_recorded_resumes_the_sandbox_and_keeps_it(
    slot: Slot,
) -> None:
    idle_then_sweep(slot)
    recorded = slot.wait_for_state(State.CHECKPOINTED)
    assert slot.frozen()
    answer = slot.poll()
    assert isinstance(answer, Seeded)
    assert answer.frozen
    report = slot.stack.sweep()  # not idle any more: nothing is parked
    assert report.parked == []
    assert report.checkpoints_requested == []
    wait_for(slot.running, "the sandbox is resumed")
    wait_for(lambda: slot.record().frozen_at is None, "the record says it is resumed")
    record = slot.record()
    assert record.state is State.SEEDED
    assert record.checkpoint == recorded.checkpoint  # still the receipt's `present`
    heartbeat = (slot.checkout / ".heartbeat").read_text()
    wait_for(lambda: (slot.checkout / ".heartbeat").read_text() != heartbeat, "it runs on")


def test_a_poll_racing_the_park_fence_wins_and_resumes_the_sandbox(
    slot: Slot, monkeypatch: pytest.MonkeyPatch
) -> None:
    idle_then_sweep(slot)
    slot.wait_for_state(State.CHECKPOINTED)
    time.sleep(1)
    runtime_type = type(slot.stack.runtime)
    statuses = runtime_type.statuses

    def a_poll_arrives(self: Any, incarnations: Sequence[str]) -> dict[str, TaskState]:
        slot.poll()  # between the sweep's read and its fence
        return statuses(self, incarnations)

    monkeypatch.setattr(runtime_type, "statuses", a_poll_arrives)
    report = slot.stack.sweep()
    assert report.parked == []
    assert report.retained["touched"] == 1
    monkeypatch.setattr(runtime_type, "statuses", statuses)
    wait_for(slot.running, "the sandbox is resumed")
    assert slot.record().state is State.SEEDED
    assert slot.stack.runtime.status(slot.incarnation) is TaskStatus.RUNNING


class FaultyStore(http.server.ThreadingHTTPServer):
    """Stands in for R2 on the checkpoint's PUT: "refuse" answers 403 AccessDenied as S3
    does; "stall" reads the request line and headers, then holds the upload until closed."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.puts = threading.Event()
        self.closing = threading.Event()
        super().__init__(("127.0.0.1", 0), _FaultyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()

    @contextmanager
    def presigned_for(self, slot: Slot) -> Iterator[None]:
        """The slot goes idle and is asked to checkpoint while the checkpoint function
        presigns its PUT for this store (the R2 endpoint it reads), until the PUT arrives."""
        real = os.environ["SEEDKEEPER_R2_ENDPOINT"]
        os.environ["SEEDKEEPER_R2_ENDPOINT"] = self.endpoint
        try:
            idle_then_sweep(slot)
            assert self.puts.wait(60)
            yield
        finally:
            os.environ["SEEDKEEPER_R2_ENDPOINT"] = real

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up on a stalled answer is part of the tests."""


class _FaultyHandler(http.server.BaseHTTPRequestHandler):
    server: FaultyStore

    def log_message(self, *_: Any) -> None:
        pass

    def do_PUT(self) -> None:
        self.server.puts.set()
        if self.server.mode == "stall":
            self.server.closing.wait(120)
            return
        body = b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
        self.send_response(403)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def faulty_store(request: pytest.FixtureRequest) -> Iterator[FaultyStore]:
    """The checkpoint function presigns its PUT for this store (the R2 endpoint it reads)."""
    store = FaultyStore(request.param)
    yield store
    store.close()


def checkpoint_objects() -> list[str]:
    bucket = os.environ["SEEDKEEPER_R2_BUCKET"]
    listed = the_store().list_objects_v2(Bucket=bucket, Prefix="checkpoints/")
    return [item["Key"] for item in listed.get("Contents", [])]


@pytest.mark.parametrize("faulty_store", ["refuse"], indirect=True)
def test_r2_refusing_the_put_resumes_the_sandbox_and_records_why(
    slot: Slot, faulty_store: FaultyStore
) -> None:
    with faulty_store.presigned_for(slot):
        record = slot.wait_for_state(State.SEEDED)  # tried three times, then gave up
    assert (record.retained_reason, record.checkpoint_failures) == ("checkpoint-failed", 1)
    assert record.checkpoint is None
    assert record.frozen_at is None
    ops = [e for e in record.window.entries if e.kind is OpKind.CHECKPOINT]
    assert ops[-1].outcome == "http-403-accessdenied"
    assert record.idle_deadline >= record.updated_at + 60  # asked again after a backoff
    wait_for(slot.running, "the sandbox is resumed")
    report = slot.stack.sweep()
    assert report.parked == []
    assert report.checkpoints_requested == []
    assert slot.record().state is State.SEEDED
    assert checkpoint_objects() == []


@pytest.mark.parametrize("faulty_store", ["stall"], indirect=True)
def test_a_task_stopped_during_its_upload_is_never_parked_and_its_loss_is_recorded(
    slot: Slot, faulty_store: FaultyStore
) -> None:
    """SIGTERM mid-upload (Spot, scale-in): the task goes on uploading within its stop
    budget, but the runtime's grace (5 s here) runs out first and SIGKILL ends it. Nothing
    verified, nothing parked: the sweep finds the task stopped and records the loss."""
    with faulty_store.presigned_for(slot):
        slot.stack.runtime.stop(slot.incarnation)
    record = slot.record()
    assert (record.state, record.checkpoint) == (State.CHECKPOINTING, None)
    time.sleep(IDLE + 1)
    report = slot.stack.sweep()
    assert (report.parked, report.lost) == ([], [slot.name])
    lost = slot.record()
    assert lost.state is State.LOST
    assert lost.loss is not None
    assert lost.loss.reason == "task-stopped"
    assert checkpoint_objects() == []


def test_a_task_killed_during_its_capture_is_never_parked_and_is_recorded_lost(slot: Slot) -> None:
    big = slot.checkout / "big.bin"
    big.write_bytes(os.urandom(40 * 1024 * 1024))
    os.chown(big, slot.uid, slot.uid)
    idle_then_sweep(slot)
    wait_for(lambda: slot.record().frozen_at is not None, "the task freezes")
    attempt = slot.checkout.parent.parent / "attempt-1.json"
    os.killpg(json.loads(attempt.read_text())["pid"], signal.SIGKILL)
    wait_for(
        lambda: slot.stack.runtime.status(slot.incarnation) is TaskStatus.STOPPED, "it is gone"
    )
    record = slot.record()
    assert record.state is State.CHECKPOINTING
    assert record.checkpoint is None
    report = slot.stack.sweep()  # still expired: the request came with the deadline passed
    assert (report.parked, report.lost) == ([], [slot.name])
    lost = slot.record()
    assert (lost.state, lost.checkpoint) == (State.LOST, None)
    assert lost.loss is not None
    assert (lost.loss.reason, lost.loss.detail) == ("task-stopped", "killed by SIGKILL")
    receipt = slot.client.receipt(
        slot.name, claim=slot.claim, seed=slot.seed, incarnation=slot.incarnation
    )
    assert (receipt.checkpoint, receipt.why) == ("lost", "task-stopped")
    assert checkpoint_objects() == []
