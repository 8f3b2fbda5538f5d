"""The resume benchmark (`make bench`): the slot task resuming a parked slot vs its baseline.

The real slot task restores a parked slot from its checkpoint object; its baseline is a
shell script doing the resume's work and nothing more.

The checkpoint: the snapshot is the restore benchmark's (its generator and cached
archives: a repository with history and a node_modules-like deps tree restored inside it).
Once per size, untimed, the real slot task seeds it and the checkout it leaves (the deps
tree in it) is captured as the supervisor captures it (`capture.capture`: mksquashfs zstd
level 3, the config scrubbed): that one squashfs is the parked slot's checkpoint object,
served from the page cache.

Cells: every link of `links.LINKS` (`--links`: a 50 MiB/s cap per connection over HTTP; a
1 Gbit/s cap on the sum with 30 ms of round trip over HTTPS, the certificate trusted by
every client; unlimited loopback) at every CPU shape (`--cpus`: 1 and 2 vCPU, each a CFS
quota on a cgroup of its own), for every size. Each cell runs `--rounds` rounds (at least
5) of the four methods below, each round's order drawn at random (`links.shuffled`,
`random.Random(--seed)`) and recorded; one untimed run of each per link comes first (at the
smallest size). Every run writes into a fresh journaled ext4 of its own (a loop-mounted
image made for it, as a Fargate task's disk is fresh; see LOCAL-AWS-NOTES), the disk synced
before it. Every timed command runs inside the cell's CPU shape (`CpuShape.wrap`: it and
all it starts); nginx, moto and the checkpoint function (served in this process) stay
outside, as R2 and AWS's side are not the task's.

- resume: a record made parked through the store's own transitions (birth, the seed's
  settle, the sweep's checkpoint request, the freeze, the checkpoint recorded, the park
  fence, the park), then `RESUME` applied as the seed function applies it and the new
  incarnation recorded; the real slot task (`python -m seedkeeper_task`) restores it. As
  in a deployment its plan carries no URL: it starts at the real checkpoint function
  (`POST /tasks/start`, signed with the task's keys), which answers a presigned GET of the
  record's checkpoint key on the link's nginx (path-style, `/<bucket>/<key>`). The task
  downloads it in `download_parts` (8) ranges at once, hashing as it comes, checks its
  listing, extracts it (`unsquashfs`, staged, its tree checked, renamed into place),
  hardens `.git`, writes its marker and settles. Timed from its spawn to its settled record
  (interpreter start, imports and the start call included: the sandbox command, which
  starts once settled, writes the time), and as the task records its restore (`result.ms`,
  `result.steps`); its CPU seconds (user + system, the task and its children, until it
  exits) and peak RSS (VmHWM, as its sandbox command reads it). Checked `seeded` with
  `result.resumed`, HEAD the snapshot's and every worktree entry back.
- baseline: the strongest shell for the same work, one bash script inside the shape:
  `aria2c --no-conf -q -x8 -s8 -k1M --file-allocation=none` of the checkpoint object (as
  many connections as the task opens), `openssl dgst -sha256` of it (the digest compared
  with the object's; OpenSSL uses the CPU's SHA extensions as the task's hashlib does), and
  `unsquashfs` with the task's own flags (`restore.task_unsquashfs`: its bounded caches,
  its threads) into the checkout's path. No git: the resume checks nothing out either.
  Timed whole from spawn to reap; each step's wall time and its processes' CPU seconds
  from the script's own marks (`$EPOCHREALTIME` and bash's `times`, neither of which
  starts a process).
- seed: the same slot seeded afresh by the real task from the snapshot's two archives (its
  start granted presigned GETs of them), as the restore benchmark starts it: what a resume
  saves over a new seed.
- floor: `unsquashfs` (the task's flags) of the checkpoint object alone, from the page
  cache into a fresh filesystem, inside the shape: the CPU floor. Each cell prints the
  floor as its median plus the link's floor (`LinkSpec.floor_s` of the checkpoint's size
  over 8 connections): what no restore that downloads this object over this link, then
  extracts it, can beat.

It reports, per cell, medians, paired ratios (each run against the same round's run of the
other method) as median (min-max): resume / baseline, resume / seed, resume / floor and
baseline / floor; where the time goes (the task's steps and its process beside the
script's); CPU seconds; peak RSS; and the target of issue 31, resume <= 0.9x its baseline,
as met or NOT met. Where it is not met, it says the time of each side step by step, and
whether 0.9x the baseline lies below the floor or below the resume's own CPU seconds
spread over its vCPUs (then no restore of this object that downloads, then extracts,
meets it, or none without spending less CPU). It never fails on a figure (exit 1 only when
the benchmark itself breaks, such as a resume that does not seed). Inputs are cached in
the work dir (default `$TMPDIR/seedkeeper-bench`, shared with the other benchmarks); every
run, each cell's orders and the seed are written there as resume-results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
from rich.console import Console
from rich.table import Table

from seedkeeper.domain import transitions
from seedkeeper.domain.opwindow import OpRef
from seedkeeper.domain.plan import SlotPlan
from seedkeeper.domain.record import Checkpoint, SeedSucceeded, SlotRecord
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper.store.snapshots import SnapshotStore
from seedkeeper_task import capture
from seedkeeper_task.restore.extract import UNSQUASHFS_COMMAND
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.supervisor import CHECKOUT
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.motoserver import AtomicMotoServer
from seedkeeper_tools.local.principals import TaskKeys

if TYPE_CHECKING:
    from benchmarks import links, restore
else:
    import links
    import restore  # the script's own folder is on sys.path: the restore benchmark

MB = restore.MB
DEFAULT_SIZES = ("300 MB",)
TARGET = 0.9  # issue 31: resume / its baseline, the paired median, in every cell
RSS_TARGET_MB = 150.0  # issue 31: the task's peak RSS
CAPTURE_TIMEOUT = 900.0
RETENTION = 7 * 86_400
RESUME, SEED, BASELINE, FLOOR = "resume", "seed", "baseline", "floor"
METHODS = (RESUME, SEED, BASELINE, FLOOR)
# The ranges the task downloads at once (`download_parts`): aria2c's connections, and the
# link floor's.
STREAMS: int = TaskSettings.model_fields["download_parts"].default
ARIA2C = (
    "aria2c",
    "--no-conf",
    "-q",
    f"-x{STREAMS}",
    f"-s{STREAMS}",
    "-k1M",
    "--file-allocation=none",
)
SHA256_COMMAND = ("openssl", "dgst", "-sha256", "-r")  # "<digest> *<file>"
DOWNLOADED = "checkpoint.sqsh"  # the baseline's download, on the run's fresh filesystem
# The commands every run needs, and the Debian packages holding them.
TOOLS = {
    "git": "git",
    "mksquashfs": "squashfs-tools",
    "unsquashfs": "squashfs-tools",
    "openssl": "openssl",
    "aria2c": "aria2",
    "nginx": "nginx",
    "mkfs.ext4": "e2fsprogs",
    "tc": "iproute2",
}
_TIMES = re.compile(r"(\d+)m([0-9.]+)s")

P = TypeVar("P")


# -- one run of each ------------------------------------------------------------------------


@dataclass
class TaskRun:
    process_s: float  # spawn to settled: interpreter start, imports, start call, restore, settle
    restore_s: float  # result.ms: as the task records it
    exit_s: float  # spawn to reaped (its sandbox command ran, it exited)
    steps_ms: dict[str, int]
    peak_rss_kb: int  # the task's own VmHWM
    tree_max_rss_kb: int  # its largest process (the task, unsquashfs, find, git)
    cpu_s: float  # user + system, the task and its children, until it exited


@dataclass
class ShellRun:
    total_s: float  # spawn to reap, inside the shape
    steps_s: dict[str, float]  # each step's wall time, from the script's marks
    steps_cpu_s: dict[str, float]  # each step's processes' user + system
    cpu_s: float  # user + system of everything it ran, the shell included
    max_rss_kb: int  # its largest process


@dataclass(frozen=True)
class Parkable:
    """A size's checkpoint object, as the supervisor captured the seeded checkout."""

    path: Path  # in the served folder
    size: int
    sha256: str
    md5: str
    worktree: int  # entries of the captured checkout outside .git


