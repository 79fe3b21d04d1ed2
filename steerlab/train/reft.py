"""LoReFT training (Wu et al. 2024): a rank-r intervention at chosen prompt positions.

``Φ(h) = h + Rᵀ(W h + b − R h)`` at ``site`` on the tokens ``positions`` names, with R's
rows kept orthonormal by torch's orthogonal parametrization (as pyreft does). The loss is
the target continuation's cross-entropy, the prompt's tokens masked; only R, W, b train.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal

from steerlab.core.concepts import Example, Preference
from steerlab.core.errors import SteerError
from steerlab.core.positions import Positions, _as_positions, position_form
from steerlab.core.reft import LoReFT
from steerlab.core.scalars import flag
from steerlab.train.data import (
    Row,
    check_factors,
    check_items,
    check_rows_fit,
    check_settings,
    data_sha256,
    rows_of,
)
from steerlab.train.loop import (
    History,
    attach_edit,
    batches,
    check_site,
    continuation_logprobs,
    decaying_adamw,
    frozen_call,
    local_engine,
    progress_bar,
    step_count,
    take_step,
    timed,
)
from steerlab.train.reps import PairData

LOREFT_FACTORS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0)  # AxBench's RePS-LoReFT grid


class Intervention(nn.Module):
    """The trainable LoReFT: ``rotate`` (R, orthonormal rows) and ``source`` (W, b)."""

    def __init__(self, d_model: int, rank: int) -> None:
        super().__init__()
        self.rotate = orthogonal(nn.Linear(d_model, rank, bias=False))
        self.source = nn.Linear(d_model, rank)
        self.alpha: torch.Tensor | None = None  # [rows]: RePS's per-sequence factor; None: 1

    def R(self) -> torch.Tensor:
        """``[rank, d]``: the parametrization's orthonormal rows."""
        weight = self.rotate.weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        R, x = self.R(), h.float()
        edit = (self.source(x) - x @ R.T) @ R  # [rows, seq, d]
        if self.alpha is not None:
            edit = self.alpha.to(edit.device)[:, None, None] * edit
        return h + edit.to(h.dtype)

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return (self.R().detach().clone(), self.source.weight.detach().clone(),
                    self.source.bias.detach().clone())  # fmt: skip


