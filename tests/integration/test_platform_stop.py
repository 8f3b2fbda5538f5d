"""A platform stop (DESIGN §10, step 7): SIGTERM to a slot task with no request of ours
(Fargate Spot, a retirement, a scale-in, someone's StopTask). The task keeps its slot's work
within its stop budget, checkpointed and parked, or says it is lost and why; a stop the
sweep made itself (`closing`) writes nothing.

Real slot tasks of the local stack (a sandbox that writes a heartbeat, real mksquashfs, the
checkpoint function through the gateway, moto for DynamoDB and R2), stopped by the local
runtime with a grace as long as Fargate's: each task must end on its own, never by the
SIGKILL that ends the grace. A task is held at a point of its checkpoint by a sitecustomize
first on its PYTHONPATH (as in test_task_faults.py), until the test releases it."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
import pytest

from conftest import running_local_stack
from executor import ORIGIN, claim_for, client_for, publish
from repos import git, make_repository
from seedkeeper.config import StoreSettings
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.record import SlotRecord, State, Supported
from seedkeeper.domain.runtime import TaskState
from seedkeeper.store.lifecycle import Written
from seedkeeper_client import Seeded
from seedkeeper_task.sandbox import user_processes
from seedkeeper_task.settings import STOP_MARGIN
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.stack import LocalStack

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a slot user needs root (CI runs so)")

SLOT = "slot-1"
IDLE = 2
GRACE = 60.0  # the platform's stopTimeout: a task that needs it all was SIGKILLed
SANDBOX = ["sh", "-c", "while :; do date +%s%N > .heartbeat; sleep 0.1; done"]
# TASK_HOLD_AT "<profile event>:<qualified name>" of a slot task function: the task's main
# thread creates TASK_REACHED there once, then waits for TASK_RELEASE to exist (at most
# TASK_HOLD_SECONDS). Signals are still handled meanwhile: a SIGTERM is taken in.
SITECUSTOMIZE = """
import os
import sys
import time

def _hold(frame, event, arg):
    global _AT
    code = frame.f_code
    if (event, code.co_qualname) == _AT and "/seedkeeper_task/" in code.co_filename:
        _AT = None
        open(os.environ["TASK_REACHED"], "x").close()
        until = time.monotonic() + float(os.environ.get("TASK_HOLD_SECONDS", "120"))
        while time.monotonic() < until and not os.path.exists(os.environ["TASK_RELEASE"]):
            time.sleep(0.05)

_AT = tuple(os.environ["TASK_HOLD_AT"].split(":")) if "TASK_HOLD_AT" in os.environ else None
if _AT is not None:
    sys.setprofile(_hold)
# The local runtime hands a task none of a test's SEEDKEEPER_* settings: this one comes
# under another name.
if "TASK_STOP_TIMEOUT" in os.environ:
    os.environ["SEEDKEEPER_STOP_TIMEOUT"] = os.environ["TASK_STOP_TIMEOUT"]
