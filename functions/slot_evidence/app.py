"""The slot-evidence function: an exact slot's owner, birth container and checkpoint state,
for its own owner only. It never answers with a stop permit."""

from __future__ import annotations

from seedkeeper.coldstart import handler_imports

with handler_imports():  # no collection over what lives as long as the process
    from aws_lambda_powertools.event_handler import Response

    from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
    from seedkeeper.api.http import entrypoint, function_url_app
    from seedkeeper.config import witness_from_env
    from seedkeeper.domain.outcomes import Evidence
    from seedkeeper.services.receipts import NO_MATCH, EvidenceRequest

app = function_url_app()


@app.post("/slot-evidence", responses=documented([Evidence], (*REQUEST_REFUSALS, NO_MATCH)))
def slot_evidence(request: EvidenceRequest) -> Response[str]:
    return answer(witness_from_env().evidence(request))


lambda_handler = entrypoint(app)
