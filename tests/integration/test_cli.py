"""The `seedkeeper` console script, run as a user would, against a moto server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
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
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper.store.sweep_index import Position, SweepIndex
from seedkeeper_tools.cli import _when

SEEDKEEPER = str(Path(sys.executable).with_name("seedkeeper"))


@pytest.fixture
def store_env(moto_endpoint: str, aws_credentials: None) -> dict[str, str]:
    return os.environ | {
        "SEEDKEEPER_TABLE": f"cli-{uuid.uuid4().hex[:8]}",
        "SEEDKEEPER_DYNAMODB_ENDPOINT": moto_endpoint,
    }


def seedkeeper(
    *args: str, env: dict[str, str], cwd: Path | None = None, columns: str | None = "200"
) -> subprocess.CompletedProcess[str]:
    """Run as a user would, its output piped; `columns` None: COLUMNS unset, as in a pipe."""
    piped = {name: value for name, value in env.items() if name != "COLUMNS"}
    return subprocess.run(
        [SEEDKEEPER, *args],
        check=False,
        env=piped | ({"COLUMNS": columns} if columns else {}),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def said_in_one_line(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said: one line, no traceback."""
    assert "Traceback" not in done.stdout + done.stderr
    assert not done.stderr, done.stderr
    [line] = done.stdout.splitlines()
    return line


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
    assert said_in_one_line(no_table) == "SEEDKEEPER_TABLE: Field required"


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


def closed_endpoint() -> str:
    """An endpoint nothing listens on: a port the system just gave out, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_creating_the_table_again_says_it_exists(store_env: dict[str, str]) -> None:
    assert seedkeeper("table-create", env=store_env).returncode == 0
    again = seedkeeper("table-create", env=store_env)
    assert again.returncode == 0  # as r2-bucket-create: there is what was asked for
    assert said_in_one_line(again) == f"the table {store_env['SEEDKEEPER_TABLE']} already exists"


@pytest.mark.parametrize(
    "command",
    [("slot", "slot-1"), ("status",), ("snapshots", "show", "widgets"), ("table-create",)],
)
def test_a_store_that_does_not_answer_is_named_in_one_line(
    store_env: dict[str, str], command: tuple[str, ...]
) -> None:
    down = closed_endpoint()
    failed = seedkeeper(*command, env=store_env | {"SEEDKEEPER_DYNAMODB_ENDPOINT": down})
    assert failed.returncode == 1
    assert said_in_one_line(failed) == f"could not reach {down} (EndpointConnectionError)"


def test_an_r2_that_does_not_answer_is_named_in_one_line(stack: Stack) -> None:
    down = closed_endpoint()
    failed = seedkeeper("r2-bucket-create", env=os.environ | {"SEEDKEEPER_R2_ENDPOINT": down})
    assert failed.returncode == 1
    assert (
        said_in_one_line(failed)
        == f"R2Unavailable: could not reach {down} (EndpointConnectionError)"
    )


def test_a_missing_table_is_named(store_env: dict[str, str]) -> None:
    for command in [("status",), ("slot", "slot-1"), ("snapshots", "show", "widgets")]:
        missing = seedkeeper(*command, env=store_env | {"SEEDKEEPER_TABLE": "nosuch"})
        assert missing.returncode == 1
        assert said_in_one_line(missing) == (
            "StoreError: the table nosuch does not exist (ResourceNotFoundException):"
            " `seedkeeper table-create` creates it"
        )


def test_settings_errors_name_the_variable_to_fix_with_its_text_as_written(
    tmp_path: Path,
) -> None:
    env = dict(os.environ)
    bucket = seedkeeper("r2-bucket-create", env=env | {"SEEDKEEPER_R2_BUCKET": "b"})
    assert bucket.returncode == 2
    assert said_in_one_line(bucket) == (
        "SEEDKEEPER_R2_BUCKET: String should match pattern '^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$'"
    )
    local = ("local", "--port", "0", "--data-dir", str(tmp_path))
    idle = seedkeeper(*local, env=env | {"SEEDKEEPER_IDLE_WINDOW": "abc"})
    assert idle.returncode == 2
    assert said_in_one_line(idle).startswith("SEEDKEEPER_IDLE_WINDOW: Input should be a valid")
    shards = seedkeeper(*local, env=env | {"SEEDKEEPER_SWEEP_SHARDS": "500"})
    assert shards.returncode == 2
    assert "Traceback" not in shards.stdout + shards.stderr
    assert "SEEDKEEPER_SWEEP_SHARDS: Input should be less than or equal to" in shards.stdout
    table = seedkeeper("slot", "slot-1", "--table", "x", env=env)
    assert table.returncode == 2
    assert "--table" in table.stderr


def test_local_refuses_a_port_it_cannot_listen_on_in_one_line(tmp_path: Path) -> None:
    outside = seedkeeper(
        "local", "--port", "70000", "--data-dir", str(tmp_path), env=dict(os.environ)
    )
    assert outside.returncode == 2
    assert "--port" in outside.stderr
    assert "0..65535" in outside.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = seedkeeper(
            "local", "--port", str(port), "--data-dir", str(tmp_path), env=dict(os.environ)
        )
    assert in_use.returncode == 1
    assert "Traceback" not in in_use.stdout + in_use.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in in_use.stdout


def test_publish_takes_relative_paths(stack: Stack, tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "pkg.txt").write_text("pinned\n")
    env = dict(os.environ)
    for lockfile_hash, cwd, checkout, deps in [
        ("lock-1", tmp_path, "widgets", "deps"),
        ("lock-2", tmp_path, "./widgets", "./deps"),
        ("lock-3", repo, ".", "../deps"),
    ]:
        published = seedkeeper(
            "publish", "--resource", "widgets", "--checkout", checkout,
            "--deps", deps, "--lockfile-hash", lockfile_hash,
            env=env, cwd=cwd,
        )  # fmt: skip
        assert published.returncode == 0, published.stdout + published.stderr
        assert "rotated" in published.stdout
    resident = SnapshotStore(stack.table).read("widgets")
    assert resident.current is not None
    assert resident.current.sha == git(repo, "rev-parse", "HEAD")
    assert resident.current.lockfile_hash == "lock-3"


def test_publish_checks_what_it_will_record_before_uploading(stack: Stack, tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    publish = ("publish", "--resource", "widgets", "--checkout", str(repo))
    for option, bad in [("--lockfile-hash", "lock/../1"), ("--ref", "a..b")]:
        deps = ("--deps", str(repo)) if option == "--lockfile-hash" else ()
        refused = seedkeeper(*publish, *deps, option, bad, env=dict(os.environ))
        assert refused.returncode == 2
        assert option in refused.stderr
        assert "kB" not in refused.stdout  # no progress: nothing was built or uploaded
    s3 = boto3.client("s3", endpoint_url=stack.endpoint, region_name="auto")
    assert s3.list_objects_v2(Bucket=stack.r2_settings.bucket or "")["KeyCount"] == 0


def test_text_from_a_user_or_an_error_is_printed_as_written(stack: Stack, tmp_path: Path) -> None:
    odd = tmp_path / "[bold]odd"
    odd.mkdir()
    refused = seedkeeper(
        "publish", "--resource", "widgets", "--checkout", str(odd), env=dict(os.environ)
    )
    assert refused.returncode == 1
    assert f"PublishFailed: git -C {odd} rev-parse failed" in refused.stdout


def test_piped_output_is_never_cut(stack: Stack, tmp_path: Path) -> None:
    """Without a terminal (nor COLUMNS), nothing is wrapped or cut at 80 columns: the seed
    handle can be copied, a loss's detail read whole."""
    repo = make_repository(tmp_path)
    env = dict(os.environ)
    published = seedkeeper("publish", "--resource", "widgets", "--checkout", str(repo), env=env)
    assert published.returncode == 0, published.stdout + published.stderr
    shown = seedkeeper("snapshots", "show", "widgets", env=env, columns=None)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if "seed handle" in line]
    handle = json.loads(line.split("│")[2])
    recorded = SnapshotStore(stack.table).read("widgets").seed_handle()
    assert recorded is not None
    assert handle == recorded.model_dump(mode="json")

    lifecycle = Lifecycle(stack.table)
    crashed = stored_in(lifecycle, "slot-lost", State.SEEDED)
    assert crashed.incarnation is not None
    detail = "exit code 137: " + "the task was killed for want of memory; " * 5
    loss = Loss(reason="task-crashed", detail=detail, at=EXPIRED)
    lost = transitions.Lost(crashed.incarnation, loss, expires_at=EXPIRED + 86_400)
    written(lifecycle.write(transitions.LOSE, crashed, lost))
    status_shown = seedkeeper("status", env=env, columns=None)
    assert status_shown.returncode == 0, status_shown.stdout + status_shown.stderr
    assert detail.strip() in row(status_shown.stdout, "slot-lost")


