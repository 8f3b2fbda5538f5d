"""The slot task as the container it ships: the local stack with its Docker runtime, each
slot a container of the slot image on the host's network, stopped as ECS stops a task."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import pytest

from conftest import running_local_stack
from cross_slot import assert_a_task_cannot_act_for_another, seed_two
from executor import ORIGIN, claim_for, client_for, publish
from repos import git, make_repository
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.caller import task_id
from seedkeeper.domain.checkpoints import RetentionSettings
from seedkeeper.domain.plan import PLAN_VARIABLE, SlotPlan
from seedkeeper.domain.record import SeedFailed, State, Supported, slot_key
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.standby import BLANK_POOL, Standby, StandbyState
from seedkeeper.errors import RuntimeUnavailable
from seedkeeper.services.sweep import Sweeper, SweepSettings
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper.store.standbys import StandbyStore
from seedkeeper.store.sweep_index import SweepIndex
from seedkeeper_client import Cold, NotSeeded, Seeded, Seeding, SeedkeeperClient
from seedkeeper_tools.local.docker import DockerRuntime
from seedkeeper_tools.local.principals import TaskKeys
from seedkeeper_tools.local.stack import LocalStack
from slots import TamperingProxy, wait_for

# The image's interpreter: the probe borrows its boto3, as a sandbox could.
IMAGE_PYTHON = "/opt/seedkeeper/bin/python"


@pytest.fixture
def stack(tmp_path: Path, aws_credentials: None, slot_image: str) -> Iterator[LocalStack]:
    """`seedkeeper local --runtime docker`: its stop stops and removes every container."""
    with running_local_stack(tmp_path, task_runtime="docker", slot_image=slot_image) as local:
        yield local


@pytest.fixture
def runtime(stack: LocalStack) -> DockerRuntime:
    runtime = stack.runtime
    assert isinstance(runtime, DockerRuntime)
    return runtime


@pytest.fixture
def client(stack: LocalStack) -> SeedkeeperClient:
    return client_for(stack)


def docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def container(incarnation: str | None) -> str:
    assert incarnation is not None
    assert incarnation.startswith("docker:")
    return incarnation.removeprefix("docker:")


def inspect(name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(docker("inspect", name))
    return found[0]


def environment_of(name: str) -> dict[str, str]:
    """The container's environment, as its task definition and launch gave it."""
    entries: list[str] = inspect(name)["Config"]["Env"]
    return dict(entry.split("=", 1) for entry in entries)


def as_slot_user(name: str, *command: str) -> str:
    return docker("exec", "--user", "1000", "--env", "HOME=/tmp", name, *command)


def record_of(stack: LocalStack, slot: str) -> Any:
    classified = Lifecycle(stack_table(stack)).read(slot)
    assert isinstance(classified, Supported)
    return classified.record


def stack_table(stack: LocalStack) -> Any:
    """The stack's table, from the environment the stack set."""
    return StoreSettings().table_resource()


def test_a_seed_runs_end_to_end_in_the_slot_container(
    stack: LocalStack, client: SeedkeeperClient, runtime: DockerRuntime, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path)
    seed = publish(client, repo, tmp_path / "scratch")
    claim = claim_for(seed)
    seeded = client.seed("slot-1", seed, claim=claim, origin=ORIGIN, wait=True, timeout=120)
    assert isinstance(seeded, Seeded), seeded
    name = container(seeded.incarnation)
    assert runtime.status(seeded.incarnation or "") is TaskStatus.RUNNING

    details = inspect(name)
    assert details["HostConfig"]["NetworkMode"] == "host"
    assert details["HostConfig"]["Init"] is True
    assert details["Config"]["StopTimeout"] == 120  # the task definition's
    environment = environment_of(name)
    assert "SEEDKEEPER_TABLE" not in environment  # the task's record is its API's to read
    # Keys of its own (its session of the task role), never the store's.
    assert (
        environment["AWS_ACCESS_KEY_ID"] == f"seedkeeper-task-{task_id(seeded.incarnation or '')}"
    )
    assert environment["AWS_ACCESS_KEY_ID"] != stack.store_credentials.access_key
    assert environment["AWS_EXECUTION_ENV"] == "AWS_ECS_FARGATE"
    assert not {"SEEDKEEPER_R2_ACCESS_KEY_ID", "SEEDKEEPER_R2_SECRET_ACCESS_KEY"} & set(environment)
    # The supervisor is root under the init process; the checkout is the slot user's.
    assert docker("exec", name, "cat", "/proc/1/comm") == "docker-init"
    assert as_slot_user(name, "stat", "-c", "%u:%g", "/workspace/checkout") == "1000:1000"
    assert as_slot_user(name, "git", "-C", "/workspace/checkout", "rev-parse", "HEAD") == seed.sha
    status = as_slot_user(name, "git", "-C", "/workspace/checkout", "status", "--porcelain")
    assert status == git(repo, "status", "--porcelain").strip()  # the work came along
    # Its workspace is a volume of its own (the task definition's, on Fargate's ephemeral
    # storage): nothing of the host's, gone with the container.
    (workspace,) = [mount for mount in details["Mounts"] if mount["Destination"] == "/workspace"]
    assert workspace["Type"] == "volume"
    assert not (stack.data_dir / "slots" / "slot-1").exists()

    again = client.seed("slot-1", seed, claim=claim, origin=ORIGIN)
    assert isinstance(again, Seeded)
    assert again.incarnation == seeded.incarnation
    runtime.stop_all()
    gone = subprocess.run(
        ["docker", "volume", "inspect", workspace["Name"]], capture_output=True, check=False
    )
    assert gone.returncode != 0


