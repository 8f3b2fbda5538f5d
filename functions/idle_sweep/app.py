"""The idle sweep, invoked on a schedule: retires cold idle slots, checkpoints and parks
seeded ones, records the loss of those whose task stopped first, pays what is owed, and
keeps the standby pools. A second schedule (`{"standbys": true}`, every minute while any
pool is kept) tends the pools alone."""

from __future__ import annotations

from seedkeeper.coldstart import handler_imports

with handler_imports():  # no collection over what lives as long as the process
    from typing import Any

    from aws_lambda_powertools.utilities.typing import LambdaContext

    from seedkeeper.config import sweeper_from_env
    from seedkeeper.observability import logger


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if isinstance(event, dict) and event.get("standbys") is True:
        return vars(sweeper_from_env().tend_standbys())
    return sweeper_from_env().sweep().summary()