@dataclass
class Bench:
    """The runs of one cell: a link's server and a CPU shape, both in `restore_bench`,
    which starts the task inside the shape and checks it."""

    restore_bench: restore.Bench
    link: links.LinkSpec
    disks: restore.Disks
    runs: Path
    parkables: dict[str, Parkable]
    counter: Iterator[int]

    @property
    def lifecycle(self) -> Lifecycle:
        return self.restore_bench.lifecycle

    @property
    def shape(self) -> links.CpuShape:
        return self.restore_bench.shape

    @property
    def server(self) -> links.Nginx:
        return self.restore_bench.nginx

    @property
    def environment(self) -> dict[str, str]:
        """The shell's: the task's own, trusting the link, in the C locale (`$EPOCHREALTIME`
        and `times` print a decimal point)."""
        return self.restore_bench.environment | self.server.client_environment() | {"LC_ALL": "C"}

    @contextlib.contextmanager
    def fresh(self, case: restore.Input, name: str) -> Iterator[tuple[Path, Path]]:
        """(a fresh journaled ext4's root, the run's folder for logs on the work dir): the
        image is removed whole afterwards, so no tree is ever deleted file by file."""
        folder = self.runs / name
        folder.mkdir(parents=True)
        try:
            with self.disks.fresh(folder, restore.capacity(case)) as root:
                yield root, folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def name(self, method: str) -> str:
        return f"{method}-{next(self.counter)}"

    def park(self, case: restore.Input, served: Path) -> Parkable:
        """Untimed: seed `case` with the real task, capture its checkout as the supervisor
        does, into `served` (the served folder)."""
        slot = self.name(RESUME)
        with self.fresh(case, slot) as (root, folder):
            workspace = root / "workspace"
            self._seed(case, slot, workspace, folder)
            target = served / f"checkpoint-{case.checkout.backup_id}.sqsh"
            try:
                captured = capture.capture(
                    workspace / CHECKOUT, target, user=None, timeout=CAPTURE_TIMEOUT
                )
            except capture.CaptureFailed as failed:
                raise links.BenchError(f"the capture failed: {failed}") from failed
            worktree = _worktree_entries(workspace / CHECKOUT)
        target.chmod(0o644)  # sealed 0600 by the capture; nginx's workers read it
        return Parkable(target, captured.size, captured.sha256, captured.md5, worktree)

    def _seed(self, case: restore.Input, slot: str, workspace: Path, folder: Path) -> TaskRun:
        bench = self.restore_bench
        record, op = bench.launched(case, slot)
        assert record.incarnation is not None  # recorded by `launched`
        plan = SlotPlan.of(record, op)
        timed = bench.task(plan, record.incarnation, workspace, folder)
        return _task_run(timed, bench.seeded(slot, case, timed, workspace, folder), folder, slot)

    def seed(self, case: restore.Input) -> TaskRun:
        slot = self.name(SEED)
        with self.fresh(case, slot) as (root, folder):
            return self._seed(case, slot, root / "workspace", folder)

    def resume(self, case: restore.Input) -> TaskRun:
        slot = self.name(RESUME)
        parkable = self.parkables[case.label]
        with self.fresh(case, slot) as (root, folder):
            record, op = self.parked_and_resumed(case, slot, parkable)
            assert record.incarnation is not None
            assert record.checkpoint is not None  # parked on it
            bench = self.restore_bench
            # Where the task's start grants it a presigned GET: the record's checkpoint key.
            restore.serve_object(self.server.root, record.checkpoint.key, parkable.path)
            workspace = root / "workspace"
            timed = bench.task(SlotPlan.of(record, op), record.incarnation, workspace, folder)
            result = bench.seeded(slot, case, timed, workspace, folder, resumed=True)
            self._check_worktree(slot, workspace / CHECKOUT, parkable)
            return _task_run(timed, result, folder, slot)

    def baseline(self, case: restore.Input) -> ShellRun:
        """aria2c of the checkpoint object, `openssl dgst -sha256` (the digest compared),
        `unsquashfs` with the task's flags into the checkout's path: one bash script inside
        the shape, each step marked."""
        name = self.name(BASELINE)
        parkable = self.parkables[case.label]
        with self.fresh(case, name) as (root, folder):
            checkout = root / "workspace" / CHECKOUT
            checkout.parent.mkdir()  # as the task's workspace is there before it starts
            downloaded = root / DOWNLOADED
            marks = shlex.quote(str(folder / "marks"))
            fetch = [*ARIA2C, *self.server.aria2c_options(), "-d", str(root), "-o", DOWNLOADED]
            script = f"""set -eu
mark() {{ echo "mark $1 $EPOCHREALTIME" >> {marks}; times >> {marks}; }}
mark start
{shlex.join([*fetch, self.server.url(parkable.path)])}
mark aria2c
digest=$({shlex.join([*SHA256_COMMAND, str(downloaded)])})
[ "${{digest%% *}}" = {parkable.sha256} ] || {{ echo "wrong digest: $digest" >&2; exit 1; }}
mark sha256
{shlex.join([*restore.task_unsquashfs(self.shape), "-d", str(checkout), str(downloaded)])}
mark unsquashfs
"""
            timed = self._timed(BASELINE, ["bash", "-c", script], folder)
            steps, cpu = _marked(folder / "marks")
            self._check_worktree(name, checkout, parkable)
        return ShellRun(timed.seconds, steps, cpu, timed.cpu_s, timed.max_rss_kb)

    def floor(self, case: restore.Input) -> ShellRun:
        """`unsquashfs` (the task's flags) of the checkpoint object alone, from the page
        cache, inside the shape: the CPU floor."""
        name = self.name(FLOOR)
        parkable = self.parkables[case.label]
        with self.fresh(case, name) as (root, folder):
            unsquashfs = restore.task_unsquashfs(self.shape)
            argv = [*unsquashfs, "-d", str(root / CHECKOUT), str(parkable.path)]
            timed = self._timed(FLOOR, argv, folder)
        return ShellRun(
            total_s=timed.seconds,
            steps_s={"unsquashfs": timed.seconds},
            steps_cpu_s={"unsquashfs": timed.cpu_s},
            cpu_s=timed.cpu_s,
            max_rss_kb=timed.max_rss_kb,
        )

    def _timed(self, name: str, argv: Sequence[str], folder: Path) -> restore.Timed:
        """One timed command inside the cell's shape, trusting the link; its output in
        `folder`/<name>.log, a failure raised with its tail."""
        log = folder / f"{name}.log"
        restore.settle_disk()
        with log.open("wb") as output:
            timed = restore.timed_run(self.shape.wrap(argv), env=self.environment, log=output)
        if timed.code != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise links.BenchError(f"{name} exited {timed.code}:\n{tail}")
        return timed

    @staticmethod
    def _check_worktree(name: str, checkout: Path, parkable: Parkable) -> None:
        restored = _worktree_entries(checkout)
        if restored != parkable.worktree:
            raise links.BenchError(
                f"{name}: {restored} worktree entries restored, {parkable.worktree} parked"
            )

    def parked_and_resumed(
        self, case: restore.Input, slot: str, parkable: Parkable
    ) -> tuple[SlotRecord, OpRef]:
        """A record parked on `parkable` through the store's transitions (the slot seeded
        two hours ago, idle since one), then resumed by its owner's seed as the seed
        function does (`RESUME` through `Lifecycle.apply`) and its new incarnation recorded:
        (the record, the resume's restore op)."""
        now = int(time.time())
        born = now - 7200
        record, restore_op = self.restore_bench.launched(case, slot, now=born)
        result = SeedSucceeded(
            ref=restore.REF, head=case.commit, from_backup=case.checkout.backup_id, steps={}, ms=0
        )
        verdict = transitions.Verdict(
            attempt=record.attempt, restore=restore_op, result=result, now=born
        )
        record = self._write(transitions.SETTLE_SEED, record, verdict).record
        idle = record.idle_deadline + 1
        asked = self._write(transitions.REQUEST_CHECKPOINT, record, transitions.At(idle))
        assert asked.entry is not None  # the checkpoint op it reserved
        upload = asked.entry.ref
        freezing = transitions.Freezing(attempt=record.attempt, op=upload, now=idle)
        record = self._write(transitions.FREEZE, asked.record, freezing).record
        assert record.incarnation is not None
        made = Checkpoint(
            key=f"checkpoints/{slot}/{record.incarnation.replace(':', '-')}/1.sqsh",
            size=parkable.size,
            etag=f'"{parkable.md5}"',
            sha256=parkable.sha256,
            created_at=idle,
            expires_at=now + RETENTION,
            owner=record.owner,
            incarnation=record.incarnation,
        )
        uploaded = transitions.Uploaded(checkpoint=made, upload=upload, now=idle)
        record = self._write(transitions.RECORD_CHECKPOINT, record, uploaded).record
        fenced = self._write(transitions.FENCE_PARK, record, transitions.At(idle))
        assert fenced.entry is not None  # the stop it reserved
        parked = transitions.Parked(stop=fenced.entry.ref, now=idle, expires_at=made.expires_at)
        record = self._write(transitions.PARK, fenced.record, parked).record
        poll = transitions.Poll(record.binding, now=now, idle_deadline=now + 3600)
        resumed = self._written(self.lifecycle.apply(slot, transitions.RESUME, poll), "resume")
        if resumed.entry is None or not resumed.record.resuming:
            raise links.BenchError(f"{slot}: the resume reserved no restore: {resumed}")
        incarnation = f"local:{slot}:{resumed.record.attempt}"
        launched = transitions.Launched(incarnation=incarnation, launch=resumed.entry.ref, now=now)
        record = self._write(transitions.RECORD_INCARNATION, resumed.record, launched).record
        return record, resumed.entry.ref

    def _write(
        self, transition: transitions.Transition[P], record: SlotRecord, params: P
    ) -> Written:
        return self._written(self.lifecycle.write(transition, record, params), transition.name)

    @staticmethod
    def _written(outcome: object, name: str) -> Written:
        if not isinstance(outcome, Written):
            raise links.BenchError(f"{name} was not written: {outcome}")
        return outcome


