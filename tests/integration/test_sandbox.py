"""The sandbox is hostile (DESIGN §9): a real seeded slot task, launched by the local runtime,
runs a sandbox command that hunts for what it must not have: the plan and its presigned
URLs, AWS, R2 and credentials-endpoint variables, the supervisor's /proc entries, another
slot's record. And restored files never keep an archive's owners or setuid/setgid bits."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest

import seedkeeper_task
from repos import git
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import slot_key
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper_task.sandbox import STATE_DIR, end_user_processes
from seedkeeper_task.supervisor import CHECKOUT, MARKER
from slots import Slots, record_archive, wait_for

NOBODY = 65534  # a user that is no slot's, for processes this test starts itself
# The probe runs as the slot user, who may not reach this virtualenv's interpreter (under
# root's home); it borrows boto3 from the virtualenv's site-packages.
SYSTEM_PYTHON = "/usr/bin/python3"
SITE_PACKAGES = str(Path(boto3.__file__).parent.parent)

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="dropping to the slot user needs root (CI runs as root)"
    ),
    pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="the probe needs a system python"),
]

# What ECS puts in a task's environment, which the sandbox must never see. A sitecustomize
# on the task's PYTHONPATH plants them in the supervisor, as the container would have them.
PLANTED = {
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/planted-relative",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials-planted",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN": "planted-authorization-token",
    "AWS_SESSION_TOKEN": "planted-session-token",
}
SITECUSTOMIZE = f"""
import os
os.environ.update({PLANTED!r})
"""

# The sandbox command: everything it could find, written to probe.json in its checkout.
PROBE = """
import json, os, sys
found = {
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "session_leader": os.getsid(0) == os.getpid(), "cwd": os.getcwd(),
    "environment": dict(os.environ),
}
def attempt(name, action):
    try:
        found[name] = action()
    except Exception as error:
        found[name] = type(error).__name__
attempt("supervisor_environ", lambda: open(f"/proc/{os.getppid()}/environ").read())
attempt("supervisor_mem", lambda: open(f"/proc/{os.getppid()}/mem", "rb").read(1))
workspace = os.path.dirname(os.getcwd())
attempt("planted_in_workspace", lambda: open(os.path.join(workspace, "canary"), "x").close())
marker = os.path.join(workspace, ".seedkeeper", "seed.json")
attempt("marker_rewritten", lambda: open(marker, "w").close())
attempt("marker_read", lambda: open(marker).read())
attempt("slots_listed", lambda: os.listdir(os.path.dirname(os.path.dirname(workspace))))
def hijack():
    # Another slot's record, with whatever this environment names.
    table_name = os.environ["SEEDKEEPER_TABLE"]
    sys.path.append(sys.argv[2])
    import boto3
    table = boto3.resource(
        "dynamodb", endpoint_url=os.environ.get("SEEDKEEPER_DYNAMODB_ENDPOINT")
    ).Table(table_name)
    table.update_item(
        Key=json.loads(sys.argv[1]),
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": "hijacked"},
    )
    return "written"
attempt("other_record", hijack)
with open("probe.json.tmp", "w") as out:
    json.dump(found, out)
