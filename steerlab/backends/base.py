"""The small Protocol every backend implements.

A backend knows three things about its model: how to attach a function to a
canonical site, how to start a KV cache, and how to run one forward pass.
Everything else (steering, capture, the decode loop) is backend-agnostic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from steerlab.backends.cache import CacheOps
from steerlab.core.sites import Site

# Receives an activation [batch, pos, d_model]; returns a replacement or None.
ActivationFn = Callable[[torch.Tensor], torch.Tensor | None]


class Backend(Protocol):
    kind: str  # "bridge" | "hooked" | "hf"
    model: Any  # the library's own model object, duck-typed
    n_layers: int
    d_model: int
    n_ctx: int | None
    n_vocab: int  # logits per position

    @property
    def input_device(self) -> torch.device: ...

    def sites(self) -> list[str]: ...

    def attach(self, site: Site, fn: ActivationFn) -> list[RemovableHandle]: ...

    @property
    def cache_ops(self) -> CacheOps:
        """How this backend's cache object is copied, cropped and compacted."""
        ...

    def new_cache(self, batch: int) -> Any: ...

    def modules(self) -> list[nn.Module]:
        """Every torch module a forward runs through (hooks and the call lock live there)."""
        ...

    def generation_eos(self) -> set[int]:
        """End-of-sequence ids from the model's generation config (may be empty)."""
        ...

    def forward(
        self,
        input_ids: torch.Tensor,  # [batch, new_pos]
        attention_mask: torch.Tensor,  # [batch, cached_pos + new_pos]
        cache: Any | None,
        *,
        positions: torch.Tensor | None = None,  # [batch, new_pos]; from the mask when None
        last_only: bool = False,
        keep: torch.Tensor | None = None,  # [batch, new_pos] bool: only these positions' logits
    ) -> torch.Tensor:  # logits [batch, new_pos or 1, vocab]; with keep [kept, vocab]
        ...


def resid_mid_hooks(fn: ActivationFn) -> tuple[ActivationFn, ActivationFn]:
    """Steer ``resid_mid`` where no module outputs it: ``(on block input, on attention out)``.

    resid_mid is the block input plus the attention output, so the first function remembers
    the block input and the second rewrites the attention output to ``fn(mid) - input``.
    """
    block_input: list[torch.Tensor] = []

    def remember(hidden: torch.Tensor) -> None:
        block_input[:] = [hidden]

    def steer_attn(attn_out: torch.Tensor) -> torch.Tensor | None:
        resid_pre = block_input[0].to(attn_out.device)
        new_mid = fn(resid_pre + attn_out)
        return None if new_mid is None else new_mid - resid_pre

    return remember, steer_attn


def config_eos(config: Any) -> set[int]:
    """The EOS ids a generation config names: one id, a list of them, or none."""
    eos = getattr(config, "eos_token_id", None)
    ids = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    return {i for i in ids if isinstance(i, int)}


def hf_config(model: Any) -> Any | None:
    """The HuggingFace config a backend's model was built from: an HF model's own, a
    bridge's original model's; None where there is none (a ``HookedTransformer`` keeps
    TransformerLens's ``cfg`` only).
    """
    config = getattr(getattr(model, "original_model", model), "config", None)
    return config if hasattr(config, "to_diff_dict") else None


def position_ids(attention_mask: torch.Tensor, new_pos: int) -> torch.Tensor:
    """Positions counted from each row's first real token, for the last ``new_pos`` columns.

    Pads get position 1, as HuggingFace ``generate`` gives them; they are masked anyway.
    """
    positions = attention_mask.long().cumsum(-1) - 1
    positions = positions.masked_fill(attention_mask == 0, 1)
    return positions[:, -new_pos:]
