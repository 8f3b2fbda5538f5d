"""The resume benchmark (`make bench`): time to a usable slot, resumed from its checkpoint
or seeded afresh, both against `curl -o` + `openssl dgst -sha256` + `unsquashfs` + `git checkout`.

The snapshot is the restore benchmark's (its generator and cached archives: a repository
with history and a node_modules-like deps tree restored inside it). Once per size, untimed,
the real slot task seeds it and the checkout it leaves (the deps tree in it) is captured
as the supervisor captures it (`capture.capture`: mksquashfs zstd level 3, the config
scrubbed): that file is the parked slot's checkpoint object. Then, in rounds whose order
rotates (each method first in turn; every order in six rounds), each on a fresh journaled
ext4 (a loop-mounted image made per run, as a Fargate task's disk is fresh and journaled;
see LOCAL-AWS-NOTES):

- resume: a record made parked through the store's own transitions (birth, the seed's
  settle, the sweep's checkpoint request, the freeze, the checkpoint recorded, the park
  fence, the park), then `RESUME` applied as the seed function applies it and the new
  incarnation recorded; the real slot task (`python -m seedkeeper_task`) restores it. As
  in a deployment its plan carries no URL: it starts at the real checkpoint function
  (served in this process by the local function-URL gateway, `POST /tasks/start` signed
  with the task's keys), which answers a presigned GET of the record's checkpoint key,
  served by nginx (path-style, `/<bucket>/<key>`, a link to the checkpoint object). Timed
  from its spawn to its settled record (the start call included, part of what a task
  costs; its sandbox command, which starts once settled, writes the time), checked
  `seeded` with `result.resumed`.
- seed: the same tree seeded afresh by the real task from the snapshot's archives (its
  start granted presigned GETs of them), as the restore benchmark starts it.
- baseline: the restore benchmark's curl baseline: `curl -o` of the snapshot's archives,
  `openssl dgst -sha256` of them, `unsquashfs` with the task's own flags (its caches bounded as the
  task bounds them) of each where the task puts it, `git checkout -B`.

Both servers are nginx on loopback, the objects in the page cache: by default with a
per-connection `limit_rate` standing in for R2 (`--rates`; "none" for unlimited loopback).
50 MiB/s per connection is our assumption for one HTTPS stream from R2 to a task in an AWS
region, not a measurement: the task's download takes `download_parts` ranges of each
archive at once (8 by default), curl one stream, and nothing caps their sum here. Ratios
are paired (each run against the baseline of its round) and reported as median (min-max).
It never fails on a figure (exit 1 only when the benchmark itself breaks, such as a resume
that does not seed). Inputs are cached in the
work dir (default `$TMPDIR/seedkeeper-bench`, shared with the other benchmarks), figures
written there as resume-results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
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
DEFAULT_PAIRS = 5
CAPTURE_TIMEOUT = 900.0
RETENTION = 7 * 86_400
METHODS = ("resume", "seed", "baseline")
# The orders of the rounds, in turn: each method first once in every three rounds, and
# every order in six.
ORDERS = restore.rotations(METHODS)

P = TypeVar("P")


# -- one run of each ------------------------------------------------------------------------


@dataclass
class TaskRun:
    process_s: float  # spawn to settled: interpreter start, imports, start call, restore, settle
    restore_s: float  # result.ms: as the task records it
    steps_ms: dict[str, int]
    peak_rss_kb: int  # the task's own VmHWM


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
    """The runs of one server (one rate); `restore_bench` starts and checks the task."""

    restore_bench: restore.Bench
    rate: str | None
    disks: restore.Disks
    runs: Path
    parkables: dict[str, Parkable]
    counter: Iterator[int]

    @property
    def lifecycle(self) -> Lifecycle:
        return self.restore_bench.lifecycle

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

    def slot(self) -> str:
        return f"resume-{next(self.counter)}"

    def park(self, case: restore.Input, served: Path) -> Parkable:
        """Untimed: seed `case` with the real task, capture its checkout as the supervisor
        does, into `served` (the served folder); it is also the task's warm-up."""
        slot = self.slot()
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
        slot = self.slot()
        with self.fresh(case, slot) as (root, folder):
            return self._seed(case, slot, root / "workspace", folder)

    def resume(self, case: restore.Input) -> TaskRun:
        slot = self.slot()
        parkable = self.parkables[case.label]
        with self.fresh(case, slot) as (root, folder):
            record, op = self.parked_and_resumed(case, slot, parkable)
            assert record.incarnation is not None
            assert record.checkpoint is not None  # parked on it
            bench = self.restore_bench
            # Where the task's start grants it a presigned GET: the record's checkpoint key.
            restore.serve_object(bench.nginx.root, record.checkpoint.key, parkable.path)
            workspace = root / "workspace"
            timed = bench.task(SlotPlan.of(record, op), record.incarnation, workspace, folder)
            result = bench.seeded(slot, case, timed, workspace, folder, resumed=True)
            restored = _worktree_entries(workspace / CHECKOUT)
            if restored != parkable.worktree:
                raise links.BenchError(
                    f"{slot}: {restored} worktree entries resumed, {parkable.worktree} parked"
                )
            return _task_run(timed, result, folder, slot)

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

    def baseline(self, case: restore.Input) -> restore.BaselineRun:
        """The restore benchmark's baseline, served by this rate's nginx."""
        return self.restore_bench.baseline(case)


