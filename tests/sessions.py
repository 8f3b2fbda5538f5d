"""A boto3 session of the test's own for everything Seedkeeper builds, to observe or fault
AWS calls through botocore's events instead of reaching into adapters for their clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from boto3.session import Session
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

from seedkeeper.adapters import aws


@contextmanager
def injected_session(**options: Any) -> Iterator[Session]:
    """A new session every client is built from inside the block (seedkeeper.config
    builds its services anew from it); a new process session after.

    Register handlers on `session.events` before the first call that builds a client: a
    client copies its session's handlers when it is built. `options` go to `Session`."""
    session = Session(**options)
    aws.use_session(session)
    try:
        yield session
    finally:
        aws.use_session(None)


Answer = tuple[AWSResponse, dict[str, Any]]


def answered(parsed: dict[str, Any], status: int = 200) -> Answer:
    """What a `before-call` handler returns to answer a call itself: botocore then sends
    nothing and hands `parsed` back, or raises the error it names when `status` is one."""
    metadata = {"HTTPStatusCode": status, "HTTPHeaders": {}, "RetryAttempts": 0}
    return AWSResponse("https://answered.invalid/", status, HTTPHeaders(), None), {
        "ResponseMetadata": metadata,
        **parsed,
    }


def answer_calls(session: Session, event_name: str, answer: Callable[..., Answer]) -> None:
    """Register `answer` for a `before-call` event: its answer stands for the service's.
    (botocore's stubs declare every handler as returning None; these return.)"""
    session.events.register(event_name, cast("Callable[..., None]", answer))


def operations(session: Session, service: str) -> list[str]:
    """The operations clients of `session` call on `service` from now on, in order (the
    clients built after this call; `service` as botocore names it: "dynamodb", "s3")."""
    called: list[str] = []

    def record(event_name: str, **_: Any) -> None:
        called.append(event_name.rsplit(".", 1)[-1])

    session.events.register(f"before-call.{service}", record)
    return called
