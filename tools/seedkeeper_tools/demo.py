"""`seedkeeper demo` (`make demo`): the whole protocol on one machine, checked step by step.

It starts the local stack with standby slots (one blank, one holding the resource's current
generation), publishes a snapshot of a real git repository, seeds a claimed slot (served by
the pre-seeded standby: only its claim is bound) and a cold slot through the signed client,
shows a receipt and slot evidence, leaves
uncommitted work in the seeded checkout, lets a short idle window pass and sweeps: the cold
slot is stopped, the seeded one is asked to checkpoint; its slot task freezes the sandbox,
captures the checkout and uploads it, the checkpoint function verifies and records it; the
next sweep parks the slot (its task stopped); the work is then read back from R2 and
checked. The owner's next seed resumes the slot from its checkpoint with the work intact,
and a sweep deletes the superseded checkpoint. A platform stop (SIGTERM, as Spot sends)
makes the slot task checkpoint and park its slot itself; a crash (SIGKILL: nothing can be
saved) is found by the sweep and recorded `lost`, which the receipt says; that slot is served
by a blank standby, which restores it. It rotates twice
and shows the generations. It prints each step's outcome and timing, and exits 0 only when
every outcome is what the protocol requires.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from botocore.credentials import Credentials
from rich.console import Console
from rich.table import Table

from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import SlotRecord, State, Supported
from seedkeeper.domain.runtime import TaskStatus
from seedkeeper.domain.standby import BLANK_POOL, Standby, StandbyState
from seedkeeper.observability import logger
from seedkeeper.services.sweep import Report
from seedkeeper.store.standbys import StandbyStore
from seedkeeper_client import (
    Cold,
    NewSnapshot,
    OwnerClaim,
    Seeded,
    SeedIdentity,
    SeedkeeperClient,
)
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.runtime import LocalRuntime
from seedkeeper_tools.local.stack import LocalStack
from seedkeeper_tools.publish import backup_id_for, head_of, upload_archive

RESOURCE = "demo-widgets"
OTHER_RESOURCE = "demo-gadgets"
ORIGIN = "https://git.example.com/demo/widgets.git"
IDLE_WINDOW = 3
UNPUBLISHED = "work nobody has pushed yet\n"
# A platform stop's SIGKILL comes this long after its SIGTERM (Fargate's stopTimeout is 120 s).
STOP_GRACE = 60.0


@dataclass
class Step:
    name: str
    outcome: str
    ok: bool
    seconds: float


class Demo:
    def __init__(self, root: Path, console: Console) -> None:
        self.root = root
        self.console = console
        self.steps: list[Step] = []
        credentials = LocalCredentials("demo-access-key", secrets.token_hex(16))
        self.stack = LocalStack(
            data_dir=root / "data",
            port=0,
            credentials=credentials,
            sweep_interval=3600,  # the demo sweeps when it means to
            idle_window=IDLE_WINDOW,
            watch_interval=0.5,  # slot tasks look at their record often: the demo waits
            standbys=1,
            preseeded={RESOURCE: 1},
            standby_interval=1.0,  # refilled at once: the demo seeds one after another
        )
        self.signing = Credentials(credentials.access_key, credentials.secret_key)

    def step(self, name: str, action: Callable[[], tuple[str, bool]]) -> None:
        started = time.monotonic()
        try:
            outcome, ok = action()
        except Exception as error:
            outcome, ok = f"{type(error).__name__}: {error}", False
        self.steps.append(Step(name, outcome, ok, time.monotonic() - started))

    def run(self) -> bool:
        self.stack.start()
        try:
            self._scenario()
        finally:
            self.stack.stop()
        self._print()
        return all(step.ok for step in self.steps)

    # -- the scenario ---------------------------------------------------------------

    def _scenario(self) -> None:
        client = SeedkeeperClient(self.stack.url, credentials=self.signing)
        repo = sample_repository(self.root / "widgets")
        r2 = R2.from_settings(R2Settings(), budget=aws.TOOLS)

        def publish() -> tuple[str, bool]:
            recorded = client.publish(self._snapshot(repo, r2))
            return f"generation {recorded.current.generation} of {RESOURCE}", recorded.rotated

        self.step("publish a snapshot of a real git repository", publish)

        def waiting() -> tuple[str, bool]:
            blank, held = self._free(BLANK_POOL), self._free(RESOURCE)
            ready = f"holding generation {held.preseed.generation}" if held and held.preseed else ""
            return f"blank: {bool(blank)}; pre-seeded, {ready or 'none'}", bool(blank and ready)

        self.step("standby slots wait, one restored ahead", waiting)
        status = client.snapshot_status(RESOURCE)
        handle = status.seed_handle
        assert handle is not None
        seed = SeedIdentity(resource=RESOURCE, **handle.model_dump())
        claim = OwnerClaim(
            run="demo-run-1",
            requester="demo",
            thread="demo-thread",
            repository="demo/widgets",
            ref=handle.ref,
            head=handle.sha,
        )

        def seeded() -> tuple[str, bool]:
            held = self._free(RESOURCE)
            answer = client.seed("demo-seeded", seed, claim=claim, origin=ORIGIN, wait=True)
            if not isinstance(answer, Seeded):
                return f"not seeded: {answer}", False
            ahead = sum(ms for step, ms in answer.steps.items() if step.startswith("prepared_"))
            text = (
                f"sha={handle.sha[:12]}, by the pre-seeded standby: claim bound in "
                f"{answer.steps.get('bind', 0)} ms (restored ahead in {ahead} ms)"
            )
            by_it = held is not None and answer.incarnation == held.incarnation
            return text, answer.sha == handle.sha and by_it and "download" not in answer.steps

        def cold() -> tuple[str, bool]:
            answer = client.seed("demo-cold", None, wait=True)
            return f"state={getattr(answer, 'state', '?')}", isinstance(answer, Cold)

        self.step("seed a claimed slot of that generation, poll to the answer", seeded)
        self.step("seed a cold slot", cold)
        incarnation = self._incarnation("demo-seeded")

        def receipt() -> tuple[str, bool]:
            answer = client.receipt("demo-seeded", claim=claim, seed=seed, incarnation=incarnation)
            return f"checkpoint={answer.checkpoint} ({answer.why})", answer.checkpoint == "unknown"

        def evidence() -> tuple[str, bool]:
            answer = client.slot_evidence("demo-seeded", claim=claim)
            text = f"state={answer.state} disposition={answer.disposition}"
            return text, answer.disposition == "retained" and answer.incarnation == incarnation

        self.step("a receipt (no checkpoint yet: unknown, never a guess)", receipt)
        self.step("slot evidence (retained, never a stop permit)", evidence)
        before = self._park(client, seed, claim, incarnation)
        self._resume(client, seed, claim, before)
        self._platform_stop(client, seed, claim)
        self._crash(client, self._another_resource(client, repo, r2), claim)
        self._rotate(client, repo, r2)

    def _park(
        self, client: SeedkeeperClient, seed: SeedIdentity, claim: OwnerClaim, incarnation: str
    ) -> str:
        """Uncommitted work, idle: checkpointed, verified, parked, and intact in R2. Returns
        the work's `git status`."""
        checkout = self._leave_work("demo-seeded")
        before = _git_output(checkout, "status", "--porcelain")
        cold = self._incarnation("demo-cold")

        def sweep() -> tuple[str, bool]:
            time.sleep(IDLE_WINDOW + 1)
            report = self._sweep()
            cold_gone = self.stack.runtime.status(cold) is TaskStatus.STOPPED
            kept = self.stack.runtime.status(incarnation) is TaskStatus.RUNNING
            outcome = f"stopped={report.stopped} asked to checkpoint={report.checkpoints_requested}"
            asked = report.checkpoints_requested == ["demo-seeded"]
            return outcome, report.stopped == ["demo-cold"] and asked and cold_gone and kept

        self.step("idle window passes; the sweep runs", sweep)

        def checkpointed() -> tuple[str, bool]:
            record = self._wait_for("demo-seeded", State.CHECKPOINTED)
            checkpoint = record.checkpoint if record else None
            if record is None or checkpoint is None:
                return "no checkpoint recorded", False
            text = f"{checkpoint.size:,} bytes, sha256 {checkpoint.sha256[:16]}…"
            return text, record.frozen_at is not None

        self.step("the slot task freezes, captures, uploads; the function verifies", checkpointed)

        def parked() -> tuple[str, bool]:
            report = self._sweep()
            stopped = self.stack.runtime.status(incarnation) is TaskStatus.STOPPED
            answer = client.receipt("demo-seeded", claim=claim, seed=seed, incarnation=incarnation)
            until = time.strftime("%Y-%m-%d", time.gmtime(answer.retention_expires_at or 0))
            text = f"parked={report.parked} receipt={answer.checkpoint}, kept until {until}"
            ok = report.parked == ["demo-seeded"] and stopped and answer.checkpoint == "present"
            return text, ok and answer.parked

        self.step("the next sweep parks it: task stopped, receipt present", parked)

        def intact() -> tuple[str, bool]:
            record = self._record("demo-seeded")
            checkpoint = record.checkpoint if record else None
            if checkpoint is None:
                return "no checkpoint", False
            restored = self.root / "restored"
            verified = r2_object_verified(checkpoint.key, checkpoint.sha256, self.root, restored)
            work = (restored / "UNPUBLISHED.md").read_text() if verified else ""
            same = verified and _git_output(restored, "status", "--porcelain") == before
            return f"sha256 verified={verified}, git status as before={same}", same and bool(work)

        self.step("the work, read back from R2, is intact", intact)
        return before

    def _resume(
        self, client: SeedkeeperClient, seed: SeedIdentity, claim: OwnerClaim, before: str
    ) -> None:
        """The owner comes back: the same seed call resumes the parked slot."""
        parked = self._record("demo-seeded")
        superseded = parked.checkpoint.key if parked and parked.checkpoint else ""

        def resumed() -> tuple[str, bool]:
            answer = client.seed("demo-seeded", seed, claim=claim, origin=ORIGIN, wait=True)
            if not isinstance(answer, Seeded):
                return f"not seeded: {answer}", False
            checkout = self.stack.workspace("demo-seeded") / CHECKOUT
            same = _git_output(checkout, "status", "--porcelain") == before
            work = (checkout / "UNPUBLISHED.md").read_text() == UNPUBLISHED
            text = (
                f"resumed={answer.resumed} from={answer.from_} in {answer.ms} ms, "
                f"{answer.incarnation}; git status as before={same}"
            )
            return text, answer.resumed and answer.from_ == "checkpoint" and same and work

        self.step("the owner's next seed resumes it from the checkpoint", resumed)

        def superseded_deleted() -> tuple[str, bool]:
            report = self._sweep()
            gone = not _r2_has(superseded)
            return f"debts paid={report.debts_paid}, old checkpoint gone={gone}", gone

        self.step("a sweep deletes the superseded checkpoint", superseded_deleted)

    def _platform_stop(
        self, client: SeedkeeperClient, seed: SeedIdentity, claim: OwnerClaim
    ) -> None:
        """SIGTERM with no request of ours (Spot, retirement): the task saves and parks."""

        def kept_alive() -> tuple[str, bool]:
            answer = client.keepalive("demo-seeded", claim)
            left = answer.idle_deadline - int(time.time())
            return f"state={answer.state}, idle deadline in {left} s", answer.state == "seeded"

        self.step("keepalive: a touch without a seed body", kept_alive)
        checkout = self._leave_work("demo-seeded", "more work, as Spot reclaims the host\n")
        before = _git_output(checkout, "status", "--porcelain")
        incarnation = self._incarnation("demo-seeded")

        def stopped() -> tuple[str, bool]:
            runtime = self.stack.runtime
            assert isinstance(runtime, LocalRuntime)
            runtime.stop(incarnation, grace=STOP_GRACE)  # what ECS does: SIGTERM, then kill
            record = self._record("demo-seeded")
            checkpoint = record.checkpoint if record else None
            if record is None or checkpoint is None or record.state is not State.PARKED:
                return f"state={record.state if record else None}", False
            answer = client.receipt("demo-seeded", claim=claim, seed=seed, incarnation=incarnation)
            restored = self.root / "restored-after-stop"
            verified = r2_object_verified(checkpoint.key, checkpoint.sha256, self.root, restored)
            same = verified and _git_output(restored, "status", "--porcelain") == before
            text = f"state={record.state} receipt={answer.checkpoint}, work intact={same}"
            return text, answer.checkpoint == "present" and same

        self.step("a platform stop (SIGTERM): the task checkpoints and parks", stopped)

    def _crash(self, client: SeedkeeperClient, seed: SeedIdentity, claim: OwnerClaim) -> None:
        """SIGKILL: nothing can be saved, and the loss is recorded, never hidden."""
        crashed_claim = claim.model_copy(update={"run": "demo-run-2", "thread": "demo-thread-2"})

        def seeded() -> tuple[str, bool]:
            blank = self._free(BLANK_POOL)
            answer = client.seed("demo-crash", seed, claim=crashed_claim, origin=ORIGIN, wait=True)
            if not isinstance(answer, Seeded):
                return f"not seeded: {answer}", False
            self._leave_work("demo-crash")
            by_it = blank is not None and answer.incarnation == blank.incarnation
            return f"by a blank standby: restored in {answer.ms} ms", by_it

        self.step("seed a slot of another resource (a blank standby restores it)", seeded)
        incarnation = self._incarnation("demo-crash")

        def lost() -> tuple[str, bool]:
            runtime = self.stack.runtime
            assert isinstance(runtime, LocalRuntime)
            runtime.crash(incarnation)
            time.sleep(IDLE_WINDOW + 1)
            report = self._sweep()
            record = self._record("demo-crash")
            loss = record.loss if record else None
            answer = client.receipt(
                "demo-crash", claim=crashed_claim, seed=seed, incarnation=incarnation
            )
            why = f"{loss.reason} ({loss.detail})" if loss else "-"
            text = f"lost={report.lost} {why}; receipt={answer.checkpoint}"
            return text, report.lost == ["demo-crash"] and answer.checkpoint == "lost"

        self.step("a crash (SIGKILL): the sweep records the loss", lost)

    def _another_resource(self, client: SeedkeeperClient, repo: Path, r2: R2) -> SeedIdentity:
        """The same repository published as a resource no standby is pre-seeded with."""
        snapshot = published_snapshot(repo, OTHER_RESOURCE, self.root / "scratch-other", r2)
        client.publish(snapshot)
        handle = client.snapshot_status(OTHER_RESOURCE).seed_handle
        assert handle is not None
        return SeedIdentity(resource=OTHER_RESOURCE, **handle.model_dump())

    def _rotate(self, client: SeedkeeperClient, repo: Path, r2: R2) -> None:
        def rotate() -> tuple[str, bool]:
            for n in (2, 3):
                commit_change(repo, n)
                client.publish(self._snapshot(repo, r2))
            after = client.snapshot_status(RESOURCE)
            current, retired = after.current, after.retired
            numbers = (current.generation if current else 0, retired.generation if retired else 0)
            return f"current #{numbers[0]}, retired #{numbers[1]}", numbers == (3, 2)

        self.step("rotate twice; two generations kept", rotate)

    def _snapshot(self, repo: Path, r2: R2) -> NewSnapshot:
        return published_snapshot(repo, RESOURCE, self.root / "scratch", r2)

    def _leave_work(self, slot: str, work: str = UNPUBLISHED) -> Path:
        """What a run leaves and never pushes: an edit, a new file, as the slot user.
        Returns the slot's checkout."""
        checkout = self.stack.workspace(slot) / CHECKOUT
        (checkout / "README.md").write_text("# widgets\n\nedited, never committed\n")
        (checkout / "UNPUBLISHED.md").write_text(work)
        uid = self.stack.slot_uid(slot)
        if uid is not None:
            for name in ("README.md", "UNPUBLISHED.md"):
                os.chown(checkout / name, uid, uid)
        return checkout

    def _sweep(self) -> Report:
        return self.stack.sweep()

    @staticmethod
    def _record(slot: str) -> SlotRecord | None:
        classified = StoreSettings().lifecycle().read(slot)
        return classified.record if isinstance(classified, Supported) else None

    def _wait_for(self, slot: str, state: State, timeout: float = 60) -> SlotRecord | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self._record(slot)
            if record is not None and record.state is state:
                return record
            time.sleep(0.2)
        return None

    @staticmethod
    def _free(pool: str, timeout: float = 60) -> Standby | None:
        """A free standby of `pool`, once there is one (the stack tends the pools)."""
        standbys = StandbyStore(StoreSettings().table_resource())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            free = [s for s in standbys.pool(pool) if s.state is StandbyState.FREE]
            if free:
                return free[0]
            time.sleep(0.2)
        return None

    def _incarnation(self, slot: str) -> str:
        record = self._record(slot)
        return record.incarnation if record and record.incarnation else "local:unknown:0"

    def _print(self) -> None:
        table = Table(title="Seedkeeper demo")
        table.add_column("step")
        table.add_column("outcome")
        table.add_column("seconds", justify="right")
        table.add_column("ok")
        for step in self.steps:
            mark = "[green]yes[/green]" if step.ok else "[red]NO[/red]"
            table.add_row(step.name, step.outcome, f"{step.seconds:.2f}", mark)
        self.console.print(table)


