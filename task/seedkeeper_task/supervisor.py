"""The slot task: restore the slot's seed, verified, before the run's first command; then
run the slot's sandbox command.

First of all the task starts (`launch.start`): it tells the checkpoint function its
incarnation, which the record then names for this attempt, and is answered the presigned
URLs it restores from with the size and sha256 recorded for each; a task that is not the
attempt's is refused and touches nothing. The downloads begin then (`launch.Prefetch`),
before this module is even loaded. The task reaches its record only through the checkpoint
function too (`task_api.TaskApi`): its role holds no table grant.

DESIGN §6, step by step: re-read the record and the workspace marker (refusing before
anything is removed when either says the workspace belongs to someone); sweep an earlier
attempt's debris; take each archive once downloaded and verified against what the records
named when it was granted; extract it so its target appears last (the checkout while the
deps archive may still be coming); give the index the extracted files' stat data and fix
up git with argv lists; write the marker; settle the operation and the record,
conditional on this attempt. Any failure stops and joins the downloads, removes the half
tree and settles `seed_failed` with its reason and step.

A resume (DESIGN §10, step 6) restores the slot's parked checkpoint instead, verified
against the record's size and sha256, and checks out nothing: the checkout is the one that
was frozen, its index, untracked and ignored files included. Its `.git` is hardened as a
seed's is. Stopped by the platform, the task checkpoints and parks its slot, or records its
work lost (`watch.Watcher.stopping`).

Logs are JSON events; a presigned URL never appears in one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Literal

from seedkeeper.domain.gitref import is_valid_branch_name
from seedkeeper.domain.models import Model, Origin, OwnerClaim, SeedIdentity
from seedkeeper.domain.outcomes import RestoreGrant
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import (
    Checkpoint,
    FailureReason,
    SeedFailed,
    SeedSucceeded,
    SlotRecord,
    State,
)
from seedkeeper.observability import logger
from seedkeeper_task.launch import ArchiveName, Prefetch
from seedkeeper_task.restore.download import DownloadFailed
from seedkeeper_task.restore.extract import (
    ExtractFailed,
    UnsafeArchive,
    check_links,
    extract,
    sweep_staging,
)
from seedkeeper_task.restore.index_stat import adopt_stat_data
from seedkeeper_task.restore.repository import SafeGit, UnsafeRepository, empty_home, make_safe
from seedkeeper_task.sandbox import (
    STATE_DIR,
    end,
    end_user_processes,
    fresh_home,
    relay_output,
    start,
)
from seedkeeper_task.settings import CheckpointSettings, TaskSettings
from seedkeeper_task.task_api import TaskApi
from seedkeeper_task.watch import Watcher, WatchSettings

CHECKOUT = "checkout"
HOME = "home"  # the sandbox's HOME, the slot user's, emptied before each run
MARKER = "seed.json"
PREPARED = "prepared.json"  # a pre-seeded standby's restore, before any slot is bound
_SETTLE_ROUNDS = 2  # calls: the function re-decides on a moved record itself

Verdict = Literal["seeded", "failed", "superseded"]


class Marker(Model):
    """Names the seed a workspace's checkout came from, and whose it is."""

    slot: str
    attempt: int
    seed: SeedIdentity
    owner: OwnerClaim | None
    origin: Origin | None
    head: str


class Prepared(Model):
    """What a pre-seeded standby restored ahead (PREPARED): the seed of its generation,
    where its deps tree was placed, the HEAD it checked out, and what each step took."""

    seed: SeedIdentity
    deps_path: str
    head: str
    steps: dict[str, int]

    def serves(self, seed: SeedIdentity, deps_path: str) -> bool:
        return self.seed == seed and self.deps_path == deps_path and seed.fetch_ref is None


