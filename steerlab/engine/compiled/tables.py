"""Preallocated tensors the compiled step reads: the static KV cache and the steering table.

Both live as long as the engine and are rewritten in place for every call, so a compiled
graph (and a captured CUDA graph) sees each call's data at the same addresses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from steerlab.core.ops import form_of, unit
from steerlab.core.request import Request
from steerlab.core.sites import EMBED, Site
from steerlab.core.steer import position_form

_KINDS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


def slot(site: Site) -> int:
    """A site's row in the steering table: the embedding, then five per layer."""
    if site.kind == EMBED:
        return 0
    assert site.layer is not None
    return 1 + 5 * site.layer + _KINDS.index(site.kind)


def slot_of(layer: int, kind: str) -> int:
    return 1 + 5 * layer + _KINDS.index(kind)


class SteerTable:
    """Every steer of a call as data, one row per (site, batch row).

    Each steer is its operation's ``Form`` and its positions rule's data form, so any
    operation of ``core/ops.py`` fits: ``act + add * vector + proj * (clip(a, low, high) - a)
    * unit`` with ``a = act . unit``, on the tokens ``core.steer.touched`` picks. At most one
    steer per site per row.

    A feature clamp reads its feature through ``encoder`` (``FeatureRead``) and adds
    ``feat·(value - f)·vector``.

    Attributes:
        vector, unit, encoder: [sites, batch, d_model].
        add, proj, low, high, feat, bias, threshold, value: [sites, batch].
        on_prompt, on_generated: [sites, batch] bool; from_pos: [sites, batch] long.
    """

    def __init__(self, n_sites: int, batch: int, d_model: int, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        shape = (n_sites, batch)
        self.vector = torch.zeros(*shape, d_model, dtype=dtype, device=device)
        self.unit = torch.zeros(*shape, d_model, dtype=dtype, device=device)
        self.encoder = torch.zeros(*shape, d_model, dtype=dtype, device=device)
        self.add, self.proj, self.low, self.high = (
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(4)
        )
        self.feat, self.bias, self.threshold, self.value = (
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(4)
        )
        self.on_prompt = torch.zeros(shape, dtype=torch.bool, device=device)
        self.on_generated = torch.zeros(shape, dtype=torch.bool, device=device)
        self.from_pos = torch.zeros(shape, dtype=torch.long, device=device)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.vector, self.unit, self.add, self.proj, self.low, self.high,
                self.on_prompt, self.on_generated, self.from_pos, self.encoder, self.feat,
                self.bias, self.threshold, self.value)  # fmt: skip

    def fill(self, requests: Sequence[Request]) -> None:
        """Write each row's steers (rows past ``len(requests)`` stay unsteered)."""
        for t in self.tensors():
            t.zero_()
        dtype = self.vector.dtype
        for row, request in enumerate(requests):
            for steer in request.steers:
                at = slot(Site.parse(steer.site))
                form = form_of(steer.op)
                assert form is not None, "fit.steer_reason keeps custom operations eager"
                vector = steer.vector.to(self.vector.device, dtype)
                alpha = torch.tensor(steer.alpha, dtype=dtype).item()  # eager casts alpha too
                self.vector[at, row] = vector
                if form.add:
                    self.add[at, row] = alpha
                elif form.feature is not None:
                    read = form.feature
                    self.feat[at, row] = alpha
                    self.encoder[at, row] = read.encoder.to(self.vector.device, dtype)
                    self.bias[at, row], self.threshold[at, row] = read.bias, read.threshold
                    self.value[at, row] = read.value
                else:
                    self.unit[at, row] = unit(vector)
                    self.proj[at, row] = alpha
                self.low[at, row], self.high[at, row] = form.low, form.high
                on_prompt, on_generated, from_pos = position_form(steer.positions)
                self.on_prompt[at, row], self.on_generated[at, row] = on_prompt, on_generated
                self.from_pos[at, row] = from_pos


class StaticCache:
    """Keys and values for ``batch`` rows and ``length`` positions, per layer, plus the mask."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, length: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        shape = (batch, n_kv_heads, length, head_dim)
        self.keys = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers))
        self.values = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers))
        self.mask = torch.zeros((batch, length), dtype=torch.bool, device=device)
        self.batch, self.length = batch, length

    def load(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        """Copy a prefilled cache in: ``layers`` of (keys, values) [rows, heads, pos, head_dim]."""
        rows, pos = mask.shape
        self.mask.zero_()
        self.mask[:rows, :pos] = mask.bool()
        self.mask[rows:, 0] = True  # spare rows attend somewhere, so they never make NaNs
        for (k, v), keys, values in zip(layers, self.keys, self.values):
            keys[:rows, :, :pos] = k
            values[:rows, :, :pos] = v

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self.keys, *self.values, self.mask)
