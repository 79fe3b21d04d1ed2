"""``extract``: contrastive prompts in, a ``SteeringVector`` out.

One batched forward pass per batch of prompts reads every requested site at once;
rows are left-padded, so the last column is every row's last real token and the
attention mask says which columns are real.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch

from steerlab._version import __version__
from steerlab.core.bars import bar
from steerlab.core.prompts import Prompt
from steerlab.core.scalars import as_int, flag
from steerlab.core.sites import resolve, site_names
from steerlab.vectors.methods import Method, mean_diff
from steerlab.vectors.vector import Provenance, SteeringVector

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

Token = Literal["last", "mean"]


def data_sha256(
    positive: Sequence[Prompt], negative: Sequence[Prompt], token: str, chat: bool
) -> str:
    """A hash of the contrastive data and how it was read, stored with the vector."""
    payload = json.dumps(
        {"positive": list(positive), "negative": list(negative), "token": token, "chat": chat},
        sort_keys=True,
        ensure_ascii=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _check_prompts(name: str, prompts: Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(f"{name} must be a list of prompts, not {type(prompts).__name__}.")
    prompts = list(prompts)
    if not prompts:
        raise ValueError(f"{name} is empty: give at least one prompt.")
    for i, p in enumerate(prompts):
        if not isinstance(p, (str, list)) or (isinstance(p, str) and not p):
            raise ValueError(f"{name}[{i}] must be a non-empty string or a message list.")
    return prompts


def _read(
    acts: torch.Tensor,  # [batch, pos, d_model]
    mask: torch.Tensor,  # [batch, pos], without BOS for token="mean"
    token: Token,
) -> torch.Tensor:  # [batch, d_model]
    if token == "last":
        return acts[:, -1]  # left padding puts every row's last token in the last column
    weights = mask.to(acts.dtype)[..., None]
    return (acts * weights).sum(1) / weights.sum(1)


def without_bos(tokens: torch.Tensor, mask: torch.Tensor, bos: int | None) -> torch.Tensor:
    """The mask with each row's leading BOS dropped (kept when it is the only token).

    BOS is the same token at the same position in every prompt, so it carries no contrast,
    and its outsized activation would weigh differently in prompts of different lengths.
    """
    real = mask.bool()
    first = real.float().argmax(dim=1)  # [batch]
    rows = torch.arange(len(first))
    if bos is None:
        return real
    drop = (tokens[rows, first] == bos) & (real.sum(1) > 1)
    out = real.clone()
    out[rows[drop], first[drop]] = False
    return out


def _norm_sum(acts: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """Sum and count of L2 norms over real tokens, each row's first token left out.

    A row's first token (BOS, or an attention sink) has an outsized norm that no
    later token shares, so it would inflate the typical norm steering is compared to.
    """
    real = mask.bool().clone()
    first = real.float().argmax(dim=1)
    keep = real.clone()
    keep[torch.arange(len(first)), first] = False
    keep = torch.where(keep.sum(1, keepdim=True) > 0, keep, real)  # one-token rows
    norms = acts.norm(dim=-1)[keep]
    return float(norms.sum()), int(norms.numel())


def extract(
    lm: SteerableModel,
    positive: Sequence[Prompt],
    negative: Sequence[Prompt],
    sites: str | Sequence[str],
    method: Method = mean_diff,
    *,
    token: Token = "last",
    chat: bool = False,
    batch_size: int = 32,
    progress: bool = True,
) -> SteeringVector:
    """Extract a steering vector at ``sites`` from contrastive prompts.

    Args:
        lm: the model to read.
        positive: prompts showing the behaviour (strings, or message lists with ``chat``).
        negative: prompts showing its opposite; paired with ``positive`` for paired methods.
        sites: canonical site names, e.g. ``["blocks.2.hook_resid_pre"]``.
        method: ``mean_diff``, ``pca_diff``, ``single_pair``, ``probe`` or any ``Method``.
        token: read each prompt's ``"last"`` token, or the ``"mean"`` over its tokens
            (a leading BOS left out).
        chat: apply the tokenizer's chat template to every prompt.
        batch_size: prompts per forward pass.
        progress: show a progress bar over batches once extraction takes over a second.

    Returns:
        A ``SteeringVector`` with one direction per site, scale 1, and its provenance
        (model, method, data hash, typical residual norm per site).

    >>> vec = extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> vec
    SteeringVector(mean_diff, d_model=128, scale=1)
      blocks.2.hook_resid_pre: |v|=7.848  (residual ~29.3)
    """
    positive = _check_prompts("positive", positive)
    negative = _check_prompts("negative", negative)
    sites = site_names(sites)
    if not sites:
        raise ValueError("sites is empty: name at least one site, e.g. 'blocks.2.hook_resid_pre'.")
    names = list(dict.fromkeys(resolve(s, lm.sites()).name for s in sites))
    if token not in ("last", "mean"):
        raise ValueError(f"token must be 'last' or 'mean'; got {token!r}.")
    if as_int(batch_size) is None or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1; got {batch_size!r}.")
    batch_size = int(batch_size)
    if not callable(method) or not hasattr(method, "check"):
        raise TypeError(f"method must be a Method such as steerlab.mean_diff; got {method!r}.")
    method.check(len(positive), len(negative))

    prompts = positive + negative
    read: dict[str, list[torch.Tensor]] = {s: [] for s in names}
    norm_sums = dict.fromkeys(names, 0.0)
    counts = dict.fromkeys(names, 0)
    starts = range(0, len(prompts), batch_size)
    for start in bar(starts, desc="extract", disable=not flag(progress, "progress")):
        acts = lm.run_with_cache(prompts[start : start + batch_size], names, chat=chat)
        mask = acts.attention_mask
        content = without_bos(acts.tokens, mask, lm.tokenizer.bos_token_id)
        for s in names:
            site_acts = acts[s].float()  # [batch, pos, d_model]
            read[s].append(_read(site_acts, content, token))
            total, count = _norm_sum(site_acts, mask)
            norm_sums[s] += total
            counts[s] += count

    directions = {}
    n = len(positive)
    for s in names:
        rows = torch.cat(read[s]).clone()  # [n_pos + n_neg, d_model], out of inference mode
        direction = method(rows[:n], rows[n:])
        if direction.shape != (lm.d_model,) or not bool(torch.isfinite(direction).all()):
            raise ValueError(f"{method!r} returned a bad direction at {s}: {direction.shape}.")
        directions[s] = direction.float()

    provenance = Provenance(
        model=lm.name,
        model_config_sha256=getattr(lm, "config_sha256", ""),
        revision=lm.revision or "",
        backend=lm.engine.kind,
        method=method.name,
        data_sha256=data_sha256(positive, negative, token, chat),
        token=token,
        chat=chat,
        n_positive=len(positive),
        n_negative=len(negative),
        residual_norms={s: norm_sums[s] / max(counts[s], 1) for s in names},
        steerlab_version=__version__,
    )
    return SteeringVector(directions, 1.0, provenance)
