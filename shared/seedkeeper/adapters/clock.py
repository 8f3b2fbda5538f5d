"""Time as the records keep it: whole epoch seconds."""

from __future__ import annotations

import time


def epoch_seconds() -> int:
    return int(time.time())
