"""Forward-only scores for sweeps: steered next-token distributions and fluency.

Both are one batched forward pass, no sampling: ``next_token_logprobs`` reads the
distribution at the first generated position (prompts x alphas rows, steered), and
``completion_nll`` scores finished completions under the unsteered model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from steerlab.core import Steer
from steerlab.core.prompts import Prompt
from steerlab.core.request import Request
from steerlab.core.sampling import non_finite

if TYPE_CHECKING:
    from steerlab.model import SteerableModel


def next_token_logprobs(
    lm: SteerableModel,
    prompts: Prompt | Sequence[Prompt],
    steers: Sequence[Steer] = (),
    *,
    chat: bool = False,
) -> torch.Tensor:  # [rows, vocab], rows prompt-major as in lm.generate
    """Log-probabilities of the first new token, one row per prompt x alpha.

    >>> next_token_logprobs(lm, ["Once"], vec.steers(alpha=[0, 4])).shape  # doctest: +SKIP
    torch.Size([2, 98])
    """
    logits = lm.logits(prompts, list(steers), chat=chat, last_only=True)[:, -1]
    return logits.float().log_softmax(-1).cpu()


def kl_divergence(
    logprobs: torch.Tensor,  # [rows, vocab]
    reference: torch.Tensor,  # [rows, vocab]
) -> torch.Tensor:  # [rows]
    """``KL(p || reference)`` per row, from log-probabilities.

    >>> float(kl_divergence(torch.zeros(1, 1), torch.zeros(1, 1)))
    0.0
    """
    return (logprobs.exp() * (logprobs - reference)).sum(-1)


def completion_logprobs(
    lm: SteerableModel,
    prompt_tokens: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    batch_size: int = 64,
) -> list[list[float]]:
    """Log-probability of each completion token under the unsteered model.

    Each row is ``prompt + completion`` as token ids (no re-tokenising), left-padded, in
    batches of ``batch_size``; only the completion's tokens are scored.

    >>> completion_logprobs(lm, gen.prompt_tokens, gen.tokens)  # doctest: +SKIP
    [[-0.4, -1.2, ...], ...]
    """
    if not lm.engine.capabilities.forward:
        raise ValueError(
            f"Scoring reads full logits; the {lm.engine.kind} engine does not return them. "
            "Score with the same model on backend='hf'."
        )
    out: list[list[float]] = []
    for start in range(0, len(completions), batch_size):
        chunk = completions[start : start + batch_size]
        rows = [list(p) + list(c) for p, c in zip(prompt_tokens[start : start + batch_size], chunk)]
        # through the engine, so the call holds the model's lock like any other
        logits, _, ids, _ = lm.engine.forward([Request(tuple(row)) for row in rows])
        logprobs = logits[:, :-1].float().log_softmax(-1).cpu()
        targets = ids[:, 1:]
        picked = logprobs.gather(-1, targets[..., None])[..., 0]  # [batch, pos - 1]
        out += [
            picked[i, picked.shape[1] - len(c) :].tolist() if c else [] for i, c in enumerate(chunk)
        ]
    return out


def completion_nll(
    lm: SteerableModel,
    prompt_tokens: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    batch_size: int = 64,
) -> list[tuple[float, int]]:
    """Summed negative log-likelihood and token count of each completion, unsteered.

    >>> completion_nll(lm, gen.prompt_tokens, gen.tokens)  # doctest: +SKIP
    [(12.3, 8), ...]
    """
    rows = completion_logprobs(lm, prompt_tokens, completions, batch_size=batch_size)
    return [(-sum(row), len(row)) for row in rows]


def pooled_perplexity(nlls: Sequence[tuple[float, int]]) -> float:
    """``exp(total NLL / total tokens)``; ``nan`` when there are no tokens.

    >>> pooled_perplexity([(0.0, 3)])
    1.0
    """
    total = sum(n for _, n in nlls)
    return math.exp(sum(x for x, _ in nlls) / total) if total else math.nan


@dataclass(frozen=True)
class PromptScore:
    """One row's prompt scored by one forward pass (steered as its request is).

    ``token_logprobs[t]`` is the log-probability of prompt token ``t`` given the ones before
    (``None`` for the first); ``top[t]`` the ``n`` likeliest tokens there as ``(id,
    logprob)`` (empty for the first); ``next_top`` the same for the first new token.
    Log-probabilities are the model's own, before any sampling adjustment.
    """

    token_logprobs: list[float | None]
    top: list[list[tuple[int, float]]]
    next_top: list[tuple[int, float]]


def score_prompts(lm: SteerableModel, requests: Sequence[Request], n: int, *,
                  wait: float = 60.0) -> list[PromptScore]:  # fmt: skip
    """Each request's prompt scored in one batched forward pass through the engine (its call
    guard and lock), with the request's steers; ``n`` alternatives per position.

    >>> score_prompts(lm, rows.requests(Sampling()), 2)[0].token_logprobs[:2]  # doctest: +SKIP
    [None, -3.2]
    """
    if not lm.engine.capabilities.forward:
        raise ValueError(
            f"Scoring reads full logits; the {lm.engine.kind} engine does not return them yet. "
            "Score on backend='hf'."
        )
    logits, _, _, mask = lm.engine.forward(list(requests), wait=wait)
    out = []
    for i, request in enumerate(requests):
        length = len(request.prompt)
        real = logits[i, mask.shape[1] - length :].float()  # [length, vocab]
        if not bool(torch.isfinite(real).all()):
            raise non_finite(0, i, request)
        lp = real.log_softmax(-1).cpu()
        ids = torch.tensor(request.prompt)
        picked = lp[:-1].gather(-1, ids[1:, None])[:, 0].tolist()  # token t given < t
        top = lp.topk(min(n, lp.shape[-1]), dim=-1) if n else None
        pairs = [] if top is None else [
            list(zip(top.indices[t].tolist(), top.values[t].tolist())) for t in range(length)
        ]  # fmt: skip
        out.append(PromptScore(
            [None, *picked],
            [[], *pairs[:-1]] if pairs else [[] for _ in range(length)],
            pairs[-1] if pairs else [],
        ))  # fmt: skip
    return out
