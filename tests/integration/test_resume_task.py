"""A resume on the slot task's side (DESIGN §10, step 6): the task restores its slot's parked
checkpoint, verified, and checks nothing out, so the run finds its checkout exactly as it
was frozen; the checkpoint's `.git` is hostile data, hardened as a seed's archive is.

The first test goes through the whole protocol for real: a slot of the local stack seeded,
worked on, checkpointed by its own task (the sweep asks), parked by the sweep. The others
park a slot on an archive made here (the record taken to `parked` by the store's own
transitions), to restore what no capture would make. Either way the resume is the store's
`RESUME` and a real slot task launched with a presigned GET of the checkpoint, as the seed
function does it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from conftest import running_local_stack
from executor import ORIGIN, claim_for, client_for, publish
from repos import git, make_repository, tree
from seedkeeper.config import StoreSettings
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings, checkpoint_key, new_checkpoint
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import SeedFailed, SeedSucceeded, SlotRecord, State, Supported
from seedkeeper.store.lifecycle import Lifecycle, Outcome, Written
from seedkeeper_client import Seeded
from seedkeeper_task.restore.repository import RepositoryFormat, render_config, safe_config
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.supervisor import CHECKOUT, SlotTask
from seedkeeper_tools.local.runtime import LocalRuntime
from slots import Slots, squashfs_of, task_api, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mksquashfs") is None,
    reason="a slot user needs root, a checkpoint squashfs-tools (CI has both)",
)

SLOT = "slot-1"
IDLE = 2


def changed(outcome: Outcome) -> Written:
    assert isinstance(outcome, Written), outcome
    return outcome


def status(checkout: Path) -> str:
    """`git status` as the run would see it, everything listed, and without refreshing
    the index (GIT_OPTIONAL_LOCKS=0): the index's bytes are compared too."""
    argv = ["git", "-c", "safe.directory=*", "-C", str(checkout), "status", "--porcelain=v2"]
    done = subprocess.run(
        [*argv, "--untracked-files=all", "--ignored"],
        env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def give(root: Path, uid: int) -> None:
    """Hand what the test wrote as root back to the slot user, as the run would own it."""
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, uid)


def resume(
    lifecycle: Lifecycle, runtime: LocalRuntime, parked: SlotRecord, *, now: int | None = None
) -> SlotRecord:
    """The owner's seed on its parked slot, as the seed function makes it: `RESUME`, a task
    launched with a presigned GET of the checkpoint, its incarnation recorded; then wait
    for the task's verdict."""
    slot, checkpoint = parked.slot, parked.checkpoint
    assert checkpoint is not None
    now = now or int(time.time())
    poll = transitions.Poll(binding=parked.binding, now=now, idle_deadline=now + 1800)
    resumed = changed(lifecycle.apply(slot, transitions.RESUME, poll))
    assert resumed.entry is not None
    assert resumed.record.resuming
    plan = SlotPlan.of(resumed.record, resumed.entry.ref)
    incarnation = runtime.launch(plan)
    launched = transitions.Launched(incarnation=incarnation, launch=resumed.entry.ref, now=now)
    outcome = lifecycle.apply(slot, transitions.RECORD_INCARNATION, launched)
    assert isinstance(outcome, Written | transitions.Acknowledged), outcome

    def settled() -> bool:
        classified = lifecycle.read(slot)
        return isinstance(classified, Supported) and classified.record.state is not State.SEEDING

    wait_for(settled, f"{incarnation} settles", seconds=90)
    classified = lifecycle.read(slot)
    assert isinstance(classified, Supported)
    return classified.record


# -- the whole protocol, for real ------------------------------------------------------------


