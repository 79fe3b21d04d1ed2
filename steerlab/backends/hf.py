"""Plain HuggingFace causal LMs, steered through module hooks.

Each supported family's ``Layout`` (where the blocks live, and which block submodules
write to the residual stream) is the ``hf`` field of its record in ``backends/families.py``.
Most decoders share the Llama layout (``model.layers``, ``self_attn``, ``mlp``), so a new
family is usually one name in that module's ``_LLAMA_LIKE``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from steerlab.backends.base import (
    ActivationFn,
    config_eos,
    position_ids,
    resid_mid_hooks,
)
from steerlab.backends.cache import DynamicCacheOps
from steerlab.backends.families import HF, Layout, lookup, table
from steerlab.backends.head import plain_head, unembed, wide
from steerlab.core.errors import FamilyError
from steerlab.core.positions import kept
from steerlab.core.sites import BLOCK_KINDS, EMBED, WHY_ABSENT, Site, SiteError, all_sites
from steerlab.core.tagging import tag

# The hook table: a read-only view of each family's ``hf`` field in ``FACTS``
# (``backends/families.py``), where a new family goes.
LAYOUTS: Mapping[str, Layout] = table(HF)


def _first(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


def _with_first(output: Any, new: torch.Tensor) -> Any:
    if isinstance(output, torch.Tensor):
        return new
    return (new, *output[1:])


def _scaled(fn: ActivationFn, scale: float) -> ActivationFn:
    """``fn`` seeing ``scale * output``: what the model adds to the stream, not the raw output."""
    if scale == 1:
        return fn

    def scaled(output: torch.Tensor) -> torch.Tensor | None:
        new = fn(output * scale)
        return None if new is None else new / scale

    return scaled


def _config_scale(config: Any, attribute: str | None) -> float:
    return 1.0 if attribute is None else float(getattr(config, attribute))


def _layout_for(config: Any) -> Layout:
    model_type = config.model_type
    layout = lookup(model_type, HF)
    variant = layout.unsupported(config) if layout.unsupported else None
    if variant is not None:
        raise FamilyError(
            f"steerlab's hook table for {model_type!r} does not cover {variant}. "
            "Use backend='bridge' for it."
        )
    return layout


class HFBackend:
    """A ``transformers`` ``PreTrainedModel`` with a causal-LM head."""

    kind = "hf"

    def __init__(self, model: Any) -> None:
        config = model.config.get_text_config()
        self.layout = _layout_for(model.config)
        self.model = model
        self.blocks: Any = model.get_submodule(self.layout.blocks)
        self.embed: nn.Module = model.get_input_embeddings()
        self.parallel = self.layout.is_parallel(config)
        self.embed_scale = _config_scale(config, self.layout.embed_scale)
        self.residual_scale = _config_scale(config, self.layout.residual_scale)
        self.n_layers: int = len(self.blocks)
        self.d_model: int = config.hidden_size
        self.n_vocab: int = config.vocab_size
        self.n_ctx: int | None = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )

    @property
    def input_device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def sites(self) -> list[str]:
        kinds = [k for k in BLOCK_KINDS if not (self.parallel and k == "hook_resid_mid")]
        return all_sites(self.n_layers, kinds=kinds)

    def attach(self, site: Site, fn: ActivationFn) -> list[RemovableHandle]:
        if site.kind == EMBED:
            return [self._on_output(self.embed, _scaled(fn, self.embed_scale))]
        block = self.blocks[site.layer]
        if site.kind == "hook_resid_pre":
            return [self._on_input(block, fn)]
        if site.kind == "hook_resid_post":
            return [self._on_output(block, fn)]
        if site.kind == "hook_attn_out":
            attn = block.get_submodule(self.layout.attn)
            return [self._on_output(attn, _scaled(fn, self.residual_scale))]
        if site.kind == "hook_mlp_out":
            return self._on_mlp(block, _scaled(fn, self.residual_scale))
        if self.parallel:
            raise SiteError(f"This model has no hook_resid_mid. {WHY_ABSENT['hook_resid_mid']}")
        return self._on_resid_mid(block, fn)

    def _on_output(self, module: nn.Module, fn: ActivationFn) -> RemovableHandle:
        # A hook that only reads hands the model a copy: some blocks update a sublayer's
        # output in place afterwards (Falcon adds attention into the MLP output with +=).
        def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
            first = _first(output)
            new = fn(first)
            return _with_first(output, first.clone() if new is None else new)

        return module.register_forward_hook(tag(hook))

    def _on_input(self, module: nn.Module, fn: ActivationFn) -> RemovableHandle:
        # Blocks receive hidden_states positionally or by keyword, depending on the family.
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> Any:
            if args:
                new = fn(args[0])
                return None if new is None else ((new, *args[1:]), kwargs)
            new = fn(kwargs["hidden_states"])
            return None if new is None else (args, {**kwargs, "hidden_states": new})

        return module.register_forward_pre_hook(tag(hook), with_kwargs=True)

    def _on_mlp(self, block: nn.Module, fn: ActivationFn) -> list[RemovableHandle]:
        mlp = block.get_submodule(self.layout.mlp)
        if not self.layout.flat_mlp:
            return [self._on_output(mlp, fn)]
        # The MLP sees [batch * pos, d_model]; steer it as [batch, pos, d_model].
        shape: list[torch.Size] = []

        def remember(hidden: torch.Tensor) -> None:
            shape[:] = [hidden.shape]

        def unflatten(flat: torch.Tensor) -> torch.Tensor | None:
            new = fn(flat.view(shape[0]))
            return None if new is None else new.reshape(flat.shape)

        return [self._on_input(block, remember), self._on_output(mlp, unflatten)]

    def _on_resid_mid(self, block: nn.Module, fn: ActivationFn) -> list[RemovableHandle]:
        # HF blocks keep resid_mid in a local variable: steer it through the attention output.
        remember, steer_attn = resid_mid_hooks(fn)
        attn = block.get_submodule(self.layout.attn)  # resolved before anything is registered
        first = self._on_input(block, remember)
        return [first, self._on_output(attn, _scaled(steer_attn, self.residual_scale))]

    cache_ops = DynamicCacheOps()

    def new_cache(self, batch: int) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def modules(self) -> list[nn.Module]:
        return [self.model]

    def generation_eos(self) -> set[int]:
        return config_eos(getattr(self.model, "generation_config", None))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any | None,
        *,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if positions is None:
            positions = position_ids(attention_mask, input_ids.shape[1])
        rows = input_ids.shape[0] * (1 if last_only else input_ids.shape[1])
        head = plain_head(self.model)
        # The head multiplied only where its logits are kept, or as a CPU does it fastest.
        if head is not None and (keep is not None or wide(head, rows)):
            hidden = self.model.base_model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                past_key_values=cache, use_cache=cache is not None,
            ).last_hidden_state  # fmt: skip
            return unembed(head, kept(hidden, last_only, keep))
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=cache is not None,
            logits_to_keep=1 if last_only else 0,
        )
        return kept(output.logits, False, keep)
