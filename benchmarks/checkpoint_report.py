"""The checkpoint benchmark's figures: each cell's runs, their medians and paired ratios,
the report's tables, the targets of issue 31 and the JSON of every raw run
(checkpoint-results.json).
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
import workload
from checkpoint_scripts import PART_BYTES, PART_STREAMS

MB = harness.MB
OURS = "ours"
FILE = "tar+openssl+curl"
STREAMING = "streaming"
METHODS = (OURS, FILE, STREAMING)
BASELINES = (FILE, STREAMING)
STREAMING_TARGET = 1.0  # ours / streaming, at most (issue 31)


@dataclass
class Run:
    method: str
    round: int  # 0-based, in its cell
    position: int  # 0-based place in its round's order
    seconds: float  # the headline: ours' checkpoint (freeze to answer), a baseline's total
    cpu_s: float  # user + system of what `seconds` covers (ours: the checkpoint's)
    sent: list[int]  # the objects' sizes (bytes): one, or the streaming parts
    steps_s: dict[str, float]
    max_rss_kb: int  # wait4's: the largest process of the run (ours: with its children)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent)


@dataclass
class Cell:
    spec: harness.LinkSpec
    vcpus: int
    case: workload.Input
    checkout_bytes: int = 0
    orders: list[tuple[str, ...]] = field(default_factory=list)
    runs: dict[str, list[Run]] = field(default_factory=lambda: {method: [] for method in METHODS})

    @property
    def where(self) -> str:
        return f"{self.spec.name}, {self.vcpus} vCPU, {self.case.label}"

    def median(self, method: str, attribute: str = "seconds") -> float:
        return statistics.median(float(getattr(run, attribute)) for run in self.runs[method])

    def ours_detail(self, name: str) -> list[float]:
        return [float(run.details[name]) for run in self.runs[OURS]]

    def paired(self, baseline: str, *, process: bool = False) -> list[float]:
        """Each round's ours over that round's `baseline`: their spread shows the noise."""
        ours = self.ours_detail("process_s") if process else [r.seconds for r in self.runs[OURS]]
        return harness.ratios(ours, [run.seconds for run in self.runs[baseline]])

    def link_floor_s(self, method: str) -> float:
        """The least time the link takes to carry what `method` sent (its median run's
        objects; the streaming parts all at once)."""
        return statistics.median(self.spec.floor_s(run.sent, 1) for run in self.runs[method])

    def tcp(self, method: str, counter: str) -> float:
        """The median of a TCP counter's growth during the runs of `method`."""
        return statistics.median(float(run.details["tcp"][counter]) for run in self.runs[method])

    def peak_rss_mb(self) -> list[float]:
        return [kb * 1024 / MB for kb in self.ours_detail("peak_rss_kb")]

    def step_medians(self, method: str) -> dict[str, float]:
        runs = self.runs[method]

        def median(name: str) -> float:
            return statistics.median(run.steps_s.get(name, 0.0) for run in runs)

        if method != OURS:
            return {name: median(name) for name in runs[0].steps_s}
        # capture() holds mksquashfs and the hash, and what else it does (the layout check,
        # the config read by git, the rename).
        return {
            "process start, imports, clients": statistics.median(
                run.details["process_s"] - run.seconds for run in runs
            ),
            "freeze (the sync)": median("freeze (sync)"),
            "capture": median("capture"),
            "  mksquashfs": median("mksquashfs"),
            "  sha256 and md5, one pass": median("hash (sha256, md5)"),
            "  layout check, config read, rename": statistics.median(
                run.steps_s.get("capture", 0.0)
                - run.steps_s.get("mksquashfs", 0.0)
                - run.steps_s.get("hash (sha256, md5)", 0.0)
                for run in runs
            ),
            "presigned PUT asked for": median("presign (this benchmark)"),
            "upload": median("upload"),
        }

    def overlapped_s(self) -> float:
        """Ours at best if its upload ran during its capture, as streaming's does: the
        wall time less the shorter of the two, never under its CPU seconds per vCPU."""
        steps = self.step_medians(OURS)
        hidden = min(steps["freeze (the sync)"] + steps["capture"], steps["upload"])
        return max(self.median(OURS) - hidden, self.median(OURS, "cpu_s") / self.vcpus)

    def summary(self) -> dict[str, Any]:
        return {
            "link": self.spec.name,
            "vcpus": self.vcpus,
            "size": self.case.label,
            "files": self.case.files,
            "entries": self.case.entries,
            "checkout_mb": self.checkout_bytes / MB,
            "rounds": len(self.orders),
            "orders": [list(order) for order in self.orders],
            "median_s": {method: self.median(method) for method in METHODS},
            "median_ours_process_s": statistics.median(self.ours_detail("process_s")),
            "median_cpu_s": {method: self.median(method, "cpu_s") for method in METHODS},
            "median_mb_sent": {
                method: statistics.median(run.bytes_sent for run in self.runs[method]) / MB
                for method in METHODS
            },
            "link_floor_s": {method: self.link_floor_s(method) for method in METHODS},
            "paired_ratios": {baseline: self.paired(baseline) for baseline in BASELINES},
            "paired_ratios_process": {
                baseline: self.paired(baseline, process=True) for baseline in BASELINES
            },
            "steps_median_s": {method: self.step_medians(method) for method in METHODS},
            "ours_overlapped_at_best_s": self.overlapped_s(),
            "peak_rss_mb": self.peak_rss_mb(),
            "runs": {method: [asdict(run) for run in self.runs[method]] for method in METHODS},
        }


