"""The endpoints: OpenAI's models, completions and chat, plus health, vectors and batch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from steerlab.core.request import Completion
from steerlab.core.steer import Steer
from steerlab.engine.scheduler import Delta, Done, Event, Failed, Job, Scheduler
from steerlab.server import responses, streams
from steerlab.server.arrivals import announced
from steerlab.server.bodies import body_of
from steerlab.server.errors import ApiError, api_error
from steerlab.server.models import ServedModels
from steerlab.server.plan import Limits, Plan, beta_of, plan_batch, plan_chat, plan_completion
from steerlab.server.presets import Preset
from steerlab.server.schemas import BatchRequest, ChatRequest, CompletionRequest, Sampled
from steerlab.server.vectors import VectorStore, describe

router = APIRouter()


@dataclass
class ServerState:
    """What every request reads: the models, the vectors, the engine thread, the limits,
    and the presets served beside the model under names of their own."""

    models: ServedModels
    store: VectorStore
    batcher: Scheduler
    limits: Limits
    name: str
    presets: dict[str, Preset] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, name: str) -> list[Steer]:
        """The steers ``model: name`` stands for (none for the served model itself)."""
        if name == self.name:
            return []
        if name in self.presets:
            return self.presets[name].steers()
        known = ", ".join(repr(n) for n in [self.name, *self.presets])
        raise ApiError(404, f"No model named {name!r}; this server serves {known}.", "model",
                       "model_not_found")  # fmt: skip


def _state(request: Request) -> ServerState:
    return request.app.state.steerlab


def _beta(state: ServerState, body: Sampled) -> float | None:
    return beta_of(body, state.models.default_beta, state.models.amplifies)


@router.get("/health")
def health(request: Request) -> Response:  # sync: counting vLLM's hooks is an RPC
    """200 and ``"status": "ok"`` while the engine thread decodes; 503, ``"unhealthy"`` and
    why, once it has stopped (every request then gets a 503 too)."""
    state = _state(request)
    batcher = state.batcher
    if not batcher.running:
        why = str(batcher.failure or "The engine thread is not running.")
        return JSONResponse({"status": "unhealthy", "model": state.name, "error": why},
                            status_code=503)  # fmt: skip
    return JSONResponse({"status": "ok", "model": state.name, "hooks": state.models.hook_count(),
                         "queued": batcher.pending(), "batches": batcher.batches,
                         "cancelled": batcher.cancelled})  # fmt: skip


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    lm = state.models.lm
    card = {"id": state.name, "object": "model", "owned_by": "steerlab",
            "created": state.created, "n_layers": lm.n_layers, "d_model": lm.d_model,
            "n_ctx": lm.n_ctx, "sites": lm.sites(), "amplifies": state.models.amplifies,
            "beta": state.models.default_beta}  # fmt: skip
    presets = [{**card, "id": p.name, "root": state.name, "parent": state.name,
                "preset": {"sites": p.sites, "alpha": p.alpha}}
               for p in state.presets.values()]  # fmt: skip
    return {"object": "list", "data": [card, *presets]}


CompletionBody = Annotated[CompletionRequest, Depends(body_of(CompletionRequest))]
ChatBody = Annotated[ChatRequest, Depends(body_of(ChatRequest))]
BatchBody = Annotated[BatchRequest, Depends(body_of(BatchRequest))]


@router.post("/v1/completions")
async def completions(body: CompletionBody, request: Request) -> Response:
    state, plan, job, events = await _start(plan_completion, body, request)
    tokenizer = state.models.lm.tokenizer
    if not body.stream:
        done = await _finish(job, events, request)
        return await _json(responses.completion, plan, done, state.name, body.n, body.logprobs,
                           tokenizer)  # fmt: skip
    chunks = streams.TextChunks(plan, state.name, body.n, body.stream_options, tokenizer,
                                body.logprobs)  # fmt: skip
    return EventSourceResponse(_sse(job, events, chunks.head(), chunks.delta, chunks.finish))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatBody, request: Request) -> Response:
    state, plan, job, events = await _start(plan_chat, body, request)
    tokenizer = state.models.lm.tokenizer
    top = (body.top_logprobs or 0) if body.logprobs else None
    if not body.stream:
        done = await _finish(job, events, request)
        return await _json(responses.chat, plan, done, state.name, body.n, top, tokenizer)
    chunks = streams.ChatChunks(plan, state.name, body.n, body.stream_options, tokenizer, top)
    return EventSourceResponse(_sse(job, events, chunks.head(), chunks.delta, chunks.finish))


@router.post("/v1/batch")
async def batch(body: BatchBody, request: Request) -> Response:
    state, plan, job, events = await _start(plan_batch, body, request)
    if not body.stream:
        done = await _finish(job, events, request)
        return await _json(responses.batch, plan, done, state.name, body.logprobs)
    head = {"object": "batch.plan", "prompt_token_ids": plan.prompt_tokens,
            "prompt_index": plan.prompt_index, "alphas": plan.alphas, "seed": plan.seed}  # fmt: skip

    def delta(d: Delta) -> dict[str, Any]:
        return {"object": "batch.delta", **{k: getattr(d, k) for k in _BATCH_DELTA}}

    def result(d: Done) -> list[dict[str, Any]]:
        return [responses.batch(plan, d.completions, state.name, body.logprobs)]

    return EventSourceResponse(_sse(job, events, [head], delta, result))


_BATCH_DELTA = ("step", "row", "text", "tokens", "logprobs", "done", "reason")


async def _json(build: Callable[..., dict[str, Any]], *args: Any) -> JSONResponse:
    """``build(*args)`` as a JSON response, built and serialised in a worker thread (decoding
    every token of a long echo for its logprobs is no work for the event loop)."""
    return await run_in_threadpool(lambda: JSONResponse(build(*args)))


@router.post("/v1/vectors")
async def upload_vector(request: Request, name: str = Query(...),
                        replace: bool = Query(False)) -> dict[str, Any]:  # fmt: skip
    state = _state(request)
    data = await request.body()
    vector = await asyncio.to_thread(state.store.add, name, data, replace=replace)
    return describe(name, vector)


@router.get("/v1/vectors")
async def list_vectors(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": _state(request).store.listing()}


@router.delete("/v1/vectors/{name}")
async def delete_vector(name: str, request: Request) -> dict[str, Any]:
    _state(request).store.remove(name)
    return {"id": name, "object": "vector", "deleted": True}


async def _start(planner: Callable[..., Plan], body: Any,
                 request: Request) -> tuple[ServerState, Plan, Job, asyncio.Queue[Event]]:  # fmt: skip
    """What every generating endpoint does first: check the model ``body`` names, plan it
    with ``planner`` in a worker thread (planning tokenizes) and queue its job."""
    state = _state(request)
    preset = state.check_model(body.model)
    plan = await run_in_threadpool(planner, body, state.models.lm, state.store, state.limits,
                                   _beta(state, body), preset)  # fmt: skip
    job, events = _submit(state, plan, body.stream, request)
    return state, plan, job, events


def _submit(state: ServerState, plan: Plan, stream: bool,
            request: Request) -> tuple[Job, asyncio.Queue[Event]]:  # fmt: skip
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()

    def post(event: Event) -> None:  # called from the engine thread
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            loop.call_soon_threadsafe(events.put_nowait, event)

    job = Job(plan.requests, plan.beta, post, stream=stream)
    if state.batcher.failure is not None:  # a 503 now, before a stream's 200 goes out
        raise api_error(state.batcher.failure, job)
    state.batcher.submit(job, expected=announced(request.scope))
    return job, events


async def _finish(job: Job, events: asyncio.Queue[Event], request: Request) -> list[Completion]:
    """The job's completions; a client that goes away while waiting cancels its rows."""
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), 0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise ApiError(499, "The client went away.", None, "cancelled") from None
                continue
            if isinstance(event, Done):
                return event.completions
            if isinstance(event, Failed):
                raise api_error(event.error, job)
    finally:
        job.cancelled = not job.finished