os.rename("probe.json.tmp", "probe.json")
import time
time.sleep(600)  # the run goes on: a task whose run ended stops, and its workspace goes
"""


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "hooks"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(folder), prepend=os.pathsep)


def probe(slots: Slots, slot: str) -> dict[str, Any]:
    result = slots.workspace(slot) / CHECKOUT / "probe.json"
    wait_for(result.exists, f"the sandbox's probe: {slots.log(slot)}")
    found: dict[str, Any] = json.loads(result.read_text())
    return found


def test_the_sandbox_finds_no_secret_and_reaches_nothing_it_does_not_own(
    slots: Slots, repo: Path, planted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert slots.seed(slots.body(None, slot="other"))[0] == 200
    other = slots.record("other")
    command = [SYSTEM_PYTHON, "-c", PROBE, json.dumps(slot_key("other")), SITE_PACKAGES]
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(command))
    body = slots.body(slots.publish(repo))
    status, answer = slots.settle(body)
    assert (status, answer["seeded"]) == (200, True), (answer, slots.log("slot-1"))
    marker = (slots.workspace() / STATE_DIR / MARKER).read_text()

    found = probe(slots, "slot-1")

    workspace = slots.workspace()
    own = slots.runtime.slot_uid("slot-1")
    assert own is not None
    assert own != slots.runtime.slot_uid("other")  # every slot has a user of its own
    assert (found["uid"], found["euid"], found["gid"]) == (own, own, own)
    assert found["groups"] == []
    assert found["session_leader"] is True
    assert found["cwd"] == str(workspace / CHECKOUT)
    environment = found["environment"]
    assert set(environment) <= {"PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ"}, environment
    home = Path(environment["HOME"])
    assert home.is_dir()
    assert home.stat().st_uid == own
    text = json.dumps(environment)
    secrets = [*PLANTED.values(), "X-Amz-Signature", slots.stack.endpoint, "testing"]
    assert not [secret for secret in secrets if secret in text]
    assert found["supervisor_environ"] == "PermissionError"
    assert found["supervisor_mem"] == "PermissionError"
    assert found["planted_in_workspace"] == "PermissionError"
    assert found["marker_rewritten"] == "PermissionError"
    assert found["marker_read"] == "PermissionError"  # it names the owner's claim
    assert found["slots_listed"] == "PermissionError"
    assert found["other_record"] == "KeyError"  # no table, no endpoint, no credentials
    assert not (workspace / "canary").exists()
    assert (workspace / STATE_DIR / MARKER).read_text() == marker
    assert slots.record("other") == other
    assert "X-Amz-Signature" not in slots.log("slot-1")


def test_restored_files_belong_to_the_slot_user_without_setuid_or_setgid(
    slots: Slots, repo: Path, tmp_path: Path
) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", "everything")
    sha = git(repo, "rev-parse", "HEAD")
    archive = tmp_path / "foreign.sqsh"
    squash = ["mksquashfs", str(repo), str(archive), "-noappend", "-quiet", "-no-progress"]
    foreign = ["-force-uid", "1234", "-force-gid", "4321"]
    privileged = ["-p", "src/tool.sh m 6755 1234 4321", "-p", "src m 2775 1234 4321"]
    subprocess.run([*squash, *foreign, *privileged], check=True)
    listing = subprocess.run(
        ["unsquashfs", "-lln", str(archive)], check=True, capture_output=True, text=True
    ).stdout
    assert "-rwsr-sr-x 1234/4321" in listing  # the archive really carries them
    image = archive.read_bytes()
    seed = record_archive(
        slots,
        "widgets-foreign",
        image,
        size=len(image),
        sha256=hashlib.sha256(image).hexdigest(),
        sha=sha,
    )
    status, answer = slots.settle(slots.body(seed))
    assert (status, answer["seeded"]) == (200, True), (answer, slots.log("slot-1"))

    checkout = slots.workspace() / CHECKOUT
    entries = [checkout, *checkout.rglob("*")]
    own = slots.runtime.slot_uid("slot-1")
    assert {(path.lstat().st_uid, path.lstat().st_gid) for path in entries} == {(own, own)}
    assert not [p for p in entries if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)]
    assert (checkout / "src" / "tool.sh").stat().st_mode & 0o111


def test_a_nested_deps_path_is_the_slot_users_too(
    slots: Slots, repo: Path, deps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDKEEPER_DEPS_PATH", "vendor/js/node_modules")
    status, answer = slots.settle(slots.body(slots.publish(repo, deps)))
    assert (status, answer["seeded"]) == (200, True), (answer, slots.log("slot-1"))

    checkout = slots.workspace() / CHECKOUT
    assert (checkout / "vendor/js/node_modules/left-pad/index.js").is_file()
    entries = [checkout, *checkout.rglob("*")]
    own = slots.runtime.slot_uid("slot-1")
    assert {(path.lstat().st_uid, path.lstat().st_gid) for path in entries} == {(own, own)}


def running_with(token: str) -> list[int]:
    """Live processes (not zombies) whose command line holds `token`."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            alive = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if alive and token.encode() in command:
            found.append(int(entry.name))
    return found