def published_snapshot(repo: Path, resource: str, scratch: Path, r2: R2) -> NewSnapshot:
    """The snapshot of `repo`'s HEAD, its checkout archive uploaded to R2."""
    sha, ref = head_of(repo)
    scratch.mkdir(exist_ok=True)
    archive = upload_archive(repo, scratch, backup_id_for(resource, "checkout", sha), r2)
    return NewSnapshot(
        resource=resource,
        ref=ref,
        sha=sha,
        created_at=int(time.time()),
        checkout=archive.model_dump(),
    )


def r2_object_verified(key: str, sha256: str, scratch: Path, target: Path) -> bool:
    """Download `key` from the stack's R2, check its sha256, unpack it into `target`."""
    settings = R2Settings()
    assert settings.access_key_id is not None
    assert settings.secret_access_key is not None
    s3 = aws.r2_client(
        aws.session(),
        settings.endpoint or "",
        settings.access_key_id.get_secret_value(),
        settings.secret_access_key.get_secret_value(),
        budget=aws.TOOLS,
    )
    archive = scratch / "checkpoint.sqsh"
    s3.download_file(settings.bucket or "", key, str(archive))
    if hashlib.sha256(archive.read_bytes()).hexdigest() != sha256:
        return False
    unsquashfs = ["unsquashfs", "-q", "-no-progress", "-d", str(target), str(archive)]
    subprocess.run(unsquashfs, check=True)
    return True