"""
HOOK_VARIABLES = ["TASK_HOLD_AT", "TASK_REACHED", "TASK_RELEASE", "TASK_HOLD_SECONDS"]


class Hold:
    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached, self.release = folder / "reached", folder / "release"
        self.monkeypatch = monkeypatch

    def at(self, where: str, seconds: float | None = None) -> None:
        """Hold the tasks launched from now on at `where` (until released, or for
        `seconds`)."""
        self.monkeypatch.setenv("TASK_HOLD_AT", where)
        self.monkeypatch.setenv("TASK_REACHED", str(self.reached))
        self.monkeypatch.setenv("TASK_RELEASE", str(self.release))
        if seconds is not None:
            self.monkeypatch.setenv("TASK_HOLD_SECONDS", str(seconds))

    def wait(self) -> None:
        wait_for(self.reached.exists, "the task is held")

    def let_go(self) -> None:
        self.release.touch()


@pytest.fixture
def hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Hold:
    folder = tmp_path / "hooks"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(folder), prepend=os.pathsep)
    passed = [*HOOK_VARIABLES, "TASK_STOP_TIMEOUT"]
    monkeypatch.setenv("SEEDKEEPER_LOCAL_TASK_PASSTHROUGH", json.dumps(passed))
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(SANDBOX))
    return Hold(folder, monkeypatch)


@pytest.fixture
def stack(tmp_path: Path, aws_credentials: None, hold: Hold) -> Iterator[LocalStack]:
    with running_local_stack(tmp_path, idle_window=IDLE, watch_interval=0.5) as local:
        yield local


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


class Slot:
    """A seeded slot of the stack whose run has done work nobody committed."""

    def __init__(self, stack: LocalStack, tmp_path: Path) -> None:
        self.stack, self.client = stack, client_for(stack)
        self.seed = publish(self.client, make_repository(tmp_path), tmp_path / "scratch")
        self.claim = claim_for(self.seed)
        seeded = self.client.seed(
            SLOT, self.seed, claim=self.claim, origin=ORIGIN, wait=True, timeout=60
        )
        assert isinstance(seeded, Seeded)
        self.incarnation = seeded.incarnation or ""
        self.checkout = stack.workspace(SLOT) / CHECKOUT
        runtime = stack.runtime
        assert isinstance(runtime, LocalRuntime)
        uid = runtime.slot_uid(SLOT)
        assert uid is not None
        self.uid = uid
        wait_for((self.checkout / ".heartbeat").exists, "the sandbox runs")
        (self.checkout / "README.md").write_text("edited, never committed\n")
        (self.checkout / "notes.txt").write_text("untracked work\n")
        (self.checkout / ".gitignore").write_text("build/\n.heartbeat\n")
        for path in ("README.md", "notes.txt", ".gitignore"):
            os.chown(self.checkout / path, uid, uid)
        self.work = git(self.checkout, "status", "--porcelain", "--ignored")
        self.lifecycle = StoreSettings().lifecycle()

    def record(self) -> SlotRecord:
        classified = self.lifecycle.read(SLOT)
        assert isinstance(classified, Supported)
        return classified.record

    def wait_for_state(self, state: State) -> SlotRecord:
        wait_for(lambda: self.record().state is state, f"the slot is {state}")
        return self.record()

    def ask_for_a_checkpoint(self) -> None:
        time.sleep(IDLE + 1)
        assert self.stack.sweep().checkpoints_requested == [SLOT]

    @contextmanager
    def stopping(self) -> Iterator[None]:
        """The platform's stop (SIGTERM, SIGKILL after GRACE) sent as the block starts;
        after it, the task has ended on its own: its exit is a stopped task's, not the
        SIGKILL's of a grace run out."""
        stop = threading.Thread(target=self.stack.runtime.stop, args=(self.incarnation, GRACE))
        stop.start()
        try:
            yield
        finally:
            stop.join(GRACE + 30)
        ended = self.stack.runtime.statuses([self.incarnation])[self.incarnation]
        assert ended == TaskState.stopped(None, "exit code 0"), "killed or failed, not stopped"
        assert user_processes(self.uid) == []

    def log(self) -> str:
        return (self.checkout.parent.parent / "attempt-1.log").read_text()

    def checkpoint_object(self, record: SlotRecord, into: Path) -> Path:
        """The recorded checkpoint as R2 holds it, verified, unpacked into `into`."""
        checkpoint = record.checkpoint
        assert checkpoint is not None
        store = boto3.client(
            "s3",
            endpoint_url=os.environ["SEEDKEEPER_R2_ENDPOINT"],
            aws_access_key_id=os.environ["SEEDKEEPER_R2_ACCESS_KEY_ID"],
            aws_secret_access_key=os.environ["SEEDKEEPER_R2_SECRET_ACCESS_KEY"],
            region_name="auto",
        )
        body = store.get_object(Bucket=os.environ["SEEDKEEPER_R2_BUCKET"], Key=checkpoint.key)
        data: bytes = body["Body"].read()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (checkpoint.size, checkpoint.sha256)
        archive = into.with_suffix(".sqsh")
        archive.write_bytes(data)
        subprocess.run(["unsquashfs", "-q", "-d", str(into), str(archive)], check=True)
        return into

    def assert_parked_with_its_work(self, tmp_path: Path) -> SlotRecord:
        """Parked as a receipt tells it: on a checkpoint of this owner and incarnation that
        holds the work, kept as long as the checkpoint."""
        record = self.record()
        assert record.state is State.PARKED, record
        checkpoint = record.checkpoint
        assert checkpoint is not None
        assert checkpoint.owner is not None
        assert checkpoint.owner.model_dump() == self.claim.model_dump()
        assert checkpoint.incarnation == self.incarnation
        assert record.expires_at == checkpoint.expires_at
        assert (record.frozen_at, record.loss, record.window.unsettled) == (None, None, 0)
        receipt = self.client.receipt(
            SLOT, claim=self.claim, seed=self.seed, incarnation=self.incarnation
        )
        assert (receipt.checkpoint, receipt.parked, receipt.sha256) == (
            "present",
            True,
            checkpoint.sha256,
        )
        restored = self.checkpoint_object(record, tmp_path / "restored")
        assert (restored / "README.md").read_text() == "edited, never committed\n"
        assert git(restored, "status", "--porcelain", "--ignored") == self.work
        assert "stopped: parked" in self.log()
        return record


@pytest.fixture
def slot(stack: LocalStack, tmp_path: Path) -> Slot:
    return Slot(stack, tmp_path)


def checkpoint_ops(record: SlotRecord) -> list[tuple[int, str | None]]:
    return [(e.ordinal, e.outcome) for e in record.window.entries if e.kind is OpKind.CHECKPOINT]


def test_a_stopped_task_checkpoints_its_seeded_slot_and_parks_it(
    slot: Slot, tmp_path: Path
) -> None:
    with slot.stopping():
        pass

    record = slot.assert_parked_with_its_work(tmp_path)
    ((_, outcome),) = checkpoint_ops(record)  # its own request, recorded
    assert outcome == "uploaded"


