"""Cold starts against a minimal Powertools function-URL handler, each in a fresh
interpreter, in pairs: each of ours' runs against the baseline's run beside it, which of
the two goes first alternating. Per function: the medians, and the paired ratio as median
(min-max); the target is a paired median of at most 1.0. Each is given in wall time and in
the process's own CPU time.

1. Import alone: the handler module against a baseline with a boto3 client, Logger,
   Metrics, a resolver with validation and one pydantic model. The baseline builds its
   client at import, ours build theirs at the first request: this table alone flatters
   ours by about that client; the next counts both.
2. The first request, counted whole: the import, then one request that builds the clients
   a real first request builds and makes its store call, against a moto server with the
   table and bucket. The seed function polls a born cold slot (one conditional
   UpdateItem); the receipt function asks about a slot with no record (one GetItem).
   Neither touches an object, so neither builds its R2 client (built when an operation
   first needs it). The baseline imports the same, then at its first request builds the
   same client (a DynamoDB table resource, from a boto3 session) and makes the same call
   (an UpdateItem on an item of its own, a GetItem).

Wall time includes the store's answer: moto takes about 15 ms longer over the seed poll's
condition (every attribute the record codec knows, so that a touch never writes a record it
may not) than over the baseline's one clause, time spent in moto, not in the function. CPU
time leaves the store out. R2's keys are given as variables here; a deployment reads them
from a secret, which ours reads only when a request first touches an object: neither
request here does.

Both sides run as Lambda runs them: on the template's runtime (python3.13), from the layer
as `sam build` builds it (shared/Makefile's recipe, for this machine's architecture: the
layer's packages and the seedkeeper package, with their bytecode), never the project's
virtualenv, and writing no bytecode (Lambda's /opt and /var/task are read-only): each
handler module is compiled at each start, as a function's own code is on Lambda. The
virtualenv's 97 distributions made pydantic's plugin lookup (it reads every distribution's
entry points at the first model) cost about 25 ms on both sides, which only diluted the
ratio. The first requests are measured once more against the baseline on the layer as
SAM's python3.13 builder would ship it, without bytecode: what a function built the usual
way compiles at every cold start.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rich.table import Table

import harness
from seedkeeper.config import StoreSettings
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.motoserver import AtomicMotoServer
from seedkeeper_tools.sam_env import lambda_architecture

ROOT = Path(__file__).resolve().parents[1]
RUNS = 15
BASELINE = """
import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver
from pydantic import BaseModel

class Body(BaseModel):
    slot: str

client = boto3.client("dynamodb", region_name="us-east-1")
logger = Logger()
metrics = Metrics(namespace="Baseline")
app = LambdaFunctionUrlResolver(enable_validation=True)

@app.post("/seed")
def seed(body: Body) -> dict[str, str]:
    return {"slot": body.slot}

def lambda_handler(event, context):
    return app.resolve(event, context)
"""


# The baseline's first request: the clients a first request builds, and its one call.
FIRST_REQUEST_BASELINE = """
import os
import time

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver
from pydantic import BaseModel

class Body(BaseModel):
    slot: str

logger = Logger()
metrics = Metrics(namespace="Baseline")
app = LambdaFunctionUrlResolver(enable_validation=True)
clients = {}

def table():
    if not clients:
        session = boto3.Session()
        clients["table"] = session.resource(
            "dynamodb", endpoint_url=os.environ["SEEDKEEPER_DYNAMODB_ENDPOINT"]
        ).Table(os.environ["SEEDKEEPER_TABLE"])
    return clients["table"]

@app.post("/seed")
def seed(body: Body) -> dict[str, str]:
    table().update_item(
        Key={"PK": "SLOT#baseline-" + body.slot, "SK": "LIFECYCLE"},
        UpdateExpression="SET touched = :now",
        ConditionExpression="attribute_not_exists(PK) OR touched < :now",
        ExpressionAttributeValues={":now": time.time_ns()},
    )
    return {"slot": body.slot}

@app.post("/receipt")
def receipt(body: Body) -> dict[str, str]:
    table().get_item(Key={"PK": "SLOT#" + body.slot, "SK": "LIFECYCLE"})
    return {"slot": body.slot}

def lambda_handler(event, context):
    return app.resolve(event, context)
"""
# In a fresh interpreter: import the handler at argv[1] and, given an event at argv[2], send
# it that; print the seconds both took, wall and the process's CPU (the handler logs to
# stdout too: the last line is ours). The interpreter's own start is left out. The handler is
# imported as Lambda's runtime imports it (`importlib.import_module` of the handler's module,
# its folder first on the path, as /var/task is): loaded from its file by a spec and never
# entered in `sys.modules`, ours took about 3% longer to import (31 alternating pairs, the
# baseline 0.6%).
PROBE = """
import importlib, json, os, sys, time
event = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
class Context:
    function_name = "bench"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:bench"
    memory_limit_in_mb = 512
    aws_request_id = "bench"
    log_group_name = "bench"
    log_stream_name = "bench"
