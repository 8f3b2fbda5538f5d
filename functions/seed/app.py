"""The seed function: restore a resident snapshot into a slot, bound to the owner claim."""

from __future__ import annotations

from aws_lambda_powertools.event_handler import Response

from seedkeeper.api.http import entrypoint, function_url_app, json_response, responses
from seedkeeper.config import seed_service_from_env
from seedkeeper.services.seed import ANSWERS, SeedRequest

app = function_url_app()


@app.post("/seed", responses=responses(ANSWERS))
def seed(request: SeedRequest) -> Response[str]:
    answer = seed_service_from_env().seed(request)
    return json_response(answer.status, answer.body)


lambda_handler = entrypoint(app)