def test_a_stop_during_the_sweeps_capture_parks_the_slot_on_that_capture(
    stack: LocalStack, hold: Hold, tmp_path: Path
) -> None:
    hold.at("call:capture")
    slot = Slot(stack, tmp_path)
    slot.ask_for_a_checkpoint()
    hold.wait()  # frozen: the sandbox's last heartbeat is the one captured
    heartbeat = (slot.checkout / ".heartbeat").read_text()
    with slot.stopping():
        time.sleep(1)  # the SIGTERM is taken in while the capture waits
        hold.let_go()

    record = slot.assert_parked_with_its_work(tmp_path)
    assert [outcome for _, outcome in checkpoint_ops(record)] == ["uploaded"]  # the sweep's
    restored = tmp_path / "restored"
    assert (restored / ".heartbeat").read_text() == heartbeat


def test_a_stop_during_the_upload_parks_the_slot_once_it_is_recorded(
    stack: LocalStack, hold: Hold, tmp_path: Path
) -> None:
    hold.at("call:upload")
    slot = Slot(stack, tmp_path)
    slot.ask_for_a_checkpoint()
    hold.wait()
    with slot.stopping():
        time.sleep(1)
        hold.let_go()

    record = slot.assert_parked_with_its_work(tmp_path)
    assert [outcome for _, outcome in checkpoint_ops(record)] == ["uploaded"]


def test_a_stop_after_the_checkpoint_is_recorded_parks_the_slot_on_it(
    slot: Slot, tmp_path: Path
) -> None:
    slot.ask_for_a_checkpoint()
    recorded = slot.wait_for_state(State.CHECKPOINTED)

    with slot.stopping():
        pass

    record = slot.assert_parked_with_its_work(tmp_path)
    assert record.checkpoint == recorded.checkpoint  # no second capture
    assert checkpoint_ops(record) == checkpoint_ops(recorded)


class _StartOnly(http.server.BaseHTTPRequestHandler):
    """Forwards a task's start to the real checkpoint function, its Host header and
    signature as sent; any other call has its connection closed unanswered."""

    real: str

    def do_POST(self) -> None:
        if not self.path.startswith("/tasks/"):
            self.close_connection = True
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = urllib.request.Request(  # noqa: S310 - the local gateway
            self.real + self.path, data=body, method="POST", headers=dict(self.headers.items())
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
                status, payload = answer.status, answer.read()
        except urllib.error.HTTPError as refused:
            status, payload = refused.code, refused.read()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def only_the_start_answered() -> Iterator[None]:
    """Tasks launched in the block reach the checkpoint function for their start only:
    every later call (the upload's) finds nothing answering."""
    real = os.environ["SEEDKEEPER_CHECKPOINT_URL"]
    handler = type("StartOnly", (_StartOnly,), {"real": real})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["SEEDKEEPER_CHECKPOINT_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield
    finally:
        os.environ["SEEDKEEPER_CHECKPOINT_URL"] = real


def assert_lost(slot: Slot, reason: str) -> SlotRecord:
    record = slot.record()
    assert record.state is State.LOST, record
    loss = record.loss
    assert loss is not None
    assert loss.reason == reason
    assert record.expires_at == loss.at + RetentionSettings().park_retention
    assert (record.checkpoint, record.frozen_at, record.window.unsettled) == (None, None, 0)
    assert [outcome for _, outcome in checkpoint_ops(record)] == ["lost"]
    receipt = slot.client.receipt(
        SLOT, claim=slot.claim, seed=slot.seed, incarnation=slot.incarnation
    )
    assert (receipt.checkpoint, receipt.why) == ("lost", reason)
    assert "stopped: lost" in slot.log()
    return record


def test_a_stop_whose_checkpoint_cannot_be_uploaded_records_the_work_lost(
    stack: LocalStack, tmp_path: Path
) -> None:
    with only_the_start_answered():
        slot = Slot(stack, tmp_path)
        with slot.stopping():
            pass

    record = assert_lost(slot, "checkpoint-failed-on-stop")
    assert record.loss is not None
    assert "checkpoint-function-unreachable" in record.loss.detail


def test_a_stop_whose_checkpoint_outlasts_the_stop_budget_is_recorded_lost(
    stack: LocalStack, hold: Hold, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASK_STOP_TIMEOUT", str(STOP_MARGIN + 2))  # a budget of 2 s
    hold.at("call:capture", seconds=5)  # the capture starts after the budget ran out
    slot = Slot(stack, tmp_path)

    with slot.stopping():
        hold.wait()

    record = assert_lost(slot, "stop-timeout")
    assert record.loss is not None
    assert "capture-cancelled" in record.loss.detail


def test_a_stop_the_sweep_makes_itself_writes_nothing(slot: Slot) -> None:
    slot.ask_for_a_checkpoint()
    checkpointed = slot.wait_for_state(State.CHECKPOINTED)
    fence = transitions.At(now=checkpointed.idle_deadline + 1)
    fenced = slot.lifecycle.apply(SLOT, transitions.FENCE_PARK, fence)
    assert isinstance(fenced, Written)

    with slot.stopping():
        pass

    assert slot.record() == fenced.record  # closing, as the sweep left it: not a write
    assert "stopped: left" in slot.log()