def _marked(marks: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(each step's wall seconds, its processes' CPU seconds) from the script's marks: per
    mark a line `mark <step> <$EPOCHREALTIME>`, then bash's `times` (the shell's own user
    and system time, then those of its waited-for children, so far)."""
    lines = marks.read_text().splitlines()
    points: list[tuple[str, float, float]] = []
    for at in range(0, len(lines) - 2, 3):
        name, when = lines[at].removeprefix("mark ").rsplit(" ", 1)
        children = sum(
            int(minutes) * 60 + float(seconds) for minutes, seconds in _TIMES.findall(lines[at + 2])
        )
        points.append((name, float(when), children))
    steps = {name: when - before for (_, before, _), (name, when, _) in itertools.pairwise(points)}
    cpu = {name: used - before for (_, _, before), (name, _, used) in itertools.pairwise(points)}
    return steps, cpu


def _worktree_entries(checkout: Path) -> int:
    """Files, links and folders outside .git: a restore with fewer is broken."""
    count = 0
    for folder, directories, names in os.walk(checkout):
        if folder == str(checkout):
            directories[:] = [name for name in directories if name != ".git"]
        count += len(directories) + len(names)
    return count


def _task_run(timed: restore.Timed, result: SeedSucceeded, folder: Path, slot: str) -> TaskRun:
    return TaskRun(
        process_s=restore.ready_s(timed, folder, slot),
        restore_s=result.ms / 1000,
        exit_s=timed.seconds,
        steps_ms=dict(result.steps),
        peak_rss_kb=restore.peak_rss_kb(folder, slot),
        tree_max_rss_kb=timed.max_rss_kb,
        cpu_s=timed.cpu_s,
    )


# -- the report -----------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


@dataclass
class Result:
    """One cell (a link, a CPU shape, a size): its rounds."""

    case: restore.Input
    link: links.LinkSpec
    cpus: int  # the CPU shape's vCPUs
    cpu_shape: str  # its description, as it was while measured
    parkable: Parkable
    resume: list[TaskRun] = field(default_factory=list)
    seed: list[TaskRun] = field(default_factory=list)
    baseline: list[ShellRun] = field(default_factory=list)
    floor: list[ShellRun] = field(default_factory=list)
    orders: list[tuple[str, ...]] = field(default_factory=list)  # each round's

    @property
    def where(self) -> str:
        return f"{self.link.name}, {self.cpus} vCPU, {self.case.label}"

    @property
    def rounds(self) -> int:
        return len(self.orders)

    @property
    def link_floor_s(self) -> float:
        """The least time this link delivers the checkpoint object over the task's streams."""
        return self.link.floor_s([self.parkable.size], STREAMS)

    def floors(self) -> list[float]:
        """Each round's floor: its unsquashfs alone, plus the link's floor."""
        return [run.total_s + self.link_floor_s for run in self.floor]

    def resume_to(self, method: str) -> list[float]:
        """Each resume (its whole process) against `method`'s run of its round: their
        spread shows the noise."""
        others: dict[str, list[float]] = {
            SEED: [run.process_s for run in self.seed],
            BASELINE: [run.total_s for run in self.baseline],
            FLOOR: self.floors(),
        }
        return [
            run.process_s / other for run, other in zip(self.resume, others[method], strict=True)
        ]

    def baseline_to_floor(self) -> list[float]:
        return [
            run.total_s / floor for run, floor in zip(self.baseline, self.floors(), strict=True)
        ]

    def resume_steps(self) -> dict[str, float]:
        """The task's steps (medians, s), what else its restore did, and its process's
        own cost around it."""
        names = sorted({name for run in self.resume for name in run.steps_ms})
        medians = {
            name: _median([run.steps_ms.get(name, 0) for run in self.resume]) / 1000
            for name in names
        }
        medians["other (preflight, cleanup)"] = _median(
            [run.restore_s - sum(run.steps_ms.values()) / 1000 for run in self.resume]
        )
        medians["process (interpreter, imports, start call, settle)"] = _median(
            [run.process_s - run.restore_s for run in self.resume]
        )
        return medians

    @staticmethod
    def shell_steps(runs: list[ShellRun]) -> dict[str, tuple[float, float]]:
        """(wall, CPU) medians per step, and the shell's own share (its start, its marks)."""
        steps = {
            name: (
                _median([run.steps_s[name] for run in runs]),
                _median([run.steps_cpu_s[name] for run in runs]),
            )
            for name in runs[0].steps_s
        }
        steps["shell (start, cgroup, marks)"] = (
            _median([run.total_s - sum(run.steps_s.values()) for run in runs]),
            _median([run.cpu_s - sum(run.steps_cpu_s.values()) for run in runs]),
        )
        return steps

    def summary(self) -> dict[str, Any]:
        return {
            "link": self.link.name,
            "link_label": self.link.label,
            "vcpus": self.cpus,
            "cpu_shape": self.cpu_shape,
            "size": self.case.label,
            "files": self.case.files,
            "snapshot_archives_mb": self.case.size / MB,
            "checkpoint_mb": self.parkable.size / MB,
            "rounds": self.rounds,
            "orders": self.orders,
            "median_s": {
                RESUME: _median([run.process_s for run in self.resume]),
                "resume_restore": _median([run.restore_s for run in self.resume]),
                SEED: _median([run.process_s for run in self.seed]),
                BASELINE: _median([run.total_s for run in self.baseline]),
                "cpu_floor": _median([run.total_s for run in self.floor]),
            },
            "link_floor_s": self.link_floor_s,
            "floor_s": _median(self.floors()),
            "median_cpu_s": {
                RESUME: _median([run.cpu_s for run in self.resume]),
                SEED: _median([run.cpu_s for run in self.seed]),
                BASELINE: _median([run.cpu_s for run in self.baseline]),
                FLOOR: _median([run.cpu_s for run in self.floor]),
            },
            "paired": {
                "resume_to_baseline": self.resume_to(BASELINE),
                "resume_to_seed": self.resume_to(SEED),
                "resume_to_floor": self.resume_to(FLOOR),
                "baseline_to_floor": self.baseline_to_floor(),
                "resume_restore_to_baseline": [
                    run.restore_s / base.total_s
                    for run, base in zip(self.resume, self.baseline, strict=True)
                ],
            },
            "target": {"resume_to_baseline_at_most": TARGET, "met": self.met},
            "resume_steps_median_s": self.resume_steps(),
            "seed_steps_median_s": {
                name: _median([run.steps_ms.get(name, 0) for run in self.seed]) / 1000
                for name in sorted({name for run in self.seed for name in run.steps_ms})
            },
            "baseline_steps_median_s": {
                name: {"wall": wall, "cpu": cpu}
                for name, (wall, cpu) in self.shell_steps(self.baseline).items()
            },
            "peak_rss_mb": {
                RESUME: max(run.peak_rss_kb for run in self.resume) * 1024 / MB,
                "resume_largest_process": max(run.tree_max_rss_kb for run in self.resume)
                * 1024
                / MB,
                SEED: max(run.peak_rss_kb for run in self.seed) * 1024 / MB,
                BASELINE: max(run.max_rss_kb for run in self.baseline) * 1024 / MB,
                FLOOR: max(run.max_rss_kb for run in self.floor) * 1024 / MB,
            },
            "runs": {
                RESUME: [asdict(run) for run in self.resume],
                SEED: [asdict(run) for run in self.seed],
                BASELINE: [asdict(run) for run in self.baseline],
                FLOOR: [asdict(run) for run in self.floor],
            },
        }

    @property
    def met(self) -> bool:
        return _median(self.resume_to(BASELINE)) <= TARGET

    @property
    def peak_rss_mb(self) -> float:
        return max(run.peak_rss_kb for run in self.resume) * 1024 / MB


