"""Unit tests run with the network disabled: a test that reaches a socket fails."""

from __future__ import annotations

import pytest
from pytest_socket import disable_socket, enable_socket


def pytest_runtest_setup(item: pytest.Item) -> None:
    disable_socket(allow_unix_socket=True)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    enable_socket()
