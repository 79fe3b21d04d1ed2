"""Build a HookedTransformer from a local HuggingFace model, without the hub.

TransformerLens maps hub names to configs; a local directory has only its
``config.json``. Each supported family is one row: a config translation plus
TransformerLens's own weight conversion. Other families are refused clearly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _gpt2_config(c: Any) -> dict[str, Any]:
    return dict(
        d_model=c.n_embd,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        n_layers=c.n_layer,
        n_ctx=c.n_positions,
        eps=c.layer_norm_epsilon,
        d_vocab=c.vocab_size,
        act_fn=c.activation_function,
        normalization_type="LN",
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx,
    )


def _llama_config(c: Any) -> dict[str, Any]:
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = c.num_key_value_heads
    rope = getattr(c, "rope_parameters", None) or {}
    return dict(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        n_key_value_heads=kv_heads if kv_heads != c.num_attention_heads else None,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=d_head,
        rotary_base=rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)),
        final_rms=True,
        gated_mlp=True,
    )


def _converters() -> dict[str, tuple[Callable[[Any], dict[str, Any]], Callable]]:
    from transformer_lens.pretrained.weight_conversions import (
        convert_gpt2_weights,
        convert_llama_weights,
        convert_mistral_weights,
    )

    return {
        "gpt2": (_gpt2_config, convert_gpt2_weights),
        "llama": (_llama_config, convert_llama_weights),
        "mistral": (_llama_config, convert_mistral_weights),
    }


SUPPORTED = ("gpt2", "llama", "mistral")


def hooked_from_hf(
    hf_model: Any, tokenizer: Any, *, device: str | None = None, n_devices: int = 1
) -> Any:
    """Convert a loaded HF causal LM into an unprocessed HookedTransformer.

    Weights are not folded or centred, so logits match the HF model.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    model_type = hf_model.config.model_type
    if model_type not in SUPPORTED:
        raise ValueError(
            f"backend='hooked' converts local models of type {', '.join(SUPPORTED)}; this one is "
            f"{model_type!r}. Use backend='bridge' (any HF architecture TransformerLens "
            "supports) or pass a hub name TransformerLens knows."
        )
    make_config, convert = _converters()[model_type]
    dtype = next(hf_model.parameters()).dtype
    cfg = HookedTransformerConfig(
        **make_config(hf_model.config),
        original_architecture=type(hf_model).__name__,
        device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
        n_devices=n_devices,
        dtype=dtype,
        default_prepend_bos=False,  # steerlab tokenizes; the tokenizer decides on BOS
    )
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    model.load_and_process_state_dict(
        convert(hf_model, cfg),
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    model.move_model_modules_to_device()
    return model.eval()