def test_a_retried_launch_of_an_attempt_starts_one_container(
    stack: LocalStack, client: SeedkeeperClient, runtime: DockerRuntime
) -> None:
    cold = client.seed("cold-1", None, wait=True)
    assert isinstance(cold, Cold)
    incarnation = record_of(stack, "cold-1").incarnation
    environment = dict(
        entry.split("=", 1) for entry in inspect(container(incarnation))["Config"]["Env"]
    )
    plan = SlotPlan.from_env(environment[PLAN_VARIABLE])  # the launch, as the seed made it
    assert runtime.launch(plan) == incarnation  # retried: the same container answers
    assert runtime.status(incarnation) is TaskStatus.RUNNING
    listed = docker("ps", "--all", "--quiet", "--filter", "label=seedkeeper.slot=cold-1")
    assert len(listed.split()) == 1


PROBE = """
import glob, json, os, sys
found = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
         "environment": dict(os.environ)}
def attempt(name, action):
    try:
        found[name] = action()
    except Exception as error:
        found[name] = type(error).__name__
readable = {}
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        readable[path] = open(path, "rb").read().decode(errors="replace")
    except OSError:
        pass
found["proc_readable"] = readable
attempt("init_environ", lambda: open("/proc/1/environ").read())
attempt("supervisor_environ", lambda: open(f"/proc/{os.getppid()}/environ").read())
attempt("marker_read", lambda: open("/workspace/.seedkeeper/seed.json").read())
attempt("planted_in_workspace", lambda: open("/workspace/canary", "x").close())
attempt("docker_socket", lambda: os.path.exists("/var/run/docker.sock"))
def hijack(key, secret):
    # Another slot's record, knowing the table and the store's port (as an attacker may).
    import boto3
    table, endpoint, slot_key = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    session = boto3.session.Session(
        aws_access_key_id=key, aws_secret_access_key=secret, region_name="us-east-1"
    ) if key else boto3.session.Session(region_name="us-east-1")
    session.resource("dynamodb", endpoint_url=endpoint).Table(table).update_item(
        Key=slot_key, UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "state"}, ExpressionAttributeValues={":s": "hijacked"},
    )
    return "written"
attempt("other_record_own_credentials", lambda: hijack(None, None))
attempt("other_record_guessed_keys", lambda: hijack("testing", "testing"))
def unsigned(path):
    # The task's API (the checkpoint function) on the gateway, which the sandbox can reach.
    import urllib.error, urllib.request
    request = urllib.request.Request(sys.argv[4] + path, data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as refused:
        return refused.code
attempt("task_api_unsigned", lambda: unsigned("/tasks/record"))
with open("probe.json.tmp", "w") as out:
    json.dump(found, out)
os.rename("probe.json.tmp", "probe.json")
import time
time.sleep(600)  # the task lives as long as its sandbox: the test reads the probe first
"""