def reft(
    lm: Any,
    examples: Sequence[Example] | Sequence[Preference],
    *,
    site: str,
    rank: int = 4,
    positions: Positions = "first:3+last:3",
    epochs: int = 30,
    lr: float = 4e-3,
    batch_size: int = 8,
    seed: int = 0,
    held_out: Sequence[Example] = (),
    objective: str = "lm",
    factors: Iterable[float] = LOREFT_FACTORS,
    suppress: bool = True,
    progress: bool = True,
) -> tuple[LoReFT, History]:
    """Train a ``LoReFT`` at ``site`` to continue each prompt with its target.

    With ``objective="lm"`` (the default) it learns ``Example`` targets by cross-entropy.
    With ``objective="reps"`` it learns ``Preference`` pairs by RePS's loss
    (``sl.train.reps_loss``), as AxBench's RePS-LoReFT: ``h + Rᵀ(α(W h + b − R h))`` with α
    drawn per sequence from ``factors`` on steering pairs, and ``−α`` on suppression pairs
    (``suppress``: w = rejected, l = chosen). The returned LoReFT's alpha 1 is α = 1.

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
    if objective not in ("lm", "reps"):
        raise SteerError(f"objective must be 'lm' (cross-entropy on Example targets) or 'reps' "
                         f"(RePS on Preference pairs); got {objective!r:.40}.")  # fmt: skip
    kind = Example if objective == "lm" else Preference
    examples = check_items(examples, kind, "examples" if objective == "lm" else "pairs")
    held = check_items(held_out, Example, "held_out") if held_out else []
    if held and objective == "reps":
        raise SteerError("held_out is for objective='lm'; RePS training has no held-out loss.")
    grid = torch.tensor(check_factors(factors))
    suppress, progress = flag(suppress, "suppress"), flag(progress, "progress")
    check_settings(epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    engine = local_engine(lm)
    at = check_site(engine, site)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= engine.d_model:
        raise SteerError(f"rank must be an int in [1, d_model={engine.d_model}]; got {rank!r}.")
    positions = _as_positions(positions)
    if not position_form(positions)[0]:
        raise SteerError(f"positions={positions!r} selects no token of a training example: "
                         "training feeds each example's prompt and target in one forward, and "
                         "no token of it counts as generated. Use prompt positions, such as "
                         "'first:3+last:3' (pyreft's 'f3+l3') or 'all'.")  # fmt: skip
    if objective == "reps":
        return _reft_reps(lm, engine, at.name, examples, rank, positions, grid, suppress,
                          epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                          progress=progress)  # fmt: skip
    rows = [rows_of(lm.tokenizer, e.prompt, e.target) for e in examples]
    held_rows = [rows_of(lm.tokenizer, e.prompt, e.target) for e in held]
    check_rows_fit(engine.n_ctx, rows, "examples")
    check_rows_fit(engine.n_ctx, held_rows, "held_out")
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
        steps = step_count(len(rows), batch_size, epochs)
        with progress_bar(steps, "reft", progress) as bar:
            for epoch in range(epochs):
                for index in batches(len(rows), batch_size, generator):
                    batch = [rows[i] for i in index]
                    logp, fed = continuation_logprobs(engine, call, batch, grad=True)
                    loss = -(logp.sum() / sum(len(r.continuation) for r in batch))
                    take_step(loss, optimizer, history, epoch, fed, bar)
                if held_rows:
                    history.held_out.append((history.steps, _loss(engine, call, held_rows)))
    stop()
    return _loreft(lm, module, at.name, positions, examples, history, method="reft",
                   rank=rank, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed), history  # fmt: skip


def _loreft(lm: Any, module: Intervention, site: str, positions: Positions, data: Any,
            history: History, **settings: Any) -> LoReFT:  # fmt: skip
    record = {**settings, "data_sha256": data_sha256(data), "model": lm.name,
              "model_config_sha256": getattr(lm, "config_sha256", ""), "steps": history.steps, "last_loss": history.last_loss}  # fmt: skip
    R, W, b = module.parts()
    return LoReFT(site, R, W, b, positions=positions, provenance=json.dumps(record))


def _reft_reps(lm: Any, engine: Any, site: str, pairs: list[Preference], rank: int,
               positions: Positions, grid: torch.Tensor, suppress: bool, *, epochs: int,
               lr: float, batch_size: int, seed: int,
               progress: bool) -> tuple[LoReFT, History]:  # fmt: skip
    """RePS-LoReFT: the RePS loss, the LoReFT's edit scaled by α per row (−α to suppress)."""
    data = PairData(lm.tokenizer, pairs)
    data.check_fit(engine.n_ctx)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = Intervention(engine.d_model, rank)
    generator = torch.Generator().manual_seed(seed)
    state = {"on": False}
    history = History("reft")
    stop = timed(history)
    with frozen_call(engine, "train reft (reps)") as call:
        attach_edit(engine, check_site(engine, site), call, positions,
                    lambda: module if state["on"] else None)  # fmt: skip
        data.reference(engine, call)
        steps = step_count(len(pairs), batch_size, epochs)
        optimizer, schedule = decaying_adamw(module.parameters(), lr, steps)
        with progress_bar(steps, "reft (reps)", progress) as bar:
            for epoch in range(epochs):
                for index in batches(len(pairs), batch_size, generator):
                    rows, draws = data.rows(index, grid, generator, suppress)
                    module.alpha = torch.cat([draws, -draws]) if suppress else draws
                    state["on"] = True
                    try:
                        logp, fed = continuation_logprobs(engine, call, rows, grad=True)
                    finally:
                        state["on"], module.alpha = False, None
                    take_step(data.loss(logp, index, suppress), optimizer, history, epoch, fed,
                              bar, clip=list(module.parameters()), schedule=schedule)  # fmt: skip
    stop()
    return _loreft(lm, module, site, positions, pairs, history, method="reft",
                   objective="reps", rank=rank, epochs=epochs, lr=lr,
                   factors=" ".join(f"{f:g}" for f in grid.tolist()), suppress=suppress,
                   batch_size=batch_size,
                   seed=seed), history  # fmt: skip


def _loss(engine: Any, call: Any, rows: list[Row]) -> float:
    with torch.no_grad():
        logp, _ = continuation_logprobs(engine, call, rows, grad=False)
    return float(-(logp.sum() / sum(len(r.continuation) for r in rows)))
