"""The restore benchmark (`make bench`): our slot task's restore against the shell.

Every baseline does the task's work (download, verify, extract, check out) on the same
link, disk and CPU.

Inputs, generated once per size (deterministic: the same trees and commit every time) and
cached in the work dir: a snapshot of two archives, built with the project's own
`build_squashfs` (zstd) and `measure`, whose sizes add up to the size's label:

- the checkout: a repository with history. A synthetic source tree committed over 300
  commits by `git fast-import` (most files in the first; each later one adds a few files and
  makes small edits to a few, so the pack holds deltas), an `origin` remote, repacked into
  one pack (`git repack -a -d`) and checked out as a clone is, plus a few ignored build
  outputs.
- the deps: a node_modules-like tree (packages as folders with package.json, README.md,
  LICENSE, index.js, lib/**/*.js, some .d.ts and .js.map, nested node_modules, a .bin of
  links; file sizes lognormal, median about 2 KB), recorded as the snapshot's deps archive
  and restored by the task at the plan's deps path (`node_modules`, ignored by the
  checkout's .gitignore).

About 120,000 files at "300 MB" (20,000 in the checkout, 100,000 in the deps); a larger
size holds more files, not only bigger ones: "1 GB" has three times as many.

Cells: every link of `harness.LINKS` (`--links`: 50 MiB/s per connection over HTTP; 1
Gbit/s in all with 30 ms of round trip over HTTPS, the certificate trusted by every client;
unlimited loopback) at every CPU shape (`--cpus`: 1 and 2 vCPU, each a CFS quota on a
cgroup of its own, as ECS gives a task its CPU), for every size. Each cell runs `--rounds`
rounds (at least 5) of the five methods below (above `--plain-up-to`, of ours, the shell
and the floor), each round's order drawn at random
(`harness.rounds`, `random.Random(--seed)`) and recorded; one untimed run of ours and of
the shell comes first on each link. Every run writes into a fresh journaled ext4 of its own
(a loop-mounted sparse image, made before the run and removed whole after it: as root;
otherwise the work dir, and the report says so): this machine's root filesystem is ext4
without a journal, where creating files right after deleting many is quadratic. The disk
is synced before every timed run. Every timed command runs inside the cell's CPU shape
(`CpuShape.wrap`: it and all it starts); nginx, moto and the checkpoint function (served in
this process) stay outside, as R2 and AWS's side are not the task's.

- ours: the real slot task (`python -m seedkeeper_task`) started as the local runtime
  starts it, against a moto lifecycle table holding a record born for it. As in a
  deployment its plan carries no URL: it starts at the real checkpoint function (served in
  this process by the local function-URL gateway, `POST /tasks/start` signed with the
  task's keys), which answers presigned GETs of the archives' R2 keys pointing at the
  link's nginx (path-style, `/<bucket>/<key>`, laid out as links to the archives). Then it
  downloads both archives at once (`download_parts`: 8 ranges each, hashed as they come),
  checks each listing, extracts both (the checkout first fixed up by git, the deps tree
  staged beside it), checks the trees, writes its marker and settles. Timed as its whole
  process from its spawn to its settled record (interpreter start, imports and the start
  call are part of what a task costs; the slot is usable once settled, so the sandbox
  command, which starts then, writes the time), as the task records its restore
  (`result.ms`, `result.steps`), and until it is reaped (in the JSON), with its CPU seconds
  (user + system, the task and its children). Its sandbox command also writes the task's
  peak RSS (VmHWM), and exits.
- shell, the strongest baseline a shell user writes (`Baselines.strongest`, one bash script):
  both archives at once, each by `aria2c -x8 -s8` (as many connections as the task), each
  verified (`openssl dgst -sha256`, the digest compared) and extracted (`unsquashfs`, the
  task's own flags: the same bounded caches, the same strictness) as soon as it has landed,
  while the other still comes; the deps tree moved into the checkout; then `git -c
  core.checkStat=minimal -c core.trustctime=false checkout -B` (the index's stat data
  trusted on size and mtime, which unsquashfs restores, as the task adopts it). OpenSSL
  uses the CPU's SHA extensions as the task's hashlib does (coreutils' `sha256sum` does
  not and takes 3.5 times as long).
- aria2c and curl, the plain ones, each step a subprocess one after the other: `aria2c
  -x4 -s4` of both archives at once (from one input file), or `curl -s -f -o` of one, then
  the other; `openssl dgst -sha256` of both; `unsquashfs` of the checkout into `checkout/`
  and of the deps into `checkout/node_modules`; `git checkout -q -B main <commit>`.
- floor: `unsquashfs` of both archives at once from the page cache, nothing else: the CPU
  floor. Each cell prints the floor as this plus the link's floor (`LinkSpec.floor_s` of
  the archives over 8 connections each): what no restore that downloads, then extracts,
  can beat on that link and CPU.

Every baseline's digests and HEAD are checked. The report gives, per cell, medians and
paired ratios (each of ours' runs against the same round's run of each method) as median
(min-max), CPU seconds, where the time goes, and the targets of issue 31 (ours <= 1.0x the
shell, <= 1.1x the floor; the task's peak RSS <= 150 MB and flat in size) as met or NOT
met. It never fails on a target (exit 1 only when the benchmark itself breaks, such as a
restore that does not seed). Inputs are cached in the work dir (default
`$TMPDIR/seedkeeper-bench`); every run, each cell's orders and the seed are written there
as restore-results.json.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

import harness
import slot_task
import workload
from restore_baselines import FLOOR, PLAIN, STRONGEST, Baselines
from restore_report import Result, report

MB = harness.MB
# The commands its runs need besides the harness's, and the Debian packages holding them.
TOOLS = {
    "git": "git",
    "mksquashfs": "squashfs-tools",
    "unsquashfs": "squashfs-tools",
    "openssl": "openssl",
    "curl": "curl",
    "aria2c": "aria2",
}


@dataclass
class Bench(Baselines):
    """A cell's runs at one link and CPU shape: ours, the real task (`tasks`), and the
    baselines, each into a fresh journaled filesystem of its own."""

    tasks: slot_task.Tasks

    def ours(self, case: workload.Input) -> slot_task.TaskRun:
        slot = f"bench-{next(self.counter)}"
        folder = self.runs / slot
        with self.disks.run(folder, workload.capacity(case)) as root:
            workspace = root / "workspace"
            workspace.mkdir()
            return self.tasks.seed(case, slot, workspace, folder)


# -- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=workload.size_for,
        default=[workload.size_for("1 GB"), workload.size_for("300 MB")],
        metavar="SIZE",
        help='the snapshot\'s size: "1 GB", "300 MB", "100 MB" (a smoke run) or any "<N> MB"',
    )
    harness.add_cell_options(parser)
    parser.add_argument(
        "--plain-up-to",
        type=workload.size_for,
        metavar="SIZE",
        help="run the plain baselines (aria2c, curl) only at sizes up to this one; above it, "
        "ours, the shell and the floor (default: every method at every size)",
    )
    harness.add_workdir_option(parser, holds="cached inputs, scratch runs and restore-results.json")
    options = parser.parse_args(argv)
    harness.unwind_on_sigterm()
    console = harness.console(200)
    if harness.missing_tool(console, TOOLS):
        return 1
    workdir: Path = options.workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    os.environ.update(harness.FAKE_AWS)
    disks = harness.Disks()
    specs = [harness.LINKS[name] for name in options.links]
    try:
        with harness.scratch(workdir / "runs"):
            inputs = [workload.build_input(size, workdir, console) for size in options.sizes]
            with harness.cpu_shapes(options.cpus) as shapes:
                setting = {
                    "links": {spec.name: asdict(spec) for spec in specs},
                    "cpu_shapes": [shape.description for shape in shapes],
                    "seed": options.seed,
                    "plain_up_to": options.plain_up_to and options.plain_up_to.label,
                }
                results = measure_all(
                    console,
                    workdir,
                    inputs,
                    specs=specs,
                    shapes=shapes,
                    rounds=options.rounds,
                    rng=random.Random(options.seed),  # noqa: S311 - orders, not secrets
                    disks=disks,
                    plain=(),
                    plain_up_to=options.plain_up_to,
                )
    except harness.BenchError as broken:
        harness.could_not_measure(console, broken)
        return 1
    report(console, inputs, results, disks, workdir, setting=setting)
    return 0  # a report, not a gate


def measure_all(
    console: Console,
    workdir: Path,
    inputs: list[workload.Input],
    *,
    specs: list[harness.LinkSpec],
    shapes: list[harness.CpuShape],
    rounds: int,
    rng: random.Random,
    disks: harness.Disks,
    plain: tuple[str, ...] = PLAIN,
    plain_up_to: workload.Size | None = None,
) -> list[Result]:
    """Per link, CPU shape and size (a cell), `rounds` rounds of every method, each round in
    an order of its own; above `plain_up_to`, of the plain baselines only `plain`."""
    larger = [case for case in inputs if plain_up_to and case.size > plain_up_to.megabytes * MB]
    environment = harness.environment(workdir)
    results: list[Result] = []
    try:
        with slot_task.backend(workdir) as backend:
            slots = itertools.count(1)
            recorded = False
            for spec in specs:
                home = f"nginx-{spec.name}"
                with harness.served(spec, workdir / "archives", workdir, home=home) as server:
                    benches = [
                        Bench(
                            nginx=server,
                            shape=shape,
                            environment=environment,
                            disks=disks,
                            runs=workdir / "runs",
                            counter=slots,
                            tasks=slot_task.Tasks(backend, server, environment, shape),
                        )
                        for shape in shapes
                    ]
                    if not recorded:  # the records the task reads its archives' facts from
                        for case in inputs:
                            benches[0].tasks.record(case)
                        recorded = True
                    console.print(
                        f"{spec.label}: warming up (one untimed run of each, the smallest size)"
                    )
                    smallest = min(inputs, key=lambda case: case.size)
                    benches[-1].ours(smallest)
                    benches[-1].strongest(smallest)
                    for bench in benches:
                        for case in inputs:
                            results.append(
                                measure_cell(
                                    console,
                                    bench,
                                    spec=spec,
                                    case=case,
                                    rounds=rounds,
                                    rng=rng,
                                    plain=plain if case in larger else PLAIN,
                                )
                            )
        return results
    finally:
        shutil.rmtree(workdir / "archives" / slot_task.BUCKET, ignore_errors=True)  # links only


def measure_cell(
    console: Console,
    bench: Bench,
    *,
    spec: harness.LinkSpec,
    case: workload.Input,
    rounds: int,
    rng: random.Random,
    plain: tuple[str, ...] = PLAIN,
) -> Result:
    result = Result(case, spec, bench.shape.label, plain=plain)
    methods = ("ours", *result.measured, FLOOR)
    for index, order in harness.rounds(rounds, methods, rng, result.orders):
        for method in order:
            if method == "ours":
                result.ours.append(bench.ours(case))
            elif method == STRONGEST:
                result.baselines[method].append(bench.strongest(case))
            elif method == FLOOR:
                result.baselines[method].append(bench.floor(case))
            else:
                result.baselines[method].append(bench.plain(case, method))
        ours = result.ours[-1]
        others = ", ".join(
            f"{method} {result.baselines[method][-1].total_s:.2f} s"
            for method in (*result.measured, FLOOR)
        )
        console.print(
            f"  {result.where} #{index + 1}: ours {ours.process_s:.2f} s (restore "
            f"{ours.restore_s:.2f} s, CPU {ours.cpu_s:.2f} s), {others}"
        )
    return result


if __name__ == "__main__":
    sys.exit(main())
