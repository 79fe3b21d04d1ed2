"""Response bodies in OpenAI's shapes (plus ``token_ids`` and a ``steerlab`` block)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from steerlab.core.request import Completion
from steerlab.engine.scheduler import Delta
from steerlab.server.plan import Plan
from steerlab.vectors.scoring import PromptScore

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


def text_logprobs(tokenizer: Any, tokens: list[int], logprobs: list[float]) -> dict[str, Any]:
    pieces = [tokenizer.decode([t]) for t in tokens]
    offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    return {"tokens": pieces, "token_logprobs": logprobs, "top_logprobs": None,
            "text_offset": offsets}  # fmt: skip


def scored_completion(plan: Plan, completions: list[Completion], scores: list[PromptScore],
                      model: str, n: int, tokenizer: Any) -> dict[str, Any]:  # fmt: skip
    """``/v1/completions`` with ``echo`` and/or ``logprobs: N``: OpenAI's legacy logprobs.

    With echo, text, tokens and logprobs cover the prompt first (its first token's
    logprob ``None``), then the completion; ``text`` leaves special tokens out (a BOS is a
    token, with offset 0 length), as ``text_offset`` counts them. ``top_logprobs`` holds the N likeliest tokens at
    each position (N + 1 when the chosen one is not among them): the prompt's, from one
    forward over it, and the first new token's, from the same forward's last position.
    Log-probabilities are the model's (steered) before any sampling adjustment.
    """
    choices = []
    for i, (c, score) in enumerate(zip(completions, scores)):
        prompt = plan.requests[i].prompt
        tokens = [*prompt, *c.tokens] if plan.echo else list(c.tokens)
        values: list[float | None] = [*score.token_logprobs, *c.logprobs] if plan.echo else [
            *c.logprobs]  # fmt: skip
        tops = [*score.top, score.next_top] if plan.echo else [score.next_top]
        pieces = [tokenizer.decode([t]) for t in tokens]  # special tokens named, one per id
        shown = [tokenizer.decode([t], skip_special_tokens=True) for t in tokens]  # in ``text``
        top = None
        if plan.top:
            top = [_top(tokenizer, alts, t, v) if alts else None
                   for alts, t, v in zip(tops, tokens, values)]  # fmt: skip
            top += [None] * (len(tokens) - len(top))
        text = (
            tokenizer.decode(list(prompt), skip_special_tokens=True) if plan.echo else ""
        ) + c.text
        choices.append({
            "index": i, "text": text, "finish_reason": FINISH[c.finish_reason],
            "logprobs": {"tokens": pieces, "token_logprobs": values, "top_logprobs": top,
                         "text_offset": [sum(len(p) for p in shown[:k]) for k in range(len(shown))]},
            **_extra(plan, i, c),
        })  # fmt: skip
    return {
        **head("cmpl", model, "text_completion"),
        "choices": choices,
        "usage": _usage(plan, completions, n),
    }


def _top(tokenizer: Any, alts: list[tuple[int, float]], chosen: int,
         logprob: float | None) -> dict[str, float]:  # fmt: skip
    """The N alternatives as ``{token text: logprob}``, the chosen token added if missing."""
    out = {tokenizer.decode([t]): lp for t, lp in alts}
    if chosen not in {t for t, _ in alts} and logprob is not None:
        out.setdefault(tokenizer.decode([chosen]), logprob)
    return out


def chat_logprobs(tokenizer: Any, tokens: list[int], logprobs: list[float]) -> dict[str, Any]:
    pieces = [tokenizer.decode([t]) for t in tokens]
    return {"content": [{"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                        for p, lp in zip(pieces, logprobs)]}  # fmt: skip


def completion(plan: Plan, completions: list[Completion], model: str, n: int,
               logprobs: bool, tokenizer: Any) -> dict[str, Any]:  # fmt: skip
    choices = [{"index": i, "text": c.text, "finish_reason": FINISH[c.finish_reason],
                "logprobs": text_logprobs(tokenizer, c.tokens, c.logprobs) if logprobs else None,
                **_extra(plan, i, c)} for i, c in enumerate(completions)]  # fmt: skip
    return {**head("cmpl", model, "text_completion"), "choices": choices,
            "usage": _usage(plan, completions, n), "seed": plan.seed}  # fmt: skip


def chat(plan: Plan, completions: list[Completion], model: str, n: int, logprobs: bool,
         tokenizer: Any) -> dict[str, Any]:  # fmt: skip
    choices = [{"index": i, "message": {"role": "assistant", "content": c.text},
                "finish_reason": FINISH[c.finish_reason],
                "logprobs": chat_logprobs(tokenizer, c.tokens, c.logprobs) if logprobs else None,
                **_extra(plan, i, c)} for i, c in enumerate(completions)]  # fmt: skip
    return {**head("chatcmpl", model, "chat.completion"), "choices": choices,
            "usage": _usage(plan, completions, 1), "seed": plan.seed}  # fmt: skip


def text_chunk(base: dict[str, Any], delta: Delta, logprobs: bool, tokenizer: Any,
               finish: str | None = None) -> dict[str, Any]:  # fmt: skip
    lp = text_logprobs(tokenizer, delta.tokens, delta.logprobs) if logprobs else None
    return {**base, "choices": [{"index": delta.row, "text": delta.text, "logprobs": lp,
                                 "finish_reason": finish, "token_ids": delta.tokens}]}  # fmt: skip


def chat_chunk(base: dict[str, Any], delta: Delta, logprobs: bool, tokenizer: Any,
               finish: str | None = None, role: bool = False) -> dict[str, Any]:  # fmt: skip
    lp = chat_logprobs(tokenizer, delta.tokens, delta.logprobs) if logprobs else None
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
