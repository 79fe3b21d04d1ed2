"""Plain HuggingFace causal LMs, steered through module hooks.

Each supported family is one row of ``LAYOUTS``: where the blocks live, and which
block submodules write to the residual stream. A new family is a new row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from steerlab.backends.base import ActivationFn, config_eos, position_ids
from steerlab.engine.cache import DynamicCacheOps
from steerlab.hooks import tag
from steerlab.sites import EMBED, Site, all_sites


@dataclass(frozen=True)
class Layout:
    """Dotted paths into one architecture family.

    ``attn`` and ``mlp`` name the block submodules whose outputs are added to the
    residual stream (for Gemma 2/3 that is the post-norm after each sublayer).
    """

    blocks: str
    embed: str
    attn: str
    mlp: str


_LLAMA = Layout("model.layers", "model.embed_tokens", "self_attn", "mlp")
_GEMMA2 = Layout(
    "model.layers", "model.embed_tokens", "post_attention_layernorm", "post_feedforward_layernorm"
)
LAYOUTS: dict[str, Layout] = {
    "gpt2": Layout("transformer.h", "transformer.wte", "attn", "mlp"),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _GEMMA2,
    "gemma3_text": _GEMMA2,
}


def _first(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


def _with_first(output: Any, new: torch.Tensor) -> Any:
    if isinstance(output, torch.Tensor):
        return new
    return (new, *output[1:])


class HFBackend:
    """A ``transformers`` ``PreTrainedModel`` with a causal-LM head."""

    kind = "hf"

    def __init__(self, model: Any) -> None:
        model_type = model.config.model_type
        if model_type not in LAYOUTS:
            raise ValueError(
                f"steerlab has no hook table for HuggingFace model_type {model_type!r}. "
                f"Supported: {', '.join(sorted(LAYOUTS))}. Use backend='bridge' for others."
            )
        self.model = model
        self.layout = LAYOUTS[model_type]
        self.blocks: Any = model.get_submodule(self.layout.blocks)
        config = model.config.get_text_config()
        self.n_layers: int = len(self.blocks)
        self.d_model: int = config.hidden_size
        self.n_ctx: int | None = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )

    @property
    def input_device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def sites(self) -> list[str]:
        return all_sites(self.n_layers)

    def attach(self, site: Site, fn: ActivationFn) -> list[RemovableHandle]:
        if site.kind == EMBED:
            return [self._on_output(self.model.get_submodule(self.layout.embed), fn)]
        block = self.blocks[site.layer]
        if site.kind == "hook_resid_pre":
            return [self._on_input(block, fn)]
        if site.kind == "hook_resid_post":
            return [self._on_output(block, fn)]
        if site.kind == "hook_attn_out":
            return [self._on_output(block.get_submodule(self.layout.attn), fn)]
        if site.kind == "hook_mlp_out":
            return [self._on_output(block.get_submodule(self.layout.mlp), fn)]
        return self._on_resid_mid(block, fn)

    def _on_output(self, module: nn.Module, fn: ActivationFn) -> RemovableHandle:
        def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
            new = fn(_first(output))
            return None if new is None else _with_first(output, new)

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

    def _on_resid_mid(self, block: nn.Module, fn: ActivationFn) -> list[RemovableHandle]:
        # HF blocks keep resid_mid in a local variable. It equals the block input plus
        # the attention output, so steering it means rewriting the attention output.
        block_input: list[torch.Tensor] = []

        def remember(hidden: torch.Tensor) -> None:
            block_input[:] = [hidden]

        def steer_attn(attn_out: torch.Tensor) -> torch.Tensor | None:
            resid_pre = block_input[0].to(attn_out.device)
            new_mid = fn(resid_pre + attn_out)
            return None if new_mid is None else new_mid - resid_pre

        attn = block.get_submodule(self.layout.attn)  # resolved before anything is registered
        first = self._on_input(block, remember)
        return [first, self._on_output(attn, steer_attn)]

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
    ) -> torch.Tensor:
        if positions is None:
            positions = position_ids(attention_mask, input_ids.shape[1])
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=cache is not None,
            logits_to_keep=1 if last_only else 0,
        )
        return output.logits