def test_a_resumed_checkout_is_byte_identical_to_the_one_frozen(
    tmp_path: Path, aws_credentials: None
) -> None:
    with running_local_stack(tmp_path, idle_window=IDLE, watch_interval=0.5) as stack:
        client = client_for(stack)
        seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
        claim = claim_for(seed)
        seeded = client.seed(SLOT, seed, claim=claim, origin=ORIGIN, wait=True, timeout=60)
        assert isinstance(seeded, Seeded)
        runtime = stack.runtime
        assert isinstance(runtime, LocalRuntime)
        uid = runtime.slot_uid(SLOT)
        assert uid is not None
        checkout = stack.workspace(SLOT) / CHECKOUT

        # The run's work: a commit on a branch of its own past the claim's head, then a
        # staged change changed again, an edit, a mode change, symlinks (one leading out of
        # the checkout), untracked and ignored files.
        author = ("-c", "user.email=run@example.com", "-c", "user.name=Run")
        git(checkout, "checkout", "--quiet", "-b", "feature/resume")
        (checkout / "CHANGES.md").write_text("committed by the run\n")
        git(checkout, "add", "CHANGES.md")
        git(checkout, *author, "commit", "--quiet", "-m", "the run's own commit")
        (checkout / "src" / "lib.py").write_text("VALUE = 3  # staged\n")
        git(checkout, "add", "src/lib.py")
        (checkout / "src" / "lib.py").write_text("VALUE = 4  # changed after staging\n")
        (checkout / "README.md").write_text("edited, never committed\n")
        (checkout / "README.md").chmod(0o755)
        (checkout / "latest").symlink_to("src/lib.py")
        (checkout / "python").symlink_to("/usr/bin/python3")  # as a virtualenv links it
        (checkout / "notes.txt").write_text("untracked work\n")
        (checkout / "build" / "output.log").write_text("ignored output\n")
        give(checkout, uid)
        head = git(checkout, "rev-parse", "HEAD")
        assert head != claim.head
        before, index = tree(checkout), (checkout / ".git" / "index").read_bytes()
        porcelain = status(checkout)
        for work in ("1 MM N", "1 .M N", "? notes.txt", "? latest", "! build/output.log"):
            assert work in porcelain, porcelain

        time.sleep(IDLE + 1)
        assert stack.sweep().checkpoints_requested == [SLOT]
        lifecycle = StoreSettings().lifecycle()

        def state() -> State:
            classified = lifecycle.read(SLOT)
            assert isinstance(classified, Supported)
            return classified.record.state

        wait_for(lambda: state() is State.CHECKPOINTED, "the checkpoint", seconds=60)
        assert stack.sweep().parked == [SLOT]
        classified = lifecycle.read(SLOT)
        assert isinstance(classified, Supported)
        parked = classified.record
        assert parked.state is State.PARKED
        assert parked.checkpoint is not None
        assert not checkout.exists()  # the stopped task took its workspace with it

        record = resume(lifecycle, runtime, parked)

        restored = stack.workspace(SLOT) / CHECKOUT
        assert restored != checkout  # the resumed attempt's own workspace
        assert (restored / ".git" / "index").read_bytes() == index
        assert tree(restored) == before  # `.git/config` too: the seed's safe config again
        assert status(restored) == porcelain
        assert record.state is State.SEEDED, record
        result = record.result
        assert isinstance(result, SeedSucceeded)
        assert result.resumed
        assert (result.ref, result.head, result.from_backup) == (
            "feature/resume",
            head,
            seed.checkout_backup_id,
        )
        assert set(result.steps) == {"download", "extract", "fixup", "marker"}
        assert (record.attempt, record.incarnation) == (2, f"local:{SLOT}:2")
        assert record.checkpoint is None  # superseded: owed, never named again
        assert lifecycle.debts(SLOT) == [parked.checkpoint.key]
        restores = [e for e in record.window.entries if e.kind is OpKind.RESTORE]
        assert (restores[-1].generation, restores[-1].outcome) == (2, "seeded")


# -- archives no capture makes ------------------------------------------------------------------


