"""The infrastructure as `template.yaml` declares it, for the places that build it
outside CloudFormation (the test suite and the local stack), so they cannot drift.
Never imported by a Lambda function."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cfn_tools import load_yaml

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

# The repository this package runs from (an editable install: the local stack and the
# tests need the template and the function handlers beside it).
ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
FUNCTIONS = ROOT / "functions"
TABLE_RESOURCE = "LifecycleTable"

# The CreateTable parameters that CloudFormation's table properties carry verbatim.
_CREATE_TABLE_PROPERTIES = (
    "AttributeDefinitions",
    "KeySchema",
    "GlobalSecondaryIndexes",
    "BillingMode",
)


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    """Parse a CloudFormation template, short-form tags (`!Ref`, `!GetAtt`...) included."""
    template: dict[str, Any] = load_yaml(path.read_text())
    return template


def table_properties(template: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = template["Resources"][TABLE_RESOURCE]["Properties"]
    return properties


def create_table(client: DynamoDBClient, name: str, template: dict[str, Any]) -> None:
    """Create the lifecycle table exactly as the template declares it, TTL included."""
    properties = table_properties(template)
    client.create_table(
        TableName=name,
        **{key: properties[key] for key in _CREATE_TABLE_PROPERTIES if key in properties},
    )
    client.get_waiter("table_exists").wait(TableName=name)
    ttl = properties.get("TimeToLiveSpecification")
    if ttl:
        client.update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={
                "AttributeName": ttl["AttributeName"],
                "Enabled": ttl["Enabled"],
            },
        )
