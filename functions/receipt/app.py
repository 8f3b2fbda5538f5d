"""The receipt function: passive proof that a slot's checkpoint is present, lost or unknown.
It reads DynamoDB and one R2 HEAD; it never wakes, starts or execs anything."""

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
from seedkeeper.services.receipts import Receipt, ReceiptRequest, Refused

app = function_url_app()


@app.post(
    "/receipt", responses=responses({HTTPStatus.OK: Receipt, HTTPStatus.NOT_FOUND: ErrorAnswer})
)
def receipt(request: ReceiptRequest) -> Response[str]:
    answer = witness_from_env().receipt(request)
    if isinstance(answer, Refused):
        return json_response(HTTPStatus.NOT_FOUND, NO_MATCH)
    return json_response(HTTPStatus.OK, answer)


lambda_handler = entrypoint(app)
