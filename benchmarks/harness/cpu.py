"""The task's CPU: the shapes every timed command of a cell runs inside.

An ECS task's CPU is a CFS quota on its cgroup (Docker's `--cpus`; a Fargate task at 1 vCPU
may see more cores than it may use). A shape makes a cgroup of its own with
`cpu.cfs_quota_us` (v1) or `cpu.max` (v2) of that many cores, and `wrap`s a command so that
it and all it starts run inside; nginx, moto and the benchmark's own process (the checkpoint
function) stay outside, as R2 and AWS's side are not the task's. Without a writable cgroup
(not root), `taskset` pins the command to that many cores instead, and `description` says
so.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .runs import BenchError

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
QUOTA_PERIOD_US = 100_000


class CpuShape:
    """`count` vCPUs as ECS gives a task them: a CFS quota of `count` cores on a cgroup of
    its own (or, without one, `taskset` to `count` cores)."""

    def __init__(self, count: int) -> None:
        if not 1 <= count <= (os.cpu_count() or 1):
            raise BenchError(f"{count} vCPU: this machine has {os.cpu_count()} cores")
        self.count = count
        self.cgroup: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.count} vCPU"

    @property
    def task_environment(self) -> dict[str, str]:
        """What the template tells a task of this CPU (its SlotCpu, 1024 units a vCPU)."""
        return {"SEEDKEEPER_CPU_UNITS": str(self.count * 1024)}

    @property
    def description(self) -> str:
        if self.cgroup is not None:
            return f"{self.label}: CFS quota {self.count} x {QUOTA_PERIOD_US} us per period"
        return f"{self.label}: taskset to {self.count} cores (no writable cgroup)"

    def start(self) -> None:
        name = f"seedkeeper-bench-{self.count}cpu-{os.getpid()}"
        quota = str(self.count * QUOTA_PERIOD_US)
        with contextlib.suppress(OSError):
            if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
                group = CGROUP_V1 / name
                group.mkdir(exist_ok=True)
                (group / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(quota)
                self.cgroup = group
            elif "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
                group = CGROUP_V2 / name
                group.mkdir(exist_ok=True)
                (group / "cpu.max").write_text(f"{quota} {QUOTA_PERIOD_US}")
                self.cgroup = group

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this shape: it moves itself into the cgroup, then execs."""
        if self.cgroup is None:
            return ["taskset", "-c", f"0-{self.count - 1}", *argv]
        procs = str(self.cgroup / "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def stop(self) -> None:
        if self.cgroup is not None:
            for _ in range(50):  # its last processes may still be leaving
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            self.cgroup = None


@contextlib.contextmanager
def cpu_shapes(counts: Sequence[int]) -> Iterator[list[CpuShape]]:
    shapes = [CpuShape(count) for count in counts]
    try:
        for shape in shapes:
            shape.start()
        yield shapes
    finally:
        for shape in shapes:
            shape.stop()
