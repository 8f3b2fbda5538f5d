"""Domain errors, and the one place AWS error codes are translated into them."""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError


class SeedkeeperError(Exception):
    """Base of every error Seedkeeper raises on purpose."""


class StoreUnavailable(SeedkeeperError):
    """The store throttled or failed transiently: nothing was written; retry later."""


class StoreError(SeedkeeperError):
    """The store refused the request for a reason a retry will not fix."""


class MalformedRecord(SeedkeeperError):
    """A stored record fails validation: it is kept as it is, and nothing acts on it."""


class ResourceNotFound(SeedkeeperError):
    """Nothing is recorded for this resource."""


class RotationConflict(SeedkeeperError):
    """Another rotation or teardown of the same resource committed first."""


class SnapshotRefused(SeedkeeperError):
    """A snapshot that may not be recorded; `reason` is a reason token."""

    def __init__(self, reason: str, detail: str | None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RuntimeUnavailable(SeedkeeperError):
    """The slot runtime could not launch, describe or stop a task; nothing was assumed.
    `retryable`: it said so itself (no capacity now, throttled, its own fault), so the
    caller answers "retry later", the record still saying what is true."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class PublishFailed(SeedkeeperError):
    """Building, measuring or uploading an archive failed."""


# By error code, never by message text.
_TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "TransactionInProgressException",
    }
)


# Why a transaction's item was cancelled when nothing about the data refused it.
_TRANSIENT_REASONS = frozenset(
    {"None", "ThrottlingError", "TransactionConflict", "ProvisionedThroughputExceeded"}
)


def translate_client_error(error: ClientError) -> SeedkeeperError:
    """Callers answer failed conditions themselves; what reaches here is an error."""
    code = error.response.get("Error", {}).get("Code", "")
    if code in _TRANSIENT_CODES:
        return StoreUnavailable(code)
    if code == "TransactionCanceledException":
        reasons = {r.get("Code", "None") for r in error.response.get("CancellationReasons", [])}
        if reasons <= _TRANSIENT_REASONS:
            return StoreUnavailable(code)
    return StoreError(code or "unknown")


class R2Unconfigured(SeedkeeperError):
    """R2 transfers are not configured; `missing` names the settings that are absent."""

    def __init__(self, missing: tuple[str, ...]) -> None:
        super().__init__(f"R2 is not configured: missing {', '.join(missing)}")
        self.missing = missing


class R2Unavailable(SeedkeeperError):
    """R2 failed transiently or unexpectedly; `code` is its error code, never its message."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def translate_r2_error(error: ClientError | BotoCoreError) -> SeedkeeperError:
    """An R2 failure the caller can act on. Absence is an answer, not an error: the adapter
    handles a missing object before it gets here."""
    if isinstance(error, ClientError):
        return R2Unavailable(error.response.get("Error", {}).get("Code") or "unknown")
    # A connection or protocol failure: its class is the code (its text may hold a URL).
    return R2Unavailable(type(error).__name__)
