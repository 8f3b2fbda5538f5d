"""The one place Powertools observability objects are created. Log a constant message
with structured keys; never a presigned URL, a secret or a request body."""

from __future__ import annotations

from aws_lambda_powertools import Logger

logger = Logger(service="seedkeeper")
METRICS_NAMESPACE = "Seedkeeper"


def count(name: str, value: int = 1, **dimensions: str) -> None:
    """One CloudWatch count (an EMF log line), with its dimensions; none while Powertools'
    own switch, POWERTOOLS_METRICS_DISABLED, is on (`single_metric` does not read it).
    Powertools' metrics are imported at the first count: a handler that never counts never
    loads them."""
    from aws_lambda_powertools.metrics import MetricUnit, single_metric  # noqa: PLC0415
    from aws_lambda_powertools.metrics.functions import is_metrics_disabled  # noqa: PLC0415

    if is_metrics_disabled():
        return

    with single_metric(
        name=name, unit=MetricUnit.Count, value=value, namespace=METRICS_NAMESPACE
    ) as metric:
        for dimension, named in dimensions.items():
            metric.add_dimension(name=dimension, value=named)
