"""The TypeScript client (clients/typescript) against the local stack: its own tests under
node's test runner, the gateway's included, given a stack and a published seed.

Without node or the package's node_modules (`npm ci --prefix clients/typescript`) the test
skips, saying why; under CI=true it fails instead, as CI installs both."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from executor import claim_for, client_for, publish
from seedkeeper_tools.local.stack import LocalStack

PACKAGE = Path(__file__).parents[2] / "clients" / "typescript"
# What the build reads: a change to any of them makes dist/ stale.
BUILD_INPUTS = ("src", "package.json", "package-lock.json", "tsconfig.json")
NODE_TIMEOUT = 240
# The TAP summary node's test runner closes with.
SUMMARY = re.compile(r"^# (tests|pass|fail|skipped|cancelled|todo) (\d+)$", re.MULTILINE)


def _cannot_run(why: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the TypeScript client's tests cannot run under CI: {why}")
    pytest.skip(f"the TypeScript client's tests need {why}")


@pytest.fixture
def node() -> str:
    """node, with the package's dependencies installed as package-lock.json pins them."""
    found = shutil.which("node")
    if found is None or shutil.which("npm") is None:
        _cannot_run("node and npm (make setup installs them)")
    if not (PACKAGE / "node_modules" / "aws4fetch").is_dir():
        _cannot_run("its packages: npm ci --prefix clients/typescript (make setup)")
    return found


def _newest(paths: list[Path]) -> float:
    return max(
        (p.stat().st_mtime for path in paths for p in [path, *path.rglob("*")] if p.exists()),
        default=0.0,
    )


def _built() -> None:
    """dist/ as the sources say, built with `npm run build` (tsc) when stale."""
    built = PACKAGE / "dist" / "index.js"
    if built.exists() and built.stat().st_mtime >= _newest(
        [PACKAGE / name for name in BUILD_INPUTS]
    ):
        return
    npm = shutil.which("npm") or "npm"
    build = subprocess.run(
        [npm, "run", "build"], cwd=PACKAGE, capture_output=True, text=True, timeout=120, check=False
    )
    assert build.returncode == 0, f"npm run build failed:\n{build.stdout}\n{build.stderr}"


def test_the_typescript_client_against_the_local_stack(
    node: str, stack: LocalStack, repo: Path, tmp_path: Path
) -> None:
    # Given a stack with a published snapshot, a slot and claim for the node tests to seed,
    # and the client built
    client = client_for(stack)
    seed = publish(client, repo, tmp_path / "scratch")
    slot, claim = f"ts-{secrets.token_hex(4)}", claim_for(seed, run=f"ts-{secrets.token_hex(4)}")
    _built()

    # When node's test runner runs the package's tests against the stack's gateway
    environment = {
        **os.environ,
        "SEEDKEEPER_URL": stack.url,
        "SEEDKEEPER_ACCESS_KEY_ID": stack.credentials.access_key,
        "SEEDKEEPER_SECRET_ACCESS_KEY": stack.credentials.secret_key,
        "SEEDKEEPER_SEED_JSON": json.dumps(seed.model_dump(mode="json", exclude_none=True)),
        "SEEDKEEPER_SLOT": slot,
        "SEEDKEEPER_CLAIM_JSON": json.dumps(claim.model_dump(mode="json")),
    }
    run = subprocess.run(
        [node, "--test", "--test-reporter=tap"],
        cwd=PACKAGE,
        env=environment,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )

    # Then every test passed, none skipped (the gateway's ran), and some ran at all
    output = f"{run.stdout}\n{run.stderr}"
    assert run.returncode == 0, f"node --test failed:\n{output}"
    summary = dict(SUMMARY.findall(run.stdout))
    assert summary.get("fail") == "0", output
    skipped = summary.get("skipped") != "0" or "# SKIP" in run.stdout  # a suite's skip too
    assert not skipped, f"a test was skipped:\n{output}"
    assert int(summary.get("pass", "0")) > 0, output
    # And the slot the TypeScript client seeded is bound to exactly that claim
    evidence = client.slot_evidence(slot, claim=claim)
    assert (evidence.slot, evidence.disposition) == (slot, "retained")
    assert evidence.incarnation
