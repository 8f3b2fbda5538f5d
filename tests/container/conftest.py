"""Tests in real containers: the slot image on a Docker engine.

The session builds the image from the working tree first (`images/slot-task`, as `make
image` does; Docker's cache makes an unchanged tree's build take a second), so what runs
is what the tree holds. Where there is no engine, or the image cannot be built, the tests
skip, saying why. Under CI=true they fail instead: CI (.ci/run) starts the engine, so a
skip there would hide that nothing in a container was tested."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from seedkeeper_tools.local.docker import DEFAULT_IMAGE

REPOSITORY = Path(__file__).resolve().parents[2]


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
    with Path("/tmp/seedkeeper-slot-image.lock").open("a") as lock:
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
        if os.environ.get("CI") == "true":
            pytest.fail(f"container tests cannot run under CI: {why}")
        pytest.skip(f"container tests need Docker: {why}")
    return image


@pytest.fixture(autouse=True)
def _needs_the_slot_image(slot_image: str) -> None:
    """Every test here runs in the slot image, or skips (fails under CI) without it."""