def report(
    console: Console,
    results: list[Result],
    disks: restore.Disks,
    workdir: Path,
    *,
    seed: int,
) -> None:
    console.print(_results_table(results))
    console.print(_steps_table(results))
    console.print(
        f"[dim]resume: the slot task's whole process (spawn to settled record); its steps are "
        "its own (result.steps, inside result.ms), and its downloads start with the process, "
        "so 'download' is what was left to wait for once its restore began. baseline: "
        f"{' '.join(ARIA2C)} + openssl dgst -sha256 + unsquashfs (the task's flags), one "
        "bash script. floor: unsquashfs of the checkpoint alone from the page cache, plus "
        f"the link's floor for the checkpoint over {STREAMS} connections. Every timed "
        f"command inside the cell's CPU shape; disk: {disks.description}.[/dim]"
    )
    _targets(console, results)
    figures = workdir / "resume-results.json"
    figures.write_text(
        json.dumps(
            {
                "seed": seed,
                "cpus": os.cpu_count(),
                "disk": disks.description,
                "links": {
                    name: spec.label
                    for name, spec in links.LINKS.items()
                    if any(result.link.name == name for result in results)
                },
                "cpu_shapes": sorted({result.cpu_shape for result in results}),
                "task_download_parts": STREAMS,
                "baseline": {
                    "download": list(ARIA2C),
                    "verify": list(SHA256_COMMAND),
                    "extract": [*UNSQUASHFS_COMMAND, "-processors", "<the shape's vCPUs>"],
                },
                "versions": {
                    tool: restore._version([tool, flag])
                    for tool, flag in (
                        ("unsquashfs", "-version"),
                        ("mksquashfs", "-version"),
                        ("aria2c", "--version"),
                        ("openssl", "version"),
                        ("nginx", "-v"),
                    )
                },
                "target": {"resume_to_baseline_at_most": TARGET},
                "results": [result.summary() for result in results],
            },
            indent=2,
        )
    )
    console.print(f"figures: {figures}")


