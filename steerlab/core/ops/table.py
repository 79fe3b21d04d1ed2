"""``Form`` as table data, for every table-driven engine: an operation's columns
(``form_columns``) and their arithmetic (``apply_terms``).

The local compiled step keeps one table row per (site, batch row); vLLM's compiled graph
keeps one per distinct steer at a site and gives each token its row. Both fill the row
from ``form_columns`` and compute with ``apply_terms``, so an operation means the same on
both, and a new ``Form`` term is new code here only.
"""

from __future__ import annotations

import math

import torch

from steerlab.core.ops.base import STRENGTHS, Form, Operation, unit, wide_dtype
from steerlab.core.ops.data import form_of, operand
from steerlab.core.ops.rotate import across


def is_wide(field: str) -> bool:
    """A ``Form`` field that holds a ``[d_model]`` tensor (its annotation says so)."""
    return "Tensor" in str(Form.__annotations__[field])


# Columns of a table row: ``[d_model]`` ones (the steer's vector, its unit direction, a
# rotation plane's second axis, the form's tensor fields), then one number per other field.
WIDE = ("vector", "unit", "plane", *(f for f in Form._fields if is_wide(f)))
NUMBERS = tuple(f for f in Form._fields if not is_wide(f))


def form_columns(op: Operation, vector: torch.Tensor, dtype: torch.dtype,
                 device: torch.device | str) -> dict[str, torch.Tensor | float]:  # fmt: skip
    """The table row of a steer (``op`` with ``vector``) at alpha 1: ``vector``, ``unit``
    where the form projects or turns (what the eager op computes from its operand,
    normalised before the cast), a rotation's ``plane`` (the unit axis of ``toward``
    orthogonal to ``unit``, worked out in float32 as ``core.ops.Rotate`` does), and each
    set field of the op's ``Form``, tensors in ``dtype`` on ``device``. A table
    multiplies the ``STRENGTHS`` by the row's alpha."""
    form = form_of(op)
    if form is None:
        raise ValueError(f"{op!r} has no table form")
    out: dict[str, torch.Tensor | float] = {"vector": vector.to(device, dtype)}
    if form.proj or form.rot:
        out["unit"] = unit(operand(op, vector, dtype, device))
    if form.rot and form.toward is not None:
        wide = wide_dtype(vector.dtype)
        b1, toward = unit(vector.to(wide)), unit(form.toward.to(vector.device, wide))
        rest = across(toward, b1)
        out["plane"] = (rest / rest.norm()).to(device, dtype)
    for name, value in form._asdict().items():
        if isinstance(value, torch.Tensor):
            out[name] = value.to(device, dtype)
        elif value is not None:
            out[name] = float(value)
    return out


def apply_terms(act: torch.Tensor, c: dict[str, torch.Tensor],
                terms: tuple[str, ...] = STRENGTHS) -> torch.Tensor:  # fmt: skip
    """``act [n, d]`` with each row's ``Form`` terms applied: ``c`` holds a column per
    field, ``[n, d]`` or ``[n]``, the strengths already times each row's alpha; ``terms``
    the strengths to compute (a row whose strengths are 0 comes out equal to ``act``, in
    exact zeros added). Where to apply is the caller's (positions, gates).

    Every term moves ``act`` along one of three axes, the ``vector`` (add, feat), the
    ``unit`` direction (proj, and a rotation's first axis) and the ``plane``'s second axis
    (a rotation), so each row gets three coefficients and one sum: a handful of kernels a
    site when compiled, whatever the terms."""
    zero = act.new_zeros(act.shape[0])
    on_vector, on_unit, on_plane = zero, zero, zero
    along = (act * c["unit"]).sum(-1) if {"proj", "rot"} & set(terms) else zero  # [n]
    if "add" in terms:
        on_vector = c["add"]
    if "proj" in terms:
        moved = torch.clamp(along, min=c["low"], max=c["high"]) - along
        on_unit = c["proj"] * moved
    if "feat" in terms:
        pre = (act * c["encoder"]).sum(-1) + c["bias"]  # an SAE feature's pre-activation
        f = torch.relu(pre) * (pre > c["threshold"]).to(act.dtype)
        on_vector = on_vector + c["feat"] * (c["value"] - f)
    if "rot" in terms:
        turn_unit, on_plane = turned(act, along, c)
        on_unit = on_unit + turn_unit
    new = act + on_vector[:, None] * c["vector"] + on_unit[:, None] * c["unit"]
    return new + on_plane[:, None] * c["plane"] if "rot" in terms else new


def turned(act: torch.Tensor, x: torch.Tensor,
           c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """How far a rotation moves ``act [n, d]`` along each axis of its plane, ``[n]`` each
    (0 on rows without one): the component in the plane of ``unit`` and ``plane`` (``x``:
    its part along ``unit``) turned ``rot`` of the way to ``angle`` along the shorter arc,
    its length kept, as ``core.ops.Rotate`` turns it."""
    y = (act * c["plane"]).sum(-1)
    radius, phi = torch.hypot(x, y), torch.atan2(y, x)
    turn = torch.remainder(c["angle"] - phi + math.pi, 2 * math.pi) - math.pi
    to = phi + c["rot"] * turn
    keep = (c["rot"] != 0) & ((c["adaptive"] == 0) | (x > 0))
    zero = torch.zeros_like(x)
    return (torch.where(keep, radius * torch.cos(to) - x, zero),
            torch.where(keep, radius * torch.sin(to) - y, zero))  # fmt: skip
