"""The sweep's index keys, decided without I/O: a live slot's shard (stable, in range,
spread), its `sweep_at` (the idle deadline, or a retain's next look), and the retain's
backoff (doubling, capped, ended by any other write)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
from pydantic import ValidationError

from builders import EXPIRED, IDLE, record_in
from seedkeeper.config import StoreSettings
from seedkeeper.domain import transitions
from seedkeeper.domain.checkpoints import Backoff
from seedkeeper.domain.opwindow import Actor, OpKind
from seedkeeper.domain.record import MAX_SWEEP_SHARDS, SlotRecord, State, encode, sweep_shard
from seedkeeper.domain.transitions import Change
from seedkeeper.services.sweep import RetainedAlertSettings, SweepSettings

SLOTS = [f"slot-{n}" for n in range(5000)]


def test_a_shard_is_sha256_of_the_slot_id_the_same_in_every_process() -> None:
    """Pinned values, and the same answer from processes whose string hashes differ:
    Python's `hash` is salted per process, so a shard taken from it would move."""
    assert [sweep_shard("slot-1", 16), sweep_shard("bulk-42", 64), sweep_shard("x", 1)] == [
        "live#14",
        "live#02",
        "live#00",
    ]
    program = "from seedkeeper.domain.record import sweep_shard; print(sweep_shard('slot-9', 64))"
    answers = {
        subprocess.run(
            [sys.executable, "-c", program],
            env=os.environ | {"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert answers == {sweep_shard("slot-9", 64)}


@pytest.mark.parametrize("shards", [1, 2, 16, 64, MAX_SWEEP_SHARDS])
def test_every_shard_is_in_range_and_evenly_used(shards: int) -> None:
    used = Counter(sweep_shard(slot, shards) for slot in SLOTS)
    assert set(used) == {f"live#{shard:02d}" for shard in range(shards)}
    mean = len(SLOTS) / shards
    assert max(used.values()) < 1.5 * mean  # no shard takes a hot share of the touches


@pytest.mark.parametrize("shards", [0, MAX_SWEEP_SHARDS + 1])
def test_the_shard_count_is_one_to_a_hundred(shards: int) -> None:
    with pytest.raises(ValidationError):
        StoreSettings(table="seedkeeper", sweep_shards=shards)


def test_the_settings_are_read_by_the_names_the_readme_and_the_template_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "SEEDKEEPER_TABLE": "seedkeeper",
        "SEEDKEEPER_SWEEP_SHARDS": "64",
        "SEEDKEEPER_SWEEP_RETAIN_BACKOFF": "120",
        "SEEDKEEPER_SWEEP_RETAIN_BACKOFF_MOST": "1800",
        "SEEDKEEPER_RETAINED_ALERT_AFTER": "7200",
    }.items():
        monkeypatch.setenv(name, value)
    assert StoreSettings().sweep_shards == 64
    assert SweepSettings().backoff == Backoff(first=120, most=1800)
    assert RetainedAlertSettings().retained_alert_after == 7200


def test_the_backoff_doubles_from_one_sweep_period_to_an_hour() -> None:
    backoff = SweepSettings().backoff
    assert [backoff.after(n) for n in range(1, 8)] == [300, 600, 1200, 2400, 3600, 3600, 3600]
    assert backoff.after(1000) == 3600


def test_a_backoff_that_would_shrink_is_refused() -> None:
    with pytest.raises(ValidationError):
        SweepSettings(retain_backoff=600, retain_backoff_most=300)


def retained(record: SlotRecord, now: int) -> SlotRecord:
    decision = transitions.NOTE_RETAINED.decide(
        record, transitions.Retained("task-unknown", now=now, backoff=Backoff(300, 3600))
    )
    assert isinstance(decision, Change)
    return decision.record


def test_each_retain_in_a_row_looks_again_later_and_sweep_at_follows() -> None:
    record = record_in(State.SEEDED)
    assert encode(record)["sweep_at"] == record.idle_deadline  # no backoff: the deadline
    first = retained(record, EXPIRED)
    second = retained(first, EXPIRED + 400)
    assert (first.retains, first.next_look) == (1, EXPIRED + 300)
    assert (second.retains, second.next_look) == (2, EXPIRED + 400 + 600)
    assert encode(second)["sweep_at"] == EXPIRED + 1000
    assert second.idle_deadline == record.idle_deadline  # its meaning is kept
    assert second.retained_reason == "task-unknown"


def test_any_other_write_ends_the_backoff() -> None:
    """A touch, or a write by anyone (here the slot task's settle of its launch): the
    sweep looks at the slot again as soon as it is idle."""
    backed_off = retained(retained(record_in(State.SEEDED), EXPIRED), EXPIRED + 400)
    poll = transitions.Poll(backed_off.binding, now=EXPIRED + 500, idle_deadline=EXPIRED + 500)
    touched = transitions.TOUCH.decide(backed_off, poll)
    reserved = transitions.RESERVE.decide(
        backed_off,
        transitions.Reservation(kind=OpKind.LAUNCH, actor=Actor.SEED_FN, now=EXPIRED + 500),
    )
    for decision in (touched, reserved):
        assert isinstance(decision, Change)
        assert (decision.record.next_look, decision.record.retains) == (None, None)
        assert encode(decision.record)["sweep_at"] == decision.record.idle_deadline


def test_a_backoff_never_hides_a_later_idle_deadline() -> None:
    """A deadline moved past the next look (a failed checkpoint's retry) is when the
    sweep looks: the later of the two."""
    backed_off = retained(record_in(State.SEEDED), EXPIRED)
    assert backed_off.sweep_at == EXPIRED + 300
    later = backed_off.model_copy(update={"idle_deadline": EXPIRED + 10 * IDLE})
    assert later.sweep_at == EXPIRED + 10 * IDLE
