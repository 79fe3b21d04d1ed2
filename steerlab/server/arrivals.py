"""Requests on their way to the engine thread, announced to its batching window.

The scheduler waits up to its window for more jobs to share a batch. A client that sends one
request at a time (lm-eval, by default) would wait the window out on every request, for
nothing. So each request for a job is announced (``Scheduler.expect``) as soon as its body
has arrived whole, and withdrawn when it ends without one (a bad body, a client gone); the
window closes once nothing is queued and nothing announced is on its way.

An announcement waits for the body, not the headers: a client that sends its headers and
part of a body, then stalls (or trickles the rest in), would otherwise keep every batch
waiting its whole window for a job that may never come. Between the body's last byte and
the job's submission there is only parsing and tokenizing, which never waits on a client.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steerlab.engine.scheduler import Scheduler

ANNOUNCED = "steerlab.announced"  # in a request's scope from its body's end to its job's submission
JOB_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/batch"})


class Announce:
    """ASGI middleware: ``batcher.expect()`` once a POST to a path that submits a job has
    sent its whole body."""

    def __init__(self, app: ASGIApp, batcher: Scheduler) -> None:
        self.app, self.batcher = app, batcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in JOB_PATHS:
            await self.app(scope, receive, send)
            return

        arrived = False

        async def receive_and_announce() -> Message:
            nonlocal arrived
            message = await receive()
            whole = message["type"] == "http.request" and not message.get("more_body", False)
            if whole and not arrived:
                self.batcher.expect()
                scope[ANNOUNCED] = arrived = True
            return message

        try:
            await self.app(scope, receive_and_announce, send)
        finally:
            if scope.pop(ANNOUNCED, False):  # ended before its job was submitted
                self.batcher.unexpect()


def announced(scope: Scope) -> bool:
    """Whether the request was announced; it no longer is (its job is being submitted).

    >>> scope = {ANNOUNCED: True}
    >>> announced(scope), announced(scope)
    (True, False)
    """
    return bool(scope.pop(ANNOUNCED, False))
