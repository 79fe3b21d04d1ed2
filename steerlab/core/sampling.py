"""Sampling as a pure function of logits and one uniform number per row."""

from __future__ import annotations

import torch


def sample_next(
    logits: torch.Tensor,  # [batch, vocab]
    uniform: torch.Tensor,  # [batch], in [0, 1)
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
) -> torch.Tensor:  # [batch] token ids
    """Pick one token per row: greedy at temperature 0, else inverse-CDF sampling.

    Taking the random number as an argument (not a generator) is what lets a
    baseline row and a steered row share their randomness: where the two
    distributions agree, they pick the same token.

    >>> sample_next(torch.tensor([[0.0, 2.0, 1.0]]), torch.tensor([0.5]), temperature=0)
    tensor([1])
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    cdf = probs.cumsum(dim=-1)
    target = uniform.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return picked.clamp(max=probs.shape[-1] - 1)