def report(
    console: Console,
    cells: list[Cell],
    setting: dict[str, Any],
    workdir: Path,
    *,
    store: str,
    disk: str,
) -> None:
    """`store` and `disk` tell where the bodies and the trees were written."""
    for name, spec in setting["links"].items():
        console.print(f"[dim]link {name}: {spec['label']}[/dim]")
    for shape in setting["cpu_shapes"]:
        console.print(f"[dim]CPU {shape}, every timed command inside it[/dim]")
    console.print(_cells_table(cells))
    console.print(
        "[dim]ours = freeze to the upload's answer (what a running supervisor spends); ours' "
        "process adds its interpreter start, imports and clients. CPU = user+sys of the "
        "run's processes (ours: from the freeze on, with mksquashfs); CPU/vCPU is a floor no "
        "run can beat. Link floor: the bytes each sent, at the link's cap after its round "
        "trips. Ratios are paired (each round's ours over that round's baseline).[/dim]"
    )
    cores = os.cpu_count() or 1
    if any(cell.vcpus >= cores and cell.spec.total is not None for cell in cells):
        console.print(
            f"[yellow]This machine has {cores} cores: at {cores} vCPU the task may take all "
            "of them, and nginx (TLS, the bodies), the delay line and the kernel's forwarding "
            "compete with it for the CPU the total link needs; there the link is slower than "
            "its cap, for every method alike.[/yellow]"
        )
    console.print(_steps_table(cells))
    console.print(_memory_table(cells))
    if not all(run.details["hwm_reset"] for cell in cells for run in cell.runs[OURS]):
        console.print(
            "[yellow]VmHWM could not be reset: the peak includes the process start[/yellow]"
        )
    console.print(
        f"[dim]store: nginx's dav module, bodies on {store}, outside the "
        f"CPU shape; disk: {disk}; the tree as the restore leaves it "
        "(extracted, synced, in the page cache), each capture or archive written beside it."
        "[/dim]"
    )
    _targets(console, cells)
    harness.write_results(
        console,
        workdir / "checkpoint-results.json",
        setting
        | {
            "cores": os.cpu_count(),
            "disk": disk,
            "store": f"nginx dav, bodies on {store}",
            "streaming": {"part_bytes": PART_BYTES, "parts_at_once": PART_STREAMS},
            "mksquashfs": harness.version(["mksquashfs", "-version"]),
            "tar": harness.version(["tar", "--version"]),
            "zstd": harness.version(["zstd", "--version"]),
            "openssl": harness.version(["openssl", "version"]),
            "curl": harness.version(["curl", "--version"]),
            "targets": {
                "ours_over_streaming": STREAMING_TARGET,
                "peak_rss_mb": harness.RSS_TARGET_MB,
                "flat_mb": harness.RSS_FLAT_MB,
            },
            "cells": [cell.summary() for cell in cells],
        },
        says="figures and raw runs",
    )


def _cells_table(cells: list[Cell]) -> Table:
    table = Table(
        title="Checkpoint per cell: ours vs tar+openssl+curl and streaming multipart "
        "(medians in s, (min-max) over the rounds; paired ratios as median (min-max))"
    )
    for column in (
        "cell",
        "method",
        "s",
        "ours / it",
        "ours' process / it",
        "CPU s",
        "CPU / vCPU",
        "MB sent",
        "link floor s",
        "TCP retrans. (RTOs)",
    ):
        table.add_column(column, justify="left" if column in ("cell", "method") else "right")
    for cell in cells:
        for index, method in enumerate(METHODS):
            runs = cell.runs[method]
            seconds = [run.seconds for run in runs]
            ours = method == OURS
            table.add_row(
                cell.where if index == 0 else "",
                f"ours ({len(runs)} rounds)" if ours else method,
                harness.spread(seconds),
                "" if ours else harness.spread(cell.paired(method)),
                "" if ours else harness.spread(cell.paired(method, process=True)),
                f"{cell.median(method, 'cpu_s'):.2f}",
                f"{cell.median(method, 'cpu_s') / cell.vcpus:.2f}",
                f"{statistics.median(run.bytes_sent for run in runs) / MB:.1f}",
                f"{cell.link_floor_s(method):.2f}",
                f"{cell.tcp(method, 'RetransSegs'):.0f} ({cell.tcp(method, 'TCPTimeouts'):.0f})",
            )
        process = cell.ours_detail("process_s")
        table.add_row(
            "",
            "ours' process",
            harness.spread(process),
            "",
            "",
            f"{statistics.median(cell.ours_detail('process_cpu_s')):.2f}",
            "",
            "",
            "",
            "",
            end_section=True,
        )
    return table


