"""Build a HookedTransformer from a local HuggingFace model, without the hub.

TransformerLens maps hub names to configs; a local directory has only its
``config.json``. Each supported family's ``Conversion`` (``hooked_config.py``) is the
``hooked`` field of its record in ``families.py``: which HF config attributes it maps to
``HookedTransformerConfig`` fields, which ones cannot change an eval-mode forward pass,
and which ones TransformerLens can express at one value only. Every attribute of the
config must fall into one of those groups; anything else is refused by name before a
model is built, so a field the converter does not understand can never be dropped
silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from steerlab.backends.families import HOOKED, lookup, table
from steerlab.backends.hooked_config import Conversion, refuse
from steerlab.backends.hooked_config import ConversionError as ConversionError

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

# The rows: a read-only view of each family's ``hooked`` field in ``FACTS`` (``families.py``).
FAMILIES: Mapping[str, Conversion] = table(HOOKED)


def _is_empty(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (dict, list)) and not value)


def unaccounted(config: Any, family: Conversion) -> list[str]:
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
    family = lookup(config.model_type, HOOKED)
    refuse(config, unaccounted(config, family))
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
    convert = getattr(weight_conversions, lookup(hf_model.config.model_type, HOOKED).weights)
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
