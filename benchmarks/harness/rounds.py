"""Cells and rounds: what a benchmark measures, and in what order.

A cell is a link at a CPU shape (and a size). Each cell runs `--rounds` rounds (at least
MIN_ROUNDS) of every method; each round's order is drawn from `random.Random(--seed)` and
recorded before it runs (`rounds`), so that no method is always the one that finds the
page cache, the disk or the link warmed by another, and a run can be ordered again.
"""

from __future__ import annotations

import argparse
import random
import signal
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from .links import LINKS

MIN_ROUNDS = 5
DEFAULT_CPUS = (1, 2)

M = TypeVar("M")


def default_workdir() -> Path:
    """Where the benchmarks cache their inputs and write their figures, shared by them."""
    return Path(tempfile.gettempdir()) / "seedkeeper-bench"


def add_cell_options(
    parser: argparse.ArgumentParser, *, links: Sequence[str] = tuple(LINKS)
) -> None:
    """--links (default `links`), --cpus, --rounds and --seed, as the restore, resume and
    checkpoint benchmarks take them: every link at every CPU shape is a cell."""
    parser.add_argument(
        "--links",
        nargs="+",
        choices=list(LINKS),
        default=list(links),
        metavar="LINK",
        help=f"the links to measure on, of {', '.join(LINKS)} (default: {' '.join(links)})",
    )
    parser.add_argument(
        "--cpus",
        nargs="+",
        type=int,
        default=list(DEFAULT_CPUS),
        metavar="N",
        help="the task's vCPUs, one series each (a CFS quota; default: 1 2)",
    )
    parser.add_argument(
        "--rounds",
        type=_at_least(MIN_ROUNDS),
        default=MIN_ROUNDS,
        help=f"rounds per cell, each in an order of its own (at least {MIN_ROUNDS})",
    )
    add_seed_option(parser)


def add_seed_option(parser: argparse.ArgumentParser) -> None:
    """--seed: the random orders' seed, recorded in the JSON."""
    parser.add_argument(
        "--seed", type=int, default=1, help="the random orders' seed (recorded in the JSON)"
    )


def add_workdir_option(parser: argparse.ArgumentParser, *, holds: str) -> None:
    """--workdir: the cached inputs and what `holds` says, default `default_workdir()`."""
    parser.add_argument("--workdir", type=Path, default=default_workdir(), help=holds)


def _at_least(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"at least {least}")
        return value

    return parse


def shuffled(methods: Sequence[M], rng: random.Random) -> tuple[M, ...]:
    """One round's order: `methods` in a random order of `rng`'s."""
    order = list(methods)
    rng.shuffle(order)
    return tuple(order)


def rounds(
    count: int, methods: Sequence[M], rng: random.Random, orders: list[tuple[M, ...]]
) -> Iterator[tuple[int, tuple[M, ...]]]:
    """`count` rounds, each (its index, its order): `methods` in an order of its own drawn
    from `rng` and recorded in `orders` before the round runs."""
    for index in range(count):
        order = shuffled(methods, rng)
        orders.append(order)
        yield index, order


def unwind_on_sigterm() -> None:
    """A benchmark stopped by SIGTERM unwinds as on Ctrl-C: the finally blocks remove the
    namespace, cgroups, mounts and servers it made."""

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
