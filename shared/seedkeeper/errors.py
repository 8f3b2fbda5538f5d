"""Domain errors, and the one place AWS error codes are translated into them."""

from __future__ import annotations

from botocore.exceptions import ClientError


class SeedkeeperError(Exception):
    """Base of every error Seedkeeper raises on purpose."""


class StoreUnavailable(SeedkeeperError):
    """The store throttled or failed transiently: nothing was written; retry later."""


class StoreError(SeedkeeperError):
    """The store refused the request for a reason a retry will not fix."""


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


def translate_client_error(error: ClientError) -> SeedkeeperError:
    code = error.response.get("Error", {}).get("Code", "")
    if code in _TRANSIENT_CODES:
        return StoreUnavailable(code)
    return StoreError(code or "unknown")
