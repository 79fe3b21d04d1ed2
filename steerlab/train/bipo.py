"""BiPO (Cao et al. 2024): train one steering vector at one site on preference pairs.

Each batch draws ``d ∈ {−1, +1}``, steers with ``d·v`` at every position and minimises
``−log σ(d·β·[log π_v(y_w|x) − log π(y_w|x) − log π_v(y_l|x) + log π(y_l|x)])``, with π the
same frozen model unsteered. Only ``v`` trains (AdamW, zero init).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from steerlab.core.concepts import Preference
from steerlab.core.errors import SteerError
from steerlab.core.scalars import flag
from steerlab.train.data import check_items, check_settings
from steerlab.train.loop import (
    History,
    attach_edit,
    batches,
    check_site,
    continuation_logprobs,
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


def bipo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
              reference_chosen: torch.Tensor, reference_rejected: torch.Tensor,
              direction: float, beta: float) -> torch.Tensor:  # fmt: skip
    """The mean BiPO loss of a batch of pairs (summed continuation log-probabilities ``[n]``).

    >>> bipo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), 1.0, 0.1)
    tensor(0.6931)
    """
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    return -F.logsigmoid(direction * beta * margin).mean()


def bipo(
    lm: Any,
    pairs: Sequence[Preference],
    *,
    site: str,
    epochs: int = 10,
    lr: float = 2e-2,
    beta: float = 0.1,
    batch_size: int = 16,
    seed: int = 0,
    held_out: Sequence[Preference] = (),
    progress: bool = True,
) -> tuple[SteeringVector, History]:
    """Train a steering vector at ``site`` on preference pairs; the model stays frozen.

    Returns the vector (provenance: method "bipo", the data's sha256, the settings and the
    last loss) and the ``History`` (loss per step; the held-out loss per epoch, if given).
    Steer with ``vec * alpha`` as with any vector.

    The defaults train on tens of pairs: on the README's 48 toy pairs the loss goes from
    log 2 to 0.51 and ``vec * 4`` turns all four held-out openings happy. The paper's
    learning rate, 5e-4 (for its 7B models; 20 epochs, batches of 8), ends there at 0.67,
    and even ``vec * 10`` turns one opening of the four.

    Raises:
        SteerError: bad input (before any compute); vLLM, which cannot train.
        TrainingError: a loss that is not finite, naming the step.

    >>> pairs = [sl.Preference("The day was", " happy and bright.", " sad and cold.")]
    >>> vec, history = sl.train.bipo(lm, pairs, site="blocks.2.hook_resid_pre", epochs=2,
    ...                              progress=False)
    >>> vec.provenance.method, history.steps
    ('bipo', 2)
    """
    pairs = check_items(pairs, Preference, "pairs")
    held = check_items(held_out, Preference, "held_out") if held_out else []
    progress = flag(progress, "progress")
    check_settings(epochs=epochs, lr=lr, batch_size=batch_size, beta=beta, seed=seed)
    if beta <= 0:
        raise SteerError(f"beta must be above 0; got {beta!r}: at 0 the loss is log 2 whatever "
                         "the vector (nothing trains), and below 0 it trains the opposite "
                         "preference (swap chosen and rejected instead).")  # fmt: skip
    engine = local_engine(lm)
    at = check_site(engine, site)
    data, held_data = PairRows(lm.tokenizer, pairs), PairRows(lm.tokenizer, held)
    data.check_fit(engine.n_ctx)
    held_data.check_fit(engine.n_ctx, "held_out's")
    generator = torch.Generator().manual_seed(seed)
    v = torch.nn.Parameter(torch.zeros(engine.d_model))
    state: dict[str, float] = {"d": 0.0}  # the steer's sign now; 0: unsteered (π)
    history = History("bipo")
    stop = timed(history)
    with frozen_call(engine, "train bipo") as call:
        attach_edit(engine, at, call, "all",
                    lambda: (lambda act: act + state["d"] * v) if state["d"] else None)  # fmt: skip
        data.reference(engine, call)
        if held:
            held_data.reference(engine, call)
        optimizer = torch.optim.AdamW([v], lr=lr)
        steps = step_count(len(pairs), batch_size, epochs)
        with progress_bar(steps, "bipo", progress) as bar:
            for epoch in range(epochs):
                for index in batches(len(pairs), batch_size, generator):
                    d = 1.0 if torch.randint(2, (1,), generator=generator).item() else -1.0
                    state["d"] = d
                    rows = [data.chosen[i] for i in index] + [data.rejected[i] for i in index]
                    logp, fed = continuation_logprobs(engine, call, rows, grad=True)
                    n = len(index)
                    loss = bipo_loss(logp[:n], logp[n:], data.ref_c[index], data.ref_r[index],
                                     d, beta)  # fmt: skip
                    take_step(loss, optimizer, history, epoch, fed, bar)
                if held:
                    value = _held_out_loss(engine, call, held_data, state, beta)
                    history.held_out.append((history.steps, value))
                state["d"] = 0.0
    stop()
    return trained_vector(lm, "bipo", {at.name: v}, pairs, history, epochs=epochs, lr=lr,
                          beta=beta, batch_size=batch_size, seed=seed), history  # fmt: skip


def _held_out_loss(engine: Any, call: Any, held: PairRows, state: dict[str, float],
                   beta: float) -> float:  # fmt: skip
    """The held-out BiPO loss, averaged over both signs of the vector."""
    total = 0.0
    for d in (1.0, -1.0):
        state["d"] = d
        chosen, rejected = held.logprobs(engine, call)
        total += float(bipo_loss(chosen, rejected, held.ref_c, held.ref_r, d, beta)) / 2
    state["d"] = 0.0
    return total
