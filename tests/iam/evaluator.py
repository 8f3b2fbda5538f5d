"""AWS's policy evaluation for the suite: `@cloud-copilot/iam-simulate` (npm), which
implements IAM's evaluation logic with condition operators, set operators
(`ForAllValues:`, `ForAnyValue:`) and service condition keys such as
`dynamodb:LeadingKeys`, from AWS's own published authorization data (shipped in the package:
it reaches no network). It is AGPL-3.0, so it is a dev-only tool: `make setup` installs it
under tests/iam/node, and it runs in a node process of its own, never imported or shipped.

Chosen over the Python evaluators a user might reach for: moto's IAM check ignores
conditions; `policy_sentry` and `parliament` write and lint policies, they do not decide a
request; AWS's own IAM policy simulator is an API call, which needs an account.

One process per test process, asked one request at a time over a line protocol
(node/evaluate.cjs); each distinct request is evaluated once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from iam.deployed import Deployed

NODE_DIR = Path(__file__).parent / "node"
EVALUATOR = NODE_DIR / "evaluate.cjs"


class EvaluatorUnavailable(RuntimeError):
    """No node, or the evaluator's packages are not installed (`make setup` installs them)."""


@dataclass(frozen=True)
class Request:
    """One authorization AWS makes: `principal` (a principal of the deployed stack) doing
    `action` on `resource`, with the request's condition keys."""

    principal: str
    action: str
    resource: str
    context: Mapping[str, str | Sequence[str]] = field(default_factory=dict)

    def key(self) -> str:
        context = {
            name: sorted(value) if isinstance(value, list | tuple) else value
            for name, value in self.context.items()
        }
        return json.dumps([self.principal, self.action, self.resource, context], sort_keys=True)

    def __str__(self) -> str:
        keys = ", ".join(f"{name}={value}" for name, value in sorted(self.context.items()))
        return f"{self.principal}: {self.action} on {self.resource}" + (
            f" [{keys}]" if keys else ""
        )


@dataclass(frozen=True)
class Decision:
    result: str  # Allowed, ImplicitlyDenied, ExplicitlyDenied, Error
    ignored: tuple[str, ...] = ()  # condition keys the action does not take: a mapping bug
    error: str | None = None

    @property
    def allowed(self) -> bool:
        return self.result == "Allowed"


class Evaluator:
    def __init__(self, deployed: Deployed) -> None:
        node = shutil.which("node")
        if node is None or not (NODE_DIR / "node_modules" / "@cloud-copilot").is_dir():
            raise EvaluatorUnavailable(
                "the IAM check needs node and its evaluator: run `make setup` "
                f"(npm ci in {NODE_DIR})"
            )
        self._process = subprocess.Popen(
            [node, str(EVALUATOR)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=NODE_DIR,
        )
        self._lock = threading.Lock()
        self._decided: dict[str, Decision] = {}
        principals = {
            name: {
                "arn": principal.arn,
                "policies": [{"name": n, "policy": document} for n, document in principal.policies],
            }
            for name, principal in deployed.principals.items()
        }
        ready = self._ask({"principals": principals})
        if ready.get("invalid"):
            raise ValueError(f"policies AWS would refuse: {ready['invalid']}")

    def decide(self, request: Request) -> Decision:
        key = request.key()
        with self._lock:
            if key not in self._decided:
                answer = self._ask(
                    {
                        "id": 0,
                        "principal": request.principal,
                        "action": request.action,
                        "resource": request.resource,
                        "context": dict(request.context),
                    }
                )
                self._decided[key] = Decision(
                    answer["result"],
                    tuple(answer.get("ignored", ())),
                    json.dumps(answer["error"]) if "error" in answer else None,
                )
            return self._decided[key]

    def _ask(self, message: Mapping[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        stdin.write(json.dumps(message) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise EvaluatorUnavailable("the IAM evaluator ended")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        return self._process.stdin, self._process.stdout

    def close(self) -> None:
        stdin, _ = self._pipes()
        stdin.close()
        self._process.wait(timeout=10)
