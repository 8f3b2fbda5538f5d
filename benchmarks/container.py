"""A seed in the slot container against the same seed as a local process (`make bench`).

One local stack, one published snapshot; each pair seeds two new slots from it, one with
each runtime (`SEEDKEEPER_RUNTIME` docker or local, read by the handlers in this process),
the order alternating. Measured per seed: the executor's wall time from the first POST
/seed to the `seeded` answer (polls every 50 ms, so up to 50 ms of it is the poll's), and
the restore the task reports (`ms`: download, extract, fix-up, marker). Their difference is
what a task costs before and after its restore: launch, interpreter start, imports, reads,
settle. Reported: medians with their spread over the pairs, and the paired ratio.

Without a Docker engine (or the image) it says so and exits 0: nothing to compare.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from botocore.credentials import Credentials
from rich.console import Console
from rich.table import Table

import harness
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.observability import logger
from seedkeeper_client import OwnerClaim, Seeded, SeedIdentity, SeedkeeperClient
from seedkeeper_tools.demo import published_snapshot, sample_repository
from seedkeeper_tools.local.docker import DEFAULT_IMAGE, DockerRuntime
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.stack import LocalStack

ORIGIN = "https://git.example.com/bench/widgets.git"
RUNTIMES = ("local", "docker")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Seed:
    wall: float  # seconds, POST to `seeded`
    restore: float  # seconds, as the task reports it

    @property
    def around(self) -> float:
        return self.wall - self.restore


def seed_once(client: SeedkeeperClient, slot: str, seed: SeedIdentity) -> Seed:
    claim = OwnerClaim(
        run=slot,
        requester="bench",
        thread=slot,
        repository="bench/widgets",
        ref=seed.ref,
        head=seed.sha,
    )
    started = time.monotonic()
    answer = client.seed(slot, seed, claim=claim, origin=ORIGIN, wait=True, interval=0.05)
    wall = time.monotonic() - started
    if not isinstance(answer, Seeded):
        raise RuntimeError(f"{slot}: {answer}")
    return Seed(wall=wall, restore=answer.ms / 1000)


def run(root: Path, pairs: int, image: str) -> dict[str, list[Seed]]:
    stack = LocalStack(
        data_dir=root / "data",
        port=0,
        credentials=LocalCredentials("bench", secrets.token_hex(16)),
        sweep_interval=3600,
    ).start()
    results: dict[str, list[Seed]] = {runtime: [] for runtime in RUNTIMES}
    try:
        os.environ["SEEDKEEPER_SLOT_IMAGE"] = image
        client = SeedkeeperClient(
            stack.url,
            credentials=Credentials(stack.credentials.access_key, stack.credentials.secret_key),
        )
        repo = sample_repository(root / "widgets")
        snapshot = published_snapshot(
            repo, "widgets", root / "scratch", R2.from_settings(R2Settings())
        )
        client.publish(snapshot)
        handle = client.snapshot_status("widgets").seed_handle
        assert handle is not None
        seed = SeedIdentity(resource="widgets", **handle.model_dump())
        for pair in range(pairs):
            order = RUNTIMES if pair % 2 == 0 else RUNTIMES[::-1]
            for runtime in order:
                os.environ["SEEDKEEPER_RUNTIME"] = runtime
                results[runtime].append(seed_once(client, f"{runtime}-{pair}", seed))
    finally:
        DockerRuntime(stack.data_dir, image).stop_all()
        stack.stop()
    return results


def spread(values: list[float]) -> str:
    return harness.spread(values, unit=" s", to=" to ")


def report(results: dict[str, list[Seed]], image: str, console: Console) -> None:
    table = Table(title=f"a seed as a container ({image}) and as a local process")
    table.add_column("runtime")
    table.add_column("POST to seeded", justify="right")
    table.add_column("restore in the task", justify="right")
    table.add_column("around the restore", justify="right")
    for runtime in RUNTIMES:
        seeds = results[runtime]
        table.add_row(
            "container" if runtime == "docker" else "process",
            spread([seed.wall for seed in seeds]),
            spread([seed.restore for seed in seeds]),
            spread([seed.around for seed in seeds]),
        )
    console.print(table)
    ratios = harness.ratios(
        [seed.wall for seed in results["docker"]], [seed.wall for seed in results["local"]]
    )
    console.print(
        f"container / process, POST to seeded, paired over {len(ratios)} pairs: "
        f"median {harness.spread(ratios, to=' to ')}"
    )
    size = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    console.print(f"image {image}: {int(size) / 1e6:.0f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    args = parser.parse_args()
    console = harness.console(120)
    built = subprocess.run(
        [str(ROOT / "images" / "slot-task")],
        env=os.environ | {"SLOT_IMAGE": args.image},
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        console.print(f"no container seed measured: {built.stderr.strip()[-300:]}")
        return 0
    logger.setLevel("WARNING")
    with tempfile.TemporaryDirectory(prefix="seedkeeper-container-") as root:
        os.chmod(root, 0o711)  # noqa: S103 - search only: slot users reach their workspaces
        results = run(Path(root), args.pairs, args.image)
    report(results, args.image, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