def _worktree_entries(checkout: Path) -> int:
    """Files, links and folders outside .git: a resume that seeds with fewer is broken."""
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
        steps_ms=dict(result.steps),
        peak_rss_kb=restore.peak_rss_kb(folder, slot),
    )


# -- the report -----------------------------------------------------------------------------


@dataclass
class Result:
    case: restore.Input
    rate: str | None
    parkable: Parkable
    resume: list[TaskRun] = field(default_factory=list)
    seed: list[TaskRun] = field(default_factory=list)
    baseline: list[restore.BaselineRun] = field(default_factory=list)

    def ratios(self, runs: list[TaskRun], measure: Callable[[TaskRun], float]) -> list[float]:
        """Each run against the baseline run of its round: their spread shows the noise."""
        return [measure(run) / base.total_s for run, base in zip(runs, self.baseline, strict=True)]

    def resume_to_seed(self) -> list[float]:
        return [
            resumed.process_s / seeded.process_s
            for resumed, seeded in zip(self.resume, self.seed, strict=True)
        ]

    def steps(self, runs: list[TaskRun]) -> dict[str, float]:
        """The task's steps (medians, s), what else its restore did, and its process's
        own cost around it."""
        names = sorted({name for run in runs for name in run.steps_ms})
        medians = {
            name: statistics.median(run.steps_ms.get(name, 0) for run in runs) / 1000
            for name in names
        }
        medians["other (preflight, cleanup)"] = statistics.median(
            run.restore_s - sum(run.steps_ms.values()) / 1000 for run in runs
        )
        medians["process (interpreter, imports, start call, settle)"] = statistics.median(
            run.process_s - run.restore_s for run in runs
        )
        return medians

    def summary(self) -> dict[str, Any]:
        def median(values: Sequence[float]) -> float:
            return statistics.median(values)

        return {
            "size": self.case.label,
            "files": self.case.files,
            "archive_entries": self.case.entries,
            "raw_mb": self.case.raw_bytes / MB,
            "snapshot_archive_mb": self.case.size / MB,
            "checkpoint_mb": self.parkable.size / MB,
            "server": restore.rate_label(self.rate),
            "pairs": len(self.baseline),
            "median_baseline_s": median([run.total_s for run in self.baseline]),
            "median_seed_process_s": median([run.process_s for run in self.seed]),
            "median_resume_process_s": median([run.process_s for run in self.resume]),
            "median_seed_restore_s": median([run.restore_s for run in self.seed]),
            "median_resume_restore_s": median([run.restore_s for run in self.resume]),
            "paired_ratios_resume": self.ratios(self.resume, lambda run: run.process_s),
            "paired_ratios_seed": self.ratios(self.seed, lambda run: run.process_s),
            "paired_ratios_resume_restore": self.ratios(self.resume, lambda run: run.restore_s),
            "paired_ratios_seed_restore": self.ratios(self.seed, lambda run: run.restore_s),
            "paired_ratios_resume_to_seed": self.resume_to_seed(),
            "resume_steps_median_s": self.steps(self.resume),
            "seed_steps_median_s": self.steps(self.seed),
            "baseline_steps_median_s": {
                name: median([run.steps_s[name] for run in self.baseline])
                for name in self.baseline[0].steps_s
            },
            "peak_rss_mb": {
                "resume": max(run.peak_rss_kb for run in self.resume) * 1024 / MB,
                "seed": max(run.peak_rss_kb for run in self.seed) * 1024 / MB,
            },
            "runs": {
                "resume": [asdict(run) for run in self.resume],
                "seed": [asdict(run) for run in self.seed],
                "baseline": [asdict(run) for run in self.baseline],
            },
        }


