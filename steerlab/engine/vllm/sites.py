"""Where steerlab's canonical sites live in vLLM's own model classes: one row per family.

vLLM reimplements each architecture, so its modules are not HuggingFace's. Two forms cover
the GPT-2 and Llama families (Qwen2/3 and Mistral share Llama's):

- ``full``: a block takes and returns the whole residual stream (GPT-2). ``resid_mid`` is
  never a module's input or output there, so it is steered by rewriting the attention
  output against the remembered block input.
- ``pair``: a block takes and returns ``(delta, residual)`` whose sum is the residual stream
  (vLLM fuses the residual add into the next norm). A steer acts on the sum and writes the
  difference back into ``delta``; the post-attention norm's input pair is ``resid_mid``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from steerlab.core.sites import BLOCK_KINDS, EMBED


@dataclass(frozen=True)
class VLLMLayout:
    """Dotted paths inside a vLLM model for one family.

    Attributes:
        blocks: the list of decoder layers.
        embed: the token embedding (its output is ``hook_embed``).
        attn: the attention submodule of a block (its output is ``hook_attn_out``).
        mlp: the MLP submodule of a block (its output is ``hook_mlp_out``).
        mid_norm: the norm that takes ``(attn_out, residual)`` in the ``pair`` form.
        form: ``"full"`` or ``"pair"`` (see the module docstring).
    """

    blocks: str
    embed: str
    attn: str
    mlp: str
    mid_norm: str | None
    form: Literal["full", "pair"]


_LLAMA = VLLMLayout("model.layers", "model.embed_tokens", "self_attn", "mlp",
                    "post_attention_layernorm", "pair")  # fmt: skip
LAYOUTS: dict[str, VLLMLayout] = {
    "gpt2": VLLMLayout("transformer.h", "transformer.wte", "attn", "mlp", None, "full"),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
}


def layout_for(model_type: str) -> VLLMLayout:
    """The table row for a HuggingFace ``model_type``, or a clear refusal."""
    if model_type not in LAYOUTS:
        raise ValueError(
            f"steerlab's vLLM engine has no site table for model_type {model_type!r}; it "
            f"knows {', '.join(sorted(LAYOUTS))}. Use backend='hf' or 'bridge' for this model."
        )
    return LAYOUTS[model_type]


def vllm_sites(n_layers: int) -> list[str]:
    """Every site the vLLM engine steers, in forward order (all five per block, and the embed)."""
    names = [EMBED]
    for layer in range(n_layers):
        names += [f"blocks.{layer}.{kind}" for kind in BLOCK_KINDS]
    return names