def _results_table(results: list[Result]) -> Table:
    spread = restore.spread
    table = Table(
        title="Resume: the slot task resuming a parked slot vs aria2c -x8 + sha256 + "
        "unsquashfs of its checkpoint (its baseline), a fresh seed and the floor "
        "(medians in s; paired ratios as median (min-max))"
    )
    for column in (
        "link",
        "vCPU",
        "size",
        "ckpt MB",
        "rounds",
        "resume",
        "baseline",
        "seed",
        "floor",
        "resume / baseline",
        "resume / seed",
        "resume / floor",
        "baseline / floor",
        "CPU s resume / baseline",
        "peak RSS MB",
    ):
        left = column in ("link", "size")
        table.add_column(column, justify="left" if left else "right", no_wrap=left)
    for result in results:
        summary = result.summary()
        medians, cpu, paired = summary["median_s"], summary["median_cpu_s"], summary["paired"]
        table.add_row(
            result.link.name,
            str(result.cpus),
            result.case.label,
            f"{result.parkable.size / MB:.1f}",
            str(result.rounds),
            f"{medians[RESUME]:.2f}",
            f"{medians[BASELINE]:.2f}",
            f"{medians[SEED]:.2f}",
            f"{summary['floor_s']:.2f}",
            spread(paired["resume_to_baseline"]),
            spread(paired["resume_to_seed"]),
            spread(paired["resume_to_floor"]),
            spread(paired["baseline_to_floor"]),
            f"{cpu[RESUME]:.2f} / {cpu[BASELINE]:.2f}",
            f"{result.peak_rss_mb:.1f}",
        )
    return table


