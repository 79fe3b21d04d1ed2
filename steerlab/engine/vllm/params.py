"""One steerlab ``Request`` as one vLLM request: prompt, sampling settings, steers as data.

Nothing here imports vLLM: the engine builds vLLM's types from these plain values.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from steerlab.core.positions import position_mask, prompt_span
from steerlab.core.request import OPTIONS, Request
from steerlab.core.sampling import is_greedy
from steerlab.core.steer import Steer
from steerlab.engine.plan import Plan
from steerlab.engine.vllm.batch import DATA_KEY


def live_steers(request: Request) -> tuple[Steer, ...]:
    """The steers that change anything: alpha 0 leaves an activation bit-identical."""
    return tuple(s for s in request.steers if s.alpha[0] != 0.0)


def sent_steers(request: Request) -> tuple[Steer, ...]:
    """The steers a worker is told of (``Plan.told``)."""
    return tuple(request.steers[j] for j in Plan.of([request]).told(0))


def row_plan(request: Request, row: str, plan: Plan | None = None) -> Plan:
    """The plan a worker is told of for one row (``Plan.only``, named ``row``): its sent
    steers, its monitors and where its conditions read from."""
    return (plan or Plan.of([request])).only(0, row)


def row_tensors(request: Request, plan: Plan | None = None) -> dict[str, torch.Tensor]:
    """Every tensor a row's plan names by key (``Plan.tensors``): its steers' vectors,
    their ops' tensors, their conditions' directions, and its monitors' directions."""
    return row_plan(request, "", plan).tensors()


def cache_salt(request: Request, revision: str) -> str | None:
    """A prefix-cache namespace for a steered request; None for an unsteered one.

    A row that reads (a condition or a monitor) gets a salt of its own, never reused: its
    worker must see every prompt token, so it reads nothing from the prefix cache.

    KV blocks computed under one steer must never be served to a request steered
    differently, or not at all. The salt covers what the keys and values depend on: each
    steer (site, vector, positions, op) with its alpha, and the model revision. Where the
    steer depends on which tokens are prompt ("prompt" / "generated", a span such as
    "first:3+last:3"), the prompt length too: a longer prompt turns some of a shorter one's
    generated tokens into prompt tokens, and moves a span's last tokens.
    """
    if request.reads:
        return "steerlab-reads:" + secrets.token_hex(16)
    steers = live_steers(request)
    if not steers:
        return None
    parts = [f"revision={revision}"]
    parts += [s.mark() for s in steers]
    if any(s.positions in ("prompt", "generated") or prompt_span(s.positions) for s in steers):
        parts.append(f"prompt_len={len(request.prompt)}")
    return "steerlab:" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def request_seed(seed: int, stream: str) -> int:
    """vLLM's per-request seed: rows with the same ``(seed, stream)`` draw the same numbers."""
    digest = hashlib.sha256(f"{seed}|{stream}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


@dataclass(frozen=True)
class VLLMRequest:
    """What ``LLMEngine.add_request`` takes, as plain values."""

    row: str
    prompt: dict[str, Any]  # a TokensPrompt: prompt_token_ids and, if steered, cache_salt
    sampling: dict[str, Any]  # SamplingParams keyword arguments


def to_vllm(request: Request, row: str, *, revision: str, eos_ids: set[int],
            vocab: int | None = None, plan: Plan | None = None,
            told: Plan | None = None) -> VLLMRequest:  # fmt: skip
    """The vLLM form of one row: its steers travel by vector key, as ``extra_args``.

    Scores are vLLM's raw logprobs (the engine starts vLLM with ``logprobs_mode=
    "raw_logprobs"``: before temperature, top-k or top-p), N alternatives capped at the
    ``vocab`` size. vLLM samples at least one token, so a row that only scores its prompt
    (``max_new_tokens=0``) samples one that the engine drops: the prompt's scores come from
    the same prefill either way. ``plan``: ``Plan.of([request])``, and ``told``:
    ``row_plan(request, row)``, where made already.
    """
    s = request.sampling
    prompt_top = None if s.prompt_logprobs is None else _capped(s.prompt_logprobs, vocab)
    plan = told or row_plan(request, row, plan)
    prompt: dict[str, Any] = {"prompt_token_ids": list(request.prompt)}
    salt = cache_salt(request, revision)
    if salt is not None:
        prompt["cache_salt"] = salt
    sampling: dict[str, Any] = {
        "max_tokens": max(s.max_new_tokens, 1),
        "temperature": 0.0 if is_greedy(s.temperature) else s.temperature,  # one floor
        "top_k": s.top_k or 0,
        "seed": request_seed(s.seed, request.stream),
        "ignore_eos": True,  # steerlab's EOS set, below, is the only one that stops a row
        "stop_token_ids": sorted(eos_ids) if s.stop_at_eos else [],
        "logprobs": _capped(s.logprobs or 0, vocab),  # 0: the sampled token's own
        "prompt_logprobs": prompt_top,
        "detokenize": False,  # steerlab decodes the text itself; vLLM would decode every top
        "logit_bias": dict(s.logit_bias) or None,
        # the options vLLM takes as they are (core.request.OPTIONS): top-p and min-p, and
        # the logit adjustments core.sampling.adjust_logits writes out (vLLM's min_tokens
        # masks the EOS ids whether or not they stop the row, as steerlab's does)
        **{o.name: getattr(s, o.name) for o in OPTIONS if o.vllm},
    }
    if plan.steers or request.monitors:
        sampling["extra_args"] = {DATA_KEY: plan.to_data()}
    return VLLMRequest(row, prompt, sampling)


def _capped(top: int, vocab: int | None) -> int:
    return top if vocab is None else min(top, vocab)


def expected_tokens(request: Request, cached: int, generated: int) -> int:
    """A lower bound on the tokens a row's hooks must have steered (summed over steers).

    The model is fed positions ``cached .. len(prompt) + generated - 2``: prefix-cache hits
    are not recomputed, and the last sampled token is never fed back.
    """
    n_prompt = len(request.prompt)
    fed = fed_positions(request, cached, generated)
    return sum(int(position_mask(s.positions, fed, fed >= n_prompt, n_prompt).sum())
               for s in live_steers(request))  # fmt: skip


def fed_positions(request: Request, cached: int, generated: int) -> np.ndarray:
    """The positions vLLM fed a row with ``generated`` tokens sampled: from the first not
    served by the prefix cache (``cached``) to the last but one (the last sampled token is
    never fed back)."""
    return np.arange(cached, len(request.prompt) + generated - 1)
