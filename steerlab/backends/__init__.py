"""Backends: one small adapter per model library, behind ``Backend``."""

from __future__ import annotations

from typing import Any

from steerlab.backends.base import Backend
from steerlab.backends.hf import HFBackend
from steerlab.backends.lens import BridgeBackend, HookedBackend

__all__ = ["Backend", "BridgeBackend", "HFBackend", "HookedBackend", "backend_for"]


def backend_for(model: Any) -> Backend:
    """The backend for an already-built TransformerBridge, HookedTransformer or HF model."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):  # first: plain HF needs no TransformerLens
        return HFBackend(model)
    from transformer_lens import HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge

    if isinstance(model, TransformerBridge):
        return BridgeBackend(model)
    if isinstance(model, HookedTransformer):
        return HookedBackend(model)
    raise TypeError(
        "steerlab.wrap takes a TransformerBridge, a HookedTransformer or a HuggingFace "
        f"PreTrainedModel; got {type(model).__name__}."
    )
