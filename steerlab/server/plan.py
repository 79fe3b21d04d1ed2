"""From a checked request body to engine rows, exactly as ``lm.generate`` lays them out.

A server request is defined as an in-process call: ``/v1/completions`` with prompt P and
``n`` is ``lm.generate([P] * n, steer, ...)``, rows prompt-major, the k-th repeat of a text
drawing from its own random stream. A row's stream depends only on its own request, so
what else shares its batch never changes its tokens. Everything here runs before compute
and fails with an ``ApiError`` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from steerlab.core.directions import direction_of
from steerlab.core.errors import ContextError, SamplingError
from steerlab.core.monitors import Monitor
from steerlab.core.ops import SteerError
from steerlab.core.prompts import Prompt, PromptError
from steerlab.core.reads import Condition, Gate
from steerlab.core.reft import LoReFT
from steerlab.core.request import OPTIONS, Request, Sampling, fresh_seed
from steerlab.core.rows import Rows, checked_monitors, lay_out, lay_out_ids
from steerlab.core.sites import SiteError, resolve
from steerlab.core.steer import Steer, SteerData, at_alphas, steer_from_data, steers_at
from steerlab.core.window import check_window
from steerlab.model import SteerableModel
from steerlab.server.errors import ApiError
from steerlab.server.schemas import (
    BatchItem,
    BatchRequest,
    ChatRequest,
    CompletionRequest,
    MonitorSpec,
    Sampled,
    Steering,
)
from steerlab.server.vectors import VectorStore
from steerlab.vectors.vector import SteeringVector

# The generation options by wire name (core.request.OPTIONS); a null one is the default.
# max_tokens and seed have defaults of the endpoint's own, given to sampling_of.
_SETTINGS = tuple(o.wire for o in OPTIONS)
_WIRE = {o.name: o.wire for o in OPTIONS}  # Sampling's names -> the wire's


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; larger requests get a 400 naming the field."""

    max_n: int = 16
    max_rows: int = 64  # prompts x n x alphas in one request
    max_tokens: int = 4096
    max_body_bytes: int = 8 << 20
    max_vectors: int = 256  # vectors the store holds (--max-vectors)
    max_vector_bytes: int = 1024 << 20  # their tensors' bytes together (--max-vector-mb)


@dataclass
class Plan:
    """One request's rows, and what its response reports about them (one entry per row)."""

    requests: list[Request]
    prompt_tokens: list[list[int]]
    prompt_index: list[int]
    alphas: list[tuple[float, ...]]
    seed: int
    beta: float | None
    echo: list[str] = field(default_factory=list)  # per row, the prompt text echoed (echo=true)


def steers_of(items: Sequence[Steering], lm: SteerableModel, store: VectorStore,
              alphas: Sequence[float] | None = None, where: str = "steering") -> list[Steer]:  # fmt: skip
    """The ``Steer`` values a ``steering`` list asks for, each checked against ``lm``."""
    out: list[Steer] = []
    for i, item in enumerate(items):
        out += _steers(item, lm, store, alphas, f"{where}[{i}]")
    return out


def _steers(item: Steering, lm: SteerableModel, store: VectorStore,
            alphas: Sequence[float] | None, param: str) -> list[Steer]:  # fmt: skip
    def named(name: str, site: str) -> torch.Tensor:  # a condition's named vector
        return direction_of(store.vector(name, f"{param}.when.vector"), site)[0]

    try:  # the core's one reader of a steer's data form
        data = steer_from_data(item.model_dump(exclude={"sha256"}), partial=True, vectors=named)
    except SteerError as error:
        raise ApiError(
            400, str(error), f"{param}.{error.field}" if error.field else param
        ) from None
    if data.when is not None:
        check_gate(data.when, lm, f"{param}.when")
    alpha = data.alpha if data.alpha is not None else _alphas(alphas or 1.0, f"{param}.alpha")
    if item.site is not None:
        try:
            resolve(item.site, lm.sites())
        except SiteError as error:
            raise ApiError(400, str(error), f"{param}.site") from None
    source: torch.Tensor | SteeringVector
    if isinstance(item.vector, str):
        held = store.held(item.vector, f"{param}.vector", item.sha256)
        if isinstance(held, LoReFT):
            return _reft_steers(held, item, data, alpha, param)
        source = held
    else:
        if item.site is None:
            raise ApiError(400, "An inline vector needs a site.", f"{param}.site")
        if item.sha256 is not None:
            raise ApiError(
                400, "sha256 pins a named vector; this one is inline.", f"{param}.sha256"
            )
        source = _inline(item.vector, lm.d_model, f"{param}.vector")
    try:
        return steers_at(source, item.site, alpha, data.positions, data.op, when=data.when)
    except SteerError as error:
        where = f"{param}.{error.field}" if error.field in ("when", "op") else param
        raise ApiError(400, str(error), where) from None


