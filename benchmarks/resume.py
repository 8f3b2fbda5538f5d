"""The resume benchmark (`make bench`): the slot task resuming a parked slot vs its baseline.

The real slot task restores a parked slot from its checkpoint object; its baseline is a
shell script doing the resume's work and nothing more.

The checkpoint: the snapshot is the restore benchmark's (`workload.py`: cached archives of
a repository with history and a node_modules-like deps tree restored inside it).
Once per size, untimed, the real slot task seeds it and the checkout it leaves (the deps
tree in it) is captured as the supervisor captures it (`capture.capture`: mksquashfs zstd
level 3, the config scrubbed): that one squashfs is the parked slot's checkpoint object,
served from the page cache.

Cells: every link of `harness.LINKS` (`--links`: a 50 MiB/s cap per connection over HTTP; a
1 Gbit/s cap on the sum with 30 ms of round trip over HTTPS, the certificate trusted by
every client; unlimited loopback) at every CPU shape (`--cpus`: 1 and 2 vCPU, each a CFS
quota on a cgroup of its own), for every size. Each cell runs `--rounds` rounds (at least
5) of the four methods below, each round's order drawn at random (`harness.rounds`,
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
  `unsquashfs` with the task's own flags (`slot_task.task_unsquashfs`: its bounded
  caches, its threads) into the checkout's path. No git: the resume checks nothing out either.
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
import os
import random
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

import harness
import slot_task
import workload
from restore_baselines import SHA256_COMMAND
from resume_report import (
    ARIA2C,
    BASELINE,
    FLOOR,
    METHODS,
    RESUME,
    SEED,
    Result,
    ShellRun,
    report,
)
from seedkeeper.domain.plan import SlotPlan
from seedkeeper_task import capture
from seedkeeper_task.supervisor import CHECKOUT

MB = harness.MB
DEFAULT_SIZES = ("300 MB",)
CAPTURE_TIMEOUT = 900.0
DOWNLOADED = "checkpoint.sqsh"  # the baseline's download, on the run's fresh filesystem
# The commands its runs need besides the harness's, and the Debian packages holding them.
TOOLS = {
    "git": "git",
    "mksquashfs": "squashfs-tools",
    "unsquashfs": "squashfs-tools",
    "openssl": "openssl",
    "aria2c": "aria2",
}
_TIMES = re.compile(r"(\d+)m([0-9.]+)s")


# -- one run of each ------------------------------------------------------------------------


@dataclass
class Bench:
    """The runs of one cell: a link's server and a CPU shape, both in `tasks`, which
    starts the task inside the shape and checks it."""

    tasks: slot_task.Tasks
    link: harness.LinkSpec
    disks: harness.Disks
    runs: Path
    parkables: dict[str, slot_task.Parkable]
    counter: Iterator[int]

    @property
    def shape(self) -> harness.CpuShape:
        return self.tasks.shape

    @property
    def server(self) -> harness.Nginx:
        return self.tasks.nginx

    @property
    def environment(self) -> dict[str, str]:
        """The shell's: the task's own, trusting the link, in the C locale (`$EPOCHREALTIME`
        and `times` print a decimal point)."""
        return self.tasks.environment | self.server.client_environment() | {"LC_ALL": "C"}

    @contextlib.contextmanager
    def fresh(self, case: workload.Input, name: str) -> Iterator[tuple[Path, Path]]:
        """(a fresh journaled ext4's root, the run's folder for logs on the work dir): the
        image is removed whole afterwards, so no tree is ever deleted file by file."""
        folder = self.runs / name
        with self.disks.run(folder, workload.capacity(case)) as root:
            yield root, folder

    def name(self, method: str) -> str:
        return f"{method}-{next(self.counter)}"

    def park(self, case: workload.Input, served: Path) -> slot_task.Parkable:
        """Untimed: seed `case` with the real task, capture its checkout as the supervisor
        does, into `served` (the served folder)."""
        slot = self.name(RESUME)
        with self.fresh(case, slot) as (root, folder):
            workspace = root / "workspace"
            self.tasks.seed(case, slot, workspace, folder)
            target = served / f"checkpoint-{case.checkout.backup_id}.sqsh"
            try:
                captured = capture.capture(
                    workspace / CHECKOUT, target, user=None, timeout=CAPTURE_TIMEOUT
                )
            except capture.CaptureFailed as failed:
                raise harness.BenchError(f"the capture failed: {failed}") from failed
            worktree = _worktree_entries(workspace / CHECKOUT)
        target.chmod(0o644)  # sealed 0600 by the capture; nginx's workers read it
        return slot_task.Parkable(target, captured.size, captured.sha256, captured.md5, worktree)

    def seed(self, case: workload.Input) -> slot_task.TaskRun:
        slot = self.name(SEED)
        with self.fresh(case, slot) as (root, folder):
            return self.tasks.seed(case, slot, root / "workspace", folder)

    def resume(self, case: workload.Input) -> slot_task.TaskRun:
        slot = self.name(RESUME)
        parkable = self.parkables[case.label]
        with self.fresh(case, slot) as (root, folder):
            record, op = self.tasks.parked_and_resumed(case, slot, parkable)
            assert record.incarnation is not None
            assert record.checkpoint is not None  # parked on it
            # Where the task's start grants it a presigned GET: the record's checkpoint key.
            harness.serve_object(
                self.server.root, record.checkpoint.key, parkable.path, bucket=slot_task.BUCKET
            )
            workspace = root / "workspace"
            plan = SlotPlan.of(record, op)
            timed = self.tasks.task(plan, record.incarnation, workspace, folder)
            result = self.tasks.seeded(slot, case, timed, workspace, folder, resumed=True)
            self._check_worktree(slot, workspace / CHECKOUT, parkable)
            return slot_task.TaskRun.of(timed, result, folder, slot)

    def baseline(self, case: workload.Input) -> ShellRun:
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
{shlex.join([*slot_task.task_unsquashfs(self.shape), "-d", str(checkout), str(downloaded)])}
mark unsquashfs
"""
            timed = self._timed(BASELINE, ["bash", "-c", script], folder)
            steps, cpu = _marked(folder / "marks")
            self._check_worktree(name, checkout, parkable)
        return ShellRun(timed.seconds, steps, cpu, timed.cpu_s, timed.max_rss_kb)

    def floor(self, case: workload.Input) -> ShellRun:
        """`unsquashfs` (the task's flags) of the checkpoint object alone, from the page
        cache, inside the shape: the CPU floor."""
        name = self.name(FLOOR)
        parkable = self.parkables[case.label]
        with self.fresh(case, name) as (root, folder):
            unsquashfs = slot_task.task_unsquashfs(self.shape)
            argv = [*unsquashfs, "-d", str(root / CHECKOUT), str(parkable.path)]
            timed = self._timed(FLOOR, argv, folder)
        return ShellRun(
            total_s=timed.seconds,
            steps_s={"unsquashfs": timed.seconds},
            steps_cpu_s={"unsquashfs": timed.cpu_s},
            cpu_s=timed.cpu_s,
            max_rss_kb=timed.max_rss_kb,
        )

    def _timed(self, name: str, argv: Sequence[str], folder: Path) -> harness.Timed:
        """One timed command inside the cell's shape, trusting the link; its output in
        `folder`/<name>.log, a failure raised with its tail."""
        harness.settle_disk()
        return harness.timed_step(name, argv, folder, shape=self.shape, env=self.environment)

    @staticmethod
    def _check_worktree(name: str, checkout: Path, parkable: slot_task.Parkable) -> None:
        restored = _worktree_entries(checkout)
        if restored != parkable.worktree:
            raise harness.BenchError(
                f"{name}: {restored} worktree entries restored, {parkable.worktree} parked"
            )


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