def stubborn_sandbox(token: str) -> list[str]:
    """A sandbox that ignores SIGTERM, starts a child that ignores it too, and a grandchild
    that leaves the sandbox's session (setsid); each carries `token` in its command line."""
    child = f"trap '' TERM; sleep 600 & wait # {token}"
    escaped = f"setsid sh -c 'sleep 600 & wait # {token}-escaped' &"
    script = f"trap '' TERM; {escaped} sh -c \"{child}\" & while :; do sleep 1; done # {token}"
    return ["sh", "-c", script]


def test_stopping_a_slot_ends_everything_its_sandbox_started(
    slots: Slots, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox leads its own session and may leave it: a local stop must still end all
    of it, as a container's end would. The slot's user is its own, so that is every process
    of that user."""
    token = f"sandbox-{os.getpid()}-{id(slots)}"
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(stubborn_sandbox(token)))
    status, answer = slots.seed(slots.body(None, slot="cold"))
    assert status == 200, answer
    wait_for(lambda: len(running_with(token)) >= 3, "the sandbox, its child and the escaped one")

    slots.runtime.stop(answer["incarnation"], grace=1)

    assert running_with(token) == []


def test_nothing_a_lost_task_left_runs_when_the_next_task_of_its_slot_starts(
    slots: Slots, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task killed outright (a lost host) leaves what escaped its process group running
    as the slot's user: the local runtime ends it once it sees the task stopped, as a
    Fargate task's end would; and whatever still runs as that user when the slot's next
    task starts is ended before it does anything as root in that user's tree."""
    token = f"leftover-{os.getpid()}-{id(slots)}"
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(stubborn_sandbox(token)))
    status, answer = slots.seed(slots.body(None, slot="lost"))
    assert status == 200, answer
    wait_for(lambda: any(True for _ in running_with(f"{token}-escaped")), "the escaped one")
    slots.kill(answer["incarnation"])  # the task's process group only, as a lost host
    wait_for(lambda: running_with(token) == [], "the runtime to end what the task left")
    # Its clearing is over once the workspace is gone: till then it may still end (again)
    # whatever runs as the slot's user, the process planted below included.
    wait_for(lambda: not slots.workspace("lost").exists(), "the runtime to clear the task")

    # One the runtime did not see (planted as the slot's user): the next task ends it.
    uid = slots.runtime.slot_uid("lost")
    assert uid is not None
    planted = subprocess.Popen(
        ["sh", "-c", f"sleep 600 & wait # {token}-planted"], user=uid, group=uid
    )
    wait_for(lambda: any(True for _ in running_with(f"{token}-planted")), "the planted one")
    monkeypatch.delenv("SEEDKEEPER_SANDBOX_COMMAND")
    record = slots.record("lost")
    again = SlotPlan(slot="lost", attempt=2, op=record.window.entries[0].ref)
    slots.runtime.launch(again)

    wait_for(lambda: running_with(token) == [], "the slot's next task to end the leftovers")
    planted.wait(timeout=10)


