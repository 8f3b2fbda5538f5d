"""The restore benchmark's figures: each cell's runs, their medians and paired ratios, the
report's tables, the targets of issue 31 and the JSON of every run (restore-results.json).
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
from restore_baselines import BASELINES, DESCRIPTIONS, FLOOR, PLAIN, STRONGEST, BaselineRun

MB = harness.MB
# Targets (issue 31), each on the paired median of the whole task process, in every cell.
STRONGEST_TARGET = 1.0  # against the strongest baseline
FLOOR_TARGET = 1.1  # against the CPU floor (unsquashfs of both alone) plus the link floor


@dataclass
class Result:
    case: workload.Input
    link: harness.LinkSpec
    shape: str  # the task's CPU, "1 vCPU"
    ours: list[slot_task.TaskRun] = field(default_factory=list)
    baselines: dict[str, list[BaselineRun]] = field(
        default_factory=lambda: {name: [] for name in (*BASELINES, FLOOR)}
    )
    orders: list[tuple[str, ...]] = field(default_factory=list)  # each round's
    plain: tuple[str, ...] = PLAIN  # the plain baselines run (none above `--plain-up-to`)

    @property
    def measured(self) -> tuple[str, ...]:
        """The baselines run, the strongest first."""
        return (STRONGEST, *self.plain)

    @property
    def where(self) -> str:
        return f"{self.link.name}, {self.case.label}, {self.shape}"

    @property
    def rounds(self) -> int:
        return len(self.ours)

    def median(self, method: str) -> float:
        """The median seconds of a baseline (or the floor's unsquashfs), or of ours' whole
        process."""
        if method == "ours":
            return statistics.median(run.process_s for run in self.ours)
        return statistics.median(run.total_s for run in self.baselines[method])

    def cpu_s(self, method: str) -> float:
        runs = self.ours if method == "ours" else self.baselines[method]
        return statistics.median(run.cpu_s for run in runs)

    @property
    def restore_s(self) -> float:
        return statistics.median(run.restore_s for run in self.ours)

    @property
    def link_floor_s(self) -> float:
        """The least time the link brings both archives, each over the task's ranges."""
        sizes = [archived.size for archived in self.case.archives]
        return self.link.floor_s(sizes, slot_task.TASK_PARTS)

    def floors(self) -> list[float]:
        """Each round's floor: its unsquashfs of both alone, plus the link floor."""
        return [run.total_s + self.link_floor_s for run in self.baselines[FLOOR]]

    @property
    def peak_rss_mb(self) -> float:
        return max(run.peak_rss_kb for run in self.ours) * 1024 / MB

    def paired(self, baseline: str, *, whole: bool = True) -> list[float]:
        """Each of ours' runs (its whole process, else its restore) against the `baseline`
        run of its round (FLOOR: the round's floor): their spread shows the noise."""
        against = (
            self.floors() if baseline == FLOOR else [r.total_s for r in self.baselines[baseline]]
        )
        ours = [run.process_s if whole else run.restore_s for run in self.ours]
        return harness.ratios(ours, against)

    def baseline_steps(self, baseline: str) -> dict[str, float]:
        runs = self.baselines[baseline]
        return {
            name: statistics.median(run.steps_s[name] for run in runs) for name in runs[0].steps_s
        }

    def summary(self) -> dict[str, Any]:
        ratios = {
            f"paired_{'process' if whole else 'restore'}_to_{baseline}": self.paired(
                baseline, whole=whole
            )
            for baseline in (*self.measured, FLOOR)
            for whole in (True, False)
        }
        return {
            "size": self.case.label,
            "link": self.link.name,
            "link_label": self.link.label,
            "cpu": self.shape,
            "rounds": self.rounds,
            "link_floor_s": self.link_floor_s,
            "median_unsquashfs_plus_link_floor_s": statistics.median(self.floors()),
            "median_ours_process_s": self.median("ours"),
            "median_ours_restore_s": self.restore_s,
            **{f"median_{method}_s": self.median(method) for method in (*self.measured, FLOOR)},
            **{
                f"median_{method}_cpu_s": self.cpu_s(method)
                for method in ("ours", *self.measured, FLOOR)
            },
            **ratios,
            "peak_rss_mb": self.peak_rss_mb,
            "ours_steps_median_s": slot_task.task_steps(self.ours),
            **{
                f"{baseline}_steps_median_s": self.baseline_steps(baseline)
                for baseline in self.measured
            },
            "ours_tree_max_rss_mb": max(run.tree_max_rss_kb for run in self.ours) * 1024 / MB,
            "orders": self.orders,
            "runs": {
                "ours": [asdict(run) for run in self.ours],
                **{
                    method: [asdict(run) for run in self.baselines[method]]
                    for method in (*self.measured, FLOOR)
                },
            },
        }


def report(
    console: Console,
    inputs: list[workload.Input],
    results: list[Result],
    disks: harness.Disks,
    workdir: Path,
    *,
    setting: dict[str, Any],
) -> None:
    console.print(_inputs_table(inputs))
    console.print(_results_table(results))
    console.print(_steps_table(results))
    console.print(
        "[dim]ours' steps are the task's own (result.steps, inside result.ms); whatever it "
        "does before its restore's clock starts (its downloads start with the process) falls "
        f"in 'process'. disk: {disks.description}; the archives in the page cache; "
        + "; ".join(f"{method}: {text}" for method, text in DESCRIPTIONS.items())
        + ".[/dim]"
    )
    _targets(console, results)
    harness.write_results(
        console,
        workdir / "restore-results.json",
        {
            "cpus": os.cpu_count(),
            "disk": disks.description,
            **setting,
            "versions": {
                tool: harness.version([tool, flag])
                for tool, flag in (
                    ("unsquashfs", "-version"),
                    ("git", "--version"),
                    ("curl", "--version"),
                    ("aria2c", "--version"),
                    ("nginx", "-v"),
                )
            },
            "task_download_parts": slot_task.TASK_PARTS,
            "methods": DESCRIPTIONS,
            "targets": {
                "process_to_strongest": STRONGEST_TARGET,
                "process_to_floor": FLOOR_TARGET,
                "peak_rss_mb": harness.RSS_TARGET_MB,
                "peak_rss_flat_mb": harness.RSS_FLAT_MB,
            },
            "inputs": [case.summary() for case in inputs],
            "results": [result.summary() for result in results],
        },
    )


def _inputs_table(inputs: list[workload.Input]) -> Table:
    sizes = Table(title="Inputs: the snapshot's two archives (files: regular and links)")
    for column in (
        "size",
        "checkout files",
        "deps files",
        "files",
        "checkout MB",
        "deps MB",
        "archives MB",
        "tree MB",
        "commits",
    ):
        sizes.add_column(column, justify="left" if column == "size" else "right")
    for case in inputs:
        sizes.add_row(
            case.label,
            f"{case.checkout.files:,}",
            f"{case.deps.files:,}",
            f"{case.files:,}",
            f"{case.checkout.size / MB:.1f}",
            f"{case.deps.size / MB:.1f}",
            f"{case.size / MB:.1f}",
            f"{case.raw_bytes / MB:.0f}",
            str(case.commits),
        )
    return sizes


def _results_table(results: list[Result]) -> Table:
    table = Table(
        title="Restore: ours (the whole task process) vs the strongest shell baseline "
        f"({STRONGEST}), aria2c and curl; floor = unsquashfs of both alone + the link's floor "
        "(medians in s, CPU in s; paired ratios as median (min-max))"
    )
    for column in (
        "link",
        "size",
        "CPU",
        "rounds",
        "ours",
        STRONGEST,
        "aria2c",
        "curl",
        "link floor",
        "floor",
        "ours / shell",
        "ours / floor",
        "ours / aria2c",
        "ours / curl",
        "CPU: ours",
        "CPU: shell",
        "peak RSS MB",
    ):
        table.add_column(column, justify="left" if column in ("link", "size", "CPU") else "right")
    for result in results:
        table.add_row(
            result.link.name,
            result.case.label,
            result.shape,
            str(result.rounds),
            f"{result.median('ours'):.2f}",
            f"{result.median(STRONGEST):.2f}",
            *(f"{result.median(m):.2f}" if m in result.plain else "not run" for m in PLAIN),
            f"{result.link_floor_s:.2f}",
            f"{statistics.median(result.floors()):.2f}",
            harness.spread(result.paired(STRONGEST)),
            harness.spread(result.paired(FLOOR)),
            *(harness.spread(result.paired(m)) if m in result.plain else "not run" for m in PLAIN),
            f"{result.cpu_s('ours'):.2f}",
            f"{result.cpu_s(STRONGEST):.2f}",
            f"{result.peak_rss_mb:.1f}",
        )
    return table


def _steps_table(results: list[Result]) -> Table:
    steps = Table(
        title="Where the time goes (medians, seconds; the shell's branches as times from its "
        "start, when each step ended)"
    )
    baselines = [heading for name in BASELINES for heading in (f"{name}: step", "s")]
    for heading in ("cell", "ours: step", "s", *baselines):
        steps.add_column(heading, justify="right" if heading == "s" else "left")
    for result in results:
        listed = [slot_task.task_steps(result.ours)] + [
            result.baseline_steps(baseline) if baseline in result.measured else {}
            for baseline in BASELINES
        ]
        harness.add_side_by_side(steps, result.where, listed)
    return steps


def _targets(console: Console, results: list[Result]) -> None:
    console.print("[bold]Targets[/bold] (paired medians of the whole task process)")
    for result in results:
        strongest = statistics.median(result.paired(STRONGEST))
        harness.verdict(
            console,
            strongest <= STRONGEST_TARGET,
            f"{result.where}: ours / {STRONGEST} {strongest:.2f}, target <= {STRONGEST_TARGET}",
        )
        floor = statistics.median(result.paired(FLOOR))
        harness.verdict(
            console,
            floor <= FLOOR_TARGET,
            f"{result.where}: ours / floor {floor:.2f} (floor "
            f"{statistics.median(result.floors()):.2f} s = unsquashfs "
            f"{result.median(FLOOR):.2f} + link {result.link_floor_s:.2f}), "
            f"target <= {FLOOR_TARGET}",
        )
    harness.peak_rss_verdicts(
        console,
        [(result.case.label, result.case.size, result.peak_rss_mb) for result in results],
        "{label}: task peak RSS {peak:.1f} MB",
    )
