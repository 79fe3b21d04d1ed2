"""Sampling as a pure function of logits and one uniform number per row, after the logit
adjustments (penalties, bias, ``min_tokens``) that every engine applies as vLLM does."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from steerlab.core.errors import NonFiniteError
from steerlab.core.request import OPTIONS, Request, Sampling

# Below this temperature decoding is greedy, on every engine (vLLM's sampler uses the same
# floor). Dividing logits by a subnormal temperature overflows to inf and samples junk.
GREEDY_BELOW = 1e-5


def is_greedy(temperature: float) -> bool:
    """Whether ``temperature`` decodes greedily: 0, or anything below ``GREEDY_BELOW``.

    >>> is_greedy(0.0), is_greedy(1e-39), is_greedy(0.7)
    (True, True, False)
    """
    return temperature < GREEDY_BELOW


def adjusts(sampling: Sampling) -> bool:
    """Whether ``adjust_logits`` changes this row's logits at all.

    >>> adjusts(Sampling()), adjusts(Sampling(repetition_penalty=1.2))
    (False, True)
    """
    s = sampling
    return bool(s.repetition_penalty != 1.0 or s.frequency_penalty or s.presence_penalty
                or s.logit_bias or s.min_tokens)  # fmt: skip


def adjust_logits(
    logits: torch.Tensor,  # [batch, vocab]
    settings: Sequence[Sampling],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    eos_ids: Collection[int],
) -> torch.Tensor:  # [batch, vocab], float32 where any row is adjusted
    """THE logit adjustments, each row by its own settings, as vLLM v1's sampler makes them.

    In vLLM's order, on float32 logits: ``min_tokens`` (``eos_ids`` get -inf while the
    row's output is shorter), ``logit_bias`` (added), then the repetition penalty (on
    every token of the prompt or the output: a positive logit times ``1 / p``, any other
    times ``p``), the frequency penalty (minus ``f`` per occurrence in the output) and the
    presence penalty (minus ``p`` once for a token in the output). ``prompts[i]`` is every
    token before row i's output (a continued cache's included); ``outputs[i]`` its tokens
    so far. Rows with none of these settings are left as they are; when no row has any,
    ``logits`` itself is returned. Temperature, top-k and top-p come after, in
    ``sample_next``.

    >>> row = torch.tensor([[2.0, -1.0, 0.5]])
    >>> adjust_logits(row, [Sampling(repetition_penalty=2.0)], [[0]], [[1]], eos_ids=())
    tensor([[ 1.0000, -2.0000,  0.5000]])
    """
    rows = [i for i, s in enumerate(settings) if adjusts(s)]
    if not rows:
        return logits
    out = logits.float().clone()  # vLLM adjusts in float32; the caller's logits stay raw
    for i in rows:
        out[i] = _adjusted_row(out[i], settings[i], prompts[i], outputs[i], eos_ids)
    return out


def _adjusted_row(row: torch.Tensor, s: Sampling, prompt: Sequence[int], output: Sequence[int],
                  eos_ids: Collection[int]) -> torch.Tensor:  # fmt: skip
    device, vocab = row.device, row.shape[-1]
    if len(output) < s.min_tokens and eos_ids:
        row[torch.tensor(sorted(eos_ids), device=device)] = float("-inf")
    if s.logit_bias:
        ids, biases = zip(*s.logit_bias)
        row[torch.tensor(ids, device=device)] += torch.tensor(biases, dtype=row.dtype,
                                                              device=device)  # fmt: skip
    if s.repetition_penalty == 1.0 and not s.frequency_penalty and not s.presence_penalty:
        return row
    counts = torch.bincount(torch.tensor(output, dtype=torch.long, device=device), minlength=vocab)[
        :vocab
    ]  # [vocab]: occurrences in the output
    in_output = counts > 0
    if s.repetition_penalty != 1.0:
        seen = in_output.clone()
        seen[torch.tensor(prompt, dtype=torch.long, device=device)] = True
        p = torch.tensor(s.repetition_penalty, dtype=row.dtype, device=device)
        penalty = torch.where(seen, p, 1.0)
        row = row * torch.where(row > 0, 1.0 / penalty, penalty)
    row = row - torch.tensor(s.frequency_penalty, dtype=row.dtype, device=device) * counts
    return row - torch.tensor(s.presence_penalty, dtype=row.dtype, device=device) * in_output


def sample_next(
    logits: torch.Tensor,  # [batch, vocab]
    uniform: torch.Tensor,  # [batch], in [0, 1)
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:  # [batch] token ids
    """Pick one token per row: greedy at temperature 0 (or below ``GREEDY_BELOW``), else
    inverse-CDF sampling after top-k, top-p and min-p, in HF's order. A top-p so small that only the top token reaches it keeps that
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
    if min_p > 0.0:  # relative to the likeliest token, which always stays (HF's, vLLM's)
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    cdf = probs.cumsum(dim=-1)
    target = uniform.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return picked.clamp(max=probs.shape[-1] - 1)


def sample(logits: torch.Tensor, uniform: torch.Tensor,
           requests: Sequence[Request]) -> torch.Tensor:  # fmt: skip
    """One token per row, each row by its own sampler settings (``Option.sampler``: the
    temperature and the truncations); rows that agree on them sample together."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(_sampler(r.sampling), []).append(i)
    if len(groups) == 1:
        return sample_next(logits, uniform, **dict(next(iter(groups))))
    token = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for settings, index in groups.items():
        at = torch.tensor(index, device=logits.device)
        token[at] = sample_next(logits[at], uniform[index], **dict(settings))
    return token


def _sampler(sampling: Sampling) -> tuple[tuple[str, object], ...]:
    return tuple((o.name, getattr(sampling, o.name)) for o in OPTIONS if o.sampler)


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
        "; ".join(f"{type(s.op).__name__} at {s.site} with alpha={s.alpha[0]:g}" for s in steers)
        if steers
        else "no steer: the model's own logits"
    )
    return NonFiniteError(
        f"The logits of row {row} hold NaN or inf at step {step}, from: {what}. A steer "
        "that large overflows this dtype: lower alpha (or use float32)."
    )
