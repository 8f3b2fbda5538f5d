"""The one place AWS clients are made, and the one place their botocore `Config`s are.

Every client Seedkeeper uses (DynamoDB, ECS, Secrets Manager, R2 through the S3 API) is
built here, from a boto3 `Session`, with explicit timeouts and botocore's standard retry
mode: boto's defaults (60 s to connect, 60 s per read, legacy retries: up to 5 attempts,
DynamoDB 10) would let one stuck call outlive a 30 s function many times over.

The session is the process's one (`session()`, built when first asked for, never at
import: a Session costs milliseconds a handler's cold start need not pay), or any other a
caller passes. `use_session` replaces it: a test registers botocore event handlers on its
own session (`session.events.register("before-call.dynamodb.TransactWriteItems", ...)`) to
observe or fault calls; the local stack starts afresh after putting new keys in the
environment (a session keeps the credentials it first resolved). A client copies its
session's handlers when it is built, so handlers go on the session before the clients.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

import botocore.session
from boto3.session import Session
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.service_resource import Table
    from mypy_boto3_ecs import ECSClient
    from mypy_boto3_s3 import S3Client

# What botocore's standard retry mode waits before retry i (0-based; botocore/retries/
# standard.py, ExponentialBackoff): at most min(2**i, 20) s (1 s scale for throttling,
# 25-50 ms for other errors), and up to 5 s more when the answer carries x-amz-retry-after.
# The worst case below takes the largest of each.
BACKOFF_CAP = 20.0
RETRY_AFTER_EXTRA = 5.0


@dataclass(frozen=True)
class Budget:
    """How long one API call may take, its retries included."""

    connect: float  # seconds to open a connection (TCP and TLS); not DNS
    read: float  # seconds to wait for each read from the socket
    attempts: int  # in all, the first included (botocore's `total_max_attempts`)

    def config(self) -> Config:
        # `total_max_attempts`, not `max_attempts`: the latter counts retries only.
        return Config(
            connect_timeout=self.connect,
            read_timeout=self.read,
            retries={"mode": "standard", "total_max_attempts": self.attempts},
        )

    @property
    def worst_case(self) -> float:
        """Seconds one call can take: every attempt times out connecting and reading, and
        every wait between attempts is the longest the standard mode allows."""
        waits = sum(min(2.0**i, BACKOFF_CAP) + RETRY_AFTER_EXTRA for i in range(self.attempts - 1))
        return self.attempts * (self.connect + self.read) + waits


# Budgets, per call, against the time of whoever waits (template.yaml). A second is lost
# to one dropped SYN (Linux retransmits it after 1 s), so 2 s to connect; the services
# answer these calls in milliseconds, so a read that waits seconds is a stuck one, better
# abandoned and retried once. One retry, not more: the executor retries a 503 itself.
# Every read timeout bounds one wait for bytes, not a whole answer: these answers are small.
#
# The functions (Timeout 30 s; the idle sweep 300 s, which makes the same calls):
# DynamoDB items, queries and transactions: 2 x (2 + 5) + (1 + 5) = 20 s of 30.
DYNAMODB = Budget(connect=2, read=5, attempts=2)
# ECS RunTask (idempotent by its client token, so a retry launches nothing twice), which
# answers once the task is placed, the slowest of these; DescribeTasks, StopTask (the
# sweep): 2 x (2 + 6) + (1 + 5) = 22 s of 30.
ECS = Budget(connect=2, read=6, attempts=2)
# R2 from the functions: HEAD (receipts, slot evidence), DELETE and DeleteObjects (rotation,
# the sweep; a batch that times out stays owed and is paid by a later sweep). Presigning
# signs locally and sends nothing. 2 x (2 + 5) + (1 + 5) = 20 s of 30.
R2 = Budget(connect=2, read=5, attempts=2)
# The R2 keys, read once per cold start when a secret holds them: 20 s of 30.
SECRETS_MANAGER = Budget(connect=2, read=5, attempts=2)
# A local stand-in for DynamoDB (moto, named by an endpoint): it shares a developer's or a
# CI machine's cores with everything else, so a loaded one can take seconds to answer, and
# no Lambda timeout applies there. A retried conditional write that had landed answers as a
# conflict with itself, which every caller re-decides, but needlessly: wait instead.
STAND_IN = Budget(connect=5, read=60, attempts=2)
# The developer tools (the CLI, the local stack, the demo): a person waits, not a function,
# and an upload's 16 MiB part may wait longer for its answer. 5 x 65 + 35 = 360 s.
TOOLS = Budget(connect=5, read=60, attempts=5)

# R2 speaks SigV4 in region "auto", wants path-style addressing, and rejects some of the
# optional checksums newer botocore sends by default.
R2_DIALECT = Config(
    signature_version="s3v4",
    s3={"addressing_style": "path"},
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
)

Service = Literal["dynamodb", "ecs", "s3", "secretsmanager"]
_BUDGETS: dict[Service, Budget] = {
    "dynamodb": DYNAMODB,
    "ecs": ECS,
    "s3": R2,
    "secretsmanager": SECRETS_MANAGER,
}

# A Session is not thread-safe; the clients it builds are. The local stack's gateway
# serves functions on several threads: building is one at a time.
_lock = threading.RLock()
_session: Session | None = None


def session() -> Session:
    """The process's session, built when first asked for."""
    global _session  # noqa: PLW0603 - the one process-wide session, replaceable
    with _lock:
        if _session is None:
            _session = Session()
        return _session


