"""The harness the benchmarks share (`make bench`), so that each measures the same way.

- `links`: the links a cell measures on (nginx per connection, capped in all with a round
  trip over HTTPS, loopback), their floors, and objects laid where nginx answers R2's GETs;
- `cpu`: the task's CPU shapes, a CFS quota on a cgroup of the benchmark's own;
- `disks`: a fresh journaled filesystem per run, and the scratch folders cleared of what a
  killed run left;
- `runs`: one command timed from spawn to reap (wall, CPU, peak RSS), inside its shape, in
  an environment free of a developer's settings;
- `rounds`: cells of rounds, each round's order shuffled by a recorded seed, and the
  options that choose them;
- `stats`: medians with their spread, and ratios paired by round;
- `report`: the commands the harness needs, the console, the tables' side-by-side steps,
  the targets' verdicts and the JSON of every raw run with the commit it was measured at.

The benchmarks run as scripts (`python benchmarks/restore.py`): their folder is on sys.path
and they import this package as `harness`.
"""

from .cpu import CpuShape, cpu_shapes
from .disks import Disks, scratch, settle_disk
from .links import (
    LINKS,
    LinkSpec,
    Nginx,
    parse_rate,
    rate_bytes,
    rate_label,
    serve_object,
    served,
)
from .report import (
    RSS_FLAT_MB,
    RSS_TARGET_MB,
    add_rows_side_by_side,
    add_side_by_side,
    console,
    could_not_measure,
    missing_tool,
    peak_rss_verdicts,
    verdict,
    write_results,
)
from .rounds import (
    add_cell_options,
    add_seed_option,
    add_workdir_option,
    default_workdir,
    rounds,
    shuffled,
    unwind_on_sigterm,
)
from .runs import (
    FAKE_AWS,
    GIT_ENV,
    REGION,
    BenchError,
    Timed,
    deadline,
    environment,
    free_port,
    reaped,
    run_checked,
    stop_process,
    timed_run,
    timed_step,
    version,
)
from .stats import MB, ratios, spread

__all__ = [
    "FAKE_AWS",
    "GIT_ENV",
    "LINKS",
    "MB",
    "REGION",
    "RSS_FLAT_MB",
    "RSS_TARGET_MB",
    "BenchError",
    "CpuShape",
    "Disks",
    "LinkSpec",
    "Nginx",
    "Timed",
    "add_cell_options",
    "add_rows_side_by_side",
    "add_seed_option",
    "add_side_by_side",
    "add_workdir_option",
    "console",
    "could_not_measure",
    "cpu_shapes",
    "deadline",
    "default_workdir",
    "environment",
    "free_port",
    "missing_tool",
    "parse_rate",
    "peak_rss_verdicts",
    "rate_bytes",
    "rate_label",
    "ratios",
    "reaped",
    "rounds",
    "run_checked",
    "scratch",
    "serve_object",
    "served",
    "settle_disk",
    "shuffled",
    "spread",
    "stop_process",
    "timed_run",
    "timed_step",
    "unwind_on_sigterm",
    "verdict",
    "version",
    "write_results",
]
