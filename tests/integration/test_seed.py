"""Seeding end to end: the seed function invoked as Lambda would, the local runtime running
the real slot task, real git and squashfs-tools, moto over HTTP standing in for DynamoDB and
R2, presigned URLs fetched for real."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest

from builders import NOW
from conftest import Stack
from functions import event, invoke
from repos import git, tree
from seedkeeper.adapters.r2 import backup_key
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding, SeedIdentity
from seedkeeper.domain.outcomes import GrantedArchive, RestoreGrant
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import SeedFailed, State, Supported
from seedkeeper.domain.refused import Refused
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.snapshots import NewSnapshot
from seedkeeper.store.lifecycle import Written
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_task.launch import Prefetch
from seedkeeper_task.sandbox import STATE_DIR
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.supervisor import CHECKOUT, MARKER, SlotTask
from sessions import injected_session, operations
from slots import (
    ORIGIN,
    Slots,
    TamperingProxy,
    assert_no_half_tree,
    record_archive,
    seed_function,
    squashfs_of,
    task_api,
    verdict,
    wait_for,
)


def test_a_published_snapshot_seeds_a_slot(slots: Slots, repo: Path, deps: Path) -> None:
    seed = slots.publish(repo, deps)
    body = slots.body(seed)
    status, first = slots.seed(body)
    assert status == 202
    assert first["state"] == "seeding"
    assert first["incarnation"] == "local:slot-1:1"
    assert first["claim"] == body["claim"]

    status, answer = slots.settle(body)
    assert status == 200, slots.log("slot-1")
    assert answer["seeded"] is True
    assert answer["cached"] is True
    assert (answer["ref"], answer["sha"]) == (seed["ref"], seed["sha"])
    assert answer["from"] == seed["checkout_backup_id"]
    assert set(answer["steps"]) >= {"download", "extract", "fixup"}
    assert answer["incarnation"] == "local:slot-1:1"
    record = slots.record()
    assert record.state is State.SEEDED
    assert record.window.unsettled == 0

    checkout = slots.workspace() / CHECKOUT
    assert (checkout / ".git").is_dir()
    assert git(checkout, "symbolic-ref", "--short", "HEAD") == seed["ref"]
    assert git(checkout, "rev-parse", "HEAD") == seed["sha"]
    assert git(checkout, "remote", "get-url", "origin") == ORIGIN
    # The index took the extracted files' stat data: on stat data alone, git takes only
    # the resident's uncommitted edit for changed (test_index_stat proves no file is read).
    assert git(checkout, "diff-files", "--name-only") == "src/lib.py"
    installed = checkout / "node_modules" / "left-pad" / "index.js"
    assert installed.read_text() == "module.exports = 1\n"
    assert (checkout / "src" / "tool.sh").stat().st_mode & 0o111
    marker = json.loads((slots.workspace() / STATE_DIR / MARKER).read_text())
    assert marker["seed"]["checkout_backup_id"] == seed["checkout_backup_id"]
    assert marker["owner"] == body["claim"]
    assert not (slots.workspace() / STATE_DIR / "downloads").exists()
    # The task logs its settle after the write that the poll saw, so the line may lag.
    wait_for(lambda: "restore settled" in slots.log("slot-1"), "the settle's log line")
    events = [json.loads(line) for line in slots.log("slot-1").splitlines() if line.strip()]
    assert [e["message"] for e in events][:2] == ["task started", "restore settled"]
    assert "X-Amz-Signature" not in slots.log("slot-1")
    assert slots.stack.endpoint not in slots.log("slot-1")


def test_polling_after_work_leaves_the_checkout_untouched(slots: Slots, repo: Path) -> None:
    body = slots.body(slots.publish(repo))
    slots.seed(body)
    assert slots.settle(body)[1]["seeded"] is True
    checkout = slots.workspace() / CHECKOUT
    (checkout / "src" / "feature.py").write_text("NEW = True\n")
    git(checkout, "add", "-A")
    author = ("-c", "user.email=run@example.com", "-c", "user.name=run")
    git(checkout, *author, "commit", "-qm", "run work")
    (checkout / "README.md").write_text("# uncommitted edit\n")
    before = tree(slots.workspace())
    head = git(checkout, "rev-parse", "HEAD")
    deadline_before = slots.record().idle_deadline

    for _ in range(3):
        status, answer = slots.seed(body)
        assert (status, answer["seeded"], answer["cached"]) == (200, True, True)
    assert tree(slots.workspace()) == before
    assert git(checkout, "rev-parse", "HEAD") == head
    assert slots.attempts() == ["attempt-1.json"]
    assert slots.record().idle_deadline >= deadline_before


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"claim": {"run": "run-2", "requester": "mallory"}}, "claim-mismatch"),
        ({"claim": None}, "claim-mismatch"),
        ({"seed": {"ref": "other-branch"}}, "seed-mismatch"),
        ({"origin": "https://git.example.com/acme/fork.git"}, "origin-mismatch"),
        ({"origin": None}, "origin-mismatch"),
    ],
)
def test_anyone_else_gets_409_and_learns_nothing(
    slots: Slots, repo: Path, change: dict[str, Any], reason: str
) -> None:
    body = slots.body(slots.publish(repo))
    assert slots.seed(body)[0] == 202
    other = json.loads(json.dumps(body))
    for field, value in change.items():
        if isinstance(value, dict) and isinstance(other.get(field), dict):
            other[field] |= value
        else:
            other[field] = value
    status, answer = slots.seed(other)
    assert (status, answer) == (409, {"error": reason, "detail": None, "fields": []})
    text = json.dumps(answer)
    for secret in ("alice", "run-1", "thread-1", body["seed"]["checkout_backup_id"]):
        assert secret not in text
    assert slots.attempts() == ["attempt-1.json"]


def test_a_cold_slot_is_born_unseeded_and_runs_without_a_restore(slots: Slots) -> None:
    status, answer = slots.seed(slots.body(None, slot="cold-1"))
    assert status == 200
    assert answer == {
        "state": "unseeded",
        "seeded": False,
        "slot": "cold-1",
        "attempt": 1,
        "incarnation": "local:cold-1:1",
        "claim": None,
    }
    record = slots.record("cold-1")
    assert record.state is State.UNSEEDED
    assert record.window.unsettled == 0
    assert slots.runtime.status("local:cold-1:1") is TaskStatus.RUNNING
    assert not (slots.workspace("cold-1") / CHECKOUT).exists()


def test_a_poll_that_touches_no_object_reads_no_r2_secret(
    slots: Slots, unreadable_r2_secret: list[str]
) -> None:
    """The seed function's R2 client and secret wait until a request touches an object, so
    a cold slot's birth and poll answer as they would without R2 trouble, and the secret
    is never asked for."""
    for _ in range(2):
        status, answer = slots.seed(slots.body(None, slot="cold-secret"))
        assert (status, answer["state"], answer["attempt"]) == (200, "unseeded", 1)
    assert unreadable_r2_secret == []


def test_a_backup_id_no_generation_names_is_seed_missing_with_no_effect(
    slots: Slots, repo: Path
) -> None:
    seed = slots.publish(repo) | {"checkout_backup_id": "widgets-checkout-forged"}
    assert_seed_missing_with_no_effect(slots, seed)


def test_links_that_escape_only_together_across_checkout_and_deps_are_an_unsafe_archive(
    slots: Slots, repo: Path, deps: Path
) -> None:
    """Each archive is checked against its own root, where each link stays inside; in the
    restored checkout the deps tree sits under node_modules, and `a` climbs through the
    deps tree's `L -> .` up to `/`. The whole checkout is checked once more."""
    depth = 14
    (repo / "a").symlink_to("node_modules/" + "L/" * depth + "../" * (depth + 1))
    (deps / "L").symlink_to(".")
    seed = slots.publish(repo, deps)
    _, answer = slots.settle(slots.body(seed))
    assert verdict(answer) == (False, "unsafe-archive", "fixup"), slots.log("slot-1")
    assert_no_half_tree(slots, "slot-1")