def park_on(slots: Slots, body: dict[str, Any], archive: bytes) -> SlotRecord:
    """Seed `body`'s slot for real, then park it on `archive` as its checkpoint: the task is
    killed first (nothing of it writes meanwhile) and the record taken through the
    checkpoint protocol by the store's transitions, the object put where a capture goes."""
    slot = body["slot"]
    assert slots.seed(body)[0] == 202
    status_code, answer = slots.settle(body)
    assert (status_code, answer["seeded"]) == (200, True), slots.log(slot)
    record = slots.record(slot)
    assert record.incarnation is not None
    slots.kill(record.incarnation)

    lifecycle = slots.stack.store.lifecycle()
    now = record.idle_deadline + 1
    requested = changed(lifecycle.apply(slot, transitions.REQUEST_CHECKPOINT, transitions.At(now)))
    assert requested.entry is not None
    op = requested.entry.ref
    changed(
        lifecycle.apply(slot, transitions.FREEZE, transitions.Freezing(record.attempt, op, now))
    )
    key = checkpoint_key(slot, record.incarnation, op.ordinal)
    s3 = boto3.client("s3", endpoint_url=slots.stack.endpoint, region_name="auto")
    s3.put_object(Bucket=slots.stack.r2_settings.bucket or "", Key=key, Body=archive)
    checkpoint = new_checkpoint(
        RetentionSettings(),
        key=key,
        size=len(archive),
        etag=hashlib.md5(archive, usedforsecurity=False).hexdigest(),
        sha256=hashlib.sha256(archive).hexdigest(),
        owner=record.owner,
        incarnation=record.incarnation,
        now=now,
    )
    uploaded = transitions.Uploaded(checkpoint=checkpoint, upload=op, now=now)
    changed(lifecycle.apply(slot, transitions.RECORD_CHECKPOINT, uploaded))
    fenced = changed(lifecycle.apply(slot, transitions.FENCE_PARK, transitions.At(now)))
    assert fenced.entry is not None
    parked = transitions.Parked(stop=fenced.entry.ref, now=now, expires_at=checkpoint.expires_at)
    return changed(lifecycle.apply(slot, transitions.PARK, parked)).record


def failed_resume(slots: Slots, parked: SlotRecord) -> SeedFailed:
    """Resume `parked`, expecting a failure: the record keeps naming the checkpoint (the
    work is still there), and no half tree is left to the run."""
    record = resume(slots.stack.store.lifecycle(), slots.runtime, parked, now=parked.updated_at)
    assert record.state is State.SEED_FAILED, record
    assert record.checkpoint == parked.checkpoint
    assert slots.stack.store.lifecycle().debts(parked.slot) == []
    workspace = slots.workspace(parked.slot)
    assert not (workspace / CHECKOUT).exists()
    assert not [path for path in workspace.iterdir() if ".staging" in path.name]
    assert isinstance(record.result, SeedFailed)
    return record.result