# -- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=workload.size_for,
        default=[workload.size_for(label) for label in DEFAULT_SIZES],
        metavar="SIZE",
        help='the snapshot\'s size (the restore benchmark\'s): "300 MB", "1 GB", "100 MB" or '
        'any "<N> MB" (its 300 MB trees\' files scaled in count)',
    )
    harness.add_cell_options(parser)
    harness.add_workdir_option(
        parser, holds="cached inputs (shared with restore.py), scratch runs, resume-results.json"
    )
    options = parser.parse_args(argv)
    harness.unwind_on_sigterm()
    console = harness.console(180)
    if harness.missing_tool(console, TOOLS):
        return 1
    disks = harness.Disks()
    if not disks.loop:
        # Trees deleted and made again on this machine's root filesystem would measure
        # its inode allocator, not the restore (LOCAL-AWS-NOTES).
        console.print("[red]needs root, for a loop-mounted ext4 per run[/red]")
        return 1
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    os.environ.update(harness.FAKE_AWS)
    try:
        # The runs' folders: a few logs and empty mount points; the served one: links to the
        # archives, and the checkpoints.
        with harness.scratch(workdir / "resume-runs", workdir / "resume-served"):
            inputs = [workload.build_input(size, workdir, console) for size in options.sizes]
            results = measure_all(
                console,
                workdir,
                inputs,
                specs=[harness.LINKS[name] for name in options.links],
                cpus=options.cpus,
                rounds=options.rounds,
                rng=random.Random(options.seed),  # noqa: S311 - orders, not secrets
                disks=disks,
            )
    except harness.BenchError as broken:
        harness.could_not_measure(console, broken)
        return 1
    report(console, results, disks, workdir, seed=options.seed)
    return 0  # a report, not a gate


