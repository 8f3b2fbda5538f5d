"""Two function-URL handlers in one process, on two threads (the local gateway answering a
slot task while a test, or a second gateway, invokes another function): each answers its
own request. Powertools keeps the event being resolved on a class attribute that every
resolver in the process shares, so a second invocation that starts while the first is
under way would hand the first one its event (a slot task's start once read a seed
poll's body, and failed as an invalid request)."""

from __future__ import annotations

import threading
from typing import Any

from aws_lambda_powertools.event_handler import Response, content_types

from functions import event, invoke
from seedkeeper.api.http import entrypoint, function_url_app
from seedkeeper.domain.models import Model


class Named(Model):
    name: str


def test_an_invocation_beside_another_waits_and_neither_reads_the_others_event() -> None:
    first_app, second_app = function_url_app(), function_url_app()
    first_inside, second_resolved = threading.Event(), threading.Event()

    @first_app.post("/first")
    def first(body: Named) -> Response[str]:
        first_inside.set()
        # Time for the second invocation to run, were it let in; it is not, so this waits out.
        second_resolved.wait(1.0)
        seen = first_app.current_event.json_body["name"]
        return Response(200, content_types.APPLICATION_JSON, f'"{body.name}/{seen}"')

    @second_app.post("/second")
    def second(body: Named) -> Response[str]:
        second_resolved.set()
        return Response(200, content_types.APPLICATION_JSON, f'"{body.name}"')

    answers: dict[str, tuple[int, Any]] = {}

    def call(name: str, app: Any) -> None:
        request = event("seed-new", rawPath=f"/{name}", body={"name": name})
        request["requestContext"] = request["requestContext"] | {
            "http": request["requestContext"]["http"] | {"path": f"/{name}"}
        }
        answers[name] = invoke(entrypoint(app), request)

    first_thread = threading.Thread(target=call, args=("first", first_app))
    first_thread.start()
    assert first_inside.wait(10)
    second_thread = threading.Thread(target=call, args=("second", second_app))
    second_thread.start()
    first_thread.join(10)
    second_thread.join(10)

    assert answers == {"first": (200, "first/first"), "second": (200, "second")}