def check_gate(gate: Gate, lm: SteerableModel, param: str) -> None:
    """A condition (or any_of / all_of of them) against ``lm``: each one's site and width,
    a fault named by its path in the request (``steering[0].when.any_of[1].site``)."""
    if isinstance(gate, Condition):
        try:
            gate.check(lm.sites(), lm.d_model)
        except SiteError as error:
            raise ApiError(400, f"The condition's site: {error}", f"{param}.site") from None
        except SteerError as error:
            raise ApiError(400, str(error), f"{param}.{error.field or 'vector'}") from None
        return
    for i, part in enumerate(gate.conditions):
        check_gate(part, lm, f"{param}.{gate.kind}[{i}]")


def _reft_steers(reft: LoReFT, item: Steering, data: SteerData,
                 alpha: float | Sequence[float], param: str) -> list[Steer]:  # fmt: skip
    """A held LoReFT's steer: at its own site, its op itself; positions given replace its
    own, and each alpha multiplies its scale."""
    if item.site is not None and item.site != reft.site:
        raise ApiError(400, f"{item.vector!r} is a LoReFT trained at {reft.site}; it cannot "
                            f"steer at {item.site}.", f"{param}.site")  # fmt: skip
    if "op" in item.model_fields_set:
        raise ApiError(400, f"{item.vector!r} is a LoReFT: it is its own op; leave op out.",
                       f"{param}.op")  # fmt: skip
    if "positions" in item.model_fields_set:
        reft = reft.at_positions(data.positions)
    try:
        alphas = [alpha] if isinstance(alpha, (int, float)) else list(alpha)
        return [replace(s, when=data.when) for s in at_alphas(reft.steers(), alphas)]
    except SteerError as error:
        raise ApiError(400, str(error), param) from None


def _alphas(alpha: float | Sequence[float], param: str) -> list[float]:
    values = [alpha] if isinstance(alpha, (int, float)) else list(alpha)
    if not values or not all(math.isfinite(a) for a in values):
        raise ApiError(400, f"alpha must be a finite number or a non-empty list; got {alpha!r}.",
                       param)  # fmt: skip
    return [float(a) for a in values]


def _inline(values: list[float], d_model: int, param: str) -> torch.Tensor:
    if len(values) != d_model:
        raise ApiError(400, f"The vector has {len(values)} values; this model has d_model="
                            f"{d_model}.", param)  # fmt: skip
    if not all(math.isfinite(v) for v in values):
        raise ApiError(400, "The vector has NaN or infinite values.", param)
    return torch.tensor(values, dtype=torch.float32)