def test_a_time_that_cannot_be_a_date_is_shown_as_recorded() -> None:
    """A record written by another tool, or before the API bounded its times, still
    displays: the number, not a crash."""
    assert _when(1_700_000_000) == "2023-11-14 22:13:20 UTC"
    for absurd in (10**18, -(10**18), 253_402_300_800):
        assert _when(absurd) == str(absurd)


def test_an_absurd_time_in_the_store_is_one_line(stack: Stack, tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    env = dict(os.environ)
    published = seedkeeper("publish", "--resource", "widgets", "--checkout", str(repo), env=env)
    assert published.returncode == 0, published.stdout + published.stderr
    stack.table.update_item(
        Key={"PK": "RESIDENT#widgets", "SK": "SNAPSHOT#current"},
        UpdateExpression="SET created_at = :absurd",
        ExpressionAttributeValues={":absurd": 10**18},
    )
    shown = seedkeeper("snapshots", "show", "widgets", env=env)
    assert shown.returncode == 1
    assert said_in_one_line(shown).startswith("MalformedRecord: widgets SNAPSHOT#current")


def test_an_interrupted_publish_says_so_and_records_nothing(stack: Stack, tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    tools = tmp_path / "bin"
    tools.mkdir()
    started = tmp_path / "mksquashfs-started"
    slow = tools / "mksquashfs"
    slow.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")
    slow.chmod(0o755)
    env = os.environ | {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    publishing = subprocess.Popen(
        [SEEDKEEPER, "publish", "--resource", "widgets", "--checkout", str(repo)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert publishing.poll() is None, publishing.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        publishing.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = publishing.communicate(timeout=60)
    finally:
        publishing.kill()
    assert publishing.returncode == 130
    assert "Traceback" not in out + err
    assert out.strip().splitlines()[-1] == "interrupted"
    assert not SnapshotStore(stack.table).read("widgets").exists