def _steps_table(results: list[Result]) -> Table:
    steps = Table(title="Where the time goes (medians, seconds)")
    for heading in (
        "cell",
        "resume: step",
        "s",
        "baseline: step",
        "s",
        "CPU s",
        "floor",
        "s",
    ):
        steps.add_column(heading, justify="left" if heading.endswith(("cell", "step")) else "right")
    for result in results:
        resume: list[tuple[str, str]] = [
            (name, f"{seconds:.2f}") for name, seconds in result.resume_steps().items()
        ]
        resume.append(
            ("CPU (task + children)", f"{_median([run.cpu_s for run in result.resume]):.2f}")
        )
        baseline: list[tuple[str, str, str]] = [
            (name, f"{wall:.2f}", f"{cpu:.2f}")
            for name, (wall, cpu) in result.shell_steps(result.baseline).items()
        ]
        baseline.append(
            (
                "whole",
                f"{_median([run.total_s for run in result.baseline]):.2f}",
                f"{_median([run.cpu_s for run in result.baseline]):.2f}",
            )
        )
        cpu_floor = _median([run.total_s for run in result.floor])
        floor_cpu = _median([run.cpu_s for run in result.floor])
        floor = [
            (f"unsquashfs alone (CPU {floor_cpu:.2f} s)", f"{cpu_floor:.2f}"),
            (f"link, {STREAMS} connections", f"{result.link_floor_s:.2f}"),
            ("floor", f"{cpu_floor + result.link_floor_s:.2f}"),
        ]
        rows = max(len(resume), len(baseline), len(floor))
        for index in range(rows):
            cells = [result.where if index == 0 else ""]
            cells += resume[index] if index < len(resume) else ("", "")
            cells += baseline[index] if index < len(baseline) else ("", "", "")
            cells += floor[index] if index < len(floor) else ("", "")
            steps.add_row(*cells, end_section=index == rows - 1)
    return steps


