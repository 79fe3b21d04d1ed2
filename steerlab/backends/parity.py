"""A load-time check: one short forward pass against the HuggingFace model a backend came from.

TransformerLens re-implements parts of some architectures (GPT-2's attention on the
bridge, every block on HookedTransformer). Where it gets one wrong, logits differ with
no error. ``sl.load`` therefore runs a few tokens through both and warns
(``ParityWarning``) or, with ``strict=True``, refuses (``ParityError``) when they differ
by more than the dtype's rounding allows.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from steerlab.backends.base import Backend

# Allowed ||logits - hf_logits|| / ||hf_logits|| per dtype. Two correct implementations
# differ only by rounding (float32: ~1e-6 measured); the silent errors measured on tiny
# models in float32 are 5e-3 to 1e-2. In half precision rounding on a deep model can reach
# a few percent, so there the check catches only gross errors.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
PROBE_TEXT = "The quick brown fox jumps over the lazy dog."
PROBE_TOKENS = 8


class ParityWarning(UserWarning):
    """A loaded model's logits disagree with the HuggingFace model it was built from."""


class ParityError(RuntimeError):
    """``strict=True`` and the loaded model's logits disagree with HuggingFace's."""


@dataclass(frozen=True)
class Reference:
    """HuggingFace's logits for a short probe, computed before or beside the conversion."""

    input_ids: torch.Tensor  # [1, pos] on CPU
    logits: torch.Tensor  # [1, pos, vocab] float32 on CPU
    dtype: torch.dtype  # the dtype both models run in


def probe_ids(tokenizer: Any) -> torch.Tensor:
    """A few real tokens of ordinary text, [1, pos] on CPU."""
    ids = tokenizer(PROBE_TEXT, return_tensors="pt")["input_ids"][:, :PROBE_TOKENS]
    return ids if ids.shape[1] >= 2 else torch.arange(PROBE_TOKENS)[None]


@torch.no_grad()
def hf_reference(hf_model: Any, input_ids: torch.Tensor) -> Reference:
    """The HF model's own logits for ``input_ids``."""
    device = hf_model.get_input_embeddings().weight.device
    logits = hf_model(input_ids.to(device)).logits
    dtype = next(hf_model.parameters()).dtype
    return Reference(input_ids, logits.float().cpu(), dtype)


@contextlib.contextmanager
def unbridged(hf_model: nn.Module) -> Iterator[nn.Module]:
    """The bridge's ``original_model`` with its own modules back in place, restored on exit.

    A TransformerBridge swaps each HF submodule for a component that keeps the original as
    ``_original_component``; calling ``original_model`` then runs the bridge's code, so it
    cannot serve as a reference unless the originals are put back for the call.
    """
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for _ in range(16):  # one pass per level of nesting; real models need two
            found = [(parent, name, child) for parent in hf_model.modules()
                     for name, child in parent.named_children()
                     if "_original_component" in child._modules]  # fmt: skip
            if not found:
                break
            for parent, name, child in found:
                parent._modules[name] = child._modules["_original_component"]
                swapped.append((parent, name, child))
        yield hf_model
    finally:
        for parent, name, child in reversed(swapped):
            parent._modules[name] = child


def bridge_reference(bridge: Any, input_ids: torch.Tensor) -> Reference:
    """HF's logits from the modules a TransformerBridge wraps, run without the bridge."""
    with unbridged(bridge.original_model) as hf_model:
        return hf_reference(hf_model, input_ids)


@torch.no_grad()
def check(backend: Backend, reference: Reference, *, strict: bool, name: str) -> None:
    """Warn, or raise when ``strict``, if ``backend`` disagrees with ``reference``.

    >>> ids = probe_ids(lm.tokenizer)
    >>> check(lm.backend, bridge_reference(lm.model, ids), strict=True, name="steerlab-tiny")
    >>> off = Reference(ids, bridge_reference(lm.model, ids).logits + 1.0, torch.float32)
    >>> check(lm.backend, off, strict=True, name="steerlab-tiny")
    Traceback (most recent call last):
    steerlab.backends.parity.ParityError: backend='bridge' disagrees with the HuggingFace model ...
    """
    ids = reference.input_ids.to(backend.input_device)
    logits = backend.forward(ids, torch.ones_like(ids), None).float().cpu()
    error = float((logits - reference.logits).norm() / reference.logits.norm().clamp_min(1e-12))
    tolerance = TOLERANCE.get(reference.dtype, 1e-2)
    if error <= tolerance:
        return
    message = (
        f"backend={backend.kind!r} disagrees with the HuggingFace model it was built from on "
        f"{name!r}: on {ids.shape[1]} probe tokens the logits differ by {error:.2g} of their "
        f"norm (max |difference| {(logits - reference.logits).abs().max():.3g}; "
        f"{reference.dtype} rounding allows {tolerance:g}). Results on this backend may be "
        "wrong: use backend='hf' for this model. sl.load(..., strict=True) refuses instead "
        "of warning."
    )
    if strict:
        raise ParityError(message)
    warnings.warn(message, ParityWarning, stacklevel=3)