def use_session(replacement: Session | None) -> None:
    """Build from `replacement` from now on; None: a new session when next asked for.
    What was built from the old session keeps it (seedkeeper.config builds anew)."""
    global _session  # noqa: PLW0603
    with _lock:
        _session = replacement


def read_models(services: tuple[Service, ...]) -> None:
    """Have the process session's loader read each service's model, endpoint rules and (for
    DynamoDB) boto3's resource model, as building a client would, from keys that are not a
    secret: nothing is resolved, no connection opened (SnapStart's before-snapshot hook)."""
    with _lock:
        own = session()
        region = own.region_name or "us-east-1"
        for service in services:
            own.client(
                service,
                region_name=region,
                aws_access_key_id="read-models",
                aws_secret_access_key="read-models",  # noqa: S106 - no secret: nothing signs
            )
            if service == "dynamodb":
                own.resource(
                    "dynamodb",
                    region_name=region,
                    aws_access_key_id="read-models",
                    aws_secret_access_key="read-models",  # noqa: S106
                )


def renew_session() -> None:
    """A new process session in place of the old, with the old one's loader: what the old
    one resolved or opened (credentials, connections) is left behind, the service models it
    read are kept. Everything seedkeeper.config builds is then built anew."""
    global _session  # noqa: PLW0603
    with _lock:
        fresh = botocore.session.Session()
        if _session is not None:
            fresh.register_component("data_loader", _session._session.get_component("data_loader"))
        _session = Session(botocore_session=fresh)


def _build(
    kind: Literal["client", "resource"],
    session: Session,
    service: Service,
    budget: Budget | None,
    dialect: Config | None = None,
    **options: Any,
) -> Any:
    """The one function that builds: every client and resource goes through here."""
    config = (budget or _BUDGETS[service]).config()
    if dialect is not None:
        config = config.merge(dialect)
    with _lock:
        if kind == "resource":
            return session.resource(service, config=config, **options)  # type: ignore[arg-type]
        return session.client(service, config=config, **options)


@overload
def client(
    session: Session,
    service: Literal["dynamodb"],
    *,
    budget: Budget | None = ...,
    endpoint_url: str | None = ...,
) -> DynamoDBClient: ...
@overload
def client(
    session: Session,
    service: Literal["ecs"],
    *,
    budget: Budget | None = ...,
    endpoint_url: str | None = ...,
) -> ECSClient: ...
@overload
def client(
    session: Session,
    service: Literal["secretsmanager"],
    *,
    budget: Budget | None = ...,
    endpoint_url: str | None = ...,
) -> Any: ...
def client(
    session: Session,
    service: Literal["dynamodb", "ecs", "secretsmanager"],
    *,
    budget: Budget | None = None,
    endpoint_url: str | None = None,
) -> Any:
    """A client for an AWS service, with the service's budget unless told another."""
    return _build("client", session, service, budget, endpoint_url=endpoint_url)


def dynamodb_table(
    session: Session, name: str, endpoint: str | None = None, *, budget: Budget = DYNAMODB
) -> Table:
    """The table `name` as a boto3 resource; `endpoint` names a local stand-in (moto),
    which is given the stand-in's budget."""
    if endpoint is not None:
        budget = STAND_IN
    resource = _build("resource", session, "dynamodb", budget, endpoint_url=endpoint)
    table: Table = resource.Table(name)
    return table


def r2_client(
    session: Session,
    endpoint: str,
    access_key_id: str,
    secret_access_key: str,
    *,
    budget: Budget = R2,
) -> S3Client:
    """An S3 client for R2. Explicit keys: no AWS session token mixes in."""
    s3: S3Client = _build(
        "client",
        session,
        "s3",
        budget,
        R2_DIALECT,
        endpoint_url=endpoint,
        region_name="auto",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
    )
    return s3