def test_the_sandbox_in_the_container_finds_no_secret_and_writes_no_other_record(
    stack: LocalStack, client: SeedkeeperClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(client.seed("other", None, wait=True), Cold)
    other = record_of(stack, "other")
    endpoint = os.environ["SEEDKEEPER_DYNAMODB_ENDPOINT"]
    command = [
        IMAGE_PYTHON, "-c", PROBE, stack.name, endpoint, json.dumps(slot_key("other")), stack.url
    ]  # fmt: skip
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(command))
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    seeded = client.seed("slot-1", seed, claim=claim_for(seed), origin=ORIGIN, wait=True)
    assert isinstance(seeded, Seeded), seeded
    name = container(seeded.incarnation)

    def probe_written() -> bool:
        listed = docker("exec", name, "ls", "/workspace/checkout", check=False)
        return "probe.json" in listed.split()

    wait_for(probe_written, f"the sandbox's probe: {docker('logs', name, check=False)}")
    found = json.loads(docker("exec", name, "cat", "/workspace/checkout/probe.json"))

    assert (found["uid"], found["gid"], found["groups"]) == (1000, 1000, [])
    assert set(found["environment"]) <= {"PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ"}
    task_keys = TaskKeys(stack.data_dir).issue(seeded.incarnation or "")  # its task's own
    secrets = [
        stack.store_credentials.access_key,
        stack.store_credentials.secret_key,
        task_keys.access_key,
        task_keys.secret_key,
        "SEEDKEEPER_PLAN",
        "X-Amz-Signature",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_CONTAINER_CREDENTIALS",
    ]
    seen = json.dumps(found)
    assert not [secret for secret in secrets if secret in seen]
    # What it could read of /proc is its own processes' alone: never the init's or the
    # supervisor's environment or command line.
    assert found["init_environ"] == "PermissionError"
    assert found["supervisor_environ"] == "PermissionError"
    assert found["marker_read"] == "PermissionError"  # it names the owner's claim
    assert found["planted_in_workspace"] == "PermissionError"
    assert found["docker_socket"] is False
    assert found["other_record_own_credentials"] == "NoCredentialsError"
    assert found["other_record_guessed_keys"] == "ClientError"
    assert found["task_api_unsigned"] == 403  # its task's keys are the only way in
    assert record_of(stack, "other") == other


