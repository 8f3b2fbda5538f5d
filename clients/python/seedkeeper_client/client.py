"""`SeedkeeperClient` signs every request with SigV4 (service `lambda`), as function URLs
with `AWS_IAM` auth require, and checks what comes back.

A claimed seed answer (a resumed one too) must echo the claim and carry an incarnation; a
keepalive answer must be about the slot kept alive; anything else raises. It never falls
back to treating a claimed slot as cold.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import quote

from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.session import get_session
from pydantic import BaseModel, ValidationError

from seedkeeper_client.models import (
    Cold,
    Evidence,
    KeptAlive,
    NewSnapshot,
    NotSeeded,
    OwnerClaim,
    Payment,
    Receipt,
    Recorded,
    SeedAnswer,
    Seeded,
    SeedIdentity,
    Seeding,
    SnapshotStatus,
)
from seedkeeper_client.transport import SeedkeeperError, check_url, refusal_reason, signed_call

# The function answering each path, when each function has its own URL.
FUNCTIONS = {
    "/seed": "seed",
    "/keepalive": "seed",
    "/receipt": "receipt",
    "/slot-evidence": "slot_evidence",
    "/snapshots": "rotation",
}
FINAL_TIMEOUT = 300.0

AnswerModel = TypeVar("AnswerModel", bound=BaseModel)


class SeedkeeperRefused(SeedkeeperError):
    """A 4xx or 5xx answer; `reason` is its reason token (a refusal's `error`)."""

    def __init__(self, status: int, reason: str, body: Any) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body = status, reason, body


class ClaimNotEchoed(SeedkeeperError):
    """A claimed seed answer that does not prove it is about this claim."""


class BadAnswer(SeedkeeperError):
    """A 2xx answer that is not the answer asked for: not JSON, or a field missing or of
    the wrong type (named)."""


class SeedkeeperClient:
    def __init__(
        self,
        base_url: str | Mapping[str, str],
        region: str = "us-east-1",
        credentials: Credentials | ReadOnlyCredentials | None = None,
        timeout: float = 30.0,
    ) -> None:
        """`base_url` is one URL for every route (the local stack), or one per function
        (`seed`, `receipt`, `slot_evidence`, `rotation`) as a deployment outputs them: a bad
        one raises ValueError naming it, never its text. `credentials` None: botocore's
        chain (the environment, a profile, a role), resolved once; temporary ones refresh
        themselves. `timeout` bounds each wait on the connection, not a whole call."""
        if isinstance(base_url, str):
            check_url(base_url, "base_url")
        else:
            for name, url in base_url.items():
                if name not in FUNCTIONS.values():
                    raise ValueError(f"base_url has a key that names no function: {name!r}")
                check_url(url, f"base_url[{name!r}]")
        self._urls = base_url if isinstance(base_url, str) else dict(base_url)
        self._region = region
        self._credentials = credentials
        self._timeout = timeout

    # -- seeding --------------------------------------------------------------------

    def seed(
        self,
        slot: str,
        seed: SeedIdentity | None,
        *,
        claim: OwnerClaim | None = None,
        origin: str | None = None,
        wait: bool = False,
        timeout: float = FINAL_TIMEOUT,
        interval: float = 0.5,
    ) -> SeedAnswer:
        """Seed (or poll) `slot`; with `wait`, poll until the answer is final. The same call
        on the owner's parked slot resumes it from its checkpoint (`resumed` in the answer;
        `Seeded.from_` is then "checkpoint")."""
        body = {
            "slot": slot,
            "seed": seed.model_dump(mode="json", exclude_none=True) if seed else None,
            "claim": claim.model_dump(mode="json") if claim else None,
            "origin": origin,
        }
        deadline = time.monotonic() + timeout
        while True:
            answer = self._seed_answer(self._call("POST", "/seed", body), claim, slot)
            if not (wait and isinstance(answer, Seeding)):
                return answer
            if time.monotonic() > deadline:
                raise TimeoutError(f"slot {slot} still seeding after {timeout}s")
            time.sleep(interval)

    def keepalive(self, slot: str, claim: OwnerClaim | None) -> KeptAlive:
        """Extend `slot`'s idle deadline without a seed body (`claim` None: a cold slot's).
        Idle means no seed call and no keepalive for the idle window: work done in the slot
        without either does not keep it. A slot being checkpointed is asked back, as a poll
        asks: `frozen` until it runs."""
        body = {"slot": slot, "claim": claim.model_dump(mode="json") if claim else None}
        return self._kept_alive(self._call("POST", "/keepalive", body), slot, claim)

    def receipt(
        self, slot: str, *, claim: OwnerClaim, seed: SeedIdentity, incarnation: str
    ) -> Receipt:
        """Whether `slot`'s checkpoint is present, lost or unknown; it wakes nothing."""
        body = {
            "slot": slot,
            "claim": claim.model_dump(mode="json"),
            "seed": seed.model_dump(mode="json", exclude_none=True),
            "incarnation": incarnation,
        }
        return _parsed(Receipt, self._call("POST", "/receipt", body))

    def slot_evidence(self, slot: str, *, claim: OwnerClaim) -> Evidence:
        """Exact-slot facts; never a permit to stop the slot."""
        body = {"slot": slot, "claim": claim.model_dump(mode="json")}
        return _parsed(Evidence, self._call("POST", "/slot-evidence", body))

    # -- snapshots --------------------------------------------------------------------

    def publish(self, snapshot: NewSnapshot) -> Recorded:
        """Record a snapshot whose archives are already in R2, and rotate."""
        body = snapshot.model_dump(mode="json", exclude_none=True)
        return _parsed(Recorded, self._call("POST", "/snapshots", body))

    def snapshot_status(self, resource: str) -> SnapshotStatus:
        return _parsed(SnapshotStatus, self._call("GET", f"/snapshots/{quote(resource, safe='')}"))

    def delete_snapshots(self, resource: str) -> Payment:
        return _parsed(Payment, self._call("DELETE", f"/snapshots/{quote(resource, safe='')}"))

    def healthz(self, function: str = "seed") -> dict[str, Any]:
        return _json_object(self._call("GET", "/healthz", function=function))

    # -- plumbing ---------------------------------------------------------------------

    @staticmethod
    def _seed_answer(text: bytes, claim: OwnerClaim | None, slot: str) -> SeedAnswer:
        """A slot answer (cold, seeding, seeded) must echo the claim asked with, with an
        incarnation when there is one, and a cold or seeding one must name the slot asked
        about: a claimed slot is never taken for cold, nor one slot for another."""
        answer = _json_object(text)
        if answer.get("seeded") is False and answer.get("state") != "unseeded":
            return _parsed(NotSeeded, answer)
        kind: type[Cold] | type[Seeded] | type[Seeding] = (
            Cold
            if answer.get("state") == "unseeded"
            else Seeded
            if answer.get("seeded")
            else Seeding
        )
        parsed = _parsed(kind, answer)
        if isinstance(parsed, Cold | Seeding) and parsed.slot != slot:
            raise ClaimNotEchoed("the seed answer is about another slot")
        if not _same_claim(parsed.claim, claim) or (claim is not None and not parsed.incarnation):
            raise ClaimNotEchoed("the seed answer does not echo this claim with an incarnation")
        return parsed

    @staticmethod
    def _kept_alive(text: bytes, slot: str, claim: OwnerClaim | None) -> KeptAlive:
        """An answer about another slot, or that does not echo the claim, proves nothing
        about this one."""
        answer = _parsed(KeptAlive, text)
        if answer.slot != slot or not _same_claim(answer.claim, claim):
            raise ClaimNotEchoed("the keepalive answer does not echo this slot and claim")
        return answer

    def _url(self, path: str, function: str | None) -> str:
        if isinstance(self._urls, str):
            return self._urls.rstrip("/") + path
        name = function or next(f for p, f in FUNCTIONS.items() if path.startswith(p))
        if name not in self._urls:
            raise SeedkeeperError(f"no URL given for the {name} function")
        return self._urls[name].rstrip("/") + path

    def _call(
        self, method: str, path: str, body: Any = None, *, function: str | None = None
    ) -> bytes:
        """The answer's JSON text; any other status (a redirect too: it is never followed)
        raises SeedkeeperRefused."""
        if self._credentials is None:
            self._credentials = get_session().get_credentials()
            if self._credentials is None:
                raise SeedkeeperError("no AWS credentials to sign with")
        status, payload = signed_call(
            method,
            self._url(path, function),
            body,
            credentials=self._credentials,
            region=self._region,
            timeout=self._timeout,
        )
        if 200 <= status < 300:
            return payload
        if status < 400:  # Seedkeeper never redirects: a redirect's body is not its refusal
            raise SeedkeeperRefused(status, "redirected", {})
        try:
            detail = json.loads(payload)
        except ValueError:
            detail = {"error": payload.decode(errors="replace")[:200]}
            raise SeedkeeperRefused(status, "unknown", detail) from None
        if not isinstance(detail, dict):
            detail = {"error": str(detail)[:200]}
        raise SeedkeeperRefused(status, refusal_reason(detail, "unknown"), detail)


def _json_object(text: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(text)
    except ValueError:
        raise BadAnswer("the answer is not JSON") from None
    if not isinstance(answer, dict):
        raise BadAnswer("the answer is not a JSON object")
    return answer


def _parsed(model: type[AnswerModel], answer: bytes | dict[str, Any]) -> AnswerModel:
    """`answer` as `model`, or BadAnswer naming the first field that is not as it says."""
    try:
        if isinstance(answer, bytes):
            return model.model_validate_json(answer)
        return model.model_validate(answer)
    except ValidationError as invalid:
        error = invalid.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the answer"
        raise BadAnswer(f"{where}: {error['msg']}") from None


def _same_claim(echoed: OwnerClaim | None, asked: OwnerClaim | None) -> bool:
    """Field for field (the caller's claim may be a model of its own with the same fields)."""
    if echoed is None or asked is None:
        return echoed is asked
    return echoed.model_dump() == asked.model_dump()
