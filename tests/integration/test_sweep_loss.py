"""Loss is recorded, never hidden; superseded checkpoints are deleted, never the one a slot
names: the idle sweep against moto over HTTP (DynamoDB and R2), and with real slot tasks
that die with their work."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import boto3

from builders import EXPIRED, resume, stored_in, success, written
from conftest import Stack
from seedkeeper.adapters.r2 import R2
from seedkeeper.adapters.runtime import SlotRuntime
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.opwindow import OpKind
from seedkeeper.domain.record import SCHEMA, SlotRecord, State, slot_key
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper.services.sweep import Report, Sweeper, SweepSettings
from seedkeeper.store.items import owed_since
from seedkeeper.store.lifecycle import Lifecycle, Written, debt_key
from seedkeeper.store.sweep_index import SweepIndex
from seedkeeper_task.supervisor import CHECKOUT
from slots import Slots, wait_for

LATER = 10**10  # every deadline has passed
RETENTION = RetentionSettings()


def no_runtime() -> SlotRuntime:
    raise RuntimeUnavailable("the debts' tests run no task: every task is unknown")


def sweep(
    stack: Stack, r2: R2, runtime: Callable[[], SlotRuntime] = no_runtime, at: int = EXPIRED + 1
) -> Report:
    return Sweeper(
        index=SweepIndex(stack.table),
        lifecycle=Lifecycle(stack.table),
        runtime=runtime,
        snapshots=stack.snapshots,
        r2=r2,
        settings=SweepSettings(),
        retention=RETENTION,
        clock=lambda: at,
    ).sweep()


def objects(stack: Stack) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
    listed = s3.list_objects_v2(Bucket=stack.r2_settings.bucket or "", Prefix="checkpoints/")
    return sorted(item["Key"] for item in listed.get("Contents", []))


def put_object(stack: Stack, key: str) -> None:
    s3 = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
    s3.put_object(Bucket=stack.r2_settings.bucket or "", Key=key, Body=b"a checkpoint")


def resumed(lifecycle: Lifecycle, slot: str) -> tuple[SlotRecord, str]:
    """A parked slot its owner came back to, the resume seeded: the store wrote the old
    checkpoint's debt in the settle's own transaction. Answers the record and that key."""
    parked = stored_in(lifecycle, slot, State.PARKED)
    assert parked.checkpoint is not None
    seeding = lifecycle.apply(slot, transitions.RESUME, resume(parked), as_read=parked)
    assert isinstance(seeding, Written)
    assert seeding.entry is not None
    verdict = transitions.Verdict(
        attempt=2, restore=seeding.entry.ref, result=success(resumed=True), now=EXPIRED
    )
    seeded = written(lifecycle.write(transitions.SETTLE_SEED, seeding.record, verdict))
    assert (seeded.state, seeded.checkpoint) == (State.SEEDED, None)
    assert lifecycle.debts(slot) == [parked.checkpoint.key]
    return seeded, parked.checkpoint.key


def test_a_resumed_slots_superseded_checkpoint_is_deleted_and_its_debt_paid(
    stack: Stack,
) -> None:
    lifecycle = Lifecycle(stack.table)
    _, superseded = resumed(lifecycle, "resumed")
    put_object(stack, superseded)
    kept = stored_in(lifecycle, "parked", State.PARKED).checkpoint
    assert kept is not None
    put_object(stack, kept.key)

    report = sweep(stack, stack.r2)

    assert report.debts_paid == 1
    assert objects(stack) == [kept.key]  # another slot's parked work is untouched
    assert lifecycle.debts("resumed") == []
    assert report.lost == []  # the resumed slot is seeded and fresh: left alone


def test_a_deletion_that_fails_stays_owed_and_a_later_sweep_pays_it(stack: Stack) -> None:
    lifecycle = Lifecycle(stack.table)
    _, superseded = resumed(lifecycle, "resumed")
    put_object(stack, superseded)
    unreachable = R2.from_settings(
        stack.r2_settings.model_copy(update={"endpoint": "http://127.0.0.1:1"})
    )

    failed = sweep(stack, unreachable)

    assert failed.debts_paid == 0
    assert objects(stack) == [superseded]
    assert lifecycle.debts("resumed") == [superseded]
    assert sweep(stack, stack.r2).debts_paid == 1
    assert (objects(stack), lifecycle.debts("resumed")) == ([], [])


def owe(stack: Stack, slot: str, key: str) -> None:
    """A debt item as the store writes one (planted: no transition would owe these)."""
    item: dict[str, Any] = {**debt_key(slot, key), "schema": SCHEMA, "key": key}
    stack.table.put_item(Item=item | owed_since(EXPIRED))


def test_a_debt_never_deletes_what_a_slot_names_or_another_slots_object(stack: Stack) -> None:
    lifecycle = Lifecycle(stack.table)
    parked = stored_in(lifecycle, "parked", State.PARKED).checkpoint
    assert parked is not None
    stored_in(lifecycle, "other", State.SEEDED)
    stored_in(lifecycle, "broken", State.SEEDED)
    broken = stack.table.get_item(Key=slot_key("broken"))["Item"] | {"rev": "seven"}
    stack.table.put_item(Item=broken)
    elsewhere = "checkpoints/parked/elsewhere.sqsh"
    for key in (parked.key, elsewhere, "checkpoints/broken/1.sqsh"):
        put_object(stack, key)
    owe(stack, "parked", parked.key)  # the one its record names: its parked work
    owe(stack, "other", elsewhere)  # another slot's object
    owe(stack, "broken", "checkpoints/broken/1.sqsh")  # what it names cannot be read

    report = sweep(stack, stack.r2)

    assert report.debts_paid == 0
    assert objects(stack) == sorted([parked.key, elsewhere, "checkpoints/broken/1.sqsh"])
    # Not theirs to delete: forgotten. Unreadable: still owed.
    assert (lifecycle.debts("parked"), lifecycle.debts("other")) == ([], [])
    assert lifecycle.debts("broken") == ["checkpoints/broken/1.sqsh"]


def killed(slots: Slots, incarnation: str) -> bool:
    """Whether the runtime knows how the task ended (its reaper keeps the exit)."""
    return slots.runtime.statuses([incarnation])[incarnation].detail == "killed by SIGKILL"


def test_a_slot_whose_task_died_with_its_work_is_recorded_lost(slots: Slots, repo: Path) -> None:
    """SIGKILL, as a lost host ends a task: nothing checkpointed, so the sweep records the
    loss with the runtime's cause once the slot is idle: a seeded slot, and one whose
    checkpoint was asked for (its open checkpoint can never settle now)."""
    lifecycle = slots.stack.store.lifecycle()
    seed = slots.publish(repo)
    for slot in ("seeded", "checkpointing"):
        body = slots.body(seed, slot=slot)
        slots.seed(body)
        assert slots.settle(body)[1]["seeded"] is True
        (slots.workspace(slot) / CHECKOUT / "work.txt").write_text("never checkpointed\n")
    workspaces = [slots.workspace(slot) for slot in ("seeded", "checkpointing")]
    incarnations = [f"local:{slot}:1" for slot in ("seeded", "checkpointing")]
    for incarnation in incarnations:
        slots.kill(incarnation)
        wait_for(partial(killed, slots, incarnation), f"{incarnation}'s reaper")
    asked = lifecycle.write(
        transitions.REQUEST_CHECKPOINT, slots.record("checkpointing"), transitions.At(LATER)
    )
    assert written(asked).state is State.CHECKPOINTING

    report = sweep(slots.stack, slots.stack.r2, lambda: slots.runtime, at=LATER)

    assert sorted(report.lost) == ["checkpointing", "seeded"]
    for slot, workspace in zip(("seeded", "checkpointing"), workspaces, strict=True):
        record = slots.record(slot)
        assert record.state is State.LOST
        assert record.loss is not None
        assert (record.loss.reason, record.loss.detail) == ("task-stopped", "killed by SIGKILL")
        assert record.expires_at == LATER + RETENTION.park_retention
        assert record.window.unsettled == 0
        assert not workspace.exists(), "the stopped task's workspace went with it"
        assert slots.runtime.status(f"local:{slot}:1") is TaskStatus.STOPPED
    asked_for = [
        e for e in slots.record("checkpointing").window.entries if e.kind is OpKind.CHECKPOINT
    ]
    assert [entry.outcome for entry in asked_for] == ["lost"]
    assert sweep(slots.stack, slots.stack.r2, lambda: slots.runtime, at=LATER + 1).lost == []
