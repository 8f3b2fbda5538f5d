"""The seed function: restore a resident snapshot into a slot, bound to the owner claim."""

from __future__ import annotations

from aws_lambda_powertools.event_handler import Response

from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
from seedkeeper.api.http import entrypoint, function_url_app
from seedkeeper.config import seed_service_from_env
from seedkeeper.domain.outcomes import Cold, NotSeeded, Seeded, Seeding
from seedkeeper.services.seed import SeedRequest

app = function_url_app()
REFUSED = (
    "claim-mismatch",
    "seed-mismatch",
    "origin-mismatch",
    "slot-closed",
    "record-unsupported",
)


@app.post(
    "/seed", responses=documented([Seeded, NotSeeded, Cold, Seeding], REQUEST_REFUSALS + REFUSED)
)
def seed(request: SeedRequest) -> Response[str]:
    return answer(seed_service_from_env().seed(request))


lambda_handler = entrypoint(app)
