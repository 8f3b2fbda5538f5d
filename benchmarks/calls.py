"""DynamoDB and R2 calls per request (`make bench`), counted with botocore's event hooks.

Each request goes through the local stack as the executor sends it: signed HTTP to the
function-URL gateway, which runs the same handlers in this process. A `before-call` hook on
the process's boto3 session (`seedkeeper.adapters.aws`), registered before any client
exists, counts every API call the handlers and the sweep make. The slot tasks are processes
of their own that reach the table only through the checkpoint function, so theirs are
counted there; their R2 PUT is not. Uploading archives happens outside the counted
requests. One checkpoint and park is measured whole:
the sweep's request, the checkpoint function's calls while the real slot task freezes,
captures and uploads, and the sweep's park. The slot task reads and writes its record only
through the checkpoint function (its task API), so that row counts the task's own calls too:
its watch's reads (one each watch interval) and its freeze.

Targets: a seed birth at most 3 DynamoDB calls, a poll exactly 1, a receipt and slot
evidence 1 plus at most one R2 HEAD, a rotation one transaction (two when it owes: the paid
debts are cleared in a second) plus one delete batch; a checkpoint request one write; the
checkpoint itself a read and a write to freeze, a read to upload, a read, a HEAD and a
write to record, beside the watch's reads; a park two writes and one StopTask.
It never fails on a target; exit 1 only when the benchmark itself breaks.
"""

from __future__ import annotations

import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import boto3
from botocore.credentials import Credentials
from rich.console import Console
from rich.table import Table

import harness
from seedkeeper.adapters import aws
from seedkeeper.adapters.r2 import R2, R2Settings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import State, Supported
from seedkeeper.observability import logger
from seedkeeper.store.lifecycle import Lifecycle
from seedkeeper_client import OwnerClaim, Seeded, SeedIdentity, SeedkeeperClient
from seedkeeper_tools.demo import commit_change, published_snapshot, sample_repository
from seedkeeper_tools.local.principals import LocalCredentials
from seedkeeper_tools.local.stack import LocalStack

# measure(request, target, met, call): count the calls `call` makes, as one row.
Measure = Callable[[str, str, Callable[[Counter[str]], bool], Callable[[], object]], object]
RESOURCE = "calls-widgets"
IDLE_WINDOW = 3
ORIGIN = "https://git.example.com/calls/widgets.git"