def test_a_late_look_at_a_cleared_task_ends_nothing_started_since(
    slots: Slots, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped task is cleared by whoever looks first (its reaper, a status, a stop), and
    they may look at once. Once its workspace is gone, the clearing is over: a look that
    came late must not end a process of the slot's user started since (the next attempt's).
    The reaper is held inside its clearing while a status clears the task and a process is
    started as the slot's user; then the reaper goes on."""
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(["sleep", "600"]))
    status, answer = slots.seed(slots.body(None, slot="looked"))
    assert status == 200, answer
    incarnation = answer["incarnation"]
    wait_for(lambda: slots.runtime.status(incarnation) is TaskStatus.RUNNING, "the task")
    reaper_inside, go_on = threading.Event(), threading.Event()

    def held_in_the_reaper(uid: int) -> None:
        if threading.current_thread().name.startswith("reap-"):
            reaper_inside.set()
            go_on.wait(30)
        end_user_processes(uid)

    monkeypatch.setattr("seedkeeper_tools.local.runtime.end_user_processes", held_in_the_reaper)
    slots.runtime.crash(incarnation)
    assert reaper_inside.wait(30), "the reaper did not clear the task"
    # A clearing that waits for the reaper's blocks here until it goes on: a second's grace.
    threading.Timer(1.0, go_on.set).start()
    assert slots.runtime.status(incarnation) is TaskStatus.STOPPED
    assert not slots.workspace("looked").exists()

    uid = slots.runtime.slot_uid("looked")
    assert uid is not None
    token = f"since-{os.getpid()}-{id(slots)}"
    started = subprocess.Popen(["sh", "-c", f"sleep 600 & wait # {token}"], user=uid, group=uid)
    try:
        wait_for(lambda: any(True for _ in running_with(token)), "the process started since")
        go_on.set()
        wait_for(
            lambda: not any(t.name.startswith("reap-") for t in threading.enumerate()),
            "the reaper to finish",
        )
        assert started.poll() is None, "a late look ended a process started after the clearing"
    finally:
        end_user_processes(uid)
        started.wait(timeout=10)


def test_the_sandbox_cannot_write_a_line_of_the_supervisors_log(
    slots: Slots, monkeypatch: pytest.MonkeyPatch
) -> None:
    forged = json.dumps({"level": "INFO", "message": "restore settled", "forged": True})
    command = ["sh", "-c", f"echo '{forged}'; sleep 600"]
    monkeypatch.setenv("SEEDKEEPER_SANDBOX_COMMAND", json.dumps(command))
    assert slots.seed(slots.body(None, slot="printer"))[0] == 200
    wait_for(lambda: "forged" in slots.log("printer"), "the sandbox's output")

    events = [json.loads(line) for line in slots.log("printer").splitlines() if line.strip()]
    assert not [event for event in events if "forged" in event]
    relayed = [event for event in events if event["message"] == "sandbox output"]
    assert [json.loads(event["line"]) for event in relayed] == [json.loads(forged)]


# A process of the slot user that keeps a secret in its environment, made undumpable or
# not; its pid on stdout, then it waits.
HOLDER = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from seedkeeper_task.sandbox import make_undumpable
if sys.argv[2] == "undumpable":
    make_undumpable()
print(os.getpid(), flush=True)
time.sleep(60)
"""
READER = "import sys; print(open(f'/proc/{sys.argv[1]}/environ').read())"


@pytest.mark.parametrize(("mode", "readable"), [("undumpable", False), ("dumpable", True)])
def test_an_undumpable_process_hides_its_environment_even_from_its_own_user(
    mode: str, readable: bool
) -> None:
    """The supervisor's guard when it cannot drop privileges (an unprivileged local stack):
    the sandbox then runs as the same user, and only undumpability keeps it out."""
    shared = str(Path(seedkeeper_task.__file__).parent.parent)
    as_nobody: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    holder = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", HOLDER, shared, mode],
        env={"HELD_SECRET": "planted-secret"},
        stdout=subprocess.PIPE,
        text=True,
        **as_nobody,
    )
    try:
        assert holder.stdout is not None
        pid = holder.stdout.readline().strip()
        read = subprocess.run(
            [SYSTEM_PYTHON, "-c", READER, pid],
            check=False,
            capture_output=True,
            text=True,
            **as_nobody,
        )
    finally:
        holder.kill()
        holder.wait()
    assert ("planted-secret" in read.stdout) is readable
    assert ("PermissionError" in read.stderr) is not readable
