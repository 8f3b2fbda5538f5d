"""The seed function: restore a resident snapshot (or, resuming a parked slot, its own
checkpoint) into a slot, bound to the owner claim; keep a slot alive without a seed body."""

from __future__ import annotations

from seedkeeper.coldstart import handler_imports

with handler_imports():  # no collection over what lives as long as the process
    from aws_lambda_powertools.event_handler import Response

    from seedkeeper.api.answers import REQUEST_REFUSALS, answer, documented
    from seedkeeper.api.http import entrypoint, function_url_app
    from seedkeeper.config import seed_service_from_env
    from seedkeeper.domain.outcomes import Cold, KeptAlive, NotSeeded, Seeded, Seeding
    from seedkeeper.services.seed import KEEPALIVE_REFUSALS, REFUSALS, KeepaliveRequest, SeedRequest
    from seedkeeper.snapstart import register

register(services=("dynamodb", "ecs", "secretsmanager", "s3"))  # with SeedSnapStart on
app = function_url_app()
OUTCOMES = [Seeded, NotSeeded, Cold, Seeding]


@app.post("/seed", responses=documented(OUTCOMES, (*REQUEST_REFUSALS, *REFUSALS)))
def seed(request: SeedRequest) -> Response[str]:
    return answer(seed_service_from_env().seed(request))


@app.post("/keepalive", responses=documented([KeptAlive], (*REQUEST_REFUSALS, *KEEPALIVE_REFUSALS)))
def keepalive(request: KeepaliveRequest) -> Response[str]:
    return answer(seed_service_from_env().keepalive(request))


lambda_handler = entrypoint(app)
