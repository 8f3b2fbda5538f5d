"""Validated configuration, read from the environment when asked for, never at import."""

from __future__ import annotations

from typing import TYPE_CHECKING

import boto3
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from seedkeeper.lifecycle import Lifecycle

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table


class StoreSettings(BaseSettings):
    """Where the lifecycle table is. `SEEDKEEPER_TABLE` is required: no silent default."""

    model_config = SettingsConfigDict(env_prefix="SEEDKEEPER_", extra="ignore", frozen=True)

    table: str = Field(min_length=3, max_length=255, pattern=r"^[A-Za-z0-9_.-]+$")
    dynamodb_endpoint: str | None = None  # a local stand-in (moto); None means AWS

    def table_resource(self) -> Table:
        dynamodb = boto3.resource("dynamodb", endpoint_url=self.dynamodb_endpoint)
        return dynamodb.Table(self.table)

    def lifecycle(self) -> Lifecycle:
        return Lifecycle(self.table_resource())
