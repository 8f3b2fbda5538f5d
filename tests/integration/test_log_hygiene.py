"""Nothing Seedkeeper logs or answers carries a presigned URL, an access key or a secret."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from conftest import Stack
from functions import event, invoke, load_function
from seedkeeper.adapters.r2 import R2, R2Settings, backup_key

ACCESS_KEY = "AKIADONOTLOG0000"
SECRET_KEY = "secret-do-not-log-9f2c"  # noqa: S105 - a marker to search logs for
FORBIDDEN = (ACCESS_KEY, SECRET_KEY, "X-Amz-Signature", "X-Amz-Credential", "Signature=")

rotation = load_function("rotation")


def test_handlers_and_presigning_never_log_or_answer_secrets(
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("SEEDKEEPER_R2_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("SEEDKEEPER_R2_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "DEBUG")
    caplog.set_level(logging.DEBUG, logger="seedkeeper")
    answers: list[Any] = []
    for name in ("rotation-healthz", "rotation-post", "rotation-get", "rotation-post-bad-input"):
        answers.append(invoke(rotation, event(name)))
    answers.append(invoke(rotation, event("rotation-delete")))
    monkeypatch.setenv("SEEDKEEPER_TABLE", "missing-table")
    answers.append(invoke(rotation, event("rotation-get")))  # a 500, logged with its trace

    r2 = R2.from_settings(R2Settings())
    url = r2.presign_get(backup_key("acme-checkout-1"), 60)
    assert "X-Amz-Signature" in url  # the URL itself is signed...

    captured = capsys.readouterr()
    text = captured.out + captured.err + caplog.text + repr(answers) + repr(R2Settings())
    assert "request failed" in text  # ...and the logs were really captured
    for secret in FORBIDDEN:
        assert secret not in text, secret
