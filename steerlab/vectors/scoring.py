"""Forward-only scores for sweeps: steered next-token distributions and fluency.

Both go through the engine's own scoring (``engine/scoring.py``), so they run on every
engine, vLLM's included: ``next_token_logprobs`` reads the distribution at the first
generated position (prompts x alphas rows, steered), and ``completion_nll`` scores finished
completions under the unsteered model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from steerlab.core import Steer
from steerlab.core.prompts import Prompt
from steerlab.core.request import Sampling
from steerlab.core.rows import lay_out
from steerlab.engine.scoring import next_token_distributions, score_prompts

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

    >>> steer = Steer("blocks.2.hook_resid_pre", torch.ones(lm.d_model), alpha=[0, 4])
    >>> next_token_logprobs(lm, ["Once"], [steer]).shape
    torch.Size([2, 678])
    """
    rows = lay_out(lm, prompts, list(steers), chat=chat, new_tokens=1)
    return next_token_distributions(lm.engine, rows.requests(Sampling(max_new_tokens=1)))


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

    >>> prompt = lm.tokenizer.encode("Once upon a time")
    >>> completion = lm.tokenizer.encode(", there was a dog", add_special_tokens=False)
    >>> [round(-x, 2) for x in completion_logprobs(lm, [prompt], [completion])[0]]  # "dog" surprises
    [0.0, 0.0, 0.0, 0.0, 3.16]
    """
    out: list[list[float]] = []
    for start in range(0, len(completions), batch_size):
        chunk = completions[start : start + batch_size]
        rows = [list(p) + list(c) for p, c in zip(prompt_tokens[start : start + batch_size], chunk)]
        # through the engine's scoring, so the call holds the model's lock like any other
        scored = score_prompts(lm.engine, rows)
        out += [[s.logprob for s in row[len(row) - len(c) :] if s is not None] if c else []
                for row, c in zip(scored, chunk)]  # fmt: skip
    return out


def completion_nll(
    lm: SteerableModel,
    prompt_tokens: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    batch_size: int = 64,
) -> list[tuple[float, int]]:
    """Summed negative log-likelihood and token count of each completion, unsteered.

    >>> prompt = lm.tokenizer.encode("Once upon a time")
    >>> completion = lm.tokenizer.encode(", there was a dog", add_special_tokens=False)
    >>> [(round(nll, 2), n) for nll, n in completion_nll(lm, [prompt], [completion])]
    [(3.16, 5)]
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
