"""The slot-evidence function: an exact slot's owner, birth container and checkpoint state,
for its own owner only. It never answers with a stop permit."""

from __future__ import annotations

from http import HTTPStatus

from aws_lambda_powertools.event_handler import Response

from seedkeeper.api.http import (
    NO_MATCH,
    ErrorAnswer,
    entrypoint,
    function_url_app,
    json_response,
    responses,
)
from seedkeeper.config import witness_from_env
from seedkeeper.services.receipts import Evidence, EvidenceRequest, Refused

app = function_url_app()


@app.post(
    "/slot-evidence",
    responses=responses({HTTPStatus.OK: Evidence, HTTPStatus.NOT_FOUND: ErrorAnswer}),
)
def slot_evidence(request: EvidenceRequest) -> Response[str]:
    answer = witness_from_env().evidence(request)
    if isinstance(answer, Refused):
        return json_response(HTTPStatus.NOT_FOUND, NO_MATCH)
    return json_response(HTTPStatus.OK, answer)


lambda_handler = entrypoint(app)
