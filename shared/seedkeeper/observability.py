"""The one place Powertools observability objects are created. Log a constant message
with structured keys; never a presigned URL, a secret or a request body."""

from __future__ import annotations

from aws_lambda_powertools import Logger

logger = Logger(service="seedkeeper")
METRICS_NAMESPACE = "Seedkeeper"