def sampling_of(body: Sampled, max_tokens: int, seed: int, limits: Limits, vocab: int, *,
                logprobs: int | None = None, prompt_logprobs: int | None = None) -> Sampling:  # fmt: skip
    """The engine's ``Sampling`` for these settings; ``max_tokens`` is checked against the cap,
    ``logit_bias`` against the model's vocabulary. A bad value is a 400 naming its field."""
    if max_tokens > limits.max_tokens:
        raise ApiError(400, f"max_tokens is {max_tokens}; this server allows at most "
                            f"{limits.max_tokens}.", "max_tokens")  # fmt: skip
    given = {o.name: o.from_wire(v) for o in OPTIONS
             if (v := getattr(body, o.wire, None)) is not None}  # fmt: skip
    given.update(max_new_tokens=max_tokens, seed=seed)
    try:
        sampling = Sampling.of(given, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        sampling.check_vocab(vocab)
    except SamplingError as error:
        raise ApiError(400, str(error), _WIRE.get(error.field, error.field)) from None
    return sampling


def rows_of(lm: SteerableModel, prompts: Sequence[Prompt | list[int]], steers: list[Steer],
            sampling: Sampling, *, chat: bool, param: str = "prompt",
            monitors: Sequence[Monitor] = ()) -> tuple[Rows, list[Request]]:  # fmt: skip
    """Prompts x alphas as rows, with the context window checked against ``max_tokens``;
    prompts given as token ids are fed as they are."""
    try:
        if prompts and all(_ids(p) for p in prompts):
            rows = lay_out_ids(lm, prompts, steers, new_tokens=0)  # type: ignore[arg-type]
        else:
            rows = lay_out(lm, prompts, steers, chat=chat, new_tokens=0)  # type: ignore[arg-type]
        check_window(lm.n_ctx, max(len(ids) for ids in rows.encoded), sampling.max_new_tokens,
                     what="max_tokens")  # fmt: skip
    except ContextError as error:
        raise ApiError(400, str(error), "max_tokens") from None
    except (PromptError, SteerError, SiteError) as error:  # SiteError: a steer's own, or a
        # condition's, is named where the steering is read (steers_of); here in case one slips by
        where = param if isinstance(error, PromptError) else "steering"
        raise ApiError(400, str(error), where) from None
    return rows, rows.requests(sampling, monitors)


def monitors_of(specs: Sequence[MonitorSpec], lm: SteerableModel,
                store: VectorStore) -> tuple[Monitor, ...]:  # fmt: skip
    """The ``monitor`` list as monitors, each checked against ``lm``; names must differ."""
    out = []
    for i, spec in enumerate(specs):
        param = f"monitor[{i}]"
        try:
            resolve(spec.site, lm.sites())
        except SiteError as error:
            raise ApiError(400, str(error), f"{param}.site") from None
        if isinstance(spec.vector, str):
            vector = direction_of(store.vector(spec.vector, f"{param}.vector"), spec.site)[0]
        else:
            vector = _inline(spec.vector, lm.d_model, f"{param}.vector")
        try:
            out.append(Monitor(spec.name, spec.site, vector))
        except SteerError as error:
            raise ApiError(400, str(error), param) from None
    try:
        return checked_monitors(lm, out)
    except SteerError as error:
        raise ApiError(400, str(error), "monitor") from None


def check_size(rows: int, limits: Limits, param: str) -> None:
    if rows > limits.max_rows:
        raise ApiError(400, f"This request asks for {rows} rows (prompts x n x alphas); this "
                            f"server allows at most {limits.max_rows}.", param)  # fmt: skip


def seed_of(seed: int | None) -> int:
    return fresh_seed() if seed is None else seed


def beta_of(body: Sampled, default: float | None, amplifies: bool) -> float | None:
    """The request's amplification beta: its own, else the server's; None for none."""
    if body.amplify is None:
        return default
    if not amplifies:
        raise ApiError(400, "This server holds no 'before' model to amplify against; start it "
                            "with --amplify-before PATH.", "amplify")  # fmt: skip
    if not math.isfinite(body.amplify.beta):
        raise ApiError(400, f"beta must be finite; got {body.amplify.beta!r}.", "amplify.beta")
    return float(body.amplify.beta)


def plan_completion(body: CompletionRequest, lm: SteerableModel, store: VectorStore,
                    limits: Limits, beta: float | None, preset: Sequence[Steer] = ()) -> Plan:  # fmt: skip
    """``/v1/completions``: ``lm.generate([p] * n for each prompt p, steer, ...)``.

    A prompt is text or token ids (fed as they are, no BOS added); a list of either is one
    row group per prompt. ``echo`` puts each prompt's text, tokens and log-probabilities
    before its completion; ``logprobs: N`` adds the N likeliest tokens at every position.
    The prompt is scored by the same steered forward pass that samples the first new token
    (``Sampling.prompt_logprobs``). ``max_tokens: 0`` with ``echo`` scores the prompt and
    samples nothing.
    """
    prompt: Any = body.prompt
    prompts: list[Prompt | list[int]] = [prompt] if isinstance(prompt, str) or _ids(prompt) else [*prompt]  # fmt: skip
    if not prompts:
        raise ApiError(400, "prompt is empty: give text, token ids, or a list of either.",
                       "prompt")  # fmt: skip
    if len({_ids(p) for p in prompts}) > 1:
        raise ApiError(400, "prompt mixes text and token ids.", "prompt")
    new = 16 if body.max_tokens is None else body.max_tokens
    if new == 0 and not body.echo:
        raise ApiError(400, "max_tokens 0 generates nothing: add echo=true to score the prompt.",
                       "max_tokens")  # fmt: skip
    check_stream_options(body)
    scored = body.echo and (body.logprobs is not None or new == 0)
    plan = _plan_one(body, prompts, body.n, new, False, lm, store, limits, beta, preset,
                     logprobs=body.logprobs,
                     prompt_logprobs=(body.logprobs or 0) if scored else None)  # fmt: skip
    if body.echo:  # the text as the completion's is decoded: special tokens left out
        texts = [p if isinstance(p, str) else lm.tokenizer.decode(p, skip_special_tokens=True)
                 for p in prompts]  # fmt: skip
        plan.echo = [texts[i // body.n] for i in range(len(plan.requests))]
    return plan


def check_stream_options(body: CompletionRequest | ChatRequest) -> None:
    """``stream_options`` asks for something a stream can do: refused without one."""
    options = body.stream_options
    if options is None:
        return
    if not body.stream:
        raise ApiError(400, "stream_options needs stream=true.", "stream_options")
    if options.continuous_usage_stats and not options.include_usage:
        raise ApiError(400, "continuous_usage_stats needs include_usage=true.",
                       "stream_options.continuous_usage_stats")  # fmt: skip


def _ids(prompt: object) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(type(t) is int for t in prompt)


def plan_chat(body: ChatRequest, lm: SteerableModel, store: VectorStore, limits: Limits,
              beta: float | None, preset: Sequence[Steer] = ()) -> Plan:  # fmt: skip
    """``/v1/chat/completions``: ``lm.generate([messages] * n, steer, chat=True, ...)``."""
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true.", "top_logprobs")
    check_stream_options(body)
    messages = [m.model_dump() for m in body.messages]
    if not messages:
        raise ApiError(400, "messages is empty.", "messages")
    new = body.max_completion_tokens or body.max_tokens or 64
    top = (body.top_logprobs or 0) if body.logprobs else None
    return _plan_one(body, [messages], body.n, new, True, lm, store, limits, beta, preset,
                     "messages", logprobs=top)  # fmt: skip


def _plan_one(body: CompletionRequest | ChatRequest, prompts: Sequence[Prompt | list[int]],
              n: int, new: int, chat: bool, lm: SteerableModel, store: VectorStore,
              limits: Limits, beta: float | None, preset: Sequence[Steer],
              param: str = "prompt", *,
              logprobs: int | None = None, prompt_logprobs: int | None = None) -> Plan:  # fmt: skip
    if n > limits.max_n:
        raise ApiError(400, f"n is {n}; this server allows at most {limits.max_n}.", "n")
    check_size(len(prompts) * n, limits, "n")
    steers = [*preset, *steers_of(body.steering, lm, store)]
    if any(len(s.alpha) > 1 for s in steers):
        raise ApiError(400, "alpha must be one number here; use /v1/batch for a list.",
                       "steering")  # fmt: skip
    seed = seed_of(body.seed)
    sampling = sampling_of(body, new, seed, limits, lm.n_vocab, logprobs=logprobs,
                           prompt_logprobs=prompt_logprobs)  # fmt: skip
    expanded = [p for p in prompts for _ in range(n)]
    monitors = monitors_of(body.monitor, lm, store)
    rows, requests = rows_of(lm, expanded, steers, sampling, chat=chat, param=param,
                             monitors=monitors)  # fmt: skip
    return Plan(requests, rows.encoded, rows.prompt_index, rows.alphas, seed, beta)


def plan_batch(body: BatchRequest, lm: SteerableModel, store: VectorStore, limits: Limits,
               beta: float | None, preset: Sequence[Steer] = ()) -> Plan:  # fmt: skip
    """``/v1/batch``: ``lm.generate(prompts, steer, ...)`` when settings are shared; a
    prompt with settings of its own gets rows laid out and seeded as in that same call."""
    if not body.prompts:
        raise ApiError(400, "prompts is empty.", "prompts")
    items = [p for p in body.prompts if isinstance(p, BatchItem)]
    check_alphas(body.alphas, _takes_alphas(body.steering) or any(
        i.alphas is None and _takes_alphas(i.steering) for i in items), "alphas")  # fmt: skip
    seed = seed_of(body.seed)
    shared = [*preset, *steers_of(body.steering, lm, store, body.alphas)]
    monitors = monitors_of(body.monitor, lm, store)
    texts = [p for p in body.prompts if isinstance(p, str)]
    if len(texts) == len(body.prompts):
        sampling = sampling_of(body, body.max_tokens or 64, seed, limits, lm.n_vocab)
        check_size(len(body.prompts) * max([len(s.alpha) for s in shared] or [1]), limits,
                   "prompts")  # fmt: skip
        rows, requests = rows_of(lm, [*texts], shared, sampling, chat=body.chat,
                                 param="prompts", monitors=monitors)  # fmt: skip
        return Plan(requests, rows.encoded, rows.prompt_index, rows.alphas, seed, beta)
    return _plan_items(body, shared, list(preset), seed, lm, store, limits, beta, monitors)


def _plan_items(body: BatchRequest, shared: list[Steer], preset: list[Steer], seed: int,
                lm: SteerableModel, store: VectorStore, limits: Limits,
                beta: float | None, monitors: Sequence[Monitor]) -> Plan:  # fmt: skip
    plan = Plan([], [], [], [], seed, beta)
    seen: dict[str, int] = {}
    for i, item in enumerate(body.prompts):
        item = item if isinstance(item, BatchItem) else BatchItem(prompt=item)
        prompt: Prompt = item.prompt if isinstance(item.prompt, str) else [
            m.model_dump() for m in item.prompt]  # fmt: skip
        merged = body.model_copy(update={k: v for k, v in item.model_dump().items()
                                         if v is not None and k in _SETTINGS})  # fmt: skip
        steers = _item_steers(body, item, i, shared, preset, lm, store)
        sampling = sampling_of(merged, merged.max_tokens or 64,
                               seed if item.seed is None else item.seed, limits,
                               lm.n_vocab)  # fmt: skip
        rows, requests = rows_of(lm, [prompt], steers, sampling, chat=body.chat,
                                 param=f"prompts[{i}]", monitors=monitors)  # fmt: skip
        text = repr(prompt)  # the k-th repeat of a text draws from stream k, as in lay_out
        seen[text] = seen.get(text, -1) + 1
        plan.requests += [replace(r, stream=f"{seen[text]}|{text}") for r in requests]
        plan.prompt_tokens += rows.encoded
        plan.prompt_index += [i] * len(requests)
        plan.alphas += rows.alphas
        check_size(len(plan.requests), limits, "prompts")
    return plan


def _item_steers(body: BatchRequest, item: BatchItem, i: int, shared: list[Steer],
                 preset: list[Steer], lm: SteerableModel, store: VectorStore) -> list[Steer]:  # fmt: skip
    """A batch item's steers: its own ``steering`` or the shared one, at its own ``alphas``
    or the shared ones."""
    steering = body.steering if item.steering is None else item.steering
    check_alphas(item.alphas, _takes_alphas(steering), f"prompts[{i}].alphas")
    if item.steering is None and item.alphas is None:
        return shared
    where = "steering" if item.steering is None else f"prompts[{i}].steering"
    alphas = body.alphas if item.alphas is None else item.alphas
    return preset + steers_of(steering, lm, store, alphas, where)


def _takes_alphas(steering: Sequence[Steering] | None) -> bool:
    """Whether a ``steering`` list has a steer without an alpha, which ``alphas`` gives one."""
    return any(item.alpha is None for item in steering or ())


def check_alphas(alphas: Sequence[float] | None, used: bool, param: str) -> None:
    """``/v1/batch``'s ``alphas``: honoured or refused, never dropped. Empty, it would leave
    the steers at alpha 1; with no steer to take them, one unsteered row would come back."""
    if alphas is None:
        return
    if not alphas:
        raise ApiError(400, f"{param} is empty: give at least one alpha, or leave it out.", param)
    if not all(math.isfinite(a) for a in alphas):
        raise ApiError(400, f"{param} must be finite numbers; got {list(alphas)!r}.", param)
    if not used:
        raise ApiError(400, f"{param} gives each steer without an alpha of its own one row per "
                            "alpha, and this request has no such steer (a preset's alpha is "
                            "its own): add one to steering, or leave alphas out.", param)  # fmt: skip
