"""Sampling as a pure function of logits and one uniform number per row."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from steerlab.core.errors import NonFiniteError
from steerlab.core.request import Request

# Below this temperature decoding is greedy, on every engine (vLLM's sampler uses the same
# floor). Dividing logits by a subnormal temperature overflows to inf and samples junk.
GREEDY_BELOW = 1e-5


def is_greedy(temperature: float) -> bool:
    """Whether ``temperature`` decodes greedily: 0, or anything below ``GREEDY_BELOW``.

    >>> is_greedy(0.0), is_greedy(1e-39), is_greedy(0.7)
    (True, True, False)
    """
    return temperature < GREEDY_BELOW


def sample_next(
    logits: torch.Tensor,  # [batch, vocab]
    uniform: torch.Tensor,  # [batch], in [0, 1)
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
) -> torch.Tensor:  # [batch] token ids
    """Pick one token per row: greedy at temperature 0 (or below ``GREEDY_BELOW``), else
    inverse-CDF sampling. A top-p so small that only the top token reaches it keeps that
    token alone, so it decodes as greedy does.

    Taking the random number as an argument (not a generator) is what lets a
    baseline row and a steered row share their randomness: where the two
    distributions agree, they pick the same token.

    >>> sample_next(torch.tensor([[0.0, 2.0, 1.0]]), torch.tensor([0.5]), temperature=0)
    tensor([1])
    """
    if is_greedy(temperature):
        return logits.argmax(dim=-1)
    logits = _scaled(logits.float(), temperature)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        outside[:, 0] = False  # even where top_p underflows to 0 in float32 (top_p=1e-46)
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    cdf = probs.cumsum(dim=-1)
    target = uniform.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return picked.clamp(max=probs.shape[-1] - 1)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``; a row that overflows to inf (finite logits near 1e34 at a
    temperature near the floor) is divided after subtracting its max instead, which changes
    no probability and keeps the top logit at 0, so its softmax is never NaN."""
    scaled = logits / temperature
    shifted = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    return torch.where(torch.isfinite(scaled).all(dim=-1, keepdim=True), scaled, shifted)


def check_finite(logits: torch.Tensor, step: int, requests: Sequence[Request]) -> None:
    """THE per-step check: one reduction over the step's logits; on NaN or inf, an error
    that names the first bad row's steers (the setting that made them), never a decode."""
    if bool(torch.isfinite(logits).all()):
        return
    row = int((~torch.isfinite(logits)).any(-1).nonzero()[0, 0])
    raise non_finite(step, row, requests[row])


def non_finite(step: int, row: int, request: Request) -> NonFiniteError:
    """The error for a row whose logits are NaN or inf, naming its steers (every engine)."""
    steers = request.steers
    what = (
        "; ".join(f"{type(s.op).__name__} at {s.site} with alpha={s.alpha:g}" for s in steers)
        if steers
        else "no steer: the model's own logits"
    )
    return NonFiniteError(
        f"The logits of row {row} hold NaN or inf at step {step}, from: {what}. A steer "
        "that large overflows this dtype: lower alpha (or use float32)."
    )
