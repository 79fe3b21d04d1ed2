"""Per family, how an HF config becomes ``HookedTransformerConfig`` fields (``Conversion``).

One ``Conversion`` per family that ``backend="hooked"`` converts; ``backends/families.py``
holds it in that family's record, and ``convert.py`` checks a config against it before
building anything. A row names the config attributes its ``build`` reads (``mapped``), the
ones that cannot change an eval-mode forward (``inert``), and the ones TransformerLens can
express at one value only (``pinned``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class ConversionError(ValueError):
    """An HF config holds something ``backend="hooked"`` cannot reproduce faithfully."""


# HF ``hidden_act`` / ``activation_function`` names -> TransformerLens ``act_fn``.
ACTIVATIONS = {
    "gelu": "gelu", "gelu_new": "gelu_new", "gelu_fast": "gelu_fast", "relu": "relu",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh", "silu": "silu", "swish": "silu", "relu2": "relu2",
}  # fmt: skip

# RoPE parameters each rope type may set; "type" is the legacy spelling of "rope_type".
ROPE_KEYS = {
    "default": {"rope_type", "type", "rope_theta"},
    "linear": {"rope_type", "type", "rope_theta", "factor"},
    "llama3": {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
               "high_freq_factor", "original_max_position_embeddings"},
}  # fmt: skip


@dataclass(frozen=True)
class Conversion:
    """How one HF ``model_type`` becomes a ``HookedTransformerConfig``."""

    build: Callable[[Any], dict[str, Any]]  # HF config -> HookedTransformerConfig fields
    weights: str  # name of TransformerLens's weight converter
    mapped: frozenset[str]  # attributes ``build`` reads
    inert: frozenset[str] = frozenset()  # attributes that cannot change eval logits
    pinned: Mapping[str, Any] = field(default_factory=dict)  # the one value TL can express


def refuse(config: Any, problems: list[str]) -> None:
    """Raise a ``ConversionError`` naming every problem, when there is one."""
    if problems:
        raise ConversionError(
            f"backend='hooked' cannot convert this {config.model_type!r} config faithfully: "
            + "; ".join(problems)
            + ". Use backend='hf' or backend='bridge', which run the HF modules themselves."
        )


def _act_fn(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ConversionError(
            f"backend='hooked' has no TransformerLens equivalent of activation {name!r}; "
            "use backend='hf' or backend='bridge'."
        )
    return ACTIVATIONS[name]


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
        act_fn=_act_fn(c.activation_function),
        normalization_type="LN",
        use_attn_scale=c.scale_attn_weights,
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx,
    )


def _rope_settings(c: Any) -> dict[str, Any]:
    """The RoPE settings as one dict, from transformers 5 or the older split fields."""
    rope = getattr(c, "rope_parameters", None)
    if rope is None:
        rope = {**(getattr(c, "rope_scaling", None) or {}),
                "rope_theta": getattr(c, "rope_theta", 10000.0)}  # fmt: skip
    return dict(rope)


def _rope_config(c: Any) -> dict[str, Any]:
    """RoPE fields for TransformerLens: plain, linear, or llama3 (NTK-by-parts)."""
    rope = _rope_settings(c)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_KEYS:
        refuse(c, [f"rope_parameters rope_type={kind!r} (TransformerLens reproduces "
                    f"{', '.join(ROPE_KEYS)} for this family)"])  # fmt: skip
    unused = set(rope) - ROPE_KEYS[kind]
    extra = sorted(k for k in unused if (k, rope[k]) != ("partial_rotary_factor", 1.0))
    refuse(c, [f"rope_parameters[{key!r}]={rope[key]!r} (not mapped)" for key in extra])
    fields: dict[str, Any] = dict(rotary_base=rope.get("rope_theta", 10000.0))
    if kind == "linear":
        if getattr(c, "sliding_window", None) is not None:  # TL skips the factor on local layers
            refuse(c, ["rope_type='linear' together with sliding_window"])
        fields.update(rotary_scaling_factor=float(rope["factor"]))
    elif kind == "llama3":
        fields.update(
            use_NTK_by_parts_rope=True,
            NTK_by_parts_factor=float(rope["factor"]),
            NTK_by_parts_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            NTK_by_parts_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            NTK_original_ctx_len=int(rope["original_max_position_embeddings"]),
        )
    return fields


def _llama_config(c: Any) -> dict[str, Any]:
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    window = getattr(c, "sliding_window", None)
    return dict(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=_act_fn(c.hidden_act),
        n_key_value_heads=kv_heads,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=d_head,
        final_rms=True,
        gated_mlp=True,
        use_local_attn=window is not None,
        window_size=window,
        attn_types=None if window is None else ["local"] * c.num_hidden_layers,
        **_rope_config(c),
    )


_GPT2_MAPPED = {
    "n_embd", "n_head", "n_inner", "n_layer", "n_positions", "layer_norm_epsilon",
    "vocab_size", "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
}  # fmt: skip
_LLAMA_MAPPED = {
    "hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "num_hidden_layers", "max_position_embeddings", "rms_norm_eps",
    "vocab_size", "hidden_act", "rope_parameters", "rope_scaling", "rope_theta",
}  # fmt: skip
_DROPOUT = {"attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop"}
# n_ctx is a legacy duplicate of n_positions that modeling_gpt2 never reads; the summary_*
# fields configure a classification head; reorder_and_upcast_attn only changes rounding.
_GPT2_INERT = {
    *_DROPOUT, "n_ctx", "reorder_and_upcast_attn", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
}  # fmt: skip


GPT2 = Conversion(
    _gpt2_config,
    "convert_gpt2_weights",
    mapped=frozenset(_GPT2_MAPPED),
    inert=frozenset(_GPT2_INERT),
)
LLAMA = Conversion(
    _llama_config,
    "convert_llama_weights",
    mapped=frozenset(_LLAMA_MAPPED),
    inert=frozenset({*_DROPOUT, "pretraining_tp"}),  # transformers 5 ignores pretraining_tp
    pinned={"attention_bias": False, "mlp_bias": False},  # TL's llama weights have no biases
)
MISTRAL = Conversion(
    _llama_config,
    "convert_mistral_weights",
    mapped=frozenset({*_LLAMA_MAPPED, "sliding_window"}),
    inert=frozenset(_DROPOUT),
)
