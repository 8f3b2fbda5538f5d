"""The resume benchmark's figures: each cell's runs, their medians and paired ratios, the
report's tables, the target of issue 31 and the JSON of every run (resume-results.json).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import harness
import slot_task
import workload
from restore_baselines import SHA256_COMMAND, aria2c_command
from seedkeeper_task.restore.extract import UNSQUASHFS_COMMAND

MB = harness.MB
TARGET = 0.9  # issue 31: resume / its baseline, the paired median, in every cell
RESUME, SEED, BASELINE, FLOOR = "resume", "seed", "baseline", "floor"
METHODS = (RESUME, SEED, BASELINE, FLOOR)
# The ranges the task downloads at once (`download_parts`): aria2c's connections, and the
# link floor's.
STREAMS = slot_task.TASK_PARTS
ARIA2C = aria2c_command(STREAMS)


@dataclass
class ShellRun:
    total_s: float  # spawn to reap, inside the shape
    steps_s: dict[str, float]  # each step's wall time, from the script's marks
    steps_cpu_s: dict[str, float]  # each step's processes' user + system
    cpu_s: float  # user + system of everything it ran, the shell included
    max_rss_kb: int  # its largest process


@dataclass
class Result:
    """One cell (a link, a CPU shape, a size): its rounds."""

    case: workload.Input
    link: harness.LinkSpec
    cpus: int  # the CPU shape's vCPUs
    cpu_shape: str  # its description, as it was while measured
    parkable: slot_task.Parkable
    resume: list[slot_task.TaskRun] = field(default_factory=list)
    seed: list[slot_task.TaskRun] = field(default_factory=list)
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
        return harness.ratios([run.process_s for run in self.resume], others[method])

    def baseline_to_floor(self) -> list[float]:
        return harness.ratios([run.total_s for run in self.baseline], self.floors())

    @staticmethod
    def shell_steps(runs: list[ShellRun]) -> dict[str, tuple[float, float]]:
        """(wall, CPU) medians per step, and the shell's own share (its start, its marks)."""
        steps = {
            name: (
                statistics.median([run.steps_s[name] for run in runs]),
                statistics.median([run.steps_cpu_s[name] for run in runs]),
            )
            for name in runs[0].steps_s
        }
        steps["shell (start, cgroup, marks)"] = (
            statistics.median([run.total_s - sum(run.steps_s.values()) for run in runs]),
            statistics.median([run.cpu_s - sum(run.steps_cpu_s.values()) for run in runs]),
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
                RESUME: statistics.median([run.process_s for run in self.resume]),
                "resume_restore": statistics.median([run.restore_s for run in self.resume]),
                SEED: statistics.median([run.process_s for run in self.seed]),
                BASELINE: statistics.median([run.total_s for run in self.baseline]),
                "cpu_floor": statistics.median([run.total_s for run in self.floor]),
            },
            "link_floor_s": self.link_floor_s,
            "floor_s": statistics.median(self.floors()),
            "median_cpu_s": {
                RESUME: statistics.median([run.cpu_s for run in self.resume]),
                SEED: statistics.median([run.cpu_s for run in self.seed]),
                BASELINE: statistics.median([run.cpu_s for run in self.baseline]),
                FLOOR: statistics.median([run.cpu_s for run in self.floor]),
            },
            "paired": {
                "resume_to_baseline": self.resume_to(BASELINE),
                "resume_to_seed": self.resume_to(SEED),
                "resume_to_floor": self.resume_to(FLOOR),
                "baseline_to_floor": self.baseline_to_floor(),
                "resume_restore_to_baseline": harness.ratios(
                    [run.restore_s for run in self.resume], [run.total_s for run in self.baseline]
                ),
            },
            "target": {"resume_to_baseline_at_most": TARGET, "met": self.met},
            "resume_steps_median_s": slot_task.task_steps(self.resume),
            "seed_steps_median_s": {
                name: statistics.median([run.steps_ms.get(name, 0) for run in self.seed]) / 1000
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
        return statistics.median(self.resume_to(BASELINE)) <= TARGET

    @property
    def peak_rss_mb(self) -> float:
        return max(run.peak_rss_kb for run in self.resume) * 1024 / MB


def report(
    console: Console,
    results: list[Result],
    disks: harness.Disks,
    workdir: Path,
    *,
    seed: int,
) -> None:
    summaries = [result.summary() for result in results]
    console.print(_results_table(results, summaries))
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
    harness.write_results(
        console,
        workdir / "resume-results.json",
        {
            "seed": seed,
            "cpus": os.cpu_count(),
            "disk": disks.description,
            "links": {
                name: spec.label
                for name, spec in harness.LINKS.items()
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
                tool: harness.version([tool, flag])
                for tool, flag in (
                    ("unsquashfs", "-version"),
                    ("mksquashfs", "-version"),
                    ("aria2c", "--version"),
                    ("openssl", "version"),
                    ("nginx", "-v"),
                )
            },
            "target": {"resume_to_baseline_at_most": TARGET},
            "results": summaries,
        },
    )


def _results_table(results: list[Result], summaries: list[dict[str, Any]]) -> Table:
    """The cells' figures, from their summaries (`Result.summary`, in the same order)."""
    spread = harness.spread
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
    for result, summary in zip(results, summaries, strict=True):
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
            (name, f"{seconds:.2f}")
            for name, seconds in slot_task.task_steps(result.resume).items()
        ]
        resume.append(
            (
                "CPU (task + children)",
                f"{statistics.median([run.cpu_s for run in result.resume]):.2f}",
            )
        )
        baseline: list[tuple[str, str, str]] = [
            (name, f"{wall:.2f}", f"{cpu:.2f}")
            for name, (wall, cpu) in result.shell_steps(result.baseline).items()
        ]
        baseline.append(
            (
                "whole",
                f"{statistics.median([run.total_s for run in result.baseline]):.2f}",
                f"{statistics.median([run.cpu_s for run in result.baseline]):.2f}",
            )
        )
        cpu_floor = statistics.median([run.total_s for run in result.floor])
        floor_cpu = statistics.median([run.cpu_s for run in result.floor])
        floor = [
            (f"unsquashfs alone (CPU {floor_cpu:.2f} s)", f"{cpu_floor:.2f}"),
            (f"link, {STREAMS} connections", f"{result.link_floor_s:.2f}"),
            ("floor", f"{cpu_floor + result.link_floor_s:.2f}"),
        ]
        harness.add_rows_side_by_side(
            steps, result.where, [resume, baseline, floor], widths=(2, 3, 2)
        )
    return steps