wall, cpu = time.perf_counter(), time.process_time()
folder, name = os.path.split(sys.argv[1])
sys.path.insert(0, folder)
module = importlib.import_module(os.path.splitext(name)[0])
if event is not None:
    answer = module.lambda_handler(event, Context())
    assert answer["statusCode"] in (200, 404), answer
print(time.perf_counter() - wall, time.process_time() - cpu)
"""
# (function, event): what each first request asks.
FIRST_REQUESTS = (("seed", "seed-cold"), ("receipt", "receipt"))
FUNCTIONS = ("seed", "receipt", "slot_evidence", "rotation", "idle_sweep")


@dataclass(frozen=True)
class Sample:
    wall: float  # seconds
    cpu: float  # seconds of the process's own CPU: the store's answer time left out


@dataclass(frozen=True)
class Lambda:
    """What a function runs on: the runtime's interpreter and a layer as built for it."""

    python: str
    layer: Path  # the layer's python/ folder: /opt/python on Lambda


def runtime_python() -> str:
    """The template's runtime (python3.13), found where the Makefile finds it for `sam
    build`: pyenv's, else the PATH's."""
    runtime = load_template()["Globals"]["Function"]["Runtime"]  # e.g. python3.13
    pyenv = sorted(
        Path.home().glob(f".pyenv/versions/{runtime.removeprefix('python')}*/bin/{runtime}")
    )
    found = str(pyenv[0]) if pyenv else shutil.which(runtime)
    if found is None:
        raise SystemExit(f"{runtime}, the functions' runtime (template.yaml), is not installed")
    return found


def built_layer(python: str, artifacts: Path) -> Lambda:
    """The layer as `sam build` builds it (shared/Makefile's recipe), for this machine."""
    built = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT / "shared"),
            "build-SeedkeeperLayer",
            f"ARTIFACTS_DIR={artifacts}",
            f"LAYER_PYTHON={python}",
            f"LAYER_ARCHITECTURE={lambda_architecture()}",
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        raise SystemExit(f"the layer did not build: {built.stderr[-2000:]}")
    return Lambda(python, artifacts / "python")


