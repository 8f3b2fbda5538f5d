"""The TypeScript client (clients/typescript): its own tests under `npm test` (tsc builds
dist/ and type-checks the tests, node's test runner runs them), the gateway's against the
local stack, and its answer checks held to the server's models.

Without node or the package's node_modules (`npm ci --prefix clients/typescript`) a test
skips, saying why; under CI=true it fails instead, as CI installs both."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

import seedkeeper_client
from conftest import cannot_run
from executor import claim_for, client_for, publish
from seedkeeper.api.answers import Health
from seedkeeper_tools.local.stack import LocalStack
from unit.test_client_models import SHAPES, wire

PACKAGE = Path(__file__).parents[2] / "clients" / "typescript"
NPM_TIMEOUT = 240
# The TAP summary node's test runner closes with.
SUMMARY = re.compile(r"^# (tests|pass|fail|skipped|cancelled|todo) (\d+)$", re.MULTILINE)
# Sent, never answered: the TypeScript client checks no model of them.
REQUESTS = (seedkeeper_client.SeedIdentity, seedkeeper_client.NewSnapshot)
THESE_TESTS = "the TypeScript client's tests"


@pytest.fixture
def npm() -> str:
    """npm (and node), with the package's dependencies installed as package-lock.json pins
    them."""
    found = shutil.which("npm")
    if found is None or shutil.which("node") is None:
        cannot_run(THESE_TESTS, "node and npm (make setup installs them)")
    if not (PACKAGE / "node_modules" / "aws4fetch").is_dir():
        cannot_run(THESE_TESTS, "its packages: npm ci --prefix clients/typescript (make setup)")
    return found


def _server_fields(folder: Path) -> dict[str, str]:
    """The environment naming a file of each answer's fields as the server's model has
    them, {model: {field: required}}, for test/models.test.js."""
    models = {
        client.__name__: server for client, server in SHAPES.items() if client not in REQUESTS
    }
    models["Health"] = Health
    fields = {
        name: {field: required for field, (required, _) in wire(model).items()}
        for name, model in models.items()
    }
    path = folder / "server-fields.json"
    path.write_text(json.dumps(fields))
    return {"SEEDKEEPER_SERVER_FIELDS": str(path)}


def _npm_test(npm: str, *files: str, environment: dict[str, str]) -> None:
    """`npm test` over `files` (all by default): every test passed, none skipped, some ran."""
    run = subprocess.run(
        [npm, "test", "--", "--test-reporter=tap", *files],
        cwd=PACKAGE,
        env=os.environ | environment,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT,
        check=False,
    )
    output = f"{run.stdout}\n{run.stderr}"
    assert run.returncode == 0, f"npm test failed:\n{output}"
    summary = dict(SUMMARY.findall(run.stdout))
    assert summary.get("fail") == "0", output
    skipped = summary.get("skipped") != "0" or "# SKIP" in run.stdout  # a suite's skip too
    assert not skipped, f"a test was skipped:\n{output}"
    assert int(summary.get("pass", "0")) > 0, output


def test_the_typescript_answer_checks_say_the_servers_fields(npm: str, tmp_path: Path) -> None:
    # Given each answer's fields as the server's model has them
    environment = _server_fields(tmp_path)

    # When node's test runner compares the TypeScript client's answer checks with them
    # Then they are the same models, field for field, required where the server requires
    _npm_test(npm, "test/models.test.js", environment=environment)


def test_the_typescript_client_against_the_local_stack(
    npm: str, stack: LocalStack, repo: Path, tmp_path: Path
) -> None:
    # Given a stack with a published snapshot, and a slot and claim for the node tests to seed
    client = client_for(stack)
    seed = publish(client, repo, tmp_path / "scratch")
    slot, claim = f"ts-{secrets.token_hex(4)}", claim_for(seed, run=f"ts-{secrets.token_hex(4)}")

    # When npm test runs every test of the package against the stack's gateway
    # Then every test passed, none skipped (the gateway's and the models' ran)
    _npm_test(
        npm,
        environment={
            "SEEDKEEPER_URL": stack.url,
            "SEEDKEEPER_ACCESS_KEY_ID": stack.credentials.access_key,
            "SEEDKEEPER_SECRET_ACCESS_KEY": stack.credentials.secret_key,
            "SEEDKEEPER_SEED_JSON": json.dumps(seed.model_dump(mode="json", exclude_none=True)),
            "SEEDKEEPER_SLOT": slot,
            "SEEDKEEPER_CLAIM_JSON": json.dumps(claim.model_dump(mode="json")),
            **_server_fields(tmp_path),
        },
    )
    # And the slot the TypeScript client seeded is bound to exactly that claim
    evidence = client.slot_evidence(slot, claim=claim)
    assert (evidence.slot, evidence.disposition) == (slot, "retained")
    assert evidence.incarnation