def test_a_docker_stop_during_the_restore_leaves_the_slot_truthful(
    stack: LocalStack,
    client: SeedkeeperClient,
    runtime: DockerRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    claim = claim_for(seed)
    proxy = TamperingProxy(os.environ["SEEDKEEPER_R2_ENDPOINT"], mode="stall")
    try:
        monkeypatch.setenv("SEEDKEEPER_R2_ENDPOINT", proxy.endpoint)
        seeding = client.seed("slot-1", seed, claim=claim, origin=ORIGIN)
        assert isinstance(seeding, Seeding)
        assert proxy.gets.wait(60), docker("logs", container(seeding.incarnation), check=False)

        runtime.stop(seeding.incarnation or "")
    finally:
        proxy.close()
    name = container(seeding.incarnation)
    state = inspect(name)["State"]
    assert runtime.status(seeding.incarnation or "") is TaskStatus.STOPPED
    assert state["OOMKilled"] is False
    # SIGTERM ended the task: a SIGKILL after the grace period would have made it 137.
    assert state["ExitCode"] == 0, docker("logs", name, check=False)

    record = record_of(stack, "slot-1")
    assert record.state is State.SEED_FAILED
    assert isinstance(record.result, SeedFailed)
    assert (record.result.step, record.result.reason) == ("download", "seed-failed")
    answer = client.seed("slot-1", seed, claim=claim, origin=ORIGIN)
    assert isinstance(answer, NotSeeded)
    # Nothing half-restored is left in the stopped container's filesystem.
    copied = subprocess.run(
        ["docker", "cp", f"{name}:/workspace/checkout", str(tmp_path / "left")],
        capture_output=True,
        check=False,
    )
    assert copied.returncode != 0


def test_the_idle_sweep_stops_a_cold_container_and_keeps_a_seeded_one(
    stack: LocalStack, client: SeedkeeperClient, runtime: DockerRuntime, tmp_path: Path
) -> None:
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    seeded = client.seed("seeded", seed, claim=claim_for(seed), origin=ORIGIN, wait=True)
    assert isinstance(seeded, Seeded)
    cold = client.seed("cold-1", None, wait=True)
    assert isinstance(cold, Cold)
    cold_incarnation = record_of(stack, "cold-1").incarnation
    later = record_of(stack, "cold-1").idle_deadline + 60

    table = stack_table(stack)
    report = Sweeper(
        index=SweepIndex(table),
        lifecycle=Lifecycle(table),
        runtime=lambda: runtime,
        snapshots=None,
        r2=None,
        settings=SweepSettings(),
        retention=RetentionSettings(),
        clock=lambda: later,
    ).sweep()

    assert report.stopped == ["cold-1"]
    assert runtime.status(cold_incarnation) is TaskStatus.STOPPED
    # SIGTERM ended it (0 once its handler is set, 143 before): never SIGKILL's 137.
    assert inspect(container(cold_incarnation))["State"]["ExitCode"] in {0, 143}
    assert record_of(stack, "cold-1").state is State.RETIRED
    assert runtime.status(seeded.incarnation or "") is TaskStatus.RUNNING
    assert record_of(stack, "seeded").state is State.CHECKPOINTING  # asked, never stopped


# A sandbox with a heartbeat and a child that left its session.
HEARTBEAT = (
    "setsid sh -c 'while :; do date +%s%N > /tmp/escaped; sleep 0.1; done' &"
    " while :; do date +%s%N > .heartbeat; sleep 0.1; done"
)


def slot_user_states(name: str) -> list[str]:
    """The state letter of each live process of uid 1000 in the container (T: stopped)."""
    script = (
        "for s in /proc/[0-9]*/status; do"
        " awk '/^Uid:/{u=$2} /^State:/{s=$2} END{if (u==1000 && s!=\"Z\") print s}' $s;"
        " done 2>/dev/null"
    )
    return docker("exec", name, "sh", "-c", script).split()


def test_an_idle_container_is_frozen_checkpointed_and_parked_with_its_work(
    tmp_path: Path, aws_credentials: None, slot_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(["sh", "-c", HEARTBEAT]))
    with running_local_stack(
        tmp_path,
        task_runtime="docker",
        slot_image=slot_image,
        idle_window=2,
        watch_interval=0.5,
    ) as stack:
        client = client_for(stack)
        seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
        claim = claim_for(seed)
        seeded = client.seed("slot-1", seed, claim=claim, origin=ORIGIN, wait=True, timeout=120)
        assert isinstance(seeded, Seeded), seeded
        name = container(seeded.incarnation)
        work = "echo 'never committed' >> README.md && echo notes > notes.txt"
        as_slot_user(name, "sh", "-c", f"cd /workspace/checkout && {work}")
        before = as_slot_user(name, "git", "-C", "/workspace/checkout", "status", "--porcelain")
        assert "notes.txt" in before

        time.sleep(3)
        assert stack.sweep().checkpoints_requested == ["slot-1"]
        wait_for(
            lambda: record_of(stack, "slot-1").state is State.CHECKPOINTED, "checkpointed", 120
        )
        states = slot_user_states(name)
        assert len(states) >= 2, states  # the sandbox and the child that escaped its session
        assert set(states) == {"T"}, states
        checkpoint = record_of(stack, "slot-1").checkpoint
        assert checkpoint is not None

        report = stack.sweep()
        assert report.parked == ["slot-1"]
        runtime = stack.runtime
        assert runtime.status(seeded.incarnation or "") is TaskStatus.STOPPED
        assert inspect(name)["State"]["ExitCode"] in {0, 143}  # SIGTERM, never SIGKILL
        assert record_of(stack, "slot-1").state is State.PARKED

        r2 = R2.from_settings(R2Settings())
        facts = r2.head(checkpoint.key)
        assert facts is not None
        assert facts.size == checkpoint.size
        archive = tmp_path / "checkpoint.sqsh"
        boto3.client(
            "s3",
            endpoint_url=os.environ["SEEDKEEPER_R2_ENDPOINT"],
            aws_access_key_id=os.environ["SEEDKEEPER_R2_ACCESS_KEY_ID"],
            aws_secret_access_key=os.environ["SEEDKEEPER_R2_SECRET_ACCESS_KEY"],
            region_name="auto",
        ).download_file(os.environ["SEEDKEEPER_R2_BUCKET"], checkpoint.key, str(archive))
        assert hashlib.sha256(archive.read_bytes()).hexdigest() == checkpoint.sha256
        restored = tmp_path / "restored"
        subprocess.run(["unsquashfs", "-q", "-d", str(restored), str(archive)], check=True)
        assert (restored / "notes.txt").read_text() == "notes\n"
        assert (restored / "README.md").read_text().endswith("never committed\n")
        assert git(restored, "status", "--porcelain").strip() == before
        assert os.stat(restored / "notes.txt").st_uid == 1000


def test_a_stack_without_the_slot_image_says_so_at_start(
    tmp_path: Path, aws_credentials: None
) -> None:
    with (
        pytest.raises(RuntimeUnavailable, match="make image"),
        running_local_stack(tmp_path, task_runtime="docker", slot_image="seedkeeper-none:absent"),
    ):
        pass
    assert docker("ps", "--all", "--quiet", "--filter", "ancestor=seedkeeper-none:absent") == ""


@pytest.fixture
def idle_stack(
    tmp_path: Path, aws_credentials: None, slot_image: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalStack]:
    """The Docker runtime with a short idle window, its tasks looking at their records
    rarely (a checkpoint request stays open while another task acts)."""
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(["sleep", "600"]))
    with running_local_stack(
        tmp_path, task_runtime="docker", slot_image=slot_image, idle_window=2, watch_interval=600
    ) as local:
        yield local


