"""Response bodies in OpenAI's shapes (plus ``token_ids`` and a ``steerlab`` block)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from steerlab.core.request import Completion, TokenScore
from steerlab.engine.scheduler import Delta
from steerlab.server.plan import Plan

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "length"}


def head(kind: str, model: str, object_: str) -> dict[str, Any]:
    return {"id": f"{kind}-{uuid.uuid4().hex[:24]}", "object": object_,
            "created": int(time.time()), "model": model}  # fmt: skip


def _usage(plan: Plan, completions: list[Completion], n: int) -> dict[str, int]:
    prompt = sum(len(t) for t in plan.prompt_tokens[::n])
    new = sum(len(c.tokens) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}


def _extra(plan: Plan, row: int, c: Completion) -> dict[str, Any]:
    return {"token_ids": c.tokens,
            "steerlab": {"finish_reason": c.finish_reason, "alphas": list(plan.alphas[row])}}  # fmt: skip


def legacy_logprobs(tokenizer: Any, tokens: list[int], logprobs: list[float | None],
                    tops: list[dict[str, float] | None] | None, start: int = 0) -> dict[str, Any]:  # fmt: skip
    """OpenAI's legacy ``logprobs`` object; ``text_offset`` counts from ``start``, each token
    taking the characters of its text with special tokens left out, as the text leaves them."""
    offsets, at = [], start
    for t in tokens:
        offsets.append(at)
        at += len(tokenizer.decode([t], skip_special_tokens=True))
    values = [None if lp is None else json_logprob(lp) for lp in logprobs]
    return {"tokens": [tokenizer.decode([t]) for t in tokens], "token_logprobs": values,
            "top_logprobs": tops, "text_offset": offsets}  # fmt: skip


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


def completion_logprobs(tokenizer: Any, plan: Plan, row: int, c: Completion,
                        n: int) -> dict[str, Any]:  # fmt: skip
    """The echoed prompt's tokens (the first one null) when echoing, then the sampled ones;
    an end-of-sequence token that ended the row is listed too."""
    tokens: list[int] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    if plan.echo:
        tokens += plan.prompt_tokens[row]
        for score in c.prompt_scores:
            logprobs.append(None if score is None else score.logprob)
            tops.append(None if score is None else top_dict(tokenizer, score, n))
    tokens += [s.token for s in c.scores]
    logprobs += [s.logprob for s in c.scores]
    tops += [top_dict(tokenizer, s, n) for s in c.scores]
    return legacy_logprobs(tokenizer, tokens, logprobs, tops)


def stream_logprobs(tokenizer: Any, tokens: list[int], logprobs: list[float]) -> dict[str, Any]:
    tops: list[dict[str, float] | None] = [{tokenizer.decode([t]): lp}
                                           for t, lp in zip(tokens, logprobs)]  # fmt: skip
    return legacy_logprobs(tokenizer, tokens, list(logprobs), tops)


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
            "usage": _usage(plan, completions, n), "seed": plan.seed}  # fmt: skip


def chat(plan: Plan, completions: list[Completion], model: str, n: int,
         top_logprobs: int | None, tokenizer: Any) -> dict[str, Any]:  # fmt: skip
    """``top_logprobs`` None: no logprobs; else each token's with that many alternatives."""
    choices = [{"index": i, "message": {"role": "assistant", "content": c.text},
                "finish_reason": FINISH[c.finish_reason],
                "logprobs": None if top_logprobs is None
                else chat_logprobs(tokenizer, c.scores[: len(c.tokens)], top_logprobs),
                **_extra(plan, i, c)} for i, c in enumerate(completions)]  # fmt: skip
    return {**head("chatcmpl", model, "chat.completion"), "choices": choices,
            "usage": _usage(plan, completions, 1), "seed": plan.seed}  # fmt: skip


def text_chunk(base: dict[str, Any], delta: Delta, logprobs: bool, tokenizer: Any,
               finish: str | None = None) -> dict[str, Any]:  # fmt: skip
    lp = stream_logprobs(tokenizer, delta.tokens, delta.logprobs) if logprobs else None
    return {**base, "choices": [{"index": delta.row, "text": delta.text, "logprobs": lp,
                                 "finish_reason": finish, "token_ids": delta.tokens}]}  # fmt: skip


def chat_chunk(base: dict[str, Any], delta: Delta, logprobs: bool, tokenizer: Any,
               finish: str | None = None, role: bool = False) -> dict[str, Any]:  # fmt: skip
    scores = [TokenScore(t, lp) for t, lp in zip(delta.tokens, delta.logprobs)]
    lp = chat_logprobs(tokenizer, scores, 0) if logprobs else None
    content = {"role": "assistant", "content": ""} if role else {"content": delta.text}
    return {**base, "choices": [{"index": delta.row, "delta": content, "logprobs": lp,
                                 "finish_reason": finish, "token_ids": delta.tokens}]}  # fmt: skip


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
                               "logprobs": c.logprobs if logprobs else None})  # fmt: skip
    return {**head("batch", model, "batch.result"), "results": list(results.values()),
            "seed": plan.seed, "usage": _usage(plan, completions, 1)}  # fmt: skip
