"""Response bodies in OpenAI's shapes (plus ``token_ids`` and a ``steerlab`` block)."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from steerlab.core.request import Completion, TokenScore
from steerlab.server.plan import Plan

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "length"}


def head(kind: str, model: str, object_: str) -> dict[str, Any]:
    return {"id": f"{kind}-{uuid.uuid4().hex[:24]}", "object": object_,
            "created": int(time.time()), "model": model}  # fmt: skip


def usage(plan: Plan, completions: list[Completion], n: int) -> dict[str, int]:
    """OpenAI's ``usage``: each prompt counted once (rows come ``n`` to a prompt), every row's
    new tokens."""
    prompt = sum(len(t) for t in plan.prompt_tokens[::n])
    new = sum(len(c.tokens) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}


def _extra(plan: Plan, row: int, c: Completion) -> dict[str, Any]:
    return {"token_ids": c.tokens, "steerlab": {"finish_reason": c.finish_reason,
                                                "alphas": list(plan.alphas[row]), **reads(c)}}  # fmt: skip


def reads(c: Completion) -> dict[str, Any]:
    """steerlab's extension fields for a row's reads: ``fired`` and ``condition_score``
    (when a steer is conditioned), ``monitors`` (name -> ``{"site", "prompt",
    "generated"}``, with ``monitor``). Only what the request asked for appears."""
    out: dict[str, Any] = {}
    if c.fired is not None:
        out["fired"], out["condition_score"] = c.fired, json_number(c.condition_score)
    if c.readouts:
        out["monitors"] = {
            name: {"site": r.site, "prompt": [json_number(v) for v in r.prompt],
                   "generated": [json_number(v) for v in r.generated]}
            for name, r in c.readouts.items()
        }  # fmt: skip
    return out


def json_number(value: float | None) -> float | None:
    """A float as JSON takes it: NaN and infinities (which JSON has not) become null."""
    return value if value is not None and math.isfinite(value) else None


def text_offsets(tokenizer: Any, tokens: Sequence[int], start: int = 0) -> list[int]:
    """Where each token's text begins, counting from ``start``, then where the last one ends:
    each token takes the characters of its text with special tokens left out, as the
    completion's text leaves them.

    >>> ids = lm.tokenizer.encode(" upon a time", add_special_tokens=False)
    >>> text_offsets(lm.tokenizer, ids, start=4)
    [4, 9, 11, 16]
    """
    offsets = [start]
    for t in tokens:
        offsets.append(offsets[-1] + len(tokenizer.decode([t], skip_special_tokens=True)))
    return offsets


def legacy_logprobs(tokenizer: Any, tokens: Sequence[int], scores: Sequence[TokenScore | None],
                    n: int, start: int = 0) -> dict[str, Any]:  # fmt: skip
    """OpenAI's legacy ``logprobs`` object: each token with its logprob and its ``n`` likeliest
    alternatives (null for a first prompt token, which nothing predicts); ``text_offset``
    counts from ``start``."""
    return {"tokens": [tokenizer.decode([t]) for t in tokens],
            "token_logprobs": [None if s is None else json_logprob(s.logprob) for s in scores],
            "top_logprobs": [None if s is None else top_dict(tokenizer, s, n) for s in scores],
            "text_offset": text_offsets(tokenizer, tokens, start)[:-1]}  # fmt: skip


def json_logprob(logprob: float) -> float:
    """-inf (a token the model rules out) as -9999.0, as OpenAI writes it: JSON has no inf."""
    return max(logprob, -9999.0)


def top_dict(tokenizer: Any, score: TokenScore, n: int) -> dict[str, float]:
    """The ``n`` most likely tokens and the chosen one (n + 1 entries when it is not among
    them), keyed by their text as OpenAI keys them."""
    out: dict[str, float] = {}
    for token, logprob in [*score.top[:n], (score.token, score.logprob)]:
        out.setdefault(tokenizer.decode([token]), json_logprob(logprob))
    return out


def scored_tokens(plan: Plan, row: int, prompt_scores: Sequence[TokenScore | None],
                  scores: Sequence[TokenScore]) -> tuple[list[int], list[TokenScore | None]]:  # fmt: skip
    """The tokens a completion's logprobs list, with their scores: the echoed prompt's
    (when echoing and it was scored), then the new ones, an EOS token that ended the row too."""
    prompt = plan.prompt_tokens[row] if plan.echo and prompt_scores else []
    return [*prompt, *(s.token for s in scores)], [*prompt_scores[: len(prompt)], *scores]


def completion_logprobs(tokenizer: Any, plan: Plan, row: int, c: Completion,
                        n: int) -> dict[str, Any]:  # fmt: skip
    return legacy_logprobs(tokenizer, *scored_tokens(plan, row, c.prompt_scores, c.scores), n)


def _chat_token(tokenizer: Any, token: int, logprob: float) -> dict[str, Any]:
    piece = tokenizer.decode([token])
    return {"token": piece, "logprob": json_logprob(logprob), "bytes": list(piece.encode())}


def chat_logprobs(tokenizer: Any, scores: list[TokenScore], n: int) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: each token with its ``n`` most likely alternatives."""
    return {"content": [{**_chat_token(tokenizer, s.token, s.logprob),
                         "top_logprobs": [_chat_token(tokenizer, t, lp) for t, lp in s.top[:n]]}
                        for s in scores]}  # fmt: skip