class StepFailed(Exception):
    def __init__(self, step: str, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step, self.reason, self.detail = step, reason, detail


class Superseded(Exception):
    """The record says this attempt is not the live one: touch nothing, settle nothing."""


class SlotTask:
    def __init__(
        self,
        plan: SlotPlan,
        settings: TaskSettings,
        api: TaskApi,
        stop: threading.Event,
        *,
        prefetch: Prefetch | None = None,
    ) -> None:
        """`prefetch`: the granted archives, downloading since the start (none: nothing
        was granted)."""
        self.plan = plan
        self.settings = settings
        self.api = api
        self.stop = stop
        self.workspace = settings.workspace
        self.checkout = self.workspace / CHECKOUT
        self.state_dir = self.workspace / STATE_DIR
        self.steps: dict[str, int] = {}
        self.prefetch = prefetch or Prefetch(RestoreGrant(expires_in=0), settings, stop)
        self.grant = self.prefetch.grant
        self.watcher = Watcher(
            WatchSettings(
                slot=plan.slot,
                attempt=plan.attempt,
                checkout=self.checkout,
                state_dir=self.state_dir,
                user=settings.slot_user(),
                processors=settings.processors(),
                checkpointing=CheckpointSettings(),
            ),
            api,
            stop,
        )

    # -- the restore ---------------------------------------------------------------

    def restore(self) -> Verdict:
        seed = self.plan.binding.seed
        assert seed is not None
        started = time.monotonic()
        try:
            record, prepared = self._preflight(seed)
        except Superseded as superseded:
            logger.warning("restore superseded", why=str(superseded))
            self._discard_downloads()
            return "superseded"
        except StepFailed as failed:
            logger.warning("restore refused", step=failed.step, why=failed.detail)
            self._discard_downloads()
            return self._settle(
                SeedFailed(reason=failed.reason, step=failed.step, detail=failed.detail)
            )
        created: list[Path] = []
        try:
            if record.checkpoint is not None:  # a resume: the preflight saw the plan agree
                ref, head = self._resume(seed, record.checkpoint, created)
            elif prepared is not None:  # restored and verified while this task stood by
                created.append(self.checkout)
                ref, head = seed.ref, self._adopt(seed, prepared)
            else:
                ref, head = seed.ref, self._seed(seed, created)
                with self._step("marker"):
                    self._write_marker(seed, head)
        except StepFailed as failed:
            logger.warning("restore failed", step=failed.step, reason=failed.reason)
            self._discard_downloads()  # the downloads stopped first: nothing still writes
            for path in reversed(created):
                shutil.rmtree(path, ignore_errors=True)
            return self._settle(
                SeedFailed(reason=failed.reason, step=failed.step, detail=failed.detail[:500])
            )
        self._discard_downloads()
        total = int((time.monotonic() - started) * 1000)
        return self._settle(
            SeedSucceeded(
                ref=ref,
                head=head,
                from_backup=seed.checkout_backup_id,
                steps=self.steps,
                ms=total,
                resumed=record.resuming,
            )
        )

    def _preflight(self, seed: SeedIdentity) -> tuple[SlotRecord, Prepared | None]:
        """Refuse before anything is removed unless this attempt is the live one and the
        workspace holds nothing bound to anyone; then sweep an earlier attempt's debris,
        unless it is the seed's own generation this task restored while it stood by
        (`prepare`), which it then keeps. The record as read (a resume verifies its
        checkpoint against it), and what was prepared."""
        record = self.api.read()
        if record is None:
            raise Superseded("the record names another task")
        if record.attempt != self.plan.attempt or record.state is not State.SEEDING:
            raise Superseded("the record moved on")
        if record.resuming and self.grant.resume is None:
            raise StepFailed("sweep", "seed-failed", "no checkpoint was granted to resume")
        marker = self._marker()
        if marker is not None and (marker.seed != seed or marker.owner is not None):
            raise StepFailed("sweep", "seed-failed", "the workspace holds a bound checkout")
        prepared = self._prepared()
        if (
            prepared is not None
            and prepared.serves(seed, self.plan.deps_path)
            and not (record.resuming)
        ):
            return record, prepared
        self.workspace.mkdir(parents=True, exist_ok=True)
        sweep_staging(self.workspace)
        if self.checkout.exists():
            sweep_staging(self.checkout)
            shutil.rmtree(self.checkout)  # an unbound tree: never handed to a run
        (self.state_dir / MARKER).unlink(missing_ok=True)
        (self.state_dir / PREPARED).unlink(missing_ok=True)
        return record, None

    def _seed(self, seed: SeedIdentity, created: list[Path]) -> str:
        """The archives have been downloading since the start, both at once. The checkout
        extracts as soon as it is verified, and git is fixed up in it; meanwhile the deps
        archive, once verified, extracts beside it (staged in the workspace), and is placed
        inside it once the fix-up is done. Then the whole checkout's links are checked."""
        with_deps = seed.deps_backup_id is not None
        if self.grant.checkout is None or (with_deps and self.grant.deps is None):
            raise StepFailed("download", "seed-missing", "no archive was granted")
        with self._step("download"):
            archive = self._downloaded("checkout")
        created.append(self.checkout)
        fixed: Future[None] = Future()  # the checkout in place and fixed up
        with ThreadPoolExecutor(1, thread_name_prefix="deps") as beside:
            deps_placed = beside.submit(self._extract_deps, fixed) if with_deps else None
            try:
                with self._step("extract"):
                    self._extract(archive, self.checkout)
                with self._step("fixup"):
                    head = self._fix_up(seed)
            except BaseException as failed:
                fixed.set_exception(failed)  # the deps tree is not placed: it goes
                self.prefetch.close()  # nor waited for: its download stops now
                raise
            fixed.set_result(None)
            with self._step("deps"):
                deps_links = deps_placed.result() if deps_placed is not None else None
        with self._step("links"):
            self._check_whole_checkout(deps_links)
        return head

    def _resume(
        self, seed: SeedIdentity, checkpoint: Checkpoint, created: list[Path]
    ) -> tuple[str, str]:
        """Restore the slot's checkpoint as it was frozen: (the branch HEAD names, HEAD).

        Nothing is checked out and no git command that writes the index or the worktree
        runs, so files, modes, symlinks, the index, untracked and ignored files are the
        captured bytes, links leading outside the worktree included (the run made them: a
        virtualenv's interpreter link). Only `.git` is changed, exactly as at a seed: its
        config replaced (the seed's own safe config for this origin and the seed's branch,
        which is what the capture holds unless the run changed its config) and
        `make_safe`'s removals (hooks; the rest the capture left out). The links in `.git`
        were checked by the extraction, and nothing after it makes one. HEAD need not be
        the claim's head:
        the run may have committed since the seed, and the checkpoint is the one the
        record ties to this owner, verified by its size and sha256."""
        assert self.grant.resume is not None  # the preflight refused a resume without one
        with self._step("download"):
            granted = self.grant.resume
            if (granted.size, granted.sha256) != (checkpoint.size, checkpoint.sha256):
                raise StepFailed("download", "seed-failed", "the resume granted is not as recorded")
            archive = self._downloaded("resume")
        with self._step("extract"):
            created.append(self.checkout)
            self._extract(archive, self.checkout, checkpoint=True)
        with self._step("fixup"), self._hardened(seed) as git:
            head = self._git(git, "rev-parse", "--verify", "HEAD^{commit}")
            ref = _branch(self._git(git, "rev-parse", "--symbolic-full-name", "HEAD"))
        with self._step("marker"):
            self._write_marker(seed, head)
        return ref or seed.ref, head

    def prepare(self) -> Prepared | None:
        """A pre-seeded standby's restore, ahead of any claim: the plan's seed (its
        generation) downloaded, verified, extracted, fixed up on its ref and sha with no
        origin, the deps placed, every link checked, exactly as a seed's; then the
        PREPARED marker, which names the seed. Nothing is settled: there is no slot yet.
        None: it failed (and nothing of it is left)."""
        seed = self.plan.binding.seed
        assert seed is not None
        assert self.plan.binding.owner is None  # no slot, no claim: it stands by
        created: list[Path] = []
        self.workspace.mkdir(parents=True, exist_ok=True)
        try:
            head = self._seed(seed, created)
        except StepFailed as failed:
            logger.warning("standby not prepared", step=failed.step, reason=failed.reason)
            self._discard_downloads()
            for path in reversed(created):
                shutil.rmtree(path, ignore_errors=True)
            return None
        self._discard_downloads()
        prepared = Prepared(seed=seed, deps_path=self.plan.deps_path, head=head, steps=self.steps)
        _write_private(self.state_dir / PREPARED, prepared.model_dump_json())
        return prepared

    def _prepared(self) -> Prepared | None:
        path = self.state_dir / PREPARED
        if not path.exists():
            return None
        try:
            return Prepared.model_validate_json(path.read_text())
        except ValueError:
            return None  # unreadable: swept as any debris

    def _adopt(self, seed: SeedIdentity, prepared: Prepared) -> str:
        """Bind the tree restored ahead to this slot: `.git`'s config replaced for the
        binding's origin and the seed's ref (`_hardened`), HEAD checked against the seed
        and the claim, the marker written. Nothing else changes: the tree is the one the
        preparation verified, and nothing has run in it since."""
        self.steps = {f"prepared_{step}": ms for step, ms in prepared.steps.items()}
        with self._step("bind"), self._hardened(seed) as git:
            head = self._git(git, "rev-parse", "--verify", "HEAD^{commit}")
        owner = self.plan.binding.owner
        if head != prepared.head or head != seed.sha or (owner is not None and head != owner.head):
            raise StepFailed("fixup", "seed-failed", "HEAD is not the seed's and the claim's head")
        with self._step("marker"):
            self._write_marker(seed, head)
            (self.state_dir / PREPARED).unlink()
        return head

    def _downloaded(self, name: ArchiveName) -> Path:
        """The granted archive `name` once downloaded and verified against the size and
        sha256 the checkpoint function granted it with (the records', as it read them)."""
        try:
            return self.prefetch.result(name)
        except DownloadFailed as failed:
            missing = failed.reason == "http-404"
            raise StepFailed(
                failed.step, "seed-missing" if missing else "seed-failed", failed.reason
            ) from failed

    def _extract(
        self,
        archive: Path,
        target: Path,
        before_placing: Callable[[], None] | None = None,
        *,
        checkpoint: bool = False,
    ) -> dict[PurePosixPath, str]:
        """`before_placing` given: staged in the workspace, placed after it returns. Answers
        the tree's links."""
        try:
            return extract(
                archive,
                target,
                processors=self.settings.processors(),
                owner=self.settings.slot_user(),
                worktree_links_may_leave=checkpoint,
                staging_in=self.workspace if before_placing is not None else None,
                before_placing=before_placing,
            )
        except UnsafeArchive as unsafe:
            raise StepFailed("extract", "unsafe-archive", str(unsafe)) from unsafe
        except (ExtractFailed, FileExistsError) as failed:
            raise StepFailed("extract", "seed-failed", str(failed)) from failed

    def _extract_deps(self, checkout_fixed: Future[None]) -> dict[PurePosixPath, str]:
        """The deps archive, once verified, staged in the workspace and checked while the
        checkout extracts and git is fixed up; placed at the deps path after that."""
        target = self.checkout / self.plan.deps_path

        def place() -> None:
            checkout_fixed.result()
            self._make_folders_above(target)

        return self._extract(self._downloaded("deps"), target, place)

    def _make_folders_above(self, target: Path) -> None:
        """The folders a nested deps path lands in, the slot user's like the rest of the
        checkout (the supervisor makes them: it is root)."""
        user = self.settings.slot_user()
        folder = self.checkout
        try:
            for part in target.relative_to(self.checkout).parent.parts:
                folder = folder / part
                if not os.path.lexists(folder):
                    folder.mkdir()
                    if user is not None:
                        os.chown(folder, user.uid, user.gid)
        except OSError as failed:
            raise StepFailed("extract", "seed-failed", f"deps path: {failed.strerror}") from failed

    def _check_whole_checkout(self, deps_links: dict[PurePosixPath, str] | None) -> None:
        """Each archive was checked against its own root; the checkout and the deps tree
        inside it are checked together (a link in one may climb through a link in the
        other), after git has written the seed's commit. The deps tree, placed after git
        ran and not changed since, is not walked again: its links are the ones checked."""
        placed = PurePosixPath(self.plan.deps_path) if deps_links is not None else None
        try:
            check_links(self.checkout, placed, deps_links or {})
        except UnsafeArchive as unsafe:
            raise StepFailed("fixup", "unsafe-archive", str(unsafe)) from unsafe

    @contextmanager
    def _hardened(self, seed: SeedIdentity) -> Iterator[SafeGit]:
        """The archive's `.git` is data: check it and replace its config before git runs
        at all, then git runs hardened, as the slot user, on that repository only."""
        with empty_home() as home:
            git = SafeGit(
                self.checkout,
                ceiling=self.workspace,
                home=home,
                user=self.settings.slot_user(),
                timeout=max(1.0, self.settings.restore_timeout),
            )
            try:
                dropped = make_safe(
                    git, origin=self.plan.binding.origin, branch=seed.ref, owner=git.user
                )
            except UnsafeRepository as unsafe:
                raise StepFailed("fixup", "unsafe-archive", str(unsafe)) from unsafe
            if dropped:
                logger.warning("archive credentials dropped", keys=dropped)
            yield git

    def _fix_up(self, seed: SeedIdentity) -> str:
        plan = self.plan
        with self._hardened(seed) as git:
            target = seed.sha
            if seed.fetch_ref is not None:
                self._git(git, "fetch", "--quiet", "--no-tags", "origin", "--", seed.fetch_ref)
                target = seed.fetch_sha or self._git(
                    git, "rev-parse", "--verify", "FETCH_HEAD^{commit}"
                )
            # The index names the resident's inodes: given the extracted files' stat data
            # where they match, git re-reads none of them.
            adopt_stat_data(self.checkout, git.user)
            # No --force: it would rewrite every file whose stat data is stale, and it
            # would silently discard a conflicting change.
            self._git(git, "checkout", "--quiet", "-B", seed.ref, target, "--")
            head = self._git(git, "rev-parse", "--verify", "HEAD^{commit}")
        owner = plan.binding.owner
        if owner is not None and head != owner.head:
            raise StepFailed("fixup", "seed-failed", "HEAD is not the claim's head")
        return head

    def _git(self, git: SafeGit, *args: str) -> str:
        try:
            return git(*args)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as failed:
            stderr = failed.stderr if isinstance(failed.stderr, str) else ""
            raise StepFailed(
                "fixup", "seed-failed", f"git {args[0]}: {stderr.strip()[-300:]}"
            ) from failed

    def _write_marker(self, seed: SeedIdentity, head: str) -> None:
        marker = Marker(
            slot=self.plan.slot,
            attempt=self.plan.attempt,
            seed=seed,
            owner=self.plan.binding.owner,
            origin=self.plan.binding.origin,
            head=head,
        )
        _write_private(self.state_dir / MARKER, marker.model_dump_json())

    def _marker(self) -> Marker | None:
        path = self.state_dir / MARKER
        if not path.exists():
            return None
        try:
            return Marker.model_validate_json(path.read_text())
        except ValueError as invalid:
            raise StepFailed("sweep", "seed-failed", "an unreadable marker") from invalid

    def _discard_downloads(self) -> None:
        self.prefetch.close()
        shutil.rmtree(self.prefetch.folder, ignore_errors=True)

    @contextmanager
    def _step(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.steps[name] = int((time.monotonic() - started) * 1000)

    def _settle(self, result: SeedSucceeded | SeedFailed) -> Verdict:
        """Settle this attempt's restore with its verdict (the function re-decides when a
        poll touched the record in between); superseded when the record moved on."""
        for _ in range(_SETTLE_ROUNDS):
            written = self.api.settle_seed(self.plan.attempt, self.plan.op, result)
            if written.done and written.record is not None:
                state = written.record.state
                logger.info("restore settled", state=state)
                return "seeded" if state is State.SEEDED else "failed"
            if written.outcome != "conflict":
                logger.warning("restore not settled", why=written.reason)
                return "superseded"
        return "superseded"

    # -- after the restore -----------------------------------------------------------

    def run_sandbox(self) -> int:
        """Run the sandbox command (or, with none, wait) until it ends or the task is
        stopped, watching the record meanwhile (`watch.Watcher`). Stopped, a slot seeded
        here is checkpointed and parked, or its work recorded lost, before its sandbox ends."""
        command = self.settings.sandbox_command
        if not command or self.stop.is_set():  # none, or stopped before it could start
            if self._watch(lambda: False):
                self._stopped()
            return 0
        user = self.settings.slot_user()
        if user is None:
            logger.warning("sandbox not dropped to a slot user", euid=os.geteuid())
        home = fresh_home(self.workspace / HOME, user)
        cwd = self.checkout if self.checkout.exists() else home
        try:
            process = start(command, cwd=cwd, home=home, user=user)
        except OSError as unstartable:
            logger.warning("sandbox not started", why=type(unstartable).__name__)
            return 127  # as a shell answers a command it cannot run
        self.watcher.sandbox_group = process.pid  # the leader of its own session
        relay = relay_output(process, lambda line: logger.info("sandbox output", line=line))
        try:
            if self._watch(lambda: process.poll() is not None):
                self._stopped()
                # Frozen, nothing may change after the capture: no grace to act on SIGTERM.
                return end(process, 0) if self.watcher.frozen else end(process)
            return process.returncode
        finally:
            if user is not None:
                end_user_processes(user.uid)  # what left its session ends with it
            relay.join(timeout=2)

    def _seeded_here(self) -> bool:
        """Only a slot that was seeded here is ever checkpointed."""
        return self.plan.binding.seed is not None and self.checkout.exists()

    def _stopped(self) -> None:
        """The platform stops the task: keep the slot's work or record it lost. A store
        that does not answer leaves the record as it is (the sweep finds the task gone)."""
        if not self._seeded_here():
            logger.info("stopped: left", seeded=False)
            return
        try:
            self.watcher.stopping()
        except Exception:
            logger.exception("stopped: unrecorded")

    def _watch(self, ended: Callable[[], bool]) -> bool:
        """Look at the record every watch interval until `ended()` or the task is stopped
        (True: stopped)."""
        seeded = self._seeded_here()
        next_look = time.monotonic() + self.watcher.interval()
        while not ended():
            if self.stop.wait(0.2):
                return True
            if seeded and time.monotonic() >= next_look:
                self.watcher.look()
                next_look = time.monotonic() + self.watcher.interval()
        return False


def _write_private(path: Path, text: str) -> None:
    """Whole or not at all, the supervisor's alone (a marker names the owner's claim)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    staged.chmod(0o600)
    staged.replace(path)


def _branch(head: str) -> str | None:
    """The branch `rev-parse --symbolic-full-name HEAD` names, when a record can hold it
    (None: detached, or a name no seed could have)."""
    name = head.removeprefix("refs/heads/")
    valid = name != head and len(name) <= 255 and is_valid_branch_name(name)
    return name if valid else None


def run(
    plan: SlotPlan,
    settings: TaskSettings,
    api: TaskApi,
    prefetch: Prefetch,
    stop: threading.Event,
) -> int:
    """The task once started (launch.main): restore, then run the sandbox."""
    task = SlotTask(plan, settings, api, stop, prefetch=prefetch)
    user = settings.slot_user()
    if user is not None:
        # The slot user is this slot's alone: nothing an earlier attempt's sandbox left may
        # run while the supervisor, as root, works in the tree that user owns.
        end_user_processes(user.uid)
    if plan.binding.seed is not None and task.restore() == "superseded":
        return 0  # another attempt owns the slot now
    code = task.run_sandbox()
    logger.info("task stopped", stopped_by_signal=stop.is_set(), sandbox_code=code)
    # Stopped (a park, a retirement, the platform): the task did what it was asked. The
    # sandbox's own code (killed at once when frozen) is in the log, not the task's.
    return 0 if stop.is_set() else code
