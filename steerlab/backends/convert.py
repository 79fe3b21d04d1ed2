"""Build a HookedTransformer from a local HuggingFace model, without the hub.

TransformerLens maps hub names to configs; a local directory has only its
``config.json``. Each supported family is one row of ``FAMILIES``: which HF config
attributes it maps to ``HookedTransformerConfig`` fields, which ones cannot change an
eval-mode forward pass, and which ones TransformerLens can express at one value only.
Every attribute of the config must fall into one of those groups; anything else is
refused by name before a model is built, so a field the converter does not understand
can never be dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


class ConversionError(ValueError):
    """An HF config holds something ``backend="hooked"`` cannot reproduce faithfully."""


# Attributes any HF config may carry that cannot change logits in eval mode: bookkeeping,
# output switches, classification heads, token ids, dropout, initialisation. Attributes
# whose names start with "_" are transformers' own bookkeeping and are inert too.
INERT_ANY_FAMILY = frozenset({
    "architectures", "auto_map", "model_type", "transformers_version", "dtype", "torch_dtype",
    "use_cache", "return_dict", "output_attentions", "output_hidden_states", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "problem_type", "id2label",
    "label2id", "finetuning_task", "task_specific_params", "tokenizer_class", "prefix",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "initializer_range", "tie_word_embeddings",  # weights are read from the built modules
})  # fmt: skip

# Attributes any HF config may carry that TransformerLens reproduces at one value only.
PINNED_ANY_FAMILY: Mapping[str, Any] = {
    "is_encoder_decoder": False,
    "add_cross_attention": False,
    "pruned_heads": {},
}

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
class Family:
    """How one HF ``model_type`` becomes a ``HookedTransformerConfig``."""

    build: Callable[[Any], dict[str, Any]]  # HF config -> HookedTransformerConfig fields
    weights: str  # name of TransformerLens's weight converter
    mapped: frozenset[str]  # attributes ``build`` reads
    inert: frozenset[str] = frozenset()  # attributes that cannot change eval logits
    pinned: Mapping[str, Any] = field(default_factory=dict)  # the one value TL can express


def _refuse(config: Any, problems: list[str]) -> None:
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
        _refuse(c, [f"rope_parameters rope_type={kind!r} (TransformerLens reproduces "
                    f"{', '.join(ROPE_KEYS)} for this family)"])  # fmt: skip
    unused = set(rope) - ROPE_KEYS[kind]
    extra = sorted(k for k in unused if (k, rope[k]) != ("partial_rotary_factor", 1.0))
    _refuse(c, [f"rope_parameters[{key!r}]={rope[key]!r} (not mapped)" for key in extra])
    fields: dict[str, Any] = dict(rotary_base=rope.get("rope_theta", 10000.0))
    if kind == "linear":
        if getattr(c, "sliding_window", None) is not None:  # TL skips the factor on local layers
            _refuse(c, ["rope_type='linear' together with sliding_window"])
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

FAMILIES: dict[str, Family] = {
    "gpt2": Family(
        _gpt2_config,
        "convert_gpt2_weights",
        mapped=frozenset(_GPT2_MAPPED),
        inert=frozenset(_GPT2_INERT),
    ),
    "llama": Family(
        _llama_config,
        "convert_llama_weights",
        mapped=frozenset(_LLAMA_MAPPED),
        inert=frozenset({*_DROPOUT, "pretraining_tp"}),  # transformers 5 ignores pretraining_tp
        pinned={"attention_bias": False, "mlp_bias": False},  # TL's llama weights have no biases
    ),
    "mistral": Family(
        _llama_config,
        "convert_mistral_weights",
        mapped=frozenset({*_LLAMA_MAPPED, "sliding_window"}),
        inert=frozenset(_DROPOUT),
    ),
}
SUPPORTED = tuple(FAMILIES)


def _is_empty(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (dict, list)) and not value)


def unaccounted(config: Any, family: Family) -> list[str]:
    """Each config attribute the family's row neither maps, knows to be inert, nor allows.

    An attribute the row does not name passes only when it holds the value a fresh
    config of the same class holds (or an empty value, for attributes the class lacks).
    """
    defaults = type(config)().to_dict()
    attributes = {**vars(config), **config.to_dict()}
    pinned = {**PINNED_ANY_FAMILY, **family.pinned}
    problems = []
    for key, value in sorted(attributes.items()):
        if key.startswith("_") or key in family.mapped or key in family.inert:
            continue
        if key in pinned:
            if value != pinned[key]:
                problems.append(f"{key}={value!r} (TransformerLens supports only {pinned[key]!r})")
        elif key in INERT_ANY_FAMILY:
            continue
        elif (value != defaults[key]) if key in defaults else not _is_empty(value):
            problems.append(f"{key}={value!r} (not known to steerlab's converter)")
    return problems


def hooked_config_fields(config: Any) -> dict[str, Any]:
    """The ``HookedTransformerConfig`` fields for an HF config, or a ``ConversionError``.

    >>> from steerlab.testing import tiny_config
    >>> hooked_config_fields(tiny_config("llama"))["n_layers"]
    3
    """
    if config.model_type not in FAMILIES:
        raise ValueError(
            f"backend='hooked' converts local models of type {', '.join(SUPPORTED)}; this one "
            f"is {config.model_type!r}. Use backend='bridge' (any HF architecture "
            "TransformerLens supports) or pass a hub name TransformerLens knows."
        )
    family = FAMILIES[config.model_type]
    _refuse(config, unaccounted(config, family))
    return family.build(config)


def hooked_from_hf(
    hf_model: Any, tokenizer: Any, *, device: str | None = None, n_devices: int = 1
) -> Any:
    """Convert a loaded HF causal LM into an unprocessed HookedTransformer.

    Weights are not folded or centred, so logits match the HF model. Raises
    ``ConversionError`` before building anything when the config holds a field
    TransformerLens cannot reproduce.
    """
    from steerlab.backends import tl

    HookedTransformer = tl.hooked_class()  # refused by name on TransformerLens 4
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained import weight_conversions

    fields = hooked_config_fields(hf_model.config)
    convert = getattr(weight_conversions, FAMILIES[hf_model.config.model_type].weights)
    cfg = HookedTransformerConfig(
        **fields,
        original_architecture=type(hf_model).__name__,
        device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
        n_devices=n_devices,
        dtype=next(hf_model.parameters()).dtype,
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
