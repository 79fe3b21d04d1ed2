"""Response bodies in OpenAI's shapes (plus ``token_ids`` and a ``steerlab`` block)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from steerlab.core.request import Completion
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


def text_logprobs(tokenizer: Any, tokens: list[int], logprobs: list[float]) -> dict[str, Any]:
    pieces = [tokenizer.decode([t]) for t in tokens]
    offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    return {"tokens": pieces, "token_logprobs": logprobs, "top_logprobs": None,
            "text_offset": offsets}  # fmt: skip


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