def report(console: Console, results: list[Result], disks: restore.Disks, workdir: Path) -> None:
    spread = restore.spread
    table = Table(
        title="Time to a usable slot: resume from its checkpoint and a fresh seed vs curl -o "
        "+ sha256 + unsquashfs + git checkout (whole processes; medians, paired ratios "
        "as median (min-max))"
    )
    for column in (
        "size",
        "files",
        "server",
        "snapshot / checkpoint MB",
        "pairs",
        "baseline s",
        "seed s",
        "seed / baseline",
        "resume s",
        "resume / baseline",
        "resume / seed",
    ):
        table.add_column(column, justify="left" if column in ("size", "server") else "right")
    for result in results:
        summary = result.summary()
        table.add_row(
            result.case.label,
            f"{result.case.files:,}",
            restore.rate_label(result.rate),
            f"{result.case.size / MB:.1f} / {result.parkable.size / MB:.1f}",
            str(summary["pairs"]),
            f"{summary['median_baseline_s']:.2f}",
            f"{summary['median_seed_process_s']:.2f}",
            spread(summary["paired_ratios_seed"]),
            f"{summary['median_resume_process_s']:.2f}",
            spread(summary["paired_ratios_resume"]),
            spread(summary["paired_ratios_resume_to_seed"]),
        )
    console.print(table)

    steps = Table(title="Where the time goes (medians, seconds)")
    for heading in ("size, server", "resume: step", "s", "seed: step", "s", "baseline: step", "s"):
        steps.add_column(heading, justify="right" if heading == "s" else "left")
    for result in results:
        summary = result.summary()
        listed: list[list[tuple[str, float]]] = [
            list(summary[key].items())
            for key in ("resume_steps_median_s", "seed_steps_median_s", "baseline_steps_median_s")
        ]
        rows = max(len(steps_of) for steps_of in listed)
        for index in range(rows):
            cells = [
                f"{result.case.label}, {restore.rate_label(result.rate)}" if index == 0 else ""
            ]
            for steps_of in listed:
                step, seconds = steps_of[index] if index < len(steps_of) else ("", None)
                cells += [step, "" if seconds is None else f"{seconds:.2f}"]
            steps.add_row(*cells, end_section=index == rows - 1)
    console.print(steps)
    for result in results:
        summary = result.summary()
        where = f"{result.case.label}, {restore.rate_label(result.rate)}"
        console.print(
            f"[dim]{where}: inside the task (result.ms) "
            f"resume/baseline {spread(summary['paired_ratios_resume_restore'])}, "
            f"seed/baseline {spread(summary['paired_ratios_seed_restore'])}; the task's peak "
            f"RSS {summary['peak_rss_mb']['resume']:.1f} MB resuming, "
            f"{summary['peak_rss_mb']['seed']:.1f} MB seeding[/dim]"
        )
    console.print(
        f"[dim]disk: {disks.description}; nginx on loopback, the objects in the page cache; "
        f"the task downloads {restore.TASK_PARTS} ranges of each archive at once, curl one "
        "stream; no cap on their sum.[/dim]"
    )
    figures = workdir / "resume-results.json"
    figures.write_text(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "disk": disks.description,
                "unsquashfs": restore._version(["unsquashfs", "-version"]),
                "mksquashfs": restore._version(["mksquashfs", "-version"]),
                "git": restore._version(["git", "--version"]),
                "curl": restore._version(["curl", "--version"]),
                "results": [result.summary() for result in results],
            },
            indent=2,
        )
    )
    console.print(f"figures: {figures}")


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
    restore.add_rates(parser)
    parser.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help="rounds of the three per size and rate, their order rotating",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "seedkeeper-bench",
        help="cached inputs (shared with restore.py), scratch runs, resume-results.json",
    )
    options = parser.parse_args(argv)
    if options.pairs < 1:
        parser.error("--pairs must be positive")
    try:
        rates = restore.parse_rates(options.rates)
    except argparse.ArgumentTypeError as wrong:
        parser.error(str(wrong))
    console = Console(width=max(Console().width, 140))  # the tables stay readable in a log
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    runs, served = workdir / "resume-runs", workdir / "resume-served"
    restore.unmount_leftovers(runs)
    shutil.rmtree(runs, ignore_errors=True)  # a few logs and empty mount points
    shutil.rmtree(served, ignore_errors=True)  # links to the archives, the checkpoints
    for tool in ("git", "mksquashfs", "unsquashfs", "curl", "openssl", "mkfs.ext4"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            console.print(f"[red]{tool} is not installed[/red]")
            return 1
    disks = restore.Disks()
    if not disks.loop:
        # Trees deleted and made again on this machine's root filesystem would measure
        # its inode allocator, not the restore (LOCAL-AWS-NOTES).
        console.print("[red]needs root, for a loop-mounted ext4 per run[/red]")
        return 1
    os.environ.update(restore.FAKE_AWS)
    try:
        inputs = [restore.build_input(size, workdir, console) for size in options.sizes]
        results = measure_all(
            console, workdir, inputs, rates=rates, pairs=options.pairs, disks=disks
        )
    except links.BenchError as broken:
        console.print(f"[red]the benchmark could not measure:[/red] {broken}")
        return 1
    finally:
        restore.unmount_leftovers(runs)
        shutil.rmtree(runs, ignore_errors=True)
        shutil.rmtree(served, ignore_errors=True)
    report(console, results, disks, workdir)
    return 0  # a report, not a gate


def measure_all(
    console: Console,
    workdir: Path,
    inputs: list[restore.Input],
    *,
    rates: list[str | None],
    pairs: int,
    disks: restore.Disks,
) -> list[Result]:
    runs, served = workdir / "resume-runs", workdir / "resume-served"
    served.mkdir(parents=True)
    served.chmod(0o755)  # nginx's workers read it as an unprivileged user
    # The snapshots' archives beside the checkpoints, in one served root.
    for archived in (archived for case in inputs for archived in case.archives):
        os.link(archived.path, served / archived.path.name)
    moto = AtomicMotoServer().start()
    keys = TaskKeys(workdir)
    gateway = restore.checkpoint_function(moto.endpoint, keys)
    servers = [
        links.Nginx(served, workdir, limit_rate=rate, home=f"resume-nginx-{index}")
        for index, rate in enumerate(rates)
    ]
    try:
        for server in servers:
            server.start()
        dynamodb = boto3.client("dynamodb", endpoint_url=moto.endpoint, region_name=restore.REGION)
        create_table(dynamodb, restore.TABLE, load_template())
        table = boto3.resource(
            "dynamodb", endpoint_url=moto.endpoint, region_name=restore.REGION
        ).Table(restore.TABLE)
        counter = itertools.count(1)
        parkables: dict[str, Parkable] = {}
        benches = [
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
                ),
                rate=rate,
                disks=disks,
                runs=runs,
                parkables=parkables,
                counter=counter,
            )
            for server, rate in zip(servers, rates, strict=True)
        ]
        first = benches[0]
        console.print(
            f"disk: {disks.description}; servers: {[restore.rate_label(r) for r in rates]}"
        )
        for case in inputs:
            first.restore_bench.record(case)
            console.print(f"{case.label}: seeding and capturing the checkpoint (untimed)")
            parkables[case.label] = first.park(case, served)
            console.print(
                f"  {case.files:,} files, snapshot {case.size / MB:.1f} MB, checkpoint "
                f"{parkables[case.label].size / MB:.1f} MB"
            )
        smallest = min(inputs, key=lambda case: case.size)
        console.print("warming up: one untimed resume and baseline at the smallest size")
        first.resume(smallest)
        first.baseline(smallest)
        results: list[Result] = []
        for bench in benches:
            for case in inputs:
                result = Result(case, bench.rate, parkables[case.label])
                for index in range(pairs):
                    for method in ORDERS[index % len(ORDERS)]:
                        if method == "resume":
                            result.resume.append(bench.resume(case))
                        elif method == "seed":
                            result.seed.append(bench.seed(case))
                        else:
                            result.baseline.append(bench.baseline(case))
                    console.print(
                        f"  {case.label}, {restore.rate_label(bench.rate)} #{index + 1}: baseline "
                        f"{result.baseline[-1].total_s:.2f} s, seed "
                        f"{result.seed[-1].process_s:.2f} s, resume "
                        f"{result.resume[-1].process_s:.2f} s {result.resume[-1].steps_ms}"
                    )
                results.append(result)
        return results
    finally:
        gateway.stop()
        for server in servers:
            server.stop()
        moto.stop()


if __name__ == "__main__":
    sys.exit(main())
