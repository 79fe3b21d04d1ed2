"""Attaching a call's plan to a backend: one hook per distinct steer, alphas per row.

A mixed batch holds rows with different steers. Each distinct steer of the call's plan
(``engine/plan.py``) is hooked once with its per-row alphas, 0 on rows that do not carry
it; alpha 0 leaves an activation bit-identical, so such rows are untouched. A hook acts only while its
own call has a forward running, and reads rows and positions from that forward's context.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from steerlab.backends.base import Backend
from steerlab.core.ops import Bound, bind, operand
from steerlab.core.positions import position_mask, prompt_span
from steerlab.core.steer import Steer
from steerlab.engine.context import ForwardContext
from steerlab.engine.guard import Call
from steerlab.engine.plan import PlanSteer
from steerlab.engine.reads import CallReads


def check_row_steers(backend: Backend, rows: Sequence[Sequence[Steer]]) -> None:
    """Every steer of every row against the model, before anything runs."""
    valid = backend.sites()
    for steers in rows:
        for steer in steers:
            steer.check(valid, backend.d_model)


def attach_steer(backend: Backend, steer: PlanSteer, call: Call,
                 reads: CallReads | None = None) -> None:  # fmt: skip
    """Hook ``steer`` in for ``call``; it acts on that call's forwards only, and, for a
    conditioned steer, only where ``reads`` says its gate fired."""
    direction = steer.vector
    assert isinstance(direction, torch.Tensor), "an in-process plan holds its vectors"
    moved: dict[tuple[torch.device, torch.dtype], tuple[Bound, torch.Tensor]] = {}

    def apply(act: torch.Tensor, context: ForwardContext,
              placed: tuple[torch.Tensor, ...]) -> torch.Tensor:  # fmt: skip
        key = (act.device, act.dtype)
        if key not in moved:  # move the vector to wherever this layer lives, once
            moved[key] = (bind(steer.op, operand(steer.op, direction, act.dtype, act.device)),
                          steer.alphas.to(*key))  # fmt: skip
        op, row_alphas = moved[key]
        rows, pos, generated = placed
        alphas = row_alphas[rows]  # [batch]
        batch, seq, d = act.shape
        span = context.prompt_lengths(act.device) if prompt_span(steer.positions) else None
        touched = position_mask(steer.positions, pos, generated, span) & (alphas != 0)[:, None]
        if steer.gate is not None:
            assert reads is not None, "a conditioned steer needs the call's reads"
            touched = touched & reads.gate(steer.gate, rows, pos)
        alpha = alphas[:, None].expand(batch, seq).reshape(-1, 1)
        new = op(act.reshape(-1, d), alpha).reshape(batch, seq, d)
        return torch.where(touched[..., None], new, act)

    backend.attach(steer.place, call.hook(apply))
