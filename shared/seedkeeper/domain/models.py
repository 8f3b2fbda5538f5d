"""Value types every Seedkeeper boundary validates: identifiers, the owner claim, the seed
identity and the origin. Strict: no coercion, unknown fields refused, immutable."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

from seedkeeper.domain.gitref import is_valid_branch_name


class Model(BaseModel):
    """Base of every Seedkeeper model: strict types, no unknown fields, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, defer_build=True)


M = TypeVar("M", bound=BaseModel)


def validate_item(model: type[M], fields: dict[str, Any]) -> M:
    """Validate as JSON in strict mode: a number is never taken from a string, nor an
    integer from a fraction (DynamoDB hands every number back as a Decimal)."""
    return model.model_validate_json(json.dumps(fields, default=_json_number))


def _json_number(value: object) -> int | float:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not an item value")


# One shape for every name that becomes part of a key, an object name or a folder:
# never a path (no `/`), never hidden (no leading `.`), never an option (no leading `-`).
IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

SlotId = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
BackupId = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
ResourceName = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]

# sha-1 (40) or sha-256 (64) object names, lower-case as git prints them.
GitSha = Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")]

# Free text from the executor's trusted context: bounded, printable, one line. No C0 or C1
# control, DEL, line or paragraph separator, nor bidi mark, embedding, override or isolate
# (text that a terminal or a log shows as other text).
ClaimText = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]+$",
    ),
]


def _branch_name(name: str) -> str:
    if len(name) > 255 or not is_valid_branch_name(name):
        raise ValueError("not a valid git branch name (git check-ref-format --branch)")
    return name


BranchRef = Annotated[str, AfterValidator(_branch_name)]

_UNSAFE_URL_CHARACTERS = re.compile(r"[\x00-\x20\x7f\\]")


def _credential_free_https(url: str) -> str:
    if len(url) > 2048:
        raise ValueError("origin is longer than 2048 characters")
    if _UNSAFE_URL_CHARACTERS.search(url):
        raise ValueError("origin contains whitespace, a control character or a backslash")
    if "?" in url or "#" in url:
        raise ValueError("origin must not carry a query or a fragment")
    parts = urlsplit(url)
    if parts.scheme != "https":
        raise ValueError("origin must be an https:// URL")
    if "@" in parts.netloc:
        raise ValueError("origin must not carry user-info or a password")
    try:
        host, _ = parts.hostname, parts.port
    except ValueError as invalid_port:
        raise ValueError("origin has an invalid port") from invalid_port
    if not host:
        raise ValueError("origin has no host")
    return url


# A credential-free HTTPS Git URL. Kept exactly as given (no normalisation), so a
# repeat call compares equal only when it names the very same origin.
Origin = Annotated[str, AfterValidator(_credential_free_https)]

# The container a slot was born in: an ECS task ARN, `docker:<container name>` for the local
# stack's containers, or `local:<id>` for its processes.
Incarnation = Annotated[
    str,
    StringConstraints(
        max_length=512,
        pattern=r"^(?:arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/[A-Za-z0-9/_-]+|docker:[A-Za-z0-9_.-]+|local:[A-Za-z0-9._:-]+)$",
    ),
]


class OwnerClaim(Model):
    """Who a slot's work belongs to, taken only from the executor's trusted run context.
    Immutable once bound: a slot never changes owner."""

    run: ClaimText
    requester: ClaimText
    thread: ClaimText
    repository: ClaimText
    ref: BranchRef
    head: GitSha


class SeedIdentity(Model):
    """Which snapshot a slot is seeded from: the resource's checkout archive (and its
    dependency archive), at `ref`/`sha`, optionally followed by a fetch."""

    resource: ResourceName
    ref: BranchRef
    sha: GitSha
    checkout_backup_id: BackupId
    deps_backup_id: BackupId | None = None
    fetch_ref: BranchRef | None = None
    fetch_sha: GitSha | None = None


class Binding(Model):
    """What a slot is bound to, together and for good: its owner's claim, its seed and its
    origin (each absent for a cold slot). A caller naming another binding is not the
    slot's own."""

    owner: OwnerClaim | None = None
    seed: SeedIdentity | None = None
    origin: Origin | None = None
