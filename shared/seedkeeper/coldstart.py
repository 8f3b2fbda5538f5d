"""A handler module's imports, without the garbage collector's passes over them.

What a handler imports (boto3, Powertools, pydantic, the models) lives as long as its
process, so a collection during the import frees next to nothing, yet each one walks more
objects than the last: about 30 ms of a function's cold start. `handler_imports` pauses
collection for them, then freezes what they built (`gc.freeze`: out of every later
collection's way, which also shortens those) and resumes it, even if an import fails.

Only a process's first handler import does so: one that comes later (the local stack's
gateway loads six handlers, a test process may load them many times) would freeze its host's
objects again each time, and what is frozen while garbage is never collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def handler_imports() -> Iterator[None]:
    if gc.get_freeze_count() or not gc.isenabled():
        yield  # frozen before, or collection is someone else's to resume: as it is
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
