"""The restore benchmark's baselines: what a shell user writes to do the task's restore.

Each does the task's work (download, verify, extract, check out) on the same link, disk
and CPU, every timed command inside the cell's CPU shape, into a fresh journaled filesystem
of its own; its digests and HEAD are checked (restore.py's docstring tells each).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import harness
import slot_task
import workload
from seedkeeper.domain.plan import DEPS_PATH

# The strongest baseline a shell user writes (`Baselines.strongest`): both archives at once,
# each over as many connections as the task opens, each extracted as soon as it has landed
# and verified, then git trusting the restored stat data as far as git can.
STRONGEST = "shell"
STRONGEST_GIT = ("-c", "core.checkStat=minimal", "-c", "core.trustctime=false")
# The plain ones: one step after another, git as it comes.
ARIA2C_CONNECTIONS = 4
PLAIN = ("aria2c", "curl")
BASELINES = (STRONGEST, *PLAIN)
FLOOR = "floor"  # unsquashfs of both archives at once, nothing else: the CPU floor
DESCRIPTIONS = {
    "ours": "the slot task, its whole process",
    STRONGEST: f"aria2c -x{slot_task.TASK_PARTS} per archive, both at once, each verified and "
    "extracted as it lands; git checkout with core.checkStat=minimal, trustctime=false",
    "aria2c": f"aria2c -x{ARIA2C_CONNECTIONS} of both; then sha256, unsquashfs each, git checkout",
    "curl": "curl of one archive, then the other; then sha256, unsquashfs each, git checkout",
    FLOOR: "unsquashfs of both archives at once from the page cache, nothing else",
}
# The baselines' verification: OpenSSL's sha256, as fast as the task's (CPU extensions);
# `-r` prints "<digest> *<file>", as sha256sum does.
SHA256_COMMAND = ("openssl", "dgst", "-sha256", "-r")


def aria2c_command(connections: int) -> tuple[str, ...]:
    """aria2c with `connections` per file, every piece at least 1 MiB, the file written as
    it comes (no preallocation), no configuration file read."""
    return (
        "aria2c",
        "--no-conf",
        "-q",
        f"-x{connections}",
        f"-s{connections}",
        "-k1M",
        "--file-allocation=none",
    )


@dataclass
class BaselineRun:
    total_s: float
    steps_s: dict[str, float]
    max_rss_kb: dict[str, int]
    cpu_s: float = 0.0  # user + system of every process it ran


@dataclass
class Baselines:
    """The baselines' runs at one link (its nginx) and CPU shape."""

    nginx: harness.Nginx
    shape: harness.CpuShape  # every timed command runs inside it
    environment: dict[str, str]  # what every subprocess inherits: no SEEDKEEPER_*, fake AWS
    disks: harness.Disks
    runs: Path  # the runs' folders
    counter: Iterator[int]  # numbers the runs' folders

    def folder(self, method: str) -> Path:
        """A new run's own folder."""
        return self.runs / f"{method}-{next(self.counter)}"

    def plain(self, case: workload.Input, downloader: str) -> BaselineRun:
        """`downloader` (curl or aria2c) fetching both archives, `openssl dgst -sha256` (the task
        verifies too), `unsquashfs` with the task's own flags (the same bounded caches, the
        same strictness) of each, where the task puts it, and `git checkout -B`; each a
        subprocess, one after the other, into a fresh journaled filesystem; the digests and
        HEAD checked."""
        folder = self.folder(downloader)
        steps: dict[str, float] = {}
        rss: dict[str, int] = {}
        cpu = 0.0
        with self.disks.run(folder, workload.capacity(case)) as root:
            checkout = root / "checkout"
            commands = {
                downloader: self._download(downloader, case, root, folder),
                "sha256": [*SHA256_COMMAND, *(str(root / a.path.name) for a in case.archives)],
            }
            for kind, archived, target in (
                ("checkout", case.checkout, checkout),
                ("deps", case.deps, checkout / DEPS_PATH),
            ):
                archive = str(root / archived.path.name)
                unsquashfs = slot_task.task_unsquashfs(self.shape)
                commands[f"unsquashfs {kind}"] = [*unsquashfs, "-d", str(target), archive]
            git = ["git", "-C", str(checkout)]
            commands["git checkout"] = [*git, "checkout", "-q", "-B", workload.REF, case.commit]
            harness.settle_disk()
            for name, argv in commands.items():
                timed = self._step(name, argv, folder)
                steps[name], rss[name] = timed.seconds, timed.max_rss_kb
                cpu += timed.cpu_s
            listed = (folder / "sha256.log").read_text().splitlines()
            digests = [line.split()[0] for line in listed if line]
            if digests != [archived.sha256 for archived in case.archives]:
                raise harness.BenchError(f"{downloader}: the archives' digests are wrong")
            if slot_task.head(checkout) != case.commit:
                raise harness.BenchError(f"{downloader}: HEAD is not the snapshot's commit")
        return BaselineRun(total_s=sum(steps.values()), steps_s=steps, max_rss_kb=rss, cpu_s=cpu)

    def strongest(self, case: workload.Input) -> BaselineRun:
        """The strongest restore a shell user writes, one bash script: both archives at once
        (aria2c, as many connections per archive as the task opens), each verified
        (`openssl dgst -sha256`, digest compared) and extracted (`unsquashfs`, the task's
        flags) as soon as it has landed while the other still comes, the deps tree moved
        into the checkout, then `git checkout` with `core.checkStat=minimal` and
        `core.trustctime=false` (the index's stat data trusted on size and mtime, which
        unsquashfs restores). Its steps: when each branch's download, verification and
        extraction ended, and git's time."""
        folder = self.folder(STRONGEST)
        marks = folder / "marks"
        with self.disks.run(folder, workload.capacity(case)) as root:
            checkout, deps = root / "checkout", root / "deps"
            branches = [
                shlex.join(
                    [
                        "branch",
                        kind,
                        self.nginx.url(archived.path),
                        archived.path.name,
                        archived.sha256,
                        str(target),
                    ]
                )
                + " &"
                for kind, archived, target in (
                    ("checkout", case.checkout, checkout),
                    ("deps", case.deps, deps),
                )
            ]
            aria2c = shlex.join([*self._aria2c(slot_task.TASK_PARTS), "-d", str(root)])
            unsquashfs = shlex.join(slot_task.task_unsquashfs(self.shape))
            git = shlex.join(["git", *STRONGEST_GIT, "-C", str(checkout)])
            script = f"""set -eu
mark() {{ echo "$1 $(date +%s.%N)" >> {shlex.quote(str(marks))}; }}
branch() {{
    {aria2c} -o "$3" "$2"
    mark "$1 download"
    digest=$(openssl dgst -sha256 -r {shlex.quote(str(root))}/"$3")
    [ "${{digest%% *}}" = "$4" ] || {{ echo "$1: wrong digest" >&2; exit 1; }}
    mark "$1 verify"
    {unsquashfs} -d "$5" {shlex.quote(str(root))}/"$3"
    mark "$1 unsquashfs"
}}
mark start
{branches[0]}
checkout=$!
{branches[1]}
deps=$!
wait "$checkout"
wait "$deps"
mv {shlex.quote(str(deps))} {shlex.quote(str(checkout / DEPS_PATH))}
{git} checkout -q -B {workload.REF} {case.commit}
mark git
"""
            harness.settle_disk()
            timed = self._step(STRONGEST, ["bash", "-c", script], folder)
            if slot_task.head(checkout) != case.commit or not (checkout / DEPS_PATH).is_dir():
                raise harness.BenchError(f"{STRONGEST}: HEAD is not the snapshot's commit")
            times = dict(line.rsplit(" ", 1) for line in marks.read_text().splitlines())
        start = float(times.pop("start"))
        git_s = float(times.pop("git")) - max(map(float, times.values()))
        steps = {name: float(at) - start for name, at in times.items()} | {"git checkout": git_s}
        return BaselineRun(
            total_s=timed.seconds,
            steps_s=steps,
            max_rss_kb={STRONGEST: timed.max_rss_kb},
            cpu_s=timed.cpu_s,
        )

    def floor(self, case: workload.Input) -> BaselineRun:
        """The CPU floor: `unsquashfs` (the task's flags) of both archives at once, from the
        page cache into a fresh filesystem, nothing else."""
        folder = self.folder(FLOOR)
        with self.disks.run(folder, workload.capacity(case)) as root:
            both = " & ".join(
                shlex.join(
                    [
                        *slot_task.task_unsquashfs(self.shape),
                        "-d",
                        str(root / kind),
                        str(archived.path),
                    ]
                )
                for kind, archived in (("checkout", case.checkout), ("deps", case.deps))
            )
            harness.settle_disk()
            timed = self._step(FLOOR, ["bash", "-c", f"set -e; {both} & wait %1; wait %2"], folder)
        return BaselineRun(
            total_s=timed.seconds,
            steps_s={"unsquashfs both": timed.seconds},
            max_rss_kb={FLOOR: timed.max_rss_kb},
            cpu_s=timed.cpu_s,
        )

    def _step(self, name: str, argv: Sequence[str], folder: Path) -> harness.Timed:
        """One timed command inside the task's CPU shape, trusting the link; its output in
        `folder`/<name>.log, a failure raised with its tail."""
        environment = self.environment | self.nginx.client_environment()
        return harness.timed_step(name, argv, folder, shape=self.shape, env=environment)

    def _download(
        self, downloader: str, case: workload.Input, root: Path, folder: Path
    ) -> list[str]:
        """The download's command: both archives into `root`, under their own names."""
        if downloader == "curl":  # one stream at a time, one archive after the other
            argv = ["curl", "-s", "-f", *self.nginx.curl_options()]
            for archived in case.archives:
                argv += ["-o", str(root / archived.path.name), self.nginx.url(archived.path)]
            return argv
        # Both at once from one input file, its connections each.
        listing = folder / "aria2c.input"
        listing.write_text(
            "".join(
                f"{self.nginx.url(archived.path)}\n  out={archived.path.name}\n"
                for archived in case.archives
            )
        )
        return [*self._aria2c(ARIA2C_CONNECTIONS), "-d", str(root), "-i", str(listing)]

    def _aria2c(self, connections: int) -> list[str]:
        """aria2c with `connections` per file, every piece at least 1 MiB, the file written
        as it comes (no preallocation), no configuration file read, the link trusted."""
        return [
            *aria2c_command(connections),
            "--allow-overwrite=true",
            "--auto-file-renaming=false",
            *self.nginx.aria2c_options(),
        ]
