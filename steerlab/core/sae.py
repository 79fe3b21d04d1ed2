"""How a sparse autoencoder turns activations into features: THE encoding, for every caller.

``features.SAE.encode`` and the ``FeatureClamp`` operation both call ``encode``, so what a
notebook reads and what a clamp acts on are the same numbers. It follows SAELens 6.x
(``sae_lens/saes/*_sae.py``):

- the input is cast to the SAE's dtype, and ``b_dec`` is subtracted from it when
  ``apply_b_dec_to_input`` is on (callers pass zeros, or ``b_dec``);
- ``hidden_pre = sae_in @ W_enc + b_enc``;
- ``standard``: ``relu(hidden_pre)``;
- ``jumprelu``: ``relu(hidden_pre)`` where ``hidden_pre > threshold``, else 0;
- ``topk``: the ``k`` largest entries of ``hidden_pre`` (multiplied by the decoder row
  norms first when the SAE rescales by them), relu'd; the rest 0.

``W_enc`` may be one column ``[d_in]`` (with ``b_enc`` and ``threshold`` the matching
scalars): a single feature of a ``standard`` or ``jumprelu`` SAE needs nothing else. A
``topk`` feature depends on every other feature, so it takes the whole encoder.
"""

from __future__ import annotations

import torch

ARCHITECTURE_NAMES = ("standard", "jumprelu", "topk")


def activate(architecture: str, hidden_pre: torch.Tensor, *, threshold: torch.Tensor | None = None,
             k: int | None = None, decoder_norms: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Feature activations from pre-activations, as ``architecture`` computes them."""
    if architecture == "standard":
        return torch.relu(hidden_pre)
    if architecture == "jumprelu":
        assert threshold is not None, "a jumprelu SAE has a threshold"
        base = torch.relu(hidden_pre)
        return base * (hidden_pre > threshold).to(base.dtype)
    if architecture == "topk":
        assert k is not None, "a topk SAE has a k"
        if decoder_norms is not None:
            hidden_pre = hidden_pre * decoder_norms
        values, indices = torch.topk(hidden_pre, k=k, dim=-1, sorted=False)  # [..., k]
        out = torch.zeros_like(hidden_pre)
        out.scatter_(-1, indices, values.relu())
        return out
    raise ValueError(f"unknown SAE architecture {architecture!r}")


def encode(x: torch.Tensor, W_enc: torch.Tensor, b_enc: torch.Tensor, b_dec_in: torch.Tensor,
           architecture: str, *, threshold: torch.Tensor | None = None, k: int | None = None,
           decoder_norms: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``activate(architecture, (x - b_dec_in) @ W_enc + b_enc)``, in ``W_enc``'s dtype.

    ``b_dec_in`` is ``b_dec`` when the SAE applies it to its input, else zeros.

    >>> encode(torch.tensor([[1.0, -2.0]]), torch.eye(2), torch.zeros(2), torch.zeros(2),
    ...        "standard").tolist()
    [[1.0, 0.0]]
    """
    sae_in = x.to(device=W_enc.device, dtype=W_enc.dtype) - b_dec_in
    hidden_pre = sae_in @ W_enc + b_enc
    return activate(architecture, hidden_pre, threshold=threshold, k=k,
                    decoder_norms=decoder_norms)  # fmt: skip
