"""Cold starts against a minimal Powertools function-URL handler, in fresh interpreters,
alternating; each reports the median ratio (target: at most 1.0).

1. Import alone: the handler module against a baseline with a boto3 client, Logger,
   Metrics, a resolver with validation and one pydantic model.
2. The first request, counted whole: the import, then one request that builds the clients
   a real first request builds and makes its store call, against a moto server with the
   table and bucket. The seed function polls a born cold slot (one conditional
   UpdateItem; its R2 client is built too); the receipt function asks about a slot with no
   record (one GetItem). The baseline imports the same, then at its first request builds
   the same clients (a DynamoDB table resource and an S3 client for R2, from one boto3
   session) and makes the same call (an UpdateItem on an item of its own, a GetItem).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from seedkeeper.config import StoreSettings
from seedkeeper.domain import transitions
from seedkeeper.domain.models import Binding
from seedkeeper.store.lifecycle import Lifecycle, Written
from seedkeeper_tools.infra import create_table, load_template
from seedkeeper_tools.local.motoserver import AtomicMotoServer

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
        clients["r2"] = session.client(
            "s3",
            endpoint_url=os.environ["SEEDKEEPER_R2_ENDPOINT"],
            aws_access_key_id=os.environ["SEEDKEEPER_R2_ACCESS_KEY_ID"],
            aws_secret_access_key=os.environ["SEEDKEEPER_R2_SECRET_ACCESS_KEY"],
            region_name="auto",
        )
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
# In a fresh interpreter: import the handler at argv[1], send it the event at argv[2], and
# print the seconds both took (the handler logs to stdout too: the last line is ours).
FIRST_REQUEST_PROBE = """
import importlib.util, json, sys, time
event = json.load(open(sys.argv[2]))
class Context:
    function_name = "bench"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:bench"
    memory_limit_in_mb = 512
    aws_request_id = "bench"
    log_group_name = "bench"
    log_stream_name = "bench"
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("handler", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
answer = module.lambda_handler(event, Context())
took = time.perf_counter() - started
assert answer["statusCode"] in (200, 404), answer
print(took)
"""
# (function, event): what each first request asks.
FIRST_REQUESTS = (("seed", "seed-cold"), ("receipt", "receipt"))


def cold_import(path: Path) -> float:
    """Seconds to import the handler module in a fresh interpreter (interpreter start
    subtracted by measuring inside it)."""
    probe = (
        "import importlib.util,time,sys;"
        f"spec=importlib.util.spec_from_file_location('handler',{str(path)!r});"
        "m=importlib.util.module_from_spec(spec);t=time.perf_counter();"
        "spec.loader.exec_module(m);print(time.perf_counter()-t)"
    )
    done = subprocess.run(
        [sys.executable, "-X", "frozen_modules=on", "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "AWS_DEFAULT_REGION": "us-east-1",
            "PYTHONPATH": str(ROOT / "shared"),
        },
    )
    return float(done.stdout.strip())


def first_request(path: Path, event: Path, environment: dict[str, str]) -> float:
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "frozen_modules=on",
            "-c",
            FIRST_REQUEST_PROBE,
            str(path),
            str(event),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=environment,
    )
    return float(done.stdout.strip().splitlines()[-1])


def store(endpoint: str) -> dict[str, str]:
    """A table and bucket in the moto server at `endpoint`, a cold slot born in it (as the
    seed event names it); the environment a function gets."""
    environment = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT / "shared"),
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
    import_table = imports()
    first_table = first_requests()
    console = Console()
    console.print(import_table)
    console.print(first_table)


def first_requests() -> Table:
    server = AtomicMotoServer().start()
    try:
        environment = store(server.endpoint)
        rows = []
        with tempfile.TemporaryDirectory() as scratch:
            baseline = Path(scratch) / "baseline.py"
            baseline.write_text(FIRST_REQUEST_BASELINE)
            for name, event_name in FIRST_REQUESTS:
                event = ROOT / "events" / f"{event_name}.json"
                ours, base = [], []
                for _ in range(RUNS):
                    ours.append(
                        first_request(ROOT / "functions" / name / "app.py", event, environment)
                    )
                    base.append(first_request(baseline, event, environment))
                ratio = statistics.median(ours) / statistics.median(base)
                rows.append((name, statistics.median(base), statistics.median(ours), ratio))
    finally:
        server.stop()
    table = Table(
        title=f"First request (import, clients, one store call), median of {RUNS} "
        "alternating runs (target ratio <= 1.0)"
    )
    for column in ("function", "baseline ms", "ours ms", "ratio"):
        table.add_column(column, justify="right")
    for name, base_s, ours_s, ratio in rows:
        table.add_row(name, f"{base_s * 1000:.0f}", f"{ours_s * 1000:.0f}", f"{ratio:.2f}")
    return table


def imports() -> Table:
    with tempfile.TemporaryDirectory() as scratch:
        baseline = Path(scratch) / "baseline.py"
        baseline.write_text(BASELINE)
        rows = []
        for name in ("seed", "receipt", "slot_evidence", "rotation", "idle_sweep"):
            ours, base = [], []
            for _ in range(RUNS):
                ours.append(cold_import(ROOT / "functions" / name / "app.py"))
                base.append(cold_import(baseline))
            ratio = statistics.median(ours) / statistics.median(base)
            rows.append((name, statistics.median(base), statistics.median(ours), ratio))
    table = Table(title=f"Cold import, median of {RUNS} alternating runs (target ratio <= 1.0)")
    for column in ("function", "baseline ms", "ours ms", "ratio"):
        table.add_column(column, justify="right")
    for name, base_s, ours_s, ratio in rows:
        table.add_row(name, f"{base_s * 1000:.0f}", f"{ours_s * 1000:.0f}", f"{ratio:.2f}")
    return table


if __name__ == "__main__":
    main()
