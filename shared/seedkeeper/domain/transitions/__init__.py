"""The slot lifecycle as one table: every transition declared once.

A `Transition` names the states it leaves (`InState`), the checks it makes of the record
in order (each a refusal token), what is already true (acknowledged with no write) and its
effect on the record and its operation window. From that one declaration:

- `Transition.decide` is the pure decision on the record as read: `Change` (the record to
  write), `Acknowledged` (already true) or `Refused` (a reason token);
- the store (`seedkeeper.store.lifecycle`) derives the write: its ConditionExpression is
  the same checks over the same attributes (plus the `rev` and schema it was read at), its
  UpdateExpression the difference between the record as read and as changed.

`TRANSITIONS` is the table; `mermaid()` draws it (the state diagram of the docs site's
`docs/concepts/lifecycle.md` is checked against it). A birth is the one write with no
record to read: `born`.

The machinery is in `machinery`, the table and its diagram in `table`; the transitions
are declared by concern: `polls` (the owner's), `seeding` (an attempt), `idle` (the
sweep's steps with an idle slot), `checkpoint` (the slot task's), `task_stop` (a stopped
task's work parked or lost) and `bookkeeping` (writes that keep the state).
"""

from seedkeeper.domain.transitions.bookkeeping import (
    NOTE_RETAINED,
    RESERVE,
    SETTLE,
    Reservation,
    Retained,
    Settlement,
)
from seedkeeper.domain.transitions.checkpoint import (
    CHECKPOINT_FAILED,
    CHECKPOINT_FAILED_REASON,
    FREEZE,
    RECORD_CHECKPOINT,
    THAWED,
    CheckpointFailed,
    Freezing,
    Thawed,
    Uploaded,
)
from seedkeeper.domain.transitions.idle import (
    FENCE,
    FENCE_PARK,
    PARK,
    REQUEST_CHECKPOINT,
    RETIRE,
    Parked,
    Stopped,
)
from seedkeeper.domain.transitions.machinery import (
    ALL_STATES,
    Acknowledged,
    At,
    Below,
    Change,
    Check,
    Decision,
    Equals,
    InState,
    Transition,
    holds,
    stored,
)
from seedkeeper.domain.transitions.polls import (
    CHECKPOINT_STATES,
    KEEPALIVE,
    RESUME,
    THAW,
    TOUCH,
    KeepAlive,
    Poll,
)
from seedkeeper.domain.transitions.seeding import (
    BEGIN_ATTEMPT,
    RECORD_INCARNATION,
    SETTLE_SEED,
    Launched,
    Verdict,
    born,
)
from seedkeeper.domain.transitions.table import TRANSITIONS, mermaid
from seedkeeper.domain.transitions.task_stop import (
    CHECKPOINT_ON_STOP,
    LOSE,
    PARK_ON_STOP,
    Lost,
    Stopping,
)

__all__ = [
    "ALL_STATES",
    "BEGIN_ATTEMPT",
    "CHECKPOINT_FAILED",
    "CHECKPOINT_FAILED_REASON",
    "CHECKPOINT_ON_STOP",
    "CHECKPOINT_STATES",
    "FENCE",
    "FENCE_PARK",
    "FREEZE",
    "KEEPALIVE",
    "LOSE",
    "NOTE_RETAINED",
    "PARK",
    "PARK_ON_STOP",
    "RECORD_CHECKPOINT",
    "RECORD_INCARNATION",
    "REQUEST_CHECKPOINT",
    "RESERVE",
    "RESUME",
    "RETIRE",
    "SETTLE",
    "SETTLE_SEED",
    "THAW",
    "THAWED",
    "TOUCH",
    "TRANSITIONS",
    "Acknowledged",
    "At",
    "Below",
    "Change",
    "Check",
    "CheckpointFailed",
    "Decision",
    "Equals",
    "Freezing",
    "InState",
    "KeepAlive",
    "Launched",
    "Lost",
    "Parked",
    "Poll",
    "Reservation",
    "Retained",
    "Settlement",
    "Stopped",
    "Stopping",
    "Thawed",
    "Transition",
    "Uploaded",
    "Verdict",
    "born",
    "holds",
    "mermaid",
    "stored",
]
