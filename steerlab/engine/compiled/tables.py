"""Preallocated tensors the compiled step reads: the static KV cache and the steering table.

Both live as long as the engine and are rewritten in place for every call, so a compiled
graph (and a captured CUDA graph) sees each call's data at the same addresses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from steerlab.core.ops import STRENGTHS, TERMS, form_of
from steerlab.core.ops.table import NUMBERS, WIDE, form_columns
from steerlab.core.positions import position_form
from steerlab.core.sites import EMBED, FORWARD_KINDS, Site
from steerlab.engine.compiled.fit import decode_steers
from steerlab.engine.plan import Plan


def slot(site: Site) -> int:
    """A site's row in the steering table: the embedding, then five per layer."""
    if site.kind == EMBED:
        return 0
    assert site.layer is not None
    return 1 + 5 * site.layer + FORWARD_KINDS.index(site.kind)


def slot_of(layer: int, kind: str) -> int:
    return 1 + 5 * layer + FORWARD_KINDS.index(kind)


class SteerTable:
    """Every steer of a call as data, one row per (site, batch row), in named columns.

    The columns are ``core.ops.Form``'s fields (a ``[d_model]`` column for a tensor field,
    a number otherwise; the ``STRENGTHS`` stored times the row's alpha), plus what every
    steer has: its ``vector``, its unit direction ``unit`` (normalised before the cast to
    the model's dtype) and its positions rule's data form (``on_prompt``, ``on_generated``,
    ``from_pos``). So any operation with a form fits, and a new ``Form`` term is a new
    column here without code. At most one steer per site per row.

    Attributes:
        columns: name -> ``[sites, batch, d_model]`` or ``[sites, batch]`` tensor.
    """

    def __init__(self, n_sites: int, batch: int, d_model: int, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        shape = (n_sites, batch)
        self.columns: dict[str, torch.Tensor] = {
            **{n: torch.zeros(*shape, d_model, dtype=dtype, device=device) for n in WIDE},
            **{n: torch.zeros(shape, dtype=dtype, device=device) for n in NUMBERS},
            "on_prompt": torch.zeros(shape, dtype=torch.bool, device=device),
            "on_generated": torch.zeros(shape, dtype=torch.bool, device=device),
            "from_pos": torch.zeros(shape, dtype=torch.long, device=device),
        }

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.columns.values())

    def fill(self, plan: Plan) -> None:
        """Write each row's steers from the call's plan (rows past ``plan.rows`` stay
        unsteered)."""
        columns = self.columns
        for t in columns.values():
            t.zero_()
        dtype, device = columns["vector"].dtype, columns["vector"].device
        for row in range(plan.rows):
            for steer, given in decode_steers(plan, row):  # prompt-only ones act in the prefill
                at = slot(Site.parse(steer.site))
                assert form_of(steer.op) is not None, "fit.steer_reason keeps custom ops eager"
                assert isinstance(steer.vector, torch.Tensor)
                alpha = torch.tensor(given, dtype=dtype).item()  # eager casts alpha too
                for name, value in form_columns(steer.op, steer.vector, dtype, device).items():
                    columns[name][at, row] = value * alpha if name in STRENGTHS else value
                on_prompt, on_generated, from_pos = position_form(steer.positions)
                columns["on_prompt"][at, row] = on_prompt
                columns["on_generated"][at, row] = on_generated
                columns["from_pos"][at, row] = from_pos


def spec_of(plan: Plan) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The table slots a plan steers at generated tokens and the ``Form`` terms its
    operations use (a steer with alpha 0 touches nothing, so it needs neither)."""
    slots: set[int] = set()
    terms: set[str] = set()
    for row in range(plan.rows):
        for steer, alpha in decode_steers(plan, row):
            form = form_of(steer.op)
            if form is None or alpha == 0:
                continue
            slots.add(slot(Site.parse(steer.site)))
            terms.update(form.terms)
    return tuple(sorted(slots)), tuple(t for t in TERMS if t in terms)


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
