"""The `seedkeeper` console script, run as a user would, against a moto server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from builders import IDLE, NOW, ORIGIN, owner, seed
from conftest import Stack
from repos import git, make_repository
from seedkeeper.domain.models import Binding
from seedkeeper.store.lifecycle import Lifecycle, Written

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
