"""Concept detection, AxBench's way: score each text by the largest ``h·v̂`` over its tokens
at the site, and report the ROC AUC of the concept's positive texts against its negatives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from steerlab.vectors.extract import without_bos


def token_activations(lm: Any, texts: Sequence[str], site: str,
                      batch_size: int = 32) -> list[torch.Tensor]:  # fmt: skip
    """Each text's activations at ``site`` on its real tokens, its BOS left out:
    ``[tokens, d_model]`` per text, read once and scored against any number of directions."""
    out = []
    for start in range(0, len(texts), batch_size):
        acts = lm.run_with_cache(list(texts[start : start + batch_size]), sites=[site])
        real = without_bos(acts.tokens, acts.attention_mask, lm.tokenizer.bos_token_id)
        h = acts[site].float().cpu()  # [batch, pos, d]
        out += [h[row][real[row].cpu()] for row in range(len(h))]
    return out


def max_latents(activations: Sequence[torch.Tensor], direction: torch.Tensor) -> torch.Tensor:
    """``[texts]``: each text's max over its tokens of ``h·v̂``."""
    unit = direction.detach().float().cpu() / direction.detach().float().norm()
    return torch.stack([(h @ unit).max() for h in activations])


def token_latents(lm: Any, texts: Sequence[str], site: str, direction: torch.Tensor,
                  batch_size: int = 32) -> torch.Tensor:  # fmt: skip
    """``[texts]``: each text's max over its real tokens (its BOS left out) of ``h·v̂``."""
    return max_latents(token_activations(lm, texts, site, batch_size), direction)


def roc_auc(positive: Sequence[float] | torch.Tensor, negative: Sequence[float] | torch.Tensor
            ) -> float:  # fmt: skip
    """The probability that a random positive scores above a random negative (ties count
    half): the area under the ROC curve, by the Mann-Whitney rank statistic.

    >>> roc_auc([3.0, 2.0], [1.0, 2.0])
    0.875
    """
    pos = torch.as_tensor(positive, dtype=torch.float64).flatten()
    neg = torch.as_tensor(negative, dtype=torch.float64).flatten()
    if not len(pos) or not len(neg):
        raise ValueError("roc_auc needs at least one positive and one negative score.")
    above = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return float((above + 0.5 * ties) / (len(pos) * len(neg)))