def test_a_checkpoint_gone_from_r2_fails_the_resume_at_download_as_seed_missing(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    body = slots.body(slots.publish(repo))
    parked = park_on(slots, body, squashfs_of(repo, tmp_path / "checkpoint.sqsh"))
    assert parked.checkpoint is not None
    s3 = boto3.client("s3", endpoint_url=slots.stack.endpoint, region_name="auto")
    s3.delete_object(Bucket=slots.stack.r2_settings.bucket or "", Key=parked.checkpoint.key)

    failed = failed_resume(slots, parked)

    assert (failed.reason, failed.step, failed.detail) == ("seed-missing", "download", "http-404")


def test_a_checkpoint_of_other_bytes_than_recorded_is_not_restored(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    body = slots.body(slots.publish(repo))
    parked = park_on(slots, body, squashfs_of(repo, tmp_path / "checkpoint.sqsh"))
    assert parked.checkpoint is not None
    (repo / "README.md").write_text("not what was frozen\n")
    other = squashfs_of(repo, tmp_path / "other.sqsh")
    s3 = boto3.client("s3", endpoint_url=slots.stack.endpoint, region_name="auto")
    s3.put_object(
        Bucket=slots.stack.r2_settings.bucket or "", Key=parked.checkpoint.key, Body=other
    )

    failed = failed_resume(slots, parked)

    assert (failed.reason, failed.step) == ("seed-failed", "verify")
    assert failed.detail in {"size-mismatch", "sha256-mismatch"}


def test_a_checkpoints_hooks_fsmonitor_and_credentials_are_neutralized(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    """What a run may write into its own `.git/config` before it is frozen: each would run
    code in the next run's git (a hook, the fsmonitor) or hand it a credential."""
    body = slots.body(slots.publish(repo))
    pwned = tmp_path / "pwned"
    hooks = repo / ".git" / "planted-hooks"
    hooks.mkdir()
    (hooks / "pre-commit").write_text(f"#!/bin/sh\ntouch {pwned}-hook\n")
    (hooks / "pre-commit").chmod(0o755)
    git(repo, "config", "core.hooksPath", str(hooks))
    git(repo, "config", "core.fsmonitor", f"touch {pwned}-fsmonitor; false")
    git(repo, "config", "credential.helper", f"store --file {tmp_path}/stolen")
    # The attack works on the checkout as frozen: git status runs the fsmonitor, a commit
    # the hook.
    git(repo, "status")
    git(repo, "-c", "user.email=a@b", "-c", "user.name=A", "commit", "-qm", "x", "--allow-empty")
    assert {path.name for path in tmp_path.glob("pwned-*")} == {"pwned-fsmonitor", "pwned-hook"}
    for planted in tmp_path.glob("pwned-*"):
        planted.unlink()
    parked = park_on(slots, body, squashfs_of(repo, tmp_path / "checkpoint.sqsh"))

    record = resume(slots.stack.store.lifecycle(), slots.runtime, parked, now=parked.updated_at)

    assert record.state is State.SEEDED, record
    restored = slots.workspace(SLOT) / CHECKOUT
    expected = render_config(safe_config(RepositoryFormat("0"), origin=ORIGIN, branch="main"))
    assert (restored / ".git" / "config").read_text() == expected
    git(restored, "status")
    git(
        restored, "-c", "user.email=a@b", "-c", "user.name=A", "commit", "-qm", "y", "--allow-empty"
    )
    assert list(tmp_path.glob("pwned-*")) == []
    assert "credential.helper" in slots.log(SLOT)  # named as dropped, never its value
    assert f"{tmp_path}/stolen" not in slots.log(SLOT)


@pytest.mark.parametrize(
    ("pointing", "step"),
    [("outside", "extract"), ("inside", "fixup")],
)
def test_a_checkpoint_whose_git_directory_is_a_symlink_is_refused(
    slots: Slots, repo: Path, tmp_path: Path, pointing: str, step: str
) -> None:
    """`.git` as a link: outside the archive, the extraction refuses it; inside, the
    repository's layout check (git would follow it to another repository)."""
    body = slots.body(slots.publish(repo))
    target = tmp_path / "elsewhere.git" if pointing == "outside" else repo / "real.git"
    (repo / ".git").rename(target)
    (repo / ".git").symlink_to(target if pointing == "outside" else "real.git")
    parked = park_on(slots, body, squashfs_of(repo, tmp_path / "checkpoint.sqsh"))

    failed = failed_resume(slots, parked)

    assert (failed.reason, failed.step) == ("unsafe-archive", step)
    assert ".git" in failed.detail


def test_a_resume_granted_no_checkpoint_is_refused_before_anything(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    """A resuming record whose task was granted no checkpoint to restore (a checkpoint
    function of another release) restores nothing, and says so."""
    parked = park_on(slots, slots.body(slots.publish(repo)), squashfs_of(repo, tmp_path / "c"))
    lifecycle = slots.stack.store.lifecycle()
    now = int(time.time())
    poll = transitions.Poll(binding=parked.binding, now=now, idle_deadline=now + 1800)
    resumed = changed(lifecycle.apply(parked.slot, transitions.RESUME, poll))
    assert resumed.entry is not None
    plan = SlotPlan.of(resumed.record, resumed.entry.ref)
    incarnation = f"local:{parked.slot}:{plan.attempt}"
    launched = transitions.Launched(incarnation=incarnation, launch=plan.op, now=now)
    recorded = lifecycle.apply(parked.slot, transitions.RECORD_INCARNATION, launched)
    assert isinstance(recorded, Written), recorded
    settings = TaskSettings(workspace=tmp_path / "workspace")
    stop = threading.Event()
    task = SlotTask(plan, settings, task_api(tmp_path, parked.slot, incarnation, stop), stop)

    assert task.restore() == "failed"

    classified = lifecycle.read(parked.slot)
    assert isinstance(classified, Supported)
    result = classified.record.result
    assert isinstance(result, SeedFailed)
    assert (result.reason, result.step) == ("seed-failed", "sweep")
    assert not (tmp_path / "workspace" / CHECKOUT).exists()
