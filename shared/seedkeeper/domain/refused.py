"""The one refusal every decision and service answers with: a reason token, and where it
helps the caller a detail. The API's answer table gives each reason its HTTP status."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refused:
    reason: str
    detail: str | None = None
