"""``create_app``: the FastAPI application around one loaded model and its engine thread."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steerlab.engine.scheduler import Scheduler
from steerlab.server import tokens
from steerlab.server.arrivals import Announce
from steerlab.server.errors import ApiError, invalid
from steerlab.server.models import ServedModels
from steerlab.server.plan import Limits
from steerlab.server.presets import Preset, check_names
from steerlab.server.routes import ServerState, router
from steerlab.server.vectors import VectorStore


def create_app(
    models: ServedModels,
    *,
    name: str | None = None,
    api_key: str | None = None,
    limits: Limits | None = None,
    window_ms: float = 5.0,
    max_batch_rows: int = 64,
    presets: Sequence[Preset] = (),
) -> FastAPI:
    """An OpenAI-compatible steering server for ``models`` (run it with uvicorn).

    Args:
        models: the served model, and optionally a 'before' model for amplification.
        name: the model id clients send (default: the model's name).
        api_key: when set, every request needs ``Authorization: Bearer <api_key>``.
        limits: per-request caps (``n``, rows, ``max_tokens``, body size) and the vector
            store's bounds.
        window_ms: how long the engine thread waits for more requests to batch together;
            it stops waiting once no request is on its way (``arrivals.py``).
        max_batch_rows: the most rows decoded in one batch.
        presets: vectors at an alpha, each served as a model of its own name.

    >>> from fastapi.testclient import TestClient  # the app in-process, no server
    >>> with TestClient(create_app(ServedModels(lm))) as client:
    ...     body = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 5,
    ...             "temperature": 0}
    ...     client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    ', there was a little'
    >>> uvicorn.run(create_app(ServedModels(lm)), port=8000)  # starts a server  # doctest: +SKIP
    """
    limits = limits or Limits()
    batcher = Scheduler(lambda beta: models.model_for(beta).engine, window_s=window_ms / 1000,
                        max_rows=max_batch_rows, announced=True)  # fmt: skip
    store = VectorStore(models.lm, max_vectors=limits.max_vectors,
                        max_bytes=limits.max_vector_bytes)  # fmt: skip
    served = name or models.lm.name or "model"
    check_names(served, [p.name for p in presets])
    state = ServerState(models, store, batcher, limits, served, {p.name: p for p in presets})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        batcher.stop()

    app = FastAPI(title="steerlab", lifespan=lifespan, dependencies=[Depends(_auth(api_key))])
    app.state.steerlab = state
    app.include_router(router)
    app.include_router(tokens.router)
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    app.add_middleware(Announce, batcher=batcher)  # outermost: counted as its headers arrive
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _gone)  # type: ignore[arg-type]
    return app


def _auth(api_key: str | None) -> Callable[[Request], None]:
    def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                           None, "authentication_error")  # fmt: skip

    return check


class BodyLimit:
    """A 413 for a body over ``limit`` bytes, before any route reads it: at once when its
    Content-Length says so, and as soon as the bytes received pass it for a body sent in
    chunks without one. The body is read here, then replayed to the route."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = dict(scope["headers"]).get(b"content-length", b"")
        if size.isdigit() and int(size) > self.limit:
            await self._refuse(scope, receive, send, size.decode())
            return
        messages: list[Message] = []
        seen, more = 0, True
        while more:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(scope, receive, send, f"over {self.limit}")
                return
            more = message.get("more_body", False)

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        error = ApiError(413, f"The body has {size} bytes; this server takes at most "
                              f"{self.limit}.", "body")  # fmt: skip
        await JSONResponse(error.body(), status_code=413)(scope, receive, send)


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
    return JSONResponse(invalid(error.errors()).body(), status_code=400)


async def _gone(request: Request, error: ClientDisconnect) -> Response:
    """A client that closed its connection before its body arrived (it went away, or the
    idle timeout closed it, which says so in the log): nothing to answer, and no traceback.
    The response goes nowhere: the server sends nothing on a closed connection."""
    return Response(status_code=400)


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    param = "body" if error.status_code == 413 else None
    body = ApiError(error.status_code, str(error.detail), param).body()
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)
