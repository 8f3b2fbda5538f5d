"""Handler cold import time against a minimal Powertools function-URL handler (a boto3
client, Logger, Metrics, a resolver with validation, one pydantic model), measured side by
side in fresh interpreters, alternating. Reports the median ratio (target: at most 1.0)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

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


def main() -> None:
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
    Console().print(table)


if __name__ == "__main__":
    main()