def _targets(console: Console, results: list[Result]) -> None:
    console.print(
        f"[bold]Target[/bold] (issue 31): resume <= {TARGET}x its baseline, the paired "
        "median of the whole task process, in every cell"
    )
    for result in results:
        paired = result.resume_to(BASELINE)
        _verdict(
            console,
            result.met,
            f"{result.where}: resume / baseline {restore.spread(paired)}, target <= {TARGET}",
        )
        if not result.met:
            console.print(f"            {_where_the_time_goes(result)}")
    peaks: dict[str, float] = {}
    for result in results:
        peaks[result.case.label] = max(peaks.get(result.case.label, 0.0), result.peak_rss_mb)
    for label, peak in peaks.items():
        _verdict(
            console,
            peak <= RSS_TARGET_MB,
            f"{label}: the resuming task's peak RSS {peak:.1f} MB, target <= "
            f"{RSS_TARGET_MB:.0f} MB",
        )


def _where_the_time_goes(result: Result) -> str:
    """Both sides, step by step, and what the resume would have to take."""
    resume = " + ".join(
        f"{name.split(' (')[0]} {seconds:.2f}" for name, seconds in result.resume_steps().items()
    )
    shell = result.shell_steps(result.baseline)
    baseline = " + ".join(f"{name.split(' (')[0]} {wall:.2f}" for name, (wall, _) in shell.items())
    resumed = _median([run.process_s for run in result.resume])
    base = _median([run.total_s for run in result.baseline])
    cpu_floor = _median([run.total_s for run in result.floor])
    floor = cpu_floor + result.link_floor_s
    resume_cpu = _median([run.cpu_s for run in result.resume])
    notes = []
    if TARGET * base < floor:
        notes.append("below the floor: no restore that downloads this object, then extracts it")
    if resume_cpu / result.cpus > TARGET * base:
        notes.append(
            f"below the resume's own CPU time over {result.cpus} vCPU "
            f"({resume_cpu / result.cpus:.2f} s): it must spend less CPU first"
        )
    return (
        f"resume {resumed:.2f} s = {resume} (CPU {resume_cpu:.2f} s); baseline {base:.2f} s = "
        f"{baseline} (CPU {_median([run.cpu_s for run in result.baseline]):.2f} s); "
        f"{TARGET}x the baseline is {TARGET * base:.2f} s"
        + "".join(f" ({note})" for note in notes)
        + f"; the floor {floor:.2f} s ({cpu_floor:.2f} s unsquashfs + "
        f"{result.link_floor_s:.2f} s link)"
    )


def _verdict(console: Console, met: bool, text: str) -> None:
    console.print(f"  {'[green]met[/green]    ' if met else '[red]NOT met[/red]'} {text}")


# -- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=restore.size_for,
        default=[restore.size_for(label) for label in DEFAULT_SIZES],
        metavar="SIZE",
        help='the snapshot\'s size (the restore benchmark\'s): "300 MB", "1 GB", "100 MB" or '
        'any "<N> MB" (its 300 MB trees\' files scaled in count)',
    )
    links.add_cell_options(parser)
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "seedkeeper-bench",
        help="cached inputs (shared with restore.py), scratch runs, resume-results.json",
    )
    options = parser.parse_args(argv)
    links.unwind_on_sigterm()
    console = Console(width=max(Console().width, 180))  # the tables stay readable in a log
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            console.print(f"[red]{tool} is not installed: apt-get install {package}[/red]")
            return 1
    disks = restore.Disks()
    if not disks.loop:
        # Trees deleted and made again on this machine's root filesystem would measure
        # its inode allocator, not the restore (LOCAL-AWS-NOTES).
        console.print("[red]needs root, for a loop-mounted ext4 per run[/red]")
        return 1
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    runs, served = workdir / "resume-runs", workdir / "resume-served"
    restore.unmount_leftovers(runs)
    shutil.rmtree(runs, ignore_errors=True)  # a few logs and empty mount points
    shutil.rmtree(served, ignore_errors=True)  # links to the archives, the checkpoints
    os.environ.update(restore.FAKE_AWS)
    try:
        inputs = [restore.build_input(size, workdir, console) for size in options.sizes]
        results = measure_all(
            console,
            workdir,
            inputs,
            specs=[links.LINKS[name] for name in options.links],
            cpus=options.cpus,
            rounds=options.rounds,
            rng=random.Random(options.seed),  # noqa: S311 - orders, not secrets
            disks=disks,
        )
    except links.BenchError as broken:
        console.print(f"[red]the benchmark could not measure:[/red] {broken}")
        return 1
    finally:
        restore.unmount_leftovers(runs)
        shutil.rmtree(runs, ignore_errors=True)
        shutil.rmtree(served, ignore_errors=True)
    report(console, results, disks, workdir, seed=options.seed)
    return 0  # a report, not a gate


