"""Request bodies parsed and validated in a worker thread, never on the event loop.

A body is read whole (``BodyLimit`` has already refused one over the limit with a 413),
then parsed as JSON and checked against its pydantic model in a thread, so a client posting
megabytes holds up no other client; a body that fails is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from steerlab.server.errors import invalid

M = TypeVar("M", bound=BaseModel)


def body_of(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A FastAPI dependency: the request's JSON body as a ``model``.

    >>> from fastapi import Depends, FastAPI
    >>> from fastapi.testclient import TestClient
    >>> from pydantic import BaseModel
    >>> class Echo(BaseModel):
    ...     text: str
    >>> app = FastAPI()
    >>> @app.post("/echo")
    ... async def echo(body: Echo = Depends(body_of(Echo))) -> Echo:
    ...     return body
    >>> TestClient(app).post("/echo", json={"text": "hi"}).json()
    {'text': 'hi'}
    """

    async def parse(request: Request) -> M:
        raw = await request.body()
        return await run_in_threadpool(parse_body, model, raw)

    return parse


def parse_body(model: type[M], raw: bytes) -> M:
    """``raw`` as a ``model``, or an ``ApiError`` (400) naming the first field at fault."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise invalid(error.errors()) from None
