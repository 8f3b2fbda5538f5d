"""The table template.yaml declares is the one DESIGN §3 describes."""

from __future__ import annotations

from seedkeeper.infra import TABLE_RESOURCE, load_template, table_properties


def test_the_lifecycle_table_is_declared_as_designed() -> None:
    template = load_template()
    table = template["Resources"][TABLE_RESOURCE]
    properties = table_properties(template)
    assert table["Type"] == "AWS::DynamoDB::Table"
    assert table["DeletionPolicy"] == "Retain"
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    assert properties["KeySchema"] == [
        {"AttributeName": "PK", "KeyType": "HASH"},
        {"AttributeName": "SK", "KeyType": "RANGE"},
    ]
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert properties["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    (index,) = properties["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "by-deadline"
    assert index["KeySchema"] == [
        {"AttributeName": "sweep", "KeyType": "HASH"},
        {"AttributeName": "idle_deadline", "KeyType": "RANGE"},
    ]
    types = {d["AttributeName"]: d["AttributeType"] for d in properties["AttributeDefinitions"]}
    assert types == {"PK": "S", "SK": "S", "sweep": "S", "idle_deadline": "N"}


def test_short_form_tags_are_understood() -> None:
    outputs = load_template()["Outputs"]
    assert outputs["LifecycleTableName"]["Value"] == {"Ref": "LifecycleTable"}
