"""The `seedkeeper` console script, run as a user would, against a moto server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from builders import EXPIRED, IDLE, NOW, ORIGIN, owner, seed, stored_in, success, written
from conftest import Stack
from repos import git, make_repository
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.domain.record import Loss, State, slot_key
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.sweep_index import Position, SweepIndex

SEEDKEEPER = str(Path(sys.executable).with_name("seedkeeper"))


@pytest.fixture
def store_env(moto_endpoint: str, aws_credentials: None) -> dict[str, str]:
    return os.environ | {
        "SEEDKEEPER_TABLE": f"cli-{uuid.uuid4().hex[:8]}",
        "SEEDKEEPER_DYNAMODB_ENDPOINT": moto_endpoint,
    }


def seedkeeper(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SEEDKEEPER, *args],
        check=False,
        env=env | {"COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_table_create_then_show_a_slot(store_env: dict[str, str]) -> None:
    created = seedkeeper("table-create", env=store_env)
    assert created.returncode == 0, created.stderr
    assert f"created table {store_env['SEEDKEEPER_TABLE']}" in created.stdout

    absent = seedkeeper("slot", "slot-1", env=store_env)
    assert absent.returncode == 1
    assert "absent" in absent.stdout

    table = boto3.resource("dynamodb", endpoint_url=store_env["SEEDKEEPER_DYNAMODB_ENDPOINT"])
    born = Lifecycle(table.Table(store_env["SEEDKEEPER_TABLE"])).birth(
        "slot-1",
        Binding(owner=owner(), seed=seed(), origin=ORIGIN),
        now=NOW,
        idle_deadline=NOW + IDLE,
    )
    assert isinstance(born, Written)
    shown = seedkeeper("slot", "slot-1", env=store_env)
    assert shown.returncode == 0, shown.stderr
    assert "seeding" in shown.stdout
    assert "#1 restore open" in shown.stdout
    assert "run run-1, thread thread-1, acme/widgets@main" in shown.stdout


def test_bad_input_names_the_field(store_env: dict[str, str]) -> None:
    bad_slot = seedkeeper("slot", "../etc", env=store_env)
    assert bad_slot.returncode == 2
    assert "slot" in bad_slot.stderr
    no_table = seedkeeper(
        "slot", "slot-1", env={k: v for k, v in store_env.items() if k != "SEEDKEEPER_TABLE"}
    )
    assert no_table.returncode == 2
    assert "table" in no_table.stdout


def test_publish_refuses_a_checkout_holding_credentials_unless_asked_to_scrub(
    stack: Stack, tmp_path: Path
) -> None:
    token = "ghp_CliTestSecret0123456789"  # noqa: S105 - a planted credential, not a real one
    repo = make_repository(tmp_path)
    git(repo, "config", "http.extraheader", f"Authorization: Bearer {token}")
    env = dict(os.environ)
    publish = ("publish", "--resource", "widgets", "--checkout", str(repo))

    refused = seedkeeper(*publish, env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "http.extraheader" in refused.stdout
    assert "--scrub-credentials" in refused.stdout
    assert token not in refused.stdout + refused.stderr

    scrubbed = seedkeeper(*publish, "--scrub-credentials", env=env)
    assert scrubbed.returncode == 0, scrubbed.stdout + scrubbed.stderr
    assert "scrubbed from the archive: http.extraheader" in scrubbed.stdout
    assert "rotated" in scrubbed.stdout
    assert token not in scrubbed.stdout + scrubbed.stderr
    assert token in git(repo, "config", "http.extraheader")  # the checkout is left as it is


def test_r2_lifecycle_keeps_checkpoints_as_long_as_the_park_retention(stack: Stack) -> None:
    """`--apply` writes the rule from SEEDKEEPER_PARK_RETENTION (a day more); `--check`
    fails once the retention and the bucket disagree."""
    env = os.environ | {"SEEDKEEPER_PARK_RETENTION": str(10 * 86_400)}
    assert seedkeeper("r2-lifecycle", "--check", env=env).returncode == 1
    applied = seedkeeper("r2-lifecycle", "--apply", env=env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "checkpoints/ after 11 days" in applied.stdout
    rules = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
    configured = rules.get_bucket_lifecycle_configuration(Bucket=stack.r2_settings.bucket or "")
    ours = {rule["ID"]: rule for rule in configured["Rules"]}
    assert ours["seedkeeper-checkpoints-expire"]["Expiration"]["Days"] == 11
    longer = env | {"SEEDKEEPER_PARK_RETENTION": str(30 * 86_400)}
    checked = seedkeeper("r2-lifecycle", "--check", env=longer)
    assert checked.returncode == 1
    assert "seedkeeper-checkpoints-expire: expiration days is 11, expected 31" in checked.stdout


def row(output: str, slot: str) -> str:
    """The one table line naming `slot`."""
    [line] = [line for line in output.splitlines() if f" {slot} " in line]
    return line


def test_status_lists_every_slot_record_by_state_and_reason_and_nothing_else(
    store_env: dict[str, str],
) -> None:
    assert seedkeeper("table-create", env=store_env).returncode == 0
    table = boto3.resource(
        "dynamodb", endpoint_url=store_env["SEEDKEEPER_DYNAMODB_ENDPOINT"]
    ).Table(store_env["SEEDKEEPER_TABLE"])
    lifecycle = Lifecycle(table)

    kept = stored_in(lifecycle, "slot-kept", State.SEEDED)
    retained = transitions.Retained("task-unknown", now=EXPIRED)
    written(lifecycle.write(transitions.NOTE_RETAINED, kept, retained))
    parked = stored_in(lifecycle, "slot-parked", State.PARKED)
    assert parked.checkpoint is not None
    crashed = stored_in(lifecycle, "slot-lost", State.SEEDED)
    assert crashed.incarnation is not None
    loss = Loss(reason="task-crashed", detail="exit code 137 [bold]OOM", at=EXPIRED)
    lost = transitions.Lost(crashed.incarnation, loss, expires_at=EXPIRED + 86_400)
    assert written(lifecycle.write(transitions.LOSE, crashed, lost)).state is State.LOST
    # A resumed slot: its old checkpoint becomes a debt item beside its record.
    resumed = stored_in(lifecycle, "slot-resumed", State.PARKED)
    superseded = resumed.checkpoint
    assert superseded is not None
    back = transitions.Poll(
        Binding(owner=owner(), seed=seed(), origin=ORIGIN), EXPIRED, EXPIRED + IDLE
    )
    outcome = lifecycle.write(transitions.RESUME, resumed, back)
    assert isinstance(outcome, Written)
    assert outcome.entry is not None
    restore = outcome.entry.ref
    launched = transitions.Launched("local:slot-resumed:2", restore, EXPIRED)
    resumed = written(lifecycle.write(transitions.RECORD_INCARNATION, outcome.record, launched))
    verdict = transitions.Verdict(2, restore, success(resumed=True), EXPIRED)
    written(lifecycle.write(transitions.SETTLE_SEED, resumed, verdict))
    assert lifecycle.debts("slot-resumed") == [superseded.key]
    # Records this code cannot read, the sweep's cursor, and bulk that takes the Scan past
    # its 1 MB page: the whole table is read, in two pages.
    table.put_item(Item={**slot_key("slot-future"), "schema": 2, "state": "hibernating"})
    table.put_item(Item={**slot_key("slot-broken"), "schema": 1, "state": "sleeping"})
    SweepIndex(table).keep_progress(16, Position(3))
    for pad in range(3):
        table.put_item(Item={"PK": f"PAD#{pad}", "SK": "PAD", "pad": "x" * 350_000})

    shown = seedkeeper("status", env=store_env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    out = shown.stdout
    assert "task-unknown" in row(out, "slot-kept")
    assert "seeded" in row(out, "slot-kept")
    assert "parked" in row(out, "slot-parked")
    assert "1.0 kB" in row(out, "slot-parked")  # the checkpoint's size
    assert "task-crashed" in row(out, "slot-lost")
    assert "exit code 137 [bold]OOM" in row(out, "slot-lost")  # the store's text, not markup
    assert "seeded" in row(out, "slot-resumed")
    assert "unsupported" in row(out, "slot-future")
    assert "schema 2" in row(out, "slot-future")
    assert "malformed" in row(out, "slot-broken")
    assert superseded.key not in out  # the debt is not a slot
    assert "DEBT#" not in out
    assert "SWEEP" not in out
    assert "CURSOR" not in out
    assert "PAD" not in out
    assert "seeded 2, parked 1, lost 1, unsupported 1, malformed 1: 6 slots" in out
    assert "2 Scan pages" in out

    only = seedkeeper("status", "--state", "lost", env=store_env)
    assert only.returncode == 0, only.stdout + only.stderr
    assert "task-crashed" in row(only.stdout, "slot-lost")
    for hidden in ("slot-kept", "slot-parked", "slot-resumed"):
        assert hidden not in only.stdout
    # What cannot be read cannot be filtered by its state: it is always shown.
    assert "unsupported" in row(only.stdout, "slot-future")
    assert "malformed" in row(only.stdout, "slot-broken")
    assert "lost 1, unsupported 1, malformed 1: 3 slots" in only.stdout

    several = seedkeeper("status", "--state", "parked,lost", "--state", "seeded", env=store_env)
    assert several.returncode == 0, several.stdout + several.stderr
    assert "seeded 2, parked 1, lost 1, unsupported 1, malformed 1: 6 slots" in several.stdout


def test_status_refuses_an_unknown_state_naming_the_option(store_env: dict[str, str]) -> None:
    refused = seedkeeper("status", "--state", "parked,sleeping", env=store_env)
    assert refused.returncode == 2
    assert "--state" in refused.stderr
    assert "sleeping" in refused.stderr
    assert "parked, lost" in refused.stderr  # the states it takes are named
