"""The README's executor example, run as a new user runs it: the Python client installed
alone into an empty virtualenv (no Seedkeeper, no boto3), against the local stack with a
snapshot of `widgets` published."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from executor import client_for, publish
from repos import make_repository
from seedkeeper_tools.local.stack import LocalStack

ROOT = Path(__file__).resolve().parents[2]
# The docs site includes it from between these markers (pymdownx.snippets).
EXAMPLE = re.compile(
    r"<!-- --8<-- \[start:executor-example\] -->\n```python\n(.*?)\n```", re.DOTALL
)
# The address the README's example names: `seedkeeper local`'s default port.
DOCUMENTED_URL = "http://127.0.0.1:8787"


def readme_example() -> str:
    found = EXAMPLE.findall((ROOT / "README.md").read_text())
    assert len(found) == 1, "the README holds one executor example, after its marker"
    code: str = found[0]
    assert DOCUMENTED_URL in code
    return code


def test_the_clients_readme_shows_the_same_example() -> None:
    assert f"```python\n{readme_example()}\n```" in (ROOT / "clients/python/README.md").read_text()


def test_the_readme_example_runs_with_the_client_alone(stack: LocalStack, tmp_path: Path) -> None:
    code = readme_example()
    assert len(code.splitlines()) <= 10, "a ten-line example"
    publish(client_for(stack), make_repository(tmp_path), tmp_path / "scratch")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # From a copy, as a user's checkout would be: the build writes beside its sources.
    source = shutil.copytree(
        ROOT / "clients" / "python",
        tmp_path / "seedkeeper-client",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(source)], check=True)
    script = tmp_path / "example.py"
    script.write_text(code.replace(DOCUMENTED_URL, stack.url))
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": stack.credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": stack.credentials.secret_key,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    ran = subprocess.run(
        [str(python), str(script)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    # the receipt it prints: a slot just seeded has no checkpoint yet
    assert "checkpoint='unknown'" in ran.stdout, ran.stdout
    assert "why='no-checkpoint'" in ran.stdout, ran.stdout
    alone = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('seedkeeper'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert alone.stdout.strip() == "None"
