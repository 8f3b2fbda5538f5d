"""The receipt function: passive proof that a slot's checkpoint is present, lost or unknown.
It reads DynamoDB and one R2 HEAD; it never wakes, starts or execs anything."""

from __future__ import annotations

from seedkeeper.coldstart import handler_imports

with handler_imports():  # no collection over what lives as long as the process
    from aws_lambda_powertools.event_handler import Response

    from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
    from seedkeeper.api.http import entrypoint, function_url_app
    from seedkeeper.config import witness_from_env
    from seedkeeper.domain.outcomes import Receipt
    from seedkeeper.services.receipts import NO_MATCH, ReceiptRequest

app = function_url_app()


@app.post("/receipt", responses=documented([Receipt], (*REQUEST_REFUSALS, NO_MATCH)))
def receipt(request: ReceiptRequest) -> Response[str]:
    return answer(witness_from_env().receipt(request))


lambda_handler = entrypoint(app)
