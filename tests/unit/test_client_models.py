"""The executor's client holds its own models of what it sends and reads: they must say the
same fields as the server's, name for name, required where the server requires them, so a
client built from them can neither send a field the server refuses nor miss one it needs."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from typing import Any

import pytest
from pydantic import BaseModel

import seedkeeper_client
from seedkeeper.domain import models, outcomes, snapshots

# Each client model and the server's model of the same wire shape.
SHAPES: dict[type[BaseModel], type[BaseModel]] = {
    seedkeeper_client.OwnerClaim: models.OwnerClaim,
    seedkeeper_client.SeedIdentity: models.SeedIdentity,
    seedkeeper_client.Archive: snapshots.Archive,
    seedkeeper_client.NewSnapshot: snapshots.NewSnapshot,
    seedkeeper_client.Snapshot: snapshots.Snapshot,
    seedkeeper_client.SeedHandle: snapshots.SeedHandle,
    seedkeeper_client.DepsEntry: snapshots.DepsEntry,
    seedkeeper_client.Seeding: outcomes.Seeding,
    seedkeeper_client.Seeded: outcomes.Seeded,
    seedkeeper_client.NotSeeded: outcomes.NotSeeded,
    seedkeeper_client.Cold: outcomes.Cold,
    seedkeeper_client.KeptAlive: outcomes.KeptAlive,
    seedkeeper_client.Receipt: outcomes.Receipt,
    seedkeeper_client.Evidence: outcomes.Evidence,
    seedkeeper_client.Payment: outcomes.Payment,
    seedkeeper_client.Recorded: outcomes.Recorded,
    seedkeeper_client.ObjectCounts: outcomes.ObjectCounts,
    seedkeeper_client.SnapshotStatus: outcomes.SnapshotStatus,
}


def wire(model: type[BaseModel]) -> dict[str, tuple[bool, Any]]:
    """Each field as it is on the wire (its alias): whether it is required, and its default."""
    return {
        field.alias or name: (field.is_required(), field.get_default())
        for name, field in model.model_fields.items()
    }


# What a model's JSON Schema says beyond the wire's types: its prose, the server's bounds on
# a value (the server checks them; the client need not), and the server's refusal of unknown
# fields (the client ignores them, so a newer server's answer still reads).
NOT_THE_TYPE = {"title", "description", "examples", "format", "pattern", "minLength"}
NOT_THE_TYPE |= {"maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
NOT_THE_TYPE |= {"minItems", "maxItems"}


def types(schema: Any) -> Any:
    """`schema` with only the wire's types: each field's type, enum values, const, default
    and required, nested models included."""
    if isinstance(schema, dict):
        return {
            key: types(value)
            for key, value in schema.items()
            if key not in NOT_THE_TYPE and not (key == "additionalProperties" and value is False)
        }
    if isinstance(schema, list):
        return [types(value) for value in schema]
    return schema


@pytest.mark.parametrize(("client", "server"), SHAPES.items(), ids=lambda m: m.__name__)
def test_a_client_model_says_the_fields_the_server_says(
    client: type[BaseModel], server: type[BaseModel]
) -> None:
    assert wire(client) == wire(server)


@pytest.mark.parametrize(("client", "server"), SHAPES.items(), ids=lambda m: m.__name__)
def test_a_client_model_types_each_field_as_the_server_does(
    client: type[BaseModel], server: type[BaseModel]
) -> None:
    """An enum value the server adds, or a field whose type changes, would make the client
    refuse every real answer as a BadAnswer."""
    assert types(client.model_json_schema(by_alias=True)) == types(
        server.model_json_schema(by_alias=True)
    )


def test_every_model_the_client_exports_is_held_to_the_server() -> None:
    exported = {
        value
        for value in map(partial(getattr, seedkeeper_client), seedkeeper_client.__all__)
        if isinstance(value, type) and issubclass(value, BaseModel)
    }
    assert exported == set(SHAPES)


def test_the_client_imports_nothing_of_seedkeeper() -> None:
    """Its own distribution: botocore and pydantic only."""
    probe = (
        "import sys, seedkeeper_client; "
        "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith('seedkeeper')}))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "['seedkeeper_client']"
