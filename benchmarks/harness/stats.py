"""Paired-run statistics: medians with their spread, and ratios paired by round.

A ratio is never of two medians: each of ours' runs is divided by the run it is paired with
(the same round's run of the other method), and the ratios are reported as their median
(min-max), so that their spread shows the noise both runs shared.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

MB = 1_000_000


def spread(values: Sequence[float], digits: int = 2, *, unit: str = "", to: str = "-") -> str:
    """Median (min-max): "1.23 (1.01-1.75)"; with unit " s" and to " to ", "1.23 s (1.01
    to 1.75)"."""
    return (
        f"{statistics.median(values):.{digits}f}{unit} "
        f"({min(values):.{digits}f}{to}{max(values):.{digits}f})"
    )


def ratios(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Each of ours' runs over the run paired with it (the same round's), in round order."""
    return [mine / other for mine, other in zip(ours, theirs, strict=True)]
