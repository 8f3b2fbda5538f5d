"""`EnvSettings` reads the environment as pydantic-settings' `BaseSettings` read it for every
settings class the functions use: the same values, the same refusals, for any environment."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsError
from pydantic_settings import SettingsConfigDict as PydanticSettingsConfigDict

from seedkeeper.adapters.r2 import R2Settings
from seedkeeper.adapters.runtime import RuntimeSettings
from seedkeeper.config import StoreSettings
from seedkeeper.domain.checkpoints import IdleSettings, RetentionSettings
from seedkeeper.domain.settings import EnvSettings, SettingsConfigDict
from seedkeeper.services.seed import SeedSettings
from seedkeeper.services.sweep import RetainedAlertSettings, SweepSettings

SETTINGS: tuple[type[EnvSettings], ...] = (
    StoreSettings,
    R2Settings,
    RuntimeSettings,
    IdleSettings,
    RetentionSettings,
    SeedSettings,
    SweepSettings,
    RetainedAlertSettings,
)
# Values a variable may hold: fitting and not, numbers, flags, JSON and not-quite JSON.
VALUES = st.sampled_from(
    [
        "",
        "x",
        "abc",
        "seedkeeper-backups",
        "0123456789abcdef0123456789abcdef",
        "http://127.0.0.1:4566",
        "7",
        "-1",
        "3600",
        "1.5",
        "true",
        "no",
        "local",
        "/srv/seedkeeper",
        '["subnet-1", "subnet-2"]',
        '["AWS_SECRET_ACCESS_KEY"]',
        '["DEBUG"]',
        "[]",
        '{"a": 1}',
        '"subnet-1"',
        "subnet-1,subnet-2",
        "[",
        "null",
    ]
)


def twins(settings: type[EnvSettings]) -> tuple[type[EnvSettings], type[BaseSettings]]:
    """The class's fields and configuration on each base (the model validators, pydantic's
    own either way, left out): what differs between the two is only how they read."""
    fields: dict[str, Any] = {
        name: (field.annotation, field) for name, field in settings.model_fields.items()
    }
    prefix = settings.model_config.get("env_prefix", "")
    ignore_empty = settings.model_config.get("env_ignore_empty", False)
    ours = type(
        "Ours",
        (EnvSettings,),
        {"model_config": SettingsConfigDict(env_prefix=prefix, env_ignore_empty=ignore_empty)},
    )
    theirs = type(
        "Theirs",
        (BaseSettings,),
        {
            "model_config": PydanticSettingsConfigDict(
                env_prefix=prefix, env_ignore_empty=ignore_empty, extra="ignore", frozen=True
            )
        },
    )
    return create_model("Ours", __base__=ours, **fields), create_model(
        "Theirs", __base__=theirs, **fields
    )


def outcome(settings_class: type[BaseModel], values: dict[str, Any]) -> object:
    try:
        return settings_class(**values).model_dump()
    except ValidationError as refused:
        return sorted((issue["loc"], issue["type"]) for issue in refused.errors())


@st.composite
def environments(draw: st.DrawFn) -> tuple[type[EnvSettings], dict[str, str], dict[str, str]]:
    """A settings class, variables for some of its fields (each name in some case), and
    constructor values for some."""
    settings_class = draw(st.sampled_from(SETTINGS))
    prefix = settings_class.model_config.get("env_prefix", "")
    variables: dict[str, str] = {}
    values: dict[str, str] = {}
    for name in settings_class.model_fields:
        if draw(st.booleans()):
            variable = prefix + name
            case = draw(st.sampled_from([str.upper, str.lower, str.title]))
            variables[case(variable)] = draw(VALUES)
        if draw(st.integers(0, 4)) == 0:
            values[name] = draw(VALUES)
    return settings_class, variables, values


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=environments())
def test_the_environment_is_read_as_pydantic_settings_reads_it(
    case: tuple[type[EnvSettings], dict[str, str], dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given an environment holding some of a settings class's variables
    settings_class, variables, values = case
    ours, theirs = twins(settings_class)
    with monkeypatch.context() as environment:
        for name in [name for name in os.environ if name.upper().startswith("SEEDKEEPER_")]:
            environment.delenv(name)
        for name, value in variables.items():
            environment.setenv(name, value)

        # When both read it, given the same constructor values
        try:
            expected = outcome(theirs, values)
        except SettingsError:
            # Then a variable that is not its collection's JSON is a validation error of
            # that field here (pydantic-settings raises its own error, naming the field)
            refused = outcome(ours, values)
            assert isinstance(refused, list)
            assert any(issue[1].endswith("_type") for issue in refused)
            return

        # Then they read the same values, or refuse the same fields for the same reasons
        assert outcome(ours, values) == expected


def test_a_variable_is_named_by_prefix_and_field_in_any_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("seedkeeper_table", "lifecycle")
    monkeypatch.setenv("SEEDKEEPER_Sweep_Shards", "4")
    assert (StoreSettings().table, StoreSettings().sweep_shards) == ("lifecycle", 4)
    assert StoreSettings(table="given").table == "given"  # the constructor's value first


def test_a_collection_is_read_as_json_and_anything_else_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEEDKEEPER_SUBNETS", '["subnet-1", "subnet-2"]')
    assert RuntimeSettings().subnets == ("subnet-1", "subnet-2")
    monkeypatch.setenv("SEEDKEEPER_SUBNETS", "subnet-1,subnet-2")
    with pytest.raises(ValidationError) as refused:
        RuntimeSettings()
    assert [issue["loc"] for issue in refused.value.errors()] == [("subnets",)]


def test_an_empty_variable_is_unset_only_where_the_class_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEEDKEEPER_R2_BUCKET", "")
    assert R2Settings().bucket is None
    monkeypatch.setenv("SEEDKEEPER_TABLE", "")
    with pytest.raises(ValidationError):
        StoreSettings()


def test_a_required_setting_has_no_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEEDKEEPER_TABLE", raising=False)
    with pytest.raises(ValidationError) as refused:
        StoreSettings()
    assert [(issue["loc"], issue["type"]) for issue in refused.value.errors()] == [
        (("table",), "missing")
    ]