def without_bytecode(runtime: Lambda, folder: Path) -> Lambda:
    """The same layer as SAM's python3.13 builder ships one: sources only."""
    shutil.copytree(runtime.layer, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return Lambda(runtime.python, folder)


def shipped(function: str, scratch: Path) -> Path:
    """The function's handler as its code ships, no bytecode beside it (the work tree may
    hold some): compiled at each start, as the baseline's is."""
    handler = scratch / function / "app.py"
    if not handler.exists():
        handler.parent.mkdir()
        shutil.copyfile(ROOT / "functions" / function / "app.py", handler)
    return handler


def probe(
    runtime: Lambda, path: Path, environment: dict[str, str], event: Path | None = None
) -> Sample:
    """Import the handler at `path` in a fresh interpreter (and send it `event`)."""
    done = subprocess.run(
        [
            runtime.python,
            "-X",
            "frozen_modules=on",
            "-c",
            PROBE,
            str(path),
            *([str(event)] if event is not None else []),
        ],
        check=True,
        capture_output=True,
        text=True,
        # Lambda's /opt and /var/task are read-only: no run leaves bytecode to the next.
        env=environment | {"PYTHONPATH": str(runtime.layer), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return Sample(float(wall), float(cpu))


@dataclass(frozen=True)
class Pairs:
    """Each of ours' runs and the baseline's run beside it."""

    ours: list[Sample]
    baseline: list[Sample]

    def cells(self, measure: Callable[[Sample], float]) -> tuple[str, str, str]:
        """The baseline's median, ours, and the paired ratio as median (min-max)."""
        ours, baseline = [measure(s) for s in self.ours], [measure(s) for s in self.baseline]
        return (
            f"{statistics.median(baseline) * 1000:.0f}",
            f"{statistics.median(ours) * 1000:.0f}",
            harness.spread(harness.ratios(ours, baseline)),
        )


def paired(ours: Callable[[], Sample], baseline: Callable[[], Sample]) -> Pairs:
    """RUNS pairs, which side goes first alternating: neither is always the one that finds
    the page cache, or the store, warmed by the other. One untimed run of each first, so
    that neither is the first to read its files."""
    ours()
    baseline()
    mine: list[Sample] = []
    theirs: list[Sample] = []
    for run in range(RUNS):
        if run % 2 == 0:
            mine.append(ours())
            theirs.append(baseline())
        else:
            theirs.append(baseline())
            mine.append(ours())
    return Pairs(mine, theirs)


def store(endpoint: str) -> dict[str, str]:
    """A table and bucket in the moto server at `endpoint`, a cold slot born in it (as the
    seed event names it); the environment a function gets."""
    environment = {
        "PATH": "/usr/bin:/bin",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "SEEDKEEPER_TABLE": "seedkeeper-bench-imports",
        "SEEDKEEPER_DYNAMODB_ENDPOINT": endpoint,
        "SEEDKEEPER_R2_BUCKET": "seedkeeper-bench-imports",
        "SEEDKEEPER_R2_ENDPOINT": endpoint,
        "SEEDKEEPER_R2_ACCESS_KEY_ID": "bench",
        "SEEDKEEPER_R2_SECRET_ACCESS_KEY": "bench",
    }
    os.environ.update(environment | {"PATH": os.environ["PATH"]})
    settings = StoreSettings()
    table = settings.table_resource()
    create_table(table.meta.client, settings.table, load_template())
    import boto3  # noqa: PLC0415 - the bucket, as the stack makes it

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="seedkeeper-bench-imports")
    lifecycle = Lifecycle(table)
    slot = json.loads(json.loads((ROOT / "events" / "seed-cold.json").read_text())["body"])["slot"]
    now = int(time.time())
    born = lifecycle.birth(slot, Binding(), now=now, idle_deadline=now + 86_400)
    assert isinstance(born, Written)
    assert born.entry is not None
    launched = lifecycle.write(
        transitions.RECORD_INCARNATION,
        born.record,
        transitions.Launched(incarnation=f"local:{slot}:1", launch=born.entry.ref, now=now),
    )
    assert isinstance(launched, Written)
    return environment


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        runtime = built_layer(runtime_python(), Path(scratch) / "layer")
        sources_only = without_bytecode(runtime, Path(scratch) / "sources-only")
        import_table = imports(runtime)
        first_table = first_requests(runtime, sources_only)
    console = harness.console(140)
    console.print(import_table)
    console.print(first_table)


COLUMNS = (
    "function",
    "baseline ms",
    "ours ms",
    "ratio, paired",
    "baseline CPU ms",
    "ours CPU ms",
    "CPU ratio, paired",
)


def table(title: str, rows: dict[str, Pairs]) -> Table:
    """Wall time, then the process's own CPU time; medians, and the paired ratio as median
    (min-max)."""
    shown = Table(title=title)
    for column in COLUMNS:
        shown.add_column(column, justify="right")
    for name, pairs in rows.items():
        shown.add_row(
            name, *pairs.cells(lambda sample: sample.wall), *pairs.cells(lambda sample: sample.cpu)
        )
    return shown


def first_requests(runtime: Lambda, sources_only: Lambda) -> Table:
    """Ours against the baseline on the same layer (the target), then against the baseline
    on the layer as SAM's python3.13 builder ships it, without bytecode."""
    server = AtomicMotoServer().start()
    try:
        environment = store(server.endpoint)
        rows = {}
        with tempfile.TemporaryDirectory() as scratch:
            baseline = Path(scratch) / "baseline.py"
            baseline.write_text(FIRST_REQUEST_BASELINE)
            for against, label in ((runtime, ""), (sources_only, ", baseline without bytecode")):
                for name, event_name in FIRST_REQUESTS:
                    event = ROOT / "events" / f"{event_name}.json"
                    handler = shipped(name, Path(scratch))
                    rows[name + label] = paired(
                        partial(probe, runtime, handler, environment, event),
                        partial(probe, against, baseline, environment, event),
                    )
    finally:
        server.stop()
    return table(
        f"First request (import, clients, one store call), {RUNS} pairs; target: paired ratio"
        " <= 1.0 against the baseline on the same layer. Wall time includes the store's"
        " answer (moto), CPU time leaves it out",
        rows,
    )


def imports(runtime: Lambda) -> Table:
    environment = {"PATH": "/usr/bin:/bin", "AWS_DEFAULT_REGION": "us-east-1"}
    with tempfile.TemporaryDirectory() as scratch:
        baseline = Path(scratch) / "baseline.py"
        baseline.write_text(BASELINE)
        rows = {
            name: paired(
                partial(probe, runtime, shipped(name, Path(scratch)), environment),
                partial(probe, runtime, baseline, environment),
            )
            for name in FUNCTIONS
        }
    return table(f"Cold import, {RUNS} pairs; target: paired ratio <= 1.0", rows)


if __name__ == "__main__":
    main()