def completion(plan: Plan, completions: list[Completion], model: str, n: int,
               logprobs: int | None, tokenizer: Any) -> dict[str, Any]:  # fmt: skip
    choices = [{"index": i, "text": (plan.echo[i] if plan.echo else "") + c.text,
                "finish_reason": FINISH[c.finish_reason],
                "logprobs": None if logprobs is None
                else completion_logprobs(tokenizer, plan, i, c, logprobs),
                **_extra(plan, i, c)} for i, c in enumerate(completions)]  # fmt: skip
    return {**head("cmpl", model, "text_completion"), "choices": choices,
            "usage": usage(plan, completions, n), "seed": plan.seed}  # fmt: skip


def chat(plan: Plan, completions: list[Completion], model: str, n: int,
         top_logprobs: int | None, tokenizer: Any) -> dict[str, Any]:  # fmt: skip
    """``top_logprobs`` None: no logprobs; else each token's with that many alternatives."""
    choices = [{"index": i, "message": {"role": "assistant", "content": c.text},
                "finish_reason": FINISH[c.finish_reason],
                "logprobs": None if top_logprobs is None
                else chat_logprobs(tokenizer, c.scores[: len(c.tokens)], top_logprobs),
                **_extra(plan, i, c)} for i, c in enumerate(completions)]  # fmt: skip
    return {**head("chatcmpl", model, "chat.completion"), "choices": choices,
            "usage": usage(plan, completions, n), "seed": plan.seed}  # fmt: skip


def batch(plan: Plan, completions: list[Completion], model: str,
          logprobs: bool) -> dict[str, Any]:  # fmt: skip
    """One result per prompt, each with its rows (one per alpha), in ``generate``'s order."""
    results: dict[int, dict[str, Any]] = {}
    for row, c in enumerate(completions):
        p = plan.prompt_index[row]
        result = results.setdefault(p, {"index": p, "prompt_token_ids": plan.prompt_tokens[row],
                                        "rows": []})  # fmt: skip
        result["rows"].append({"text": c.text, "token_ids": c.tokens, "finish_reason": c.finish_reason,
                               "alphas": list(plan.alphas[row]),
                               "logprobs": c.logprobs if logprobs else None,
                               **reads(c)})  # fmt: skip
    return {**head("batch", model, "batch.result"), "results": list(results.values()),
            "seed": plan.seed, "usage": usage(plan, completions, 1)}  # fmt: skip
