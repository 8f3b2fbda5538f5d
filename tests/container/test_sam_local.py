"""`sam local invoke` against a running `seedkeeper local`: the functions as `sam build`
makes them from the local template, run by the SAM CLI in the Lambda Python base image (the
public one, or the stand-in images/lambda-python builds) with the runtime interface
emulator SAM ships, pointed at the stack by the environment file `seedkeeper local
--sam-env` writes, through the relay it serves.

`sam build` runs once for the module; each test starts a stack and invokes one event. About
35 s in all on two cores with pip's and Docker's caches warm: the build ~12 s, each invoke
~7 s (SAM rebuilds its image with the layer, from Docker's cache, then the function starts
cold); a first run on a fresh machine adds the downloads and the image's first build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore.credentials import Credentials

from conftest import running_local_stack
from seedkeeper.config import StoreSettings
from seedkeeper.domain.record import SlotRecord, Supported
from seedkeeper_client import Cold, SeedkeeperClient
from seedkeeper_tools.infra import ROOT, load_template
from seedkeeper_tools.local.stack import LocalStack
from seedkeeper_tools.sam_env import serve_sam_env, write_local_template

if TYPE_CHECKING:
    from container.conftest import SamCli

COLD_SLOT = "cold-slot-1"  # events/seed-cold.json's slot


@pytest.fixture(autouse=True)
def _needs_the_slot_image() -> None:
    """Overrides the directory's: these run in the Lambda image, never the slot image."""


@pytest.fixture(scope="module")
def built(sam_cli: SamCli, lambda_image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The functions and the layer, as `sam build` makes them from the local template."""
    folder = tmp_path_factory.mktemp("sam")
    write_local_template(folder / "template.json")
    done = sam_cli.run(
        "build",
        "--template-file",
        folder / "template.json",
        "--build-dir",
        folder / "build",
        cwd=folder,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return folder / "build" / "template.yaml"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    with running_local_stack(tmp_path) as local:
        yield local


@pytest.fixture
def env_vars(stack: LocalStack, tmp_path: Path) -> Iterator[Path]:
    """The environment file, as `seedkeeper local --sam-env` writes it, and its relay."""
    path = tmp_path / "sam" / "env.json"
    with serve_sam_env(path, dict(os.environ)):
        assert path.stat().st_mode & 0o777 == 0o600  # it holds the store's keys
        yield path


def invoke(
    sam_cli: SamCli, built: Path, env_vars: Path, stack: LocalStack, *, function: str, event: str
) -> tuple[int, Any]:
    """`sam local invoke` of events/<event>.json: the status and the JSON body answered."""
    done = sam_cli.run(
        "local",
        "invoke",
        function,
        "--template",
        built,
        "--event",
        ROOT / "events" / f"{event}.json",
        "--env-vars",
        env_vars,
        "--skip-pull-image",  # the stand-in is no registry's: SAM must not pull over it
        cwd=env_vars.parent,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert stack.store_credentials.secret_key not in done.stdout + done.stderr
    answer = json.loads(done.stdout)
    return answer["statusCode"], json.loads(answer["body"])


def record(slot: str) -> SlotRecord:
    classified = StoreSettings().lifecycle().read(slot)
    assert isinstance(classified, Supported)
    return classified.record


def test_a_seed_in_the_lambda_image_answers_from_the_stacks_record_and_touches_it(
    sam_cli: SamCli, built: Path, env_vars: Path, stack: LocalStack
) -> None:
    # Given a cold slot born through the stack's gateway (its runtime launched the task)
    signing = Credentials(stack.credentials.access_key, stack.credentials.secret_key)
    born = SeedkeeperClient(stack.url, credentials=signing).seed(COLD_SLOT, None)
    assert isinstance(born, Cold)
    before = record(COLD_SLOT)
    polled_after = int(time.time())

    # When events/seed-cold.json, the same request again, runs in the Lambda image
    status, body = invoke(
        sam_cli, built, env_vars, stack, function="SeedFunction", event="seed-cold"
    )

    # Then it answers from the stack's record, and its poll moved the idle deadline there
    assert (status, body) == (
        200,
        {
            "state": "unseeded",
            "seeded": False,
            "slot": COLD_SLOT,
            "attempt": 1,
            "incarnation": born.incarnation,
            "claim": None,
        },
    )
    after = record(COLD_SLOT)
    assert after.rev > before.rev
    assert after.idle_deadline > before.idle_deadline
    assert after.idle_deadline >= polled_after + stack.idle_window


def test_a_receipt_in_the_lambda_image_reads_the_stacks_table(
    sam_cli: SamCli, built: Path, env_vars: Path, stack: LocalStack
) -> None:
    # Given the stack's table holds no record of events/receipt.json's slot
    # When the receipt event runs in the Lambda image
    status, body = invoke(
        sam_cli, built, env_vars, stack, function="ReceiptFunction", event="receipt"
    )

    # Then it answers what the table says, no match (a table it could not read: a 5xx)
    assert (status, body) == (404, {"error": "no-match", "detail": None, "fields": []})


# Every module a handler imports, loaded with the interpreter's source compiler counted:
# prints the paths it compiled (Lambda's /opt is read-only: what is compiled there at a cold
# start is compiled again at the next).
COMPILED_AT_IMPORT = """
import importlib.machinery, importlib.util, json, sys
compiled = []
compile_source = importlib.machinery.SourceFileLoader.source_to_code
def counted(loader, data, path, *args, **kwargs):
    compiled.append(path)
    return compile_source(loader, data, path, *args, **kwargs)
importlib.machinery.SourceFileLoader.source_to_code = counted
for number, handler in enumerate(sys.argv[1:]):
    spec = importlib.util.spec_from_file_location(f"handler{number}", handler)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(compiled))
"""


def test_the_layer_is_built_with_the_bytecode_of_every_module(built: Path) -> None:
    layer = built.parent / "SeedkeeperLayer" / "python"
    tag = "cpython-" + load_template()["Globals"]["Function"]["Runtime"].removeprefix(
        "python"
    ).replace(".", "")
    sources = sorted(layer.rglob("*.py"))
    assert (layer / "seedkeeper" / "coldstart.py") in sources
    assert (layer / "pydantic" / "main.py") in sources
    for source in sources:
        flags = (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").read_bytes()[4:8]
        # PEP 552: hash-based, the source never checked (a built layer never changes)
        assert int.from_bytes(flags, "little") == 0b01, source
    # no bytecode without its source: the package's own caches were not shipped
    for cached in layer.rglob("*.pyc"):
        assert cached.name.endswith(f".{tag}.pyc"), cached
        assert (cached.parent.parent / f"{cached.name.split('.')[0]}.py").exists(), cached


def test_a_cold_start_compiles_nothing_in_the_layer(
    sam_cli: SamCli, built: Path, tmp_path: Path
) -> None:
    layer = built.parent / "SeedkeeperLayer" / "python"
    python = shutil.which("python3.13", path=sam_cli.path)
    assert python is not None
    # The handlers as a function's code ships (no bytecode): those alone are compiled.
    handlers = []
    for source in sorted((ROOT / "functions").glob("*/app.py")):
        handler = tmp_path / source.parent.name / "app.py"
        handler.parent.mkdir()
        shutil.copyfile(source, handler)
        handlers.append(str(handler))
    done = subprocess.run(
        [python, "-c", COMPILED_AT_IMPORT, *handlers],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(layer),
            "PYTHONDONTWRITEBYTECODE": "1",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == handlers