def _steps_table(cells: list[Cell]) -> Table:
    table = Table(title="Where the time goes (medians, seconds)")
    for heading in ("cell", "ours: step", "s", f"{FILE}: step", "s", f"{STREAMING}: step", "s"):
        table.add_column(heading, justify="right" if heading == "s" else "left")
    for cell in cells:
        harness.add_side_by_side(
            table, cell.where, [cell.step_medians(method) for method in METHODS]
        )
    return table


def _memory_table(cells: list[Cell]) -> Table:
    table = Table(title="Memory (MB; medians, max in brackets)")
    for heading in (
        "cell",
        "ours: peak RSS (VmHWM)",
        "ours: before (VmRSS)",
        "mksquashfs, at most",
        f"{FILE}: largest, at most",
        f"{STREAMING}: uploader (VmHWM)",
        f"{STREAMING}: largest, at most",
    ):
        table.add_column(heading, justify="left" if heading == "cell" else "right")

    def shown(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({max(values):.1f})"

    def mb(values: list[int] | list[float]) -> list[float]:
        return [value * 1024 / MB for value in values]

    for cell in cells:
        table.add_row(
            cell.where,
            shown(cell.peak_rss_mb()),
            shown(mb(cell.ours_detail("resident_kb"))),
            # wait4's max RSS counts what a child shares with its parent when forked: read
            # these as upper bounds.
            shown(mb(cell.ours_detail("children_max_rss_kb"))),
            shown(mb([run.max_rss_kb for run in cell.runs[FILE]])),
            shown(mb([run.details["uploader_peak_rss_kb"] for run in cell.runs[STREAMING]])),
            shown(mb([run.max_rss_kb for run in cell.runs[STREAMING]])),
        )
    return table


def _targets(console: Console, cells: list[Cell]) -> None:
    console.print("[bold]Targets[/bold] (paired medians; ours = freeze to the upload's answer)")
    for cell in cells:
        ratio = statistics.median(cell.paired(STREAMING))
        harness.verdict(
            console,
            ratio <= STREAMING_TARGET,
            f"{cell.where}: ours / {STREAMING} {ratio:.2f} ({cell.median(OURS):.2f} s against "
            f"{cell.median(STREAMING):.2f} s), target <= {STREAMING_TARGET}",
        )
    harness.peak_rss_verdicts(
        console,
        [(cell.case.label, cell.case.size, max(cell.peak_rss_mb())) for cell in cells],
        "{label}: the supervisor's peak RSS while checkpointing {peak:.1f} MB (max over "
        "every cell)",
    )
    losing = [cell for cell in cells if statistics.median(cell.paired(STREAMING)) > 1.0]
    if not losing:
        return
    console.print(
        "[bold]Where ours loses to streaming[/bold]: it uploads only after capturing "
        "(mksquashfs seeks back to write its superblock and tables, so its output is hashed "
        "and sent once complete), where streaming sends each part as it is compressed"
    )
    winning = 0
    for cell in losing:
        steps = cell.step_medians(OURS)
        capture = steps["freeze (the sync)"] + steps["capture"]
        compressed = cell.step_medians(STREAMING)["tar | zstd, until its last byte"]
        best = cell.overlapped_s()
        winning += best <= cell.median(STREAMING) * STREAMING_TARGET
        console.print(
            f"  {cell.where}: capture {capture:.2f} s, then upload {steps['upload']:.2f} s "
            f"(link floor {cell.link_floor_s(OURS):.2f} s for its "
            f"{cell.median(OURS, 'bytes_sent') / MB:.1f} MB; streaming compresses in "
            f"{compressed:.2f} s to {cell.median(STREAMING, 'bytes_sent') / MB:.1f} MB, with "
            f"CPU {cell.median(STREAMING, 'cpu_s'):.2f} s against ours' "
            f"{cell.median(OURS, 'cpu_s'):.2f} s); overlapped, at best {best:.2f} s (the wall "
            f"less the shorter of the two, never under its CPU / {cell.vcpus} vCPU): "
            f"{best / cell.median(STREAMING):.2f}x streaming's {cell.median(STREAMING):.2f} s"
        )
    console.print(
        f"  streaming our capture would meet the target, at best, in {winning} of the "
        f"{len(losing)} cells ours loses; in the rest its capture alone costs more than "
        "streaming's compression and upload."
    )
