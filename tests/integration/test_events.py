"""Every file in events/ runs through its handler and gives its documented status. Run in
this order against one fresh stack, so each event meets the state the one before left."""

from __future__ import annotations

import json

from functions import Context, event, invoke, load_function
from seedkeeper_tools.infra import ROOT
from slots import Slots

# (event file, function, documented status), in the order they are sent.
DOCUMENTED = [
    ("rotation-healthz", "rotation", 200),
    ("rotation-get", "rotation", 404),  # nothing recorded yet
    ("rotation-post-bad-input", "rotation", 400),
    ("rotation-post", "rotation", 201),
    ("rotation-get", "rotation", 200),
    ("seed-healthz", "seed", 200),
    ("seed-bad-ref", "seed", 400),
    ("seed-new", "seed", 202),  # the event's archives are recorded by rotation-post
    ("seed-poll", "seed", 202),
    ("keepalive", "seed", 200),  # the seed-new slot's owner
    ("seed-other-owner", "seed", 409),
    ("seed-cold", "seed", 200),
    ("receipt", "receipt", 404),  # the event's incarnation is an ECS task, not this one
    ("receipt-wrong-owner", "receipt", 404),
    ("slot-evidence", "slot_evidence", 200),
    ("slot-evidence-wrong-claim", "slot_evidence", 404),
    # The slot task's calls, signed by the ECS task the events name: not this slot's task
    # (the seed-new slot's task is recorded already).
    ("task-start", "checkpoint", 403),
    ("checkpoint-upload", "checkpoint", 403),
    ("checkpoint-record", "checkpoint", 403),
    ("checkpoint-failed", "checkpoint", 403),
    ("rotation-delete", "rotation", 200),
]


def test_every_event_file_is_documented_here() -> None:
    files = {path.stem for path in (ROOT / "events").glob("*.json")}
    assert files == {name for name, _, _ in DOCUMENTED} | {"idle-sweep"}


def test_every_event_gives_its_documented_status(slots: Slots) -> None:
    handlers = {name: load_function(name) for _, name, _ in DOCUMENTED}
    statuses = [
        (name, invoke(handlers[function], event(name))[0]) for name, function, _ in DOCUMENTED
    ]
    assert statuses == [(name, status) for name, _, status in DOCUMENTED]
    summary = load_function("idle_sweep")(event("idle-sweep"), Context())
    assert json.loads(json.dumps(summary))["finished"] is True
