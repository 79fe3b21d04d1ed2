"""LoReFT training (Wu et al. 2024): a rank-r intervention at chosen prompt positions.

``Φ(h) = h + Rᵀ(W h + b − R h)`` at ``site`` on the tokens ``positions`` names, with R's
rows kept orthonormal by torch's orthogonal parametrization (as pyreft does). The loss is
the target continuation's cross-entropy, the prompt's tokens masked; only R, W, b train.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal

from steerlab.core.errors import SteerError
from steerlab.core.reft import LoReFT
from steerlab.core.steer import Positions, _as_positions
from steerlab.train.data import Example, Row, check_items, check_settings, data_sha256, rows_of
from steerlab.train.loop import (
    History,
    attach_edit,
    batches,
    check_finite,
    check_site,
    continuation_logprobs,
    frozen_call,
    local_engine,
    progress_bar,
    timed,
)


class Intervention(nn.Module):
    """The trainable LoReFT: ``rotate`` (R, orthonormal rows) and ``source`` (W, b)."""

    def __init__(self, d_model: int, rank: int) -> None:
        super().__init__()
        self.rotate = orthogonal(nn.Linear(d_model, rank, bias=False))
        self.source = nn.Linear(d_model, rank)

    def R(self) -> torch.Tensor:
        """``[rank, d]``: the parametrization's orthonormal rows."""
        weight = self.rotate.weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        R, x = self.R(), h.float()
        return h + (self.source(x) - x @ R.T) @ R

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return (self.R().detach().clone(), self.source.weight.detach().clone(),
                    self.source.bias.detach().clone())  # fmt: skip


def reft(
    lm: Any,
    examples: Sequence[Example],
    *,
    site: str,
    rank: int = 4,
    positions: Positions = "first:3+last:3",
    epochs: int = 30,
    lr: float = 4e-3,
    batch_size: int = 8,
    seed: int = 0,
    held_out: Sequence[Example] = (),
    progress: bool = True,
) -> tuple[LoReFT, History]:
    """Train a ``LoReFT`` at ``site`` to continue each prompt with its target.

    Returns the ``sl.LoReFT`` (a steer: alpha 1 is as trained) and the ``History``.

    Raises:
        SteerError: bad input (before any compute); vLLM, which cannot train.
        TrainingError: a loss that is not finite, naming the step.

    >>> data = [sl.Example("Once upon a time", " there was a boat on the sea.")]
    >>> reft, history = sl.train.reft(lm, data, site="blocks.2.hook_resid_post", epochs=2,
    ...                               progress=False)
    >>> reft.rank, history.steps
    (4, 2)
    """
    examples = check_items(examples, Example, "examples")
    held = check_items(held_out, Example, "held_out") if len(held_out) else []
    check_settings(epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    engine = local_engine(lm)
    at = check_site(engine, site)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= engine.d_model:
        raise SteerError(f"rank must be an int in [1, d_model={engine.d_model}]; got {rank!r}.")
    positions = _as_positions(positions)
    rows = [rows_of(lm.tokenizer, e.prompt, e.target) for e in examples]
    held_rows = [rows_of(lm.tokenizer, e.prompt, e.target) for e in held]
    with torch.random.fork_rng(devices=[]):  # the seed alone decides the initial R, W, b
        torch.manual_seed(seed)
        module = Intervention(engine.d_model, rank)
    generator = torch.Generator().manual_seed(seed)
    history = History("reft")
    stop = timed(history)
    with frozen_call(engine, "train reft") as call:
        attach_edit(engine, at, call, positions, lambda: module)
        optimizer = torch.optim.AdamW(
            module.parameters(), lr=lr, weight_decay=0.0
        )  # decay breaks R
        steps = epochs * -(-len(rows) // batch_size)
        with progress_bar(steps, "reft", progress) as bar:
            for epoch in range(epochs):
                for index in batches(len(rows), batch_size, generator):
                    batch = [rows[i] for i in index]
                    logp, fed = continuation_logprobs(engine, call, batch, grad=True)
                    loss = -(logp.sum() / sum(len(r.continuation) for r in batch))
                    check_finite(loss, history.steps + 1, epoch + 1)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    history.loss.append(float(loss.detach()))
                    history.epoch.append(epoch + 1)
                    history.tokens += fed
                    bar.set_postfix(loss=f"{history.last_loss:.4f}")
                    bar.update()
                if held_rows:
                    history.held_out.append((history.steps, _loss(engine, call, held_rows)))
    stop()
    settings = {"rank": rank, "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed,
                "method": "reft", "data_sha256": data_sha256(examples), "model": lm.name,
                "steps": history.steps, "last_loss": history.last_loss}  # fmt: skip
    R, W, b = module.parts()
    return LoReFT(at.name, R, W, b, positions=positions,
                  provenance=json.dumps(settings)), history  # fmt: skip


def _loss(engine: Any, call: Any, rows: list[Row]) -> float:
    with torch.no_grad():
        logp, _ = continuation_logprobs(engine, call, rows, grad=False)
    return float(-(logp.sum() / sum(len(r.continuation) for r in rows)))