class CallCounter:
    """Counts `service:Operation` for every API call any client of the session makes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()

    def __call__(self, event_name: str, **_: Any) -> None:
        _event, service, operation = event_name.split(".", 2)
        with self._lock:
            self._seen[f"{service}:{operation}"] += 1

    @contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        counted: Counter[str] = Counter()
        with self._lock:
            self._seen = counted
        yield counted
        with self._lock:
            self._seen = Counter()


@dataclass(frozen=True)
class Row:
    request: str
    calls: Counter[str]
    target: str
    met: bool

    def of(self, service: str) -> int:
        return calls_to(service, self.calls)


def calls_to(service: str, calls: Counter[str]) -> int:
    return sum(n for name, n in calls.items() if name.startswith(service + ":"))


def dynamodb_at_most(limit: int) -> Callable[[Counter[str]], bool]:
    return lambda calls: calls_to("dynamodb", calls) <= limit


def run(root: Path, console: Console) -> list[Row]:
    counter = CallCounter()
    credentials = LocalCredentials("calls-access-key", secrets.token_hex(16))
    stack = LocalStack(
        data_dir=root / "data",
        port=0,
        credentials=credentials,
        sweep_interval=3600,  # swept when measured
        idle_window=IDLE_WINDOW,
        watch_interval=0.5,
    ).start()
    # The stack starts the process's session anew with its store keys: count on that one.
    aws.session().events.register("before-call", counter)
    rows: list[Row] = []

    def measure(
        request: str, target: str, met: Callable[[Counter[str]], bool], call: Callable[[], object]
    ) -> object:
        with counter.counting() as calls:
            answer = call()
        rows.append(Row(request, Counter(calls), target, met(calls)))
        return answer

    try:
        client = SeedkeeperClient(
            stack.url, credentials=Credentials(credentials.access_key, credentials.secret_key)
        )
        r2 = R2.from_settings(R2Settings())
        repo = sample_repository(root / "widgets")
        first = published_snapshot(repo, RESOURCE, root / "scratch", r2)
        measure(
            "rotation, the first generation (owes nothing)",
            "1 transaction",
            lambda c: c["dynamodb:TransactWriteItems"] == 1 and c["s3:DeleteObjects"] == 0,
            lambda: client.publish(first),
        )
        seed = SeedIdentity(
            resource=RESOURCE,
            ref=first.ref,
            sha=first.sha,
            checkout_backup_id=first.checkout.backup_id,
        )
        claim = OwnerClaim(
            run="calls-run",
            requester="bench",
            thread="bench",
            repository="calls/widgets",
            ref=first.ref,
            head=first.sha,
        )
        seed_once = partial(client.seed, "seeded", seed, claim=claim, origin=ORIGIN)
        measure("seed: birth of a seeded slot", "DynamoDB ≤ 3", dynamodb_at_most(3), seed_once)
        measure(
            "seed: poll", "DynamoDB exactly 1", lambda c: c == {"dynamodb:UpdateItem": 1}, seed_once
        )
        measure(
            "seed: birth of a cold slot",
            "DynamoDB ≤ 3",
            dynamodb_at_most(3),
            partial(client.seed, "cold", None),
        )
        final = client.seed("seeded", seed, claim=claim, origin=ORIGIN, wait=True)
        if not isinstance(final, Seeded):
            raise RuntimeError(f"the slot did not seed: {final}")
        incarnation = final.incarnation or ""
        receipt = partial(client.receipt, "seeded", claim=claim, seed=seed, incarnation=incarnation)
        evidence = partial(client.slot_evidence, "seeded", claim=claim)
        one_read = "DynamoDB 1, R2 HEAD ≤ 1"
        measure("receipt, no checkpoint", one_read, exactly_one_read, receipt)
        measure("slot evidence, no checkpoint", one_read, exactly_one_read, evidence)
        checkpoint_and_park(stack, measure)
        measure("receipt, a checkpoint recorded", one_read, exactly_one_read, receipt)
        measure("slot evidence, a checkpoint recorded", one_read, exactly_one_read, evidence)
        for n in (2, 3):
            commit_change(repo, n)
            snapshot = published_snapshot(repo, RESOURCE, root / "scratch", r2)
            owes = n == 3  # the third generation retires the first one's objects
            measure(
                f"rotation to generation {n}" + (" (owes the first's objects)" if owes else ""),
                "2 transactions + 1 delete batch" if owes else "1 transaction",
                rotation_met(owes),
                partial(client.publish, snapshot),
            )
    finally:
        stack.stop()
    return rows


def exactly_one_read(calls: Counter[str]) -> bool:
    reads = calls["dynamodb:GetItem"]
    return reads == calls_to("dynamodb", calls) == 1 and calls["s3:HeadObject"] <= 1


def rotation_met(owes: bool) -> Callable[[Counter[str]], bool]:
    return lambda calls: (
        calls["dynamodb:TransactWriteItems"] == 1 + int(owes)
        and calls["s3:DeleteObjects"] == int(owes)
    )


def checkpoint_and_park(stack: LocalStack, measure: Measure) -> None:
    """The idle seeded slot asked to checkpoint, checkpointed by its real slot task, parked.
    The cold slot, idle too, is stopped by the first sweep (its calls are its own row)."""
    time.sleep(IDLE_WINDOW + 1)
    measure(
        "sweep: stop the idle cold slot, ask the seeded one to checkpoint",
        "UpdateItem: 2 (retire), 1 (request)",
        lambda c: c["dynamodb:UpdateItem"] == 3,
        stack.sweep,
    )
    measure(
        "checkpoint function: the task's freeze, upload, then record (its PUT between), "
        "and its watch's reads",
        "GetItem 3 (+1 each watch), UpdateItem 2 (freeze, record), HEAD 1",
        checkpoint_met,
        partial(wait_for_state, "seeded", State.CHECKPOINTED),
    )
    measure(
        "sweep: park the checkpointed slot",
        "UpdateItem 2 (fence, park)",
        lambda c: c["dynamodb:UpdateItem"] == 2,
        stack.sweep,
    )


def checkpoint_met(calls: Counter[str]) -> bool:
    """Freeze (read, write), upload (read), record (read, HEAD, write); any other GetItem is
    a read of the task's watch, and nothing else is called."""
    known = {"dynamodb:GetItem", "dynamodb:UpdateItem", "s3:HeadObject"}
    return (
        set(calls) <= known
        and calls["dynamodb:GetItem"] >= 3
        and (calls["dynamodb:UpdateItem"], calls["s3:HeadObject"]) == (2, 1)
    )


def wait_for_state(slot: str, state: State, timeout: float = 120) -> None:
    """Reads with a client of its own session: they are not the handlers' calls."""
    table = StoreSettings().table_resource(boto3.Session())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        classified = Lifecycle(table).read(slot)
        if isinstance(classified, Supported) and classified.record.state is state:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{slot} never became {state}")


def report(rows: list[Row], console: Console) -> None:
    table = Table(title="API calls per request (botocore before-call hooks)")
    table.add_column("request")
    table.add_column("DynamoDB", justify="right")
    table.add_column("R2", justify="right")
    table.add_column("calls")
    table.add_column("target")
    table.add_column("met")
    for row in rows:
        calls = ", ".join(f"{name} {n}" for name, n in sorted(row.calls.items()))
        mark = "[green]yes[/green]" if row.met else "[red]NO[/red]"
        table.add_row(
            row.request, str(row.of("dynamodb")), str(row.of("s3")), calls, row.target, mark
        )
    console.print(table)


def main() -> int:
    console = harness.console(140)
    logger.setLevel("WARNING")
    with tempfile.TemporaryDirectory(prefix="seedkeeper-calls-") as root:
        rows = run(Path(root), console)
    report(rows, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