def test_a_slot_container_cannot_act_for_another_slot(
    idle_stack: LocalStack, tmp_path: Path
) -> None:
    """tests/cross_slot.py with each task a container of the slot image."""
    client = client_for(idle_stack)
    seed = publish(client, make_repository(tmp_path), tmp_path / "scratch")
    assert_a_task_cannot_act_for_another(idle_stack, seed_two(idle_stack, client, seed))


def test_standby_containers_serve_seeds_blank_and_pre_seeded(
    tmp_path: Path, aws_credentials: None, slot_image: str
) -> None:
    """A blank standby container restores a seed when taken; a pre-seeded one, which
    restored its generation while it waited, binds the claim and nothing else."""
    with running_local_stack(
        tmp_path,
        task_runtime="docker",
        slot_image=slot_image,
        standbys=1,
        preseeded={"widgets": 1},
        standby_interval=3600,  # tended here, when the test means to
    ) as stack:
        client = client_for(stack)
        repo = make_repository(tmp_path)
        seed = publish(client, repo, tmp_path / "scratch")
        stack.tend_standbys()
        standbys = StandbyStore(StoreSettings().table_resource())

        def ready(pool: str) -> list[Standby]:
            return [s for s in standbys.pool(pool) if s.state is StandbyState.FREE]

        def each_free(least: int, most: int, seconds: float) -> None:
            for pool in ("widgets", BLANK_POOL):
                wait_for(
                    partial(lambda pool: least <= len(ready(pool)) <= most, pool),
                    f"{least} to {most} free standbys of {pool}",
                    seconds,
                )

        each_free(1, 99, 120)
        # Two tends at once (the stack's own, on its thread from its start, and this one)
        # may each have launched one: the next retires the surplus, so each pool holds one.
        stack.tend_standbys()
        each_free(1, 1, 60)
        (held,), (blank,) = ready("widgets"), ready(BLANK_POOL)
        # A standby is launched with no slot's plan: nothing of any owner's.
        assert PLAN_VARIABLE not in environment_of(container(held.incarnation))

        quick = client.seed(
            "slot-1", seed, claim=claim_for(seed), origin=ORIGIN, wait=True, timeout=120
        )
        assert isinstance(quick, Seeded), quick
        assert quick.incarnation == held.incarnation
        assert "bind" in quick.steps
        assert "download" not in quick.steps
        name = container(quick.incarnation)
        assert as_slot_user(name, "git", "-C", "/workspace/checkout", "rev-parse", "HEAD") == (
            seed.sha
        )
        remote = as_slot_user(
            name, "git", "-C", "/workspace/checkout", "remote", "get-url", "origin"
        )
        assert remote == ORIGIN  # bound to this slot's origin when taken

        restored = client.seed(
            "slot-2",
            seed,
            claim=claim_for(seed, run="run-2"),
            origin=ORIGIN,
            wait=True,
            timeout=120,
        )
        assert isinstance(restored, Seeded), restored
        # The pre-seeded pool is empty until tended: the blank standby restored it.
        assert restored.incarnation == blank.incarnation
        assert "download" in restored.steps