def measure_all(
    console: Console,
    workdir: Path,
    inputs: list[workload.Input],
    *,
    specs: list[harness.LinkSpec],
    cpus: Sequence[int],
    rounds: int,
    rng: random.Random,
    disks: harness.Disks,
) -> list[Result]:
    """Every cell's rounds: per link (its server up for all its cells), per CPU shape, per
    size, `rounds` rounds of the four methods in random orders."""
    runs, served = workdir / "resume-runs", workdir / "resume-served"
    served.mkdir(parents=True)
    served.chmod(0o755)  # nginx's workers read it as an unprivileged user
    environment = harness.environment(workdir)
    with slot_task.backend(workdir) as backend:
        counter = itertools.count(1)
        parkables: dict[str, slot_task.Parkable] = {}
        results: list[Result] = []
        with harness.cpu_shapes(cpus) as shapes:
            console.print(
                f"disk: {disks.description}; CPU: {[shape.description for shape in shapes]}"
            )
            for spec in specs:
                with harness.served(
                    spec, served, workdir, home=f"resume-nginx-{spec.name}"
                ) as server:
                    cells = [
                        Bench(
                            tasks=slot_task.Tasks(backend, server, environment, shape),
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
                            for index, order in harness.rounds(rounds, METHODS, rng, result.orders):
                                _round(bench, case, order, result)
                                console.print(f"  {result.where} #{index + 1}: {_progress(result)}")
                            results.append(result)
        return results


def _park_all(console: Console, bench: Bench, inputs: list[workload.Input], served: Path) -> None:
    """Each size's snapshot recorded and served, and its checkpoint object made (untimed)."""
    for case in inputs:
        bench.tasks.record(case)
        console.print(f"{case.label}: seeding and capturing the checkpoint (untimed)")
        bench.parkables[case.label] = bench.park(case, served)
        console.print(
            f"  {case.files:,} files, snapshot {case.size / MB:.1f} MB, checkpoint "
            f"{bench.parkables[case.label].size / MB:.1f} MB"
        )


def _round(bench: Bench, case: workload.Input, order: Sequence[str], result: Result | None) -> None:
    """One run of each method in `order`, kept in `result` (None: a warm-up)."""
    runners: dict[str, Callable[[workload.Input], slot_task.TaskRun | ShellRun]] = {
        RESUME: bench.resume,
        SEED: bench.seed,
        BASELINE: bench.baseline,
        FLOOR: bench.floor,
    }
    for method in order:
        run = runners[method](case)
        if result is None:
            continue
        if isinstance(run, slot_task.TaskRun):
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
