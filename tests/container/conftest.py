"""Tests in real containers: the slot image on a Docker engine.

The session builds the image from the working tree first (`images/slot-task`, as `make
image` does; Docker's cache makes an unchanged tree's build take a second), so what runs
is what the tree holds. Where there is no engine, or the image cannot be built, the tests
skip, saying why. Under CI=true they fail instead: CI (.ci/run) starts the engine, so a
skip there would hide that nothing in a container was tested.

`sam local invoke` tests need the Lambda Python base image (`images/lambda-python`) and the
SAM CLI instead, and skip (fail under CI) without them in the same way."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import cannot_run
from seedkeeper_tools.local.docker import DEFAULT_IMAGE
from seedkeeper_tools.sam_env import lambda_architecture

REPOSITORY = Path(__file__).resolve().parents[2]
CONTAINER_TESTS = "container tests"


def _unavailable(image: str) -> str | None:
    if shutil.which("docker") is None:
        return "no docker command on PATH"
    engine = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if engine.returncode != 0:
        return "no Docker engine answers (start dockerd)"
    # One build at a time on this machine (test workers, other checkouts' runs).
    with (Path(tempfile.gettempdir()) / "seedkeeper-slot-image.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = subprocess.run(
            [str(REPOSITORY / "images" / "slot-task")],
            env=os.environ | {"SLOT_IMAGE": image},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    if built.returncode != 0:
        return f"the slot image {image} could not be built: {built.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="session")
def slot_image() -> str:
    """The slot image's tag, once the engine answers and the image is built."""
    image = os.environ.get("SEEDKEEPER_SLOT_IMAGE", DEFAULT_IMAGE)
    why = _unavailable(image)
    if why is not None:
        cannot_run(CONTAINER_TESTS, f"Docker: {why}")
    return image


@pytest.fixture(autouse=True)
def _needs_the_slot_image(slot_image: str) -> None:
    """Every test here runs in the slot image, or skips (fails under CI) without it."""


@pytest.fixture(scope="session")
def lambda_image() -> str:
    """The Lambda Python 3.13 base image `sam local invoke` asks for on this machine: the
    public one, or the stand-in images/lambda-python builds under its name."""
    image = f"public.ecr.aws/lambda/python:3.13-{lambda_architecture()}"
    if shutil.which("docker") is None:
        cannot_run(CONTAINER_TESTS, "Docker (no docker command on PATH)")
    for argv, needed in [
        (["docker", "info"], "a Docker engine (start dockerd)"),
        (["docker", "image", "inspect", image], f"the image {image} (run images/lambda-python)"),
    ]:
        if subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode != 0:
            cannot_run(CONTAINER_TESTS, needed)
    return image


@dataclass(frozen=True)
class SamCli:
    """The SAM CLI (the Makefile's .sam-venv, else `sam` on PATH), run with a python3.13 on
    PATH for `sam build`, the layer's recipe told this machine's architecture, without
    telemetry, and without the caller's AWS or Seedkeeper settings: what points a function
    at the stack comes from its environment file alone."""

    sam: str
    path: str

    def run(self, *args: str | Path, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
        environment = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("AWS_", "SEEDKEEPER_"))
        }
        environment |= {
            "PATH": self.path,
            "SAM_CLI_TELEMETRY": "0",
            "LAYER_ARCHITECTURE": lambda_architecture(),
        }
        return subprocess.run(
            [self.sam, *map(str, args)],
            cwd=cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="session")
def sam_cli() -> SamCli:
    sam = REPOSITORY / ".sam-venv" / "bin" / "sam"
    found = str(sam) if sam.exists() else shutil.which("sam")
    # As the Makefile finds it: pyenv's own (its shim may name no installed 3.13), else PATH's.
    pythons = [*map(str, Path.home().glob(".pyenv/versions/3.13*/bin/python3.13"))]
    python = next(iter(pythons), None) or shutil.which("python3.13")
    if found is None:
        cannot_run(CONTAINER_TESTS, "the SAM CLI (`make sam-cli` installs it in .sam-venv)")
    if python is None:
        cannot_run(CONTAINER_TESTS, "a python3.13 on this machine, for `sam build`")
    return SamCli(found, os.pathsep.join([str(Path(python).parent), os.environ["PATH"]]))
