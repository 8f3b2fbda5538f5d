"""The seed function: restore a resident snapshot into a slot, bound to the owner claim."""

from __future__ import annotations

from aws_lambda_powertools.event_handler import Response

from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
from seedkeeper.api.http import entrypoint, function_url_app
from seedkeeper.config import seed_service_from_env
from seedkeeper.domain.outcomes import Cold, NotSeeded, Seeded, Seeding
from seedkeeper.services.seed import REFUSALS, SeedRequest

app = function_url_app()
OUTCOMES = [Seeded, NotSeeded, Cold, Seeding]


@app.post("/seed", responses=documented(OUTCOMES, (*REQUEST_REFUSALS, *REFUSALS)))
def seed(request: SeedRequest) -> Response[str]:
    return answer(seed_service_from_env().seed(request))


lambda_handler = entrypoint(app)
