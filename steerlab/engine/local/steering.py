"""Attaching a call's steers to a backend: one hook per distinct steer, alphas per row.

A mixed batch holds rows with different steers. Each distinct steer (site, vector, op,
positions) is hooked once with a per-row alpha, 0 on rows that do not carry it; alpha 0
leaves an activation bit-identical, so such rows are untouched. A hook acts only while its
own call has a forward running, and reads rows and positions from that forward's context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from steerlab.backends.base import Backend
from steerlab.core.ops import Operation, operand
from steerlab.core.positions import Positions, position_mask, prompt_span
from steerlab.core.reads import Gate
from steerlab.core.request import RowSteer, SteerKey
from steerlab.core.sites import Site
from steerlab.core.steer import check_steer
from steerlab.engine.context import ForwardContext
from steerlab.engine.guard import Call
from steerlab.engine.reads import CallReads


@dataclass(frozen=True)
class AttachedSteer:
    """One distinct steer of a call, with its alpha on every row of the call."""

    site: Site
    vector: torch.Tensor  # [d_model]
    positions: Positions
    op: Operation
    alphas: torch.Tensor  # [rows]
    when: Gate | None = None


def check_row_steers(backend: Backend, rows: Sequence[Sequence[RowSteer]]) -> None:
    """Every steer of every row against the model, before anything runs."""
    valid = backend.sites()
    for steers in rows:
        for steer in steers:
            check_steer(
                steer.site, steer.vector, valid, backend.d_model, steer.when, steer.positions
            )


def group_steers(rows: Sequence[Sequence[RowSteer]]) -> list[AttachedSteer]:
    """Distinct steers over all rows, in forward order; steers with all alphas 0 are dropped."""
    groups: dict[SteerKey, tuple[RowSteer, list[float]]] = {}
    for r, steers in enumerate(rows):
        for steer in steers:
            key = steer.key
            if key not in groups:
                groups[key] = (steer, [0.0] * len(rows))
            groups[key][1][r] = steer.alpha
    attached = [
        AttachedSteer(Site.parse(s.site), s.vector, s.positions, s.op, torch.tensor(alphas), s.when)
        for s, alphas in groups.values()
        if any(alphas)
    ]
    return sorted(attached, key=lambda a: a.site.forward_order)


def attach_steer(backend: Backend, steer: AttachedSteer, call: Call,
                 reads: CallReads | None = None) -> None:  # fmt: skip
    """Hook ``steer`` in for ``call``; it acts on that call's forwards only, and, for a
    conditioned steer, only where ``reads`` says its gate fired."""
    moved: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def apply(act: torch.Tensor, context: ForwardContext,
              placed: tuple[torch.Tensor, ...]) -> torch.Tensor:  # fmt: skip
        key = (act.device, act.dtype)
        if key not in moved:  # move the vector to wherever this layer lives, once
            moved[key] = (operand(steer.op, steer.vector, act.dtype, act.device),
                          steer.alphas.to(*key))  # fmt: skip
        vector, row_alphas = moved[key]
        rows, pos, generated = placed
        alphas = row_alphas[rows]  # [batch]
        batch, seq, d = act.shape
        span = context.prompt_lengths(act.device) if prompt_span(steer.positions) else None
        touched = position_mask(steer.positions, pos, generated, span) & (alphas != 0)[:, None]
        if steer.when is not None:
            assert reads is not None, "a conditioned steer needs the call's reads"
            touched = touched & reads.gate(steer.when, rows, pos)
        alpha = alphas[:, None].expand(batch, seq).reshape(-1, 1)
        new = steer.op(act.reshape(-1, d), vector, alpha).reshape(batch, seq, d)
        return torch.where(touched[..., None], new, act)

    backend.attach(steer.site, call.hook(apply))
