from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from builders import owner, seed
from seedkeeper.domain.models import (
    BackupId,
    BranchRef,
    GitSha,
    Incarnation,
    Origin,
    OwnerClaim,
    ResourceName,
    SeedIdentity,
    SlotId,
)


def accepts(annotation: Any, value: object) -> bool:
    try:
        TypeAdapter(annotation).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("identifier_type", [SlotId, BackupId, ResourceName])
@pytest.mark.parametrize(
    "value",
    ["a", "slot-1", "A.b_c-9", "0", "x" * 128, "checkout-0001.v2", "a..b"],
)
def test_identifiers_accept_plain_names(identifier_type: Any, value: str) -> None:
    assert accepts(identifier_type, value)


@pytest.mark.parametrize("identifier_type", [SlotId, BackupId, ResourceName])
@pytest.mark.parametrize(
    "value",
    [
        "",
        "x" * 129,
        "../etc",
        "..",
        ".hidden",
        "-option",
        "_under",
        "a/b",
        "a\\b",
        "a b",
        "a\x00b",
        "a\nb",
        "\u0430bc",  # Cyrillic a: a look-alike
        "slot\u2215one",  # division slash
        "caf\u00e9",
        "x" * 10_000,
        7,
        None,
    ],
)
def test_identifiers_refuse_paths_options_lookalikes_and_non_strings(
    identifier_type: Any, value: object
) -> None:
    assert not accepts(identifier_type, value)


@pytest.mark.parametrize("value", ["a" * 40, "0123456789abcdef" * 4])
def test_git_sha_accepts_sha1_and_sha256(value: str) -> None:
    assert accepts(GitSha, value)


@pytest.mark.parametrize("value", ["A" * 40, "a" * 39, "a" * 41, "g" * 40, "a" * 63, "", "HEAD"])
def test_git_sha_refuses_anything_else(value: str) -> None:
    assert not accepts(GitSha, value)


@pytest.mark.parametrize("value", ["main", "feature/x+y", "r\u00e9sum\u00e9", "@", "release-1.2"])
def test_branch_ref_accepts_git_branch_names(value: str) -> None:
    assert accepts(BranchRef, value)


@pytest.mark.parametrize("value", ["HEAD", "a..b", "-x", "a.lock", "x" * 256, "a b", ""])
def test_branch_ref_refuses_what_git_refuses_and_overlong_names(value: str) -> None:
    assert not accepts(BranchRef, value)


@pytest.mark.parametrize(
    "value",
    [
        "https://git.example.com/acme/widgets.git",
        "https://git.example.com:8443/acme/widgets",
        "https://[::1]/repo.git",
        "https://example.com",
    ],
)
def test_origin_accepts_credential_free_https(value: str) -> None:
    assert accepts(Origin, value)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("http://git.example.com/r.git", "https://"),
        ("file:///srv/repo.git", "https://"),
        ("ssh://git@example.com/r.git", "https://"),
        ("git@example.com:r.git", "https://"),
        ("https://user@git.example.com/r.git", "user-info"),
        ("https://user:token@git.example.com/r.git", "user-info"),
        ("https://git.example.com/r.git?token=abc", "query"),
        ("https://git.example.com/r.git?", "query"),
        ("https://git.example.com/r.git#main", "fragment"),
        ("https:///r.git", "no host"),
        ("https://git.example.com:99999/r.git", "port"),
        ("https://git.example.com/r .git", "whitespace"),
        ("https://git.example.com/r\n.git", "control"),
        ("https://git.example.com/" + "r" * 2048, "2048"),
    ],
)
def test_origin_refuses_credentials_other_schemes_and_smuggling(value: str, complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        TypeAdapter(Origin).validate_python(value)


def test_incarnation_is_an_ecs_task_arn_or_local() -> None:
    arn = "arn:aws:ecs:us-east-1:123456789012:task/seedkeeper/0123456789abcdef"
    assert accepts(Incarnation, arn)
    assert accepts(Incarnation, "local:slot-1:4242")
    assert not accepts(Incarnation, "arn:aws:ec2:us-east-1:123456789012:instance/i-1")
    assert not accepts(Incarnation, "local:../../etc")
    assert not accepts(Incarnation, "")


def test_owner_claim_is_strict_and_closed() -> None:
    claim = owner()
    assert claim.ref == "main"
    with pytest.raises(ValidationError, match="extra"):
        OwnerClaim.model_validate(claim.model_dump() | {"token": "secret"})
    with pytest.raises(ValidationError, match="run"):
        OwnerClaim.model_validate(claim.model_dump() | {"run": 7})
    with pytest.raises(ValidationError, match="head"):
        OwnerClaim.model_validate(claim.model_dump() | {"head": "main"})
    with pytest.raises(ValidationError, match="requester"):
        OwnerClaim.model_validate({k: v for k, v in claim.model_dump().items() if k != "requester"})
    with pytest.raises(ValidationError, match="thread"):
        OwnerClaim.model_validate(claim.model_dump() | {"thread": "a\tb"})


def test_owner_claim_accepts_a_plus_sign_ref_like_seed() -> None:
    assert owner(ref="feat+x").ref == "feat+x"
    assert seed(ref="feat+x").ref == "feat+x"


def test_owner_claim_is_immutable() -> None:
    claim = owner()
    with pytest.raises(ValidationError, match="frozen"):
        claim.run = "other"  # type: ignore[misc]


def test_seed_identity_optional_parts_and_refusals() -> None:
    bare = SeedIdentity(
        resource="acme-widgets", ref="main", sha="b" * 40, checkout_backup_id="checkout-1"
    )
    assert bare.deps_backup_id is None
    assert bare.fetch_ref is None
    with pytest.raises(ValidationError, match="checkout_backup_id"):
        seed(checkout_backup_id="../../other")
    with pytest.raises(ValidationError, match="fetch_ref"):
        seed(fetch_ref="a..b")
    with pytest.raises(ValidationError, match="extra"):
        SeedIdentity.model_validate(bare.model_dump() | {"url": "https://x"})
