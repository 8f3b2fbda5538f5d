"""The suite's IAM check: every AWS call a function makes in any test is authorized as AWS
would authorize it, against the policies template.yaml deploys, before moto (which grants
everything) sees it; and so is every signed call the local gateway routes to a function (the
executor's policy, or the slot task role).

A call the deployed policies deny is refused as AWS refuses it (`AccessDeniedException`,
so the code under test meets what it would meet in AWS), and the test that made it fails,
naming the principal, the action, the resource and the condition keys, even when the code
handled the refusal (a sweep that retains on any error would otherwise hide one).

`SEEDKEEPER_IAM_TEMPLATE` names another template to check against (an older one, to see
what it would have refused).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from iam import calls
from iam.deployed import TEMPLATE, Deployed, deploy
from iam.evaluator import Decision, Evaluator, Request
from seedkeeper_tools.local import gateway
from seedkeeper_tools.local.principals import ACTING, TASK_ROLE

FORBIDDEN = {"statusCode": 403, "body": '{"Message":"Forbidden"}'}


@dataclass(frozen=True)
class Denial:
    request: Request
    decision: Decision
    test: str

    def __str__(self) -> str:
        why = self.decision.error or self.decision.result
        if self.decision.ignored:
            why = f"condition keys the action does not take: {', '.join(self.decision.ignored)}"
        return f"{self.request}: {why} (in {self.test})"


@dataclass
class IamCheck:
    template: Path
    test: str = "no test"
    denials: list[Denial] = field(default_factory=list)
    # A test's own denials, collected apart (`iam_denials`), never failures.
    expected: list[Denial] | None = None
    # How many authorizations each principal's each action had, and how many distinct.
    tally: Counter[str] = field(default_factory=Counter)
    distinct: set[str] = field(default_factory=set)
    _deployed: Deployed | None = None
    _evaluator: Evaluator | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def deployed(self) -> Deployed:
        with self._lock:
            if self._deployed is None:
                self._deployed = deploy(self.template)
            return self._deployed

    def authorize(self, requests: Iterator[Request]) -> Denial | None:
        """Each authorization in turn; the first AWS would refuse, recorded, else None."""
        for request in requests:
            decision = self._evaluate(request)
            with self._lock:
                self.tally[f"{request.principal} {request.action}"] += 1
                self.distinct.add(request.key())
            if not decision.allowed or decision.ignored:
                denial = Denial(request, decision, self.test)
                with self._lock:
                    (self.denials if self.expected is None else self.expected).append(denial)
                return denial
        return None

    def _evaluate(self, request: Request) -> Decision:
        deployed = self.deployed
        with self._lock:
            if self._evaluator is None:
                self._evaluator = Evaluator(deployed)
            evaluator = self._evaluator
        return evaluator.decide(request)

    def drain(self) -> list[Denial]:
        with self._lock:
            drained, self.denials = self.denials, []
        return drained

    def close(self) -> None:
        if self._evaluator is not None:
            self._evaluator.close()


CHECK = IamCheck(Path(os.environ.get("SEEDKEEPER_IAM_TEMPLATE", TEMPLATE)))
_sent = getattr(BaseClient, "_make_request")  # noqa: B009 - not in botocore's stubs
_invoked = gateway.FunctionUrlGateway.invoke


def _authorized_request(
    client: BaseClient, operation: Any, request: dict[str, Any], context: dict[str, Any]
) -> Any:
    """botocore's last step before sending: a call made while a function acts is first
    authorized as that function's role."""
    function = ACTING.get()
    if function is not None:
        service = client.meta.service_model.service_name
        role = CHECK.deployed.roles[function]
        body = calls.parsed_body(request.get("body"))
        denial = CHECK.authorize(
            calls.authorizations(CHECK.deployed, role, service, operation.name, body)
        )
        if denial is not None:
            message = f"not authorized: {denial.request}"
            refused: Any = {"Error": {"Code": "AccessDeniedException", "Message": message}}
            raise ClientError(refused, operation.name)
    return _sent(client, operation, request, context)


def _authorized_invocation(
    server: gateway.FunctionUrlGateway, function: str, event: dict[str, Any], context: Any
) -> dict[str, Any] | None:
    """A signed call through a function URL: the executor's policy, or the slot task role,
    must allow both actions on the function."""
    caller = event["requestContext"]["authorizer"]["iam"]["userArn"]
    principal = "SlotTaskRole" if f":assumed-role/{TASK_ROLE}/" in caller else "ExecutorPolicy"
    if CHECK.authorize(calls.invocation(CHECK.deployed, principal, function)) is not None:
        return FORBIDDEN
    return _invoked(server, function, event, context)


# botocore's step and the gateway's, each replaced by one that authorizes first.
setattr(BaseClient, "_make_request", _authorized_request)  # noqa: B010 - not in the stubs
setattr(gateway.FunctionUrlGateway, "invoke", _authorized_invocation)  # noqa: B010


@pytest.fixture
def iam_denials() -> Iterator[list[Denial]]:
    """The denials a test means to make (its own, not failures): collected here instead."""
    collected: list[Denial] = []
    CHECK.expected = collected
    try:
        yield collected
    finally:
        CHECK.expected = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A phase that passed fails when a call it made was denied; one that failed says so too
    (the denial may be why)."""
    CHECK.test = item.nodeid
    outcome: Any = yield
    report: pytest.TestReport = outcome.get_result()
    denials = CHECK.drain()
    if not denials:
        return
    counted = Counter(str(denial) for denial in denials)
    lines = "\n".join(
        f"  {said}" + (f" (x{times})" if times > 1 else "") for said, times in counted.items()
    )
    said = f"AWS would deny what this test's code called (template: {CHECK.template}):\n{lines}"
    if report.passed:
        report.outcome = "failed"
        report.longrepr = said
    else:
        report.sections.append(("IAM", said))


def pytest_runtest_setup(item: pytest.Item) -> None:
    CHECK.test = item.nodeid


# Where each test process leaves its tally for the session's summary (`tally_folder`).
TALLY = "SEEDKEEPER_IAM_TALLY"


def pytest_configure(config: pytest.Config) -> None:
    """The first process (xdist's controller, or the only one) makes the tally's folder;
    the workers it starts inherit where it is."""
    if TALLY not in os.environ:
        os.environ[TALLY] = tempfile.mkdtemp(prefix="seedkeeper-iam-")


def pytest_sessionfinish(session: pytest.Session) -> None:
    CHECK.close()
    tally = {"tally": dict(CHECK.tally), "distinct": sorted(CHECK.distinct)}
    Path(os.environ[TALLY], f"{os.getpid()}.json").write_text(json.dumps(tally))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """What the IAM check authorized across every test process: one line, and the actions
    each principal was seen to need."""
    if hasattr(config, "workerinput"):
        return
    total: Counter[str] = Counter()
    distinct: set[str] = set()
    for report in Path(os.environ[TALLY]).glob("*.json"):
        found = json.loads(report.read_text())
        total.update(found["tally"])
        distinct.update(found["distinct"])
    principals = sorted({key.split(" ", 1)[0] for key in total})
    terminalreporter.write_line(
        f"IAM check: {sum(total.values())} authorizations ({len(distinct)} distinct) by "
        f"{len(principals)} principals, against {CHECK.template.name}"
    )
    if config.getoption("verbose") > 0:
        for key, count in sorted(total.items()):
            terminalreporter.write_line(f"  {key}: {count}")
    shutil.rmtree(os.environ[TALLY], ignore_errors=True)
