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

from steerlab.core.ops.base import STRENGTHS, Form, Operation, unit
from steerlab.core.ops.data import form_of, operand


def is_wide(field: str) -> bool:
    """A ``Form`` field that holds a ``[d_model]`` tensor (its annotation says so)."""
    return "Tensor" in str(Form.__annotations__[field])


# Columns of a table row: ``[d_model]`` ones (the steer's vector, its unit direction, the
# form's tensor fields), then one number per other form field.
WIDE = ("vector", "unit", *(f for f in Form._fields if is_wide(f)))
NUMBERS = tuple(f for f in Form._fields if not is_wide(f))


def form_columns(op: Operation, vector: torch.Tensor, dtype: torch.dtype,
                 device: torch.device | str) -> dict[str, torch.Tensor | float]:  # fmt: skip
    """The table row of a steer (``op`` with ``vector``) at alpha 1: ``vector``, ``unit``
    where the form projects or turns (what the eager op computes from its operand,
    normalised before the cast), and each set field of the op's ``Form``, tensors in
    ``dtype`` on ``device``. A table multiplies the ``STRENGTHS`` by the row's alpha."""
    form = form_of(op)
    if form is None:
        raise ValueError(f"{op!r} has no table form")
    out: dict[str, torch.Tensor | float] = {"vector": vector.to(device, dtype)}
    if form.proj or form.rot:
        out["unit"] = unit(operand(op, vector, dtype, device))
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
    exact zeros added). Where to apply is the caller's (positions, gates)."""
    new = act
    if "add" in terms:
        new = new + c["add"][:, None] * c["vector"]
    if "proj" in terms:
        along = (act * c["unit"]).sum(-1)  # [n]
        moved = torch.clamp(along, min=c["low"], max=c["high"]) - along  # [n]
        new = new + (c["proj"] * moved)[:, None] * c["unit"]
    if "feat" in terms:
        pre = (act * c["encoder"]).sum(-1) + c["bias"]  # [n]: an SAE feature's pre-activation
        f = torch.relu(pre) * (pre > c["threshold"]).to(act.dtype)
        new = new + (c["feat"] * (c["value"] - f))[:, None] * c["vector"]
    if "rot" in terms:
        along_b1, along_b2 = turned(act, c)
        new = new + along_b1 + along_b2  # in the order core.ops.Rotate adds them
    return new


def turned(act: torch.Tensor, c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """What a rotation adds to ``act [n, d]`` along each axis of its plane (0 on rows
    without one): the component in the plane of ``unit`` and ``toward`` turned ``rot`` of
    the way to ``angle``, as ``core.ops.Rotate`` turns it."""
    b1, toward = c["unit"], c["toward"]
    rest = toward - (toward * b1).sum(-1, keepdim=True) * b1
    length = rest.norm(dim=-1, keepdim=True)
    b2 = rest / length.clamp_min(torch.finfo(act.dtype).tiny)
    x, y = (act * b1).sum(-1), (act * b2).sum(-1)  # [n]
    radius, phi = torch.hypot(x, y), torch.atan2(y, x)
    turn = torch.remainder(c["angle"] - phi + math.pi, 2 * math.pi) - math.pi
    to = phi + c["rot"] * turn
    keep = ((c["rot"] != 0) & ((c["adaptive"] == 0) | (x > 0)))[:, None]
    zero = torch.zeros_like(act)
    return (torch.where(keep, (radius * torch.cos(to) - x)[:, None] * b1, zero),
            torch.where(keep, (radius * torch.sin(to) - y)[:, None] * b2, zero))  # fmt: skip
