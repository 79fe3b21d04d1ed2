"""RePS (Wu et al., "Improved Representation Steering for Language Models", 2025): a
steering vector trained with a reference-scaled preference loss, the steer AxBench ranks
first after prompting.

Each step takes a batch of pairs twice:

- **steering** (w = chosen, l = rejected): the vector acts as ``h + (α + b)·v`` at every
  position, with α drawn per sequence from ``factors`` (separately for w and l);
- **suppression** (``suppress=True``; w = rejected, l = chosen): the vector nulls the
  concept out, ``h − (ReLU(h·v + b)/‖v‖²)·v``.

and minimises ``reps_loss`` over both halves. Only ``v`` and the scalar ``b`` train (AdamW,
no weight decay, a linear decay of the learning rate, gradients clipped at 1); the model
stays frozen. ``b`` is not used at inference, as in AxBench: steer with ``vec * factor``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from steerlab.core.concepts import Preference
from steerlab.core.directions import direction_of
from steerlab.core.errors import SteerError
from steerlab.core.scalars import flag
from steerlab.train.data import (
    Row,
    check_factor_scale,
    check_factors,
    check_items,
    check_settings,
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
    trained_vector,
)
from steerlab.train.pairs import PairRows
from steerlab.vectors.vector import SteeringVector

TRAINING_FACTORS = tuple(range(2, 21, 2))  # AxBench's RePS training grid for a vector


def reps_loss(policy_w: torch.Tensor, policy_l: torch.Tensor, reference_w: torch.Tensor,
              reference_l: torch.Tensor, length_w: torch.Tensor,
              length_l: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The mean RePS loss of a batch of pairs ``[n]``: summed response log-probabilities
    under the steered model (policy) and the unsteered one (reference), and the responses'
    token counts.

    ``L = −log σ((β/|w|)·log p(w|x) − (1/|l|)·log p(l|x))``, with
    ``β = max(log p₀(l|x) − log p₀(w|x), 1)`` from the reference, not differentiated.

    A response's length is its token count, at least 1: an empty response has no
    per-token log-probability (0 / 0), so a length that is not a number >= 1 is refused.

    >>> z = torch.zeros(1)
    >>> reps_loss(z, z, z, z, torch.ones(1), torch.ones(1))
    tensor(0.6931)
    """
    for name, length in (("length_w", length_w), ("length_l", length_l)):
        if not bool((torch.as_tensor(length) >= 1).all()):  # NaN fails too
            raise SteerError(f"{name} must be token counts >= 1 (a response has at least one "
                             f"token; 0 would divide by zero); got {length!r:.80}.")  # fmt: skip
    beta = (reference_l - reference_w).detach().clamp(min=1.0)
    margin = beta * policy_w / length_w - policy_l / length_l
    return -F.logsigmoid(margin).mean()