def measure_all(
    console: Console,
    workdir: Path,
    inputs: list[restore.Input],
    *,
    specs: list[links.LinkSpec],
    cpus: Sequence[int],
    rounds: int,
    rng: random.Random,
    disks: restore.Disks,
) -> list[Result]:
    """Every cell's rounds: per link (its server up for all its cells), per CPU shape, per
    size, `rounds` rounds of the four methods in random orders."""
    runs, served = workdir / "resume-runs", workdir / "resume-served"
    served.mkdir(parents=True)
    served.chmod(0o755)  # nginx's workers read it as an unprivileged user
    moto = AtomicMotoServer().start()
    keys = TaskKeys(workdir)
    gateway = restore.checkpoint_function(moto.endpoint, keys)
    try:
        dynamodb = boto3.client("dynamodb", endpoint_url=moto.endpoint, region_name=restore.REGION)
        create_table(dynamodb, restore.TABLE, load_template())
        table = boto3.resource(
            "dynamodb", endpoint_url=moto.endpoint, region_name=restore.REGION
        ).Table(restore.TABLE)
        counter = itertools.count(1)
        parkables: dict[str, Parkable] = {}
        results: list[Result] = []
        with links.cpu_shapes(cpus) as shapes:
            console.print(
                f"disk: {disks.description}; CPU: {[shape.description for shape in shapes]}"
            )
            for spec in specs:
                with links.served(
                    spec, served, workdir, home=f"resume-nginx-{spec.name}"
                ) as server:
                    cells = [
                        Bench(
                            restore_bench=restore.Bench(
                                workdir=workdir,
                                nginx=server,
                                endpoint=moto.endpoint,
                                checkpoint_url=gateway.url,
                                lifecycle=Lifecycle(table),
                                snapshots=SnapshotStore(table),
                                environment=restore._environment(workdir),
                                keys=keys,
                                shape=shape,
                                disks=disks,
                            ),
                            link=spec,
                            disks=disks,
                            runs=runs,
                            parkables=parkables,
                            counter=counter,
                        )
                        for shape in shapes
                    ]
                    console.print(f"link {spec.name}: {spec.label}, at {server.endpoint}")
                    if not parkables:
                        _park_all(console, cells[0], inputs, served)
                    smallest = min(inputs, key=lambda case: case.size)
                    console.print("  warming up: one untimed run of each at the smallest size")
                    _round(cells[0], smallest, METHODS, None)
                    for bench in cells:
                        for case in inputs:
                            result = Result(
                                case,
                                spec,
                                bench.shape.count,
                                bench.shape.description,
                                parkables[case.label],
                            )
                            for index in range(rounds):
                                order = links.shuffled(METHODS, rng)
                                result.orders.append(order)
                                _round(bench, case, order, result)
                                console.print(f"  {result.where} #{index + 1}: {_progress(result)}")
                            results.append(result)
        return results
    finally:
        gateway.stop()
        moto.stop()


def _park_all(console: Console, bench: Bench, inputs: list[restore.Input], served: Path) -> None:
    """Each size's snapshot recorded and served, and its checkpoint object made (untimed)."""
    for case in inputs:
        bench.restore_bench.record(case)
        console.print(f"{case.label}: seeding and capturing the checkpoint (untimed)")
        bench.parkables[case.label] = bench.park(case, served)
        console.print(
            f"  {case.files:,} files, snapshot {case.size / MB:.1f} MB, checkpoint "
            f"{bench.parkables[case.label].size / MB:.1f} MB"
        )


def _round(bench: Bench, case: restore.Input, order: Sequence[str], result: Result | None) -> None:
    """One run of each method in `order`, kept in `result` (None: a warm-up)."""
    runners: dict[str, Callable[[restore.Input], TaskRun | ShellRun]] = {
        RESUME: bench.resume,
        SEED: bench.seed,
        BASELINE: bench.baseline,
        FLOOR: bench.floor,
    }
    for method in order:
        run = runners[method](case)
        if result is None:
            continue
        if isinstance(run, TaskRun):
            (result.resume if method == RESUME else result.seed).append(run)
        else:
            (result.baseline if method == BASELINE else result.floor).append(run)


def _progress(result: Result) -> str:
    resumed, base = result.resume[-1], result.baseline[-1]
    return (
        f"{'/'.join(result.orders[-1])}: resume {resumed.process_s:.2f} s "
        f"(restore {resumed.restore_s:.2f} s, CPU {resumed.cpu_s:.2f} s) {resumed.steps_ms}, "
        f"baseline {base.total_s:.2f} s (CPU {base.cpu_s:.2f} s), seed "
        f"{result.seed[-1].process_s:.2f} s, floor {result.floor[-1].total_s:.2f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