def _r2_has(key: str) -> bool:
    r2 = R2.from_settings(R2Settings(), budget=aws.TOOLS)
    return r2.head(key) is not None


def sample_repository(path: Path) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "-q", "--initial-branch=main")
    (path / "README.md").write_text("# widgets\n")
    (path / "src").mkdir()
    (path / "src" / "widget.py").write_text("def widget() -> int:\n    return 42\n")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "first")
    return path


def commit_change(repo: Path, n: int) -> None:
    (repo / f"change-{n}.txt").write_text(f"change {n}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"change {n}")


def _git(repo: Path, *args: str) -> None:
    _git_output(repo, *args)


def _git_output(repo: Path, *args: str) -> str:
    author = ["-c", "user.name=Demo", "-c", "user.email=demo@example.com"]
    safe = ["-c", f"safe.directory={repo}"]  # the slot user's checkout, read by this user
    done = subprocess.run(
        ["git", "-C", str(repo), *author, *safe, *args], check=True, capture_output=True, text=True
    )
    return done.stdout


def run_demo() -> int:
    console = Console()
    # The table tells the story: no log lines in between, not even the sweep's warning of
    # the loss the demo causes (slot tasks log to their own files under the data directory).
    logger.setLevel("ERROR")
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"  # nor the metrics' EMF lines
    with tempfile.TemporaryDirectory(prefix="seedkeeper-demo-") as root:
        # Searchable, not listable: the slot user reaches its workspace through it.
        os.chmod(root, 0o711)  # noqa: S103 - search only, for the slot user
        ok = Demo(Path(root), console).run()
    verdict = "[green]every outcome is what the protocol requires[/green]"
    console.print(verdict if ok else "[red]the demo failed[/red]")
    return 0 if ok else 1