async def _sse(job: Job, events: asyncio.Queue[Event], head: list[dict[str, Any]],
               delta: Callable[[Delta], dict[str, Any]],
               done: Callable[[Done], list[dict[str, Any]]]) -> AsyncIterator[bytes]:  # fmt: skip
    """Server-sent events: ``head``, one per delta, those ``done`` makes of the result (or
    the error), then ``[DONE]``. Events are shaped in a worker thread (they decode tokens).
    Closing the response (the client went away) cancels the job's rows between steps."""
    try:
        for item in head:
            yield _data(item)
        while True:
            event = await events.get()
            if isinstance(event, Delta):
                yield await run_in_threadpool(_shaped, delta, event)
            elif isinstance(event, Done):
                yield await run_in_threadpool(_shaped, done, event)
                yield _DONE
                return
            else:
                yield _data(api_error(event.error, job).body())
                return
    finally:
        job.cancelled = not job.finished


_DONE = b"data: [DONE]\n\n"


def _shaped(shape: Callable[[Any], dict[str, Any] | list[dict[str, Any]]], event: Event) -> bytes:
    """The events ``shape`` makes of ``event`` (one, or a list), as server-sent events."""
    items = shape(event)
    return b"".join(_data(item) for item in (items if isinstance(items, list) else [items]))


def _data(payload: dict[str, Any]) -> bytes:
    """One server-sent event; ``json.dumps`` escapes newlines, so one ``data:`` line holds it."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class EventSourceResponse(StreamingResponse):
    """A ``text/event-stream`` response that proxies pass through unbuffered."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})  # fmt: skip
