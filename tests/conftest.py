from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
import pytest
from moto import mock_aws

from seedkeeper.infra import create_table, load_template
from seedkeeper.lifecycle import Lifecycle

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

TABLE_NAME = "seedkeeper-test"


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials, so nothing can ever reach a real account."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def table(aws_credentials: None) -> Iterator[Table]:
    """The lifecycle table in moto, built from template.yaml's own definition."""
    with mock_aws():
        create_table(boto3.client("dynamodb"), TABLE_NAME, load_template())
        yield boto3.resource("dynamodb").Table(TABLE_NAME)


@pytest.fixture
def lifecycle(table: Table) -> Lifecycle:
    return Lifecycle(table)