def _targets(console: Console, results: list[Result]) -> None:
    console.print(
        f"[bold]Target[/bold] (issue 31): resume <= {TARGET}x its baseline, the paired "
        "median of the whole task process, in every cell"
    )
    for result in results:
        paired = result.resume_to(BASELINE)
        harness.verdict(
            console,
            result.met,
            f"{result.where}: resume / baseline {harness.spread(paired)}, target <= {TARGET}",
        )
        if not result.met:
            console.print(f"            {_where_the_time_goes(result)}")
    harness.peak_rss_verdicts(
        console,
        [(result.case.label, result.case.size, result.peak_rss_mb) for result in results],
        "{label}: the resuming task's peak RSS {peak:.1f} MB",
        flat=False,
    )


def _where_the_time_goes(result: Result) -> str:
    """Both sides, step by step, and what the resume would have to take."""
    resume = " + ".join(
        f"{name.split(' (')[0]} {seconds:.2f}"
        for name, seconds in slot_task.task_steps(result.resume).items()
    )
    shell = result.shell_steps(result.baseline)
    baseline = " + ".join(f"{name.split(' (')[0]} {wall:.2f}" for name, (wall, _) in shell.items())
    resumed = statistics.median([run.process_s for run in result.resume])
    base = statistics.median([run.total_s for run in result.baseline])
    cpu_floor = statistics.median([run.total_s for run in result.floor])
    floor = cpu_floor + result.link_floor_s
    resume_cpu = statistics.median([run.cpu_s for run in result.resume])
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
        f"{baseline} (CPU {statistics.median([run.cpu_s for run in result.baseline]):.2f} s); "
        f"{TARGET}x the baseline is {TARGET * base:.2f} s"
        + "".join(f" ({note})" for note in notes)
        + f"; the floor {floor:.2f} s ({cpu_floor:.2f} s unsquashfs + "
        f"{result.link_floor_s:.2f} s link)"
    )