@pytest.mark.parametrize("where", ["checkout", "deps"])
def test_either_archive_refused_while_both_extract_leaves_neither_staged(
    slots: Slots, repo: Path, deps: Path, where: str
) -> None:
    """The two archives extract at once (the deps tree staged in the workspace): when one
    is refused, the other is not placed, and nothing of either is left."""
    (repo if where == "checkout" else deps).joinpath("escape").symlink_to("../../../../out")
    seed = slots.publish(repo, deps)
    body = slots.body(seed, slot=f"refused-{where}")
    slots.seed(body)
    _, answer = slots.settle(body)
    assert verdict(answer) == (False, "unsafe-archive", "extract"), slots.log(f"refused-{where}")
    assert_no_half_tree(slots, f"refused-{where}")


def test_a_refused_checkout_does_not_wait_for_the_deps_download(
    slots: Slots, repo: Path, deps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deps archive's GET is held for good: the checkout's refusal stops that download
    and settles at once, rather than once the download gives up (its stalls retried)."""
    repo.joinpath("escape").symlink_to("../../../../out")
    seed = slots.publish(repo, deps)
    proxy = TamperingProxy(
        slots.stack.endpoint, mode="stall", only=backup_key(seed["deps_backup_id"])
    )
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", proxy.endpoint)
    body = slots.body(seed, slot="no-wait")
    slots.seed(body)

    _, answer = slots.settle(body, seconds=30)

    assert verdict(answer) == (False, "unsafe-archive", "extract"), slots.log("no-wait")
    assert not proxy.release.is_set()  # the deps archive never came
    assert_no_half_tree(slots, "no-wait")
    proxy.close()


def test_a_corrupted_archive_fails_at_verify_with_no_half_tree(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    image = squashfs_of(repo, tmp_path / "good.sqsh")
    corrupted = bytearray(image)
    corrupted[len(corrupted) // 2] ^= 0xFF
    seed = record_archive(
        slots,
        "widgets-corrupt",
        bytes(corrupted),
        size=len(image),
        sha256=hashlib.sha256(image).hexdigest(),
        sha=git(repo, "rev-parse", "HEAD"),
    )
    body = slots.body(seed, slot="corrupt")
    assert slots.seed(body)[0] == 202
    status, answer = slots.settle(body)
    verdict = (status, answer["seeded"], answer["reason"], answer["step"])
    assert verdict == (200, False, "seed-failed", "verify")
    assert_no_half_tree(slots, "corrupt")
    assert slots.record("corrupt").state is State.SEED_FAILED


def test_both_archives_download_at_once(
    slots: Slots, repo: Path, deps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every GET is held until released: the deps archive's GET must come while the
    checkout's is still held, which one download after the other never does."""
    seed = slots.publish(repo, deps)
    proxy = TamperingProxy(slots.stack.endpoint, mode="stall")
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", proxy.endpoint)
    body = slots.body(seed, slot="both")
    keys = {backup_key(seed[part]) for part in ("checkout_backup_id", "deps_backup_id")}
    slots.seed(body)
    wait_for(
        lambda: all(any(path.endswith(f"/{key}") for path in proxy.paths) for key in keys),
        "both archives requested while every GET is held",
    )
    proxy.release.set()
    _, answer = slots.settle(body)
    assert answer["seeded"] is True, slots.log("both")
    proxy.close()


def test_a_corrupted_deps_archive_fails_at_verify_and_the_extracted_checkout_goes(
    slots: Slots, repo: Path, deps: Path
) -> None:
    seed = slots.publish(repo, deps)
    s3 = boto3.client("s3", endpoint_url=slots.stack.endpoint, region_name="auto")
    bucket, key = slots.stack.r2_settings.bucket or "", backup_key(seed["deps_backup_id"])
    image = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    image[len(image) // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(image))
    body = slots.body(seed, slot="bad-deps")
    slots.seed(body)
    _, answer = slots.settle(body)
    assert verdict(answer) == (False, "seed-failed", "verify")
    assert_no_half_tree(slots, "bad-deps")


def test_an_object_shorter_than_recorded_fails_at_verify_with_no_half_tree(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    image = squashfs_of(repo, tmp_path / "good.sqsh")
    seed = record_archive(
        slots,
        "widgets-short",
        image[: len(image) // 2],
        size=len(image),
        sha256=hashlib.sha256(image).hexdigest(),
        sha=git(repo, "rev-parse", "HEAD"),
    )
    body = slots.body(seed, slot="short")
    slots.seed(body)
    _, answer = slots.settle(body)
    assert verdict(answer) == (False, "seed-failed", "verify")
    assert_no_half_tree(slots, "short")


def test_a_download_cut_short_every_time_fails_at_download_with_no_half_tree(
    slots: Slots, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = slots.publish(repo)
    proxy = TamperingProxy(slots.stack.endpoint, mode="truncate")
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", proxy.endpoint)
    body = slots.body(seed, slot="cut")
    slots.seed(body)
    _, answer = slots.settle(body)
    assert verdict(answer) == (
        False,
        "seed-failed",
        "download",
    )
    assert "retries-exhausted" in answer["detail"]
    assert_no_half_tree(slots, "cut")
    proxy.shutdown()


def test_an_archive_with_an_escaping_symlink_is_refused_and_writes_nothing_outside(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    (repo / "escape").symlink_to("../../../../outside-the-slot")
    image = squashfs_of(repo, tmp_path / "evil.sqsh")
    seed = record_archive(
        slots,
        "widgets-evil",
        image,
        size=len(image),
        sha256=hashlib.sha256(image).hexdigest(),
        sha=git(repo, "rev-parse", "HEAD"),
    )
    body = slots.body(seed, slot="evil")
    slots.seed(body)
    _, answer = slots.settle(body)
    assert verdict(answer) == (False, "unsafe-archive", "extract")
    assert_no_half_tree(slots, "evil")
    assert not (slots.workspace("evil").parents[2] / "outside-the-slot").exists()


def test_a_task_killed_mid_download_stays_seeding_and_the_next_attempt_starts_afresh(
    slots: Slots, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = slots.publish(repo)
    proxy = TamperingProxy(slots.stack.endpoint, mode="stall")
    monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", proxy.endpoint)
    body = slots.body(seed, slot="killed")
    status, answer = slots.seed(body)
    assert status == 202
    assert proxy.gets.wait(30), slots.log("killed")
    killed = slots.workspace("killed")
    slots.kill(answer["incarnation"])

    record = slots.record("killed")
    assert record.state is State.SEEDING
    assert record.window.unsettled == 1  # the detached restore: the sweep retains the slot
    assert isinstance(
        transitions.FENCE.decide(record, transitions.At(now=record.idle_deadline + 1)),
        Refused,
    )
    # As on Fargate, a stopped task's disk is gone with it.
    wait_for(lambda: not killed.exists(), "the killed attempt's workspace to go")

    proxy.release.set()
    _, answer = slots.settle(body)
    assert slots.attempts("killed") == ["attempt-1.json", "attempt-2.json"]
    assert answer["seeded"] is True
    assert slots.workspace("killed") != killed
    assert git(slots.workspace("killed") / CHECKOUT, "rev-parse", "HEAD") == seed["sha"]
    record = slots.record("killed")
    assert record.attempt == 2
    assert [entry.status.value for entry in record.window.entries] == ["unknown", "settled"]
    proxy.shutdown()


@pytest.mark.parametrize(
    ("name", "documented"),
    [
        ("seed-healthz", 200),
        ("seed-bad-ref", 400),
        ("seed-cold", 200),
        ("seed-new", 200),  # no generation records the event's ids: seed-missing, run cold
    ],
)
def test_every_seed_event_gives_its_documented_status(
    slots: Slots, name: str, documented: int
) -> None:
    status, _ = invoke(seed_function, event(name))
    assert status == documented


def test_the_new_poll_and_other_owner_events_against_a_recorded_generation(slots: Slots) -> None:
    new = json.loads(event("seed-new")["body"])
    seed = new["seed"]
    s3 = boto3.client("s3", endpoint_url=slots.stack.endpoint, region_name="auto")
    rotation = json.loads(event("rotation-post")["body"])
    for part in ("checkout", "deps"):
        key = backup_key(rotation[part]["backup_id"])
        s3.put_object(Bucket=slots.stack.r2_settings.bucket or "", Key=key, Body=b"x")
    slots.stack.snapshots.record(NewSnapshot.model_validate(rotation))
    assert seed["checkout_backup_id"] == rotation["checkout"]["backup_id"]
    assert invoke(seed_function, event("seed-new"))[0] == 202
    assert invoke(seed_function, event("seed-poll"))[0] in {200, 202}
    status, answer = invoke(seed_function, event("seed-other-owner"))
    assert (status, answer) == (409, {"error": "claim-mismatch", "detail": None, "fields": []})


def test_a_poll_costs_one_dynamodb_call(slots: Slots, repo: Path) -> None:
    body = slots.body(slots.publish(repo))
    slots.seed(body)
    slots.settle(body)
    with injected_session() as session:
        calls = operations(session, "dynamodb")
        status, _ = slots.seed(body)
    assert status == 200
    assert calls == ["UpdateItem"]


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "cold"])
def test_a_birth_costs_three_dynamodb_calls(slots: Slots, repo: Path, seeded: bool) -> None:
    """The touch that finds no slot, the birth (one transaction with the proof that the
    seed is recorded), the incarnation."""
    body = slots.body(slots.publish(repo)) if seeded else {"slot": "cold", "seed": None}
    with injected_session() as session:
        calls = operations(session, "dynamodb")
        status, _ = slots.seed(body)
    assert status == (202 if seeded else 200)
    assert calls == ["UpdateItem", "TransactWriteItems", "UpdateItem"]


def test_an_archives_own_git_hooks_and_fsmonitor_never_run_in_the_slot_task(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    """The fix-up runs git inside the restored `.git`: what the archive configures there
    to run on checkout (a hook, an fsmonitor command) must not run in the slot task."""
    ran = tmp_path / "ran"
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {ran}/hook\n")
    hook.chmod(0o755)
    monitor = repo / ".git" / "fsmonitor.sh"
    monitor.write_text(f"#!/bin/sh\ntouch {ran}/fsmonitor\n")
    monitor.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(monitor))
    ran.mkdir()
    body = slots.body(slots.publish(repo))
    slots.seed(body)
    _, answer = slots.settle(body)
    assert answer["seeded"] is True, slots.log("slot-1")
    assert list(ran.iterdir()) == []


def test_a_seed_rotated_out_after_its_birth_settles_seed_missing_in_the_task(
    stack: Stack, checkpoint_function: str, tmp_path: Path
) -> None:
    """The checkpoint function grants what the snapshot records name when the task starts,
    not what the plan says: a seed no record names any more (rotated out between the birth
    and the start) is granted nothing, and the task settles `seed-missing` with no tree."""
    seed = SeedIdentity(
        resource="widgets", ref="main", sha="a" * 40, checkout_backup_id="gone-checkout"
    )
    failed = settled_in_process(stack, seed, RestoreGrant(expires_in=0), tmp_path)
    assert (failed.reason, failed.step) == ("seed-missing", "download")


@pytest.mark.parametrize("ref", ["m\u0430in", "ma\u200bin", "develop"])
def test_a_seed_under_another_ref_than_its_generations_is_seed_missing_with_no_effect(
    slots: Slots, repo: Path, ref: str
) -> None:
    """The recorded checkout and sha under a look-alike of the generation's ref (a Cyrillic
    U+0430, a zero-width space) or under another branch name: nothing is recorded, presigned or
    launched, and no checkout ends up on a branch the resident never published."""
    seed = slots.publish(repo) | {"ref": ref}
    assert_seed_missing_with_no_effect(slots, seed)


def test_a_grant_naming_other_bytes_than_served_fails_before_anything_is_extracted(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    """The task verifies each download against the sha256 it was granted with (the
    records'): other bytes behind the URL fail the restore before anything is extracted."""
    seed = SeedIdentity.model_validate(slots.publish(repo) | {"resource": "widgets"})
    table = slots.stack.store.table_resource()
    archive = SnapshotStore(table).read("widgets").archives_for(seed)
    assert archive is not None
    recorded = archive[0]
    served = slots.stack.r2.presign_get(backup_key(recorded.backup_id), 60)
    other = GrantedArchive(url=served, size=recorded.size, sha256="f" * 64)

    failed = settled_in_process(
        slots.stack, seed, RestoreGrant(checkout=other, expires_in=60), tmp_path
    )

    assert (failed.reason, failed.step) == ("seed-failed", "verify")
    assert failed.detail == "sha256-mismatch"


def settled_in_process(
    stack: Stack, seed: SeedIdentity, grant: RestoreGrant, tmp_path: Path
) -> SeedFailed:
    """Birth a record naming `seed`, its task recorded, and run that task in-process with
    `grant`, through its API (the checkpoint function, with the task's own keys): answer
    the failure it settled, with no checkout left."""
    lifecycle = stack.store.lifecycle()
    born = lifecycle.birth(
        "in-process",
        Binding(owner=None, seed=seed, origin=None),
        now=1_800_000_000,
        idle_deadline=1_800_000_600,
    )
    assert isinstance(born, Written)
    assert born.entry is not None
    incarnation = "local:in-process:1"
    launched = transitions.Launched(incarnation=incarnation, launch=born.entry.ref, now=NOW + 1)
    recorded = lifecycle.apply("in-process", transitions.RECORD_INCARNATION, launched)
    assert isinstance(recorded, Written), recorded
    plan = SlotPlan(slot="in-process", attempt=1, op=born.entry.ref, seed=seed)
    settings = TaskSettings(workspace=tmp_path / "workspace")
    stop = threading.Event()
    prefetch = Prefetch(grant, settings, stop)
    api = task_api(tmp_path, "in-process", incarnation, stop)
    task = SlotTask(plan, settings, api, stop, prefetch=prefetch)
    assert task.restore() == "failed"
    classified = lifecycle.read("in-process")
    assert isinstance(classified, Supported)
    result = classified.record.result
    assert isinstance(result, SeedFailed)
    assert not (tmp_path / "workspace" / CHECKOUT).exists()
    assert not (tmp_path / "workspace" / STATE_DIR / "downloads").exists()
    return result


def assert_seed_missing_with_no_effect(slots: Slots, seed: dict[str, Any]) -> None:
    """`seed-missing`, and nothing presigned, recorded or launched."""
    presigned: list[str] = []
    with injected_session() as session:
        # Every signature, a presigned URL's included (it sends nothing: no before-call).
        session.events.register(
            "before-sign.s3", lambda **kwargs: presigned.append(kwargs["operation_name"])
        )
        status, answer = slots.seed(slots.body(seed))
    missing = {"seeded": False, "reason": "seed-missing", "step": None, "detail": None}
    assert (status, answer) == (200, missing)
    assert presigned == []
    assert slots.stack.store.lifecycle().read("slot-1").__class__.__name__ == "Absent"
    assert not slots.workspace().parent.exists() or slots.attempts() == []
