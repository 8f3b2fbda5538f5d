"""Every log line the end-to-end suite emits, the slot tasks' included, is scanned: no
presigned URL, signature, access key or secret may appear in any of them."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import running_local_stack
from seedkeeper_tools.local.stack import LocalStack

LEAKS = re.compile(
    r"X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|AWS4-HMAC-SHA256|Signature=",
    re.IGNORECASE,
)


@pytest.fixture(autouse=True)
def no_secret_in_any_log(
    request: pytest.FixtureRequest,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> Iterator[None]:
    caplog.set_level(logging.INFO)
    yield
    captured = capfd.readouterr()
    task_logs = "".join(
        path.read_text(errors="replace") for path in tmp_path.rglob("attempt-*.log")
    )
    text = captured.out + captured.err + caplog.text + task_logs
    assert LEAKS.search(text) is None, LEAKS.search(text)
    stack = request.node.funcargs.get("stack")
    if isinstance(stack, LocalStack):
        assert stack.credentials.secret_key not in text
        assert stack.store_credentials.secret_key not in text


@pytest.fixture
def stack(tmp_path: Path, aws_credentials: None) -> Iterator[LocalStack]:
    with running_local_stack(tmp_path) as local:
        yield local
