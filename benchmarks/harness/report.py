"""The report: rich tables on a console wide enough for a log, verdicts on the targets, and
every raw run in a JSON file.

A benchmark is a report, not a gate: a target is printed as met or NOT met and never fails
the run; exit 1 only when the benchmark itself breaks (`could_not_measure`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import disks, links

RSS_TARGET_MB = 150.0  # issue 31: a task's or supervisor's peak RSS
# "Not growing with size": the larger archive's peak is within this of the smaller's.
RSS_FLAT_MB = 10.0
REPOSITORY = Path(__file__).resolve().parents[2]
# The commands the harness itself runs (its links', its disks'): each benchmark adds its own.
TOOLS = links.TOOLS | disks.TOOLS


def console(width: int) -> Console:
    """A console at least `width` wide: the tables stay readable in a log."""
    return Console(width=max(Console().width, width))


def could_not_measure(console: Console, broken: Exception) -> None:
    console.print(f"[red]the benchmark could not measure:[/red] {broken}")


def missing_tool(console: Console, tools: Mapping[str, str]) -> bool:
    """Whether a command the harness runs (TOOLS) or of `tools` (the command: its Debian
    package) is missing, said so."""
    for tool, package in (TOOLS | dict(tools)).items():
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            console.print(
                f"[red]{tool} is not installed: apt-get install {package} (make bench "
                "installs it as root)[/red]"
            )
            return True
    return False


def verdict(console: Console, met: bool, text: str) -> None:
    console.print(f"  {'[green]met[/green]    ' if met else '[red]NOT met[/red]'} {text}")


def peak_rss_verdicts(
    console: Console, peaks: Iterable[tuple[str, int, float]], said: str, *, flat: bool = True
) -> None:
    """The peak RSS targets from (size label, size, peak MB) of every cell: per size its
    largest peak at most RSS_TARGET_MB (`said` tells it: "{label}: task peak RSS {peak:.1f}
    MB"), and with `flat` the largest size's within RSS_FLAT_MB of the smallest's."""
    largest: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for label, size, peak in peaks:
        largest[label] = max(largest.get(label, 0.0), peak)
        sizes[label] = size
    for label, peak in largest.items():
        verdict(
            console,
            peak <= RSS_TARGET_MB,
            f"{said.format(label=label, peak=peak)}, target <= {RSS_TARGET_MB:.0f} MB",
        )
    if flat and len(largest) >= 2:
        small, large = min(sizes, key=sizes.__getitem__), max(sizes, key=sizes.__getitem__)
        growth = largest[large] - largest[small]
        verdict(
            console,
            abs(growth) <= RSS_FLAT_MB,
            f"peak RSS {largest[small]:.1f} MB at {small}, {largest[large]:.1f} MB at {large}: "
            f"{growth:+.1f} MB (flat: within {RSS_FLAT_MB:.0f} MB)",
        )


def add_side_by_side(table: Table, where: str, listed: Sequence[Mapping[str, float]]) -> None:
    """One cell's steps, each method's (name, seconds) in two columns of their own, side by
    side; `where` heads its first row, a line closes it."""
    rows = [[(step, f"{seconds:.2f}") for step, seconds in steps.items()] for steps in listed]
    add_rows_side_by_side(table, where, rows, widths=[2] * len(listed))


def add_rows_side_by_side(
    table: Table, where: str, listed: Sequence[Sequence[tuple[str, ...]]], widths: Sequence[int]
) -> None:
    """One cell's rows, each method's (a step and its figures, `widths` columns) in columns
    of their own, side by side; `where` heads its first row, a line closes it."""
    count = max(len(rows) for rows in listed)
    for index in range(count):
        cells = [where if index == 0 else ""]
        for rows, width in zip(listed, widths, strict=True):
            cells += rows[index] if index < len(rows) else ("",) * width
        table.add_row(*cells, end_section=index == count - 1)


def write_results(
    console: Console, path: Path, data: Mapping[str, Any], *, says: str = "figures"
) -> None:
    """The figures and every raw run, as JSON at `path`, with the code they were measured
    with (`code`: so a figure quoted as from the benchmark as committed can be checked), and
    where they are."""
    path.write_text(json.dumps({**data, "code": git_state()}, indent=2))
    console.print(f"{says}: {path}")


def git_state() -> dict[str, Any]:
    """The repository's HEAD and whether the tree differed from it (`git status --porcelain`
    said anything) when the figures were written; None each where git cannot tell."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain")
    return {
        "commit": head.strip() if head is not None else None,
        "dirty": bool(status.strip()) if status is not None else None,
    }


def _git(*args: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(REPOSITORY), *args], check=False, capture_output=True, text=True
    )
    return done.stdout if done.returncode == 0 else None