def reps(
    lm: Any,
    pairs: Sequence[Preference],
    *,
    site: str,
    epochs: int = 18,
    lr: float = 0.04,
    factors: Iterable[float] = TRAINING_FACTORS,
    batch_size: int = 6,
    suppress: bool = True,
    init: torch.Tensor | SteeringVector | None = None,
    seed: int = 0,
    progress: bool = True,
) -> tuple[SteeringVector, History]:
    """Train a RePS steering vector at ``site`` on preference pairs; the model stays frozen.

    Args:
        lm: an in-process model (hf, hooked or bridge).
        pairs: ``chosen`` shows the concept, ``rejected`` is the model's own reply
            (``sl.train.preference_pairs`` builds them).
        site: where the vector acts.
        epochs, lr, batch_size: AxBench's Gemma-2-2B settings by default (18, 0.04, 6).
        factors: the α each steered sequence draws from (AxBench: 2, 4, ... 20).
        suppress: also train on suppression pairs (w = rejected, l = chosen, concept nulled).
        init: the starting vector (a ``[d_model]`` tensor, or a vector's direction at
            ``site`` with its scale); None: seeded Gaussian of norm about 1.
        seed: decides the initial vector, the batch order and the α draws.
        progress: a progress bar over the steps.

    Returns:
        The vector (provenance: method "reps", the data's sha256, the settings, the trained
        bias ``b`` and the last loss) and the ``History``; ``history.loss[0]`` is the first
        batch's loss before the first update.

    Raises:
        SteerError: bad input (before any compute); vLLM, which cannot train.
        TrainingError: a loss that is not finite, naming the step.

    >>> pairs = [sl.Preference("The day was", " happy and bright.", " sad and cold.")]
    >>> vec, history = sl.train.reps(lm, pairs, site="blocks.2.hook_resid_pre", epochs=2,
    ...                              progress=False)
    >>> vec.provenance.method, history.steps
    ('reps', 2)
    """
    pairs = check_items(pairs, Preference, "pairs")
    suppress, progress = flag(suppress, "suppress"), flag(progress, "progress")
    check_settings(epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    grid = torch.tensor(check_factors(factors))
    engine = local_engine(lm)
    at = check_site(engine, site)
    start = _initial(init, at.name, engine.d_model, seed)
    check_factor_scale(grid.tolist(), start)
    v = torch.nn.Parameter(start)
    b = torch.nn.Parameter(torch.zeros(()))
    data = PairData(lm.tokenizer, pairs)
    data.check_fit(engine.n_ctx)
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, Any] = {"alpha": None, "null": None}  # per row; None: unsteered (p₀)

    def edit(act: torch.Tensor) -> torch.Tensor:  # [rows, seq, d]
        alpha, null = state["alpha"].to(act.device), state["null"].to(act.device)
        added = act + ((alpha + b)[:, None, None] * v).to(act.dtype)
        latent = torch.relu(act.float() @ v + b)  # [rows, seq]
        nulled = act - ((latent / v.dot(v))[..., None] * v).to(act.dtype)
        return torch.where(null[:, None, None], nulled, added)

    history = History("reps")
    stop = timed(history)
    with frozen_call(engine, "train reps") as call:
        attach_edit(engine, at, call, "all", lambda: edit if state["alpha"] is not None else None)
        data.reference(engine, call)
        steps = step_count(len(pairs), batch_size, epochs)
        optimizer, schedule = decaying_adamw([v, b], lr, steps)
        with progress_bar(steps, "reps", progress) as bar:
            for epoch in range(epochs):
                for index in batches(len(pairs), batch_size, generator):
                    rows, draws = data.rows(index, grid, generator, suppress)
                    steered = len(draws)  # the first rows steer; the rest null the concept
                    state["alpha"] = torch.cat([draws, torch.zeros(len(rows) - steered)])
                    state["null"] = torch.arange(len(rows)) >= steered
                    try:
                        logp, fed = continuation_logprobs(engine, call, rows, grad=True)
                    finally:
                        state["alpha"] = None
                    loss = data.loss(logp, index, suppress)
                    take_step(loss, optimizer, history, epoch, fed, bar, clip=[v, b],
                              schedule=schedule)  # fmt: skip
    stop()
    return trained_vector(lm, "reps", {at.name: v}, pairs, history, epochs=epochs, lr=lr,
                          factors=" ".join(f"{f:g}" for f in grid.tolist()),
                          batch_size=batch_size, suppress=suppress,
                          seed=seed, bias=float(b.detach())), history  # fmt: skip


def _initial(init: Any, site: str, d_model: int, seed: int) -> torch.Tensor:
    if init is None:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(d_model, generator=generator) / math.sqrt(d_model)
    if isinstance(init, torch.Tensor) and init.shape != (d_model,):
        raise SteerError(f"init must be a [d_model={d_model}] vector; got {tuple(init.shape)}.")
    try:
        direction, scale = direction_of(init, site)
    except (SteerError, KeyError) as error:
        raise SteerError(f"init must be a [d_model] tensor or a SteeringVector with a "
                         f"direction at {site!r}; {error}") from None  # fmt: skip
    start = (direction.float() * scale).detach().clone()
    if start.shape != (d_model,) or not bool(torch.isfinite(start).all()) or not start.any():
        raise SteerError(f"init must be a finite, non-zero [d_model={d_model}] vector.")
    return start


class PairData(PairRows):
    """Preference pairs as training rows, and RePS's loss over a batch of them.

    A batch's rows are the chosen and rejected replies steered, then (``suppress``) the
    rejected and chosen ones with the concept taken out; the loss pairs them as
    (w = chosen, l = rejected), then (w = rejected, l = chosen).
    """

    def __init__(self, tokenizer: Any, pairs: Sequence[Preference]) -> None:
        super().__init__(tokenizer, pairs)
        self.len_c = torch.tensor([float(len(r.continuation)) for r in self.chosen])
        self.len_r = torch.tensor([float(len(r.continuation)) for r in self.rejected])

    def rows(self, index: list[int], grid: torch.Tensor, generator: torch.Generator,
             suppress: bool) -> tuple[list[Row], torch.Tensor]:  # fmt: skip
        """The batch's rows, and the factor each steered row draws (w and l separately)."""
        c, r = [self.chosen[i] for i in index], [self.rejected[i] for i in index]
        draws = grid[torch.randint(len(grid), (2 * len(index),), generator=generator)]
        return c + r + (r + c if suppress else []), draws

    def loss(self, logp: torch.Tensor, index: list[int], suppress: bool) -> torch.Tensor:
        n = len(index)
        halves = [(logp[:n], logp[n : 2 * n], self.ref_c[index], self.ref_r[index],
                   self.len_c[index], self.len_r[index])]  # fmt: skip
        if suppress:
            halves.append((logp[2 * n : 3 * n], logp[3 * n :], self.ref_r[index],
                           self.ref_c[index], self.len_r[index], self.len_c[index]))  # fmt: skip
        return reps_loss(*(torch.cat(column) for column in zip(*halves)))
