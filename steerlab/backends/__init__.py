"""Backends: one small adapter per model library, behind ``Backend``."""

from __future__ import annotations

from typing import Any

from steerlab.backends import tl
from steerlab.backends.base import Backend
from steerlab.backends.hf import HFBackend
from steerlab.backends.lens import BridgeBackend, HookedBackend

__all__ = ["Backend", "BridgeBackend", "HFBackend", "HookedBackend", "backend_for"]


def backend_for(model: Any) -> Backend:
    """The backend for an already-built TransformerBridge, HookedTransformer or HF model."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):  # plain HF needs no TransformerLens installed
        return HFBackend(model)
    kind = tl.kind_of(model)  # never names HookedTransformer on TransformerLens 4
    if kind == "bridge":
        tl.warn_if_processed(model)
        return BridgeBackend(model)
    if kind == "hooked":
        return HookedBackend(model)
    raise TypeError(
        "steerlab.wrap takes a TransformerBridge, a HookedTransformer (TransformerLens 3.9) or "
        f"a HuggingFace PreTrainedModel; got {type(model).__name__}."
    )
