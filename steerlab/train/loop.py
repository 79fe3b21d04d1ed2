"""Training a steer on a frozen model, through the engine: the call guard, a trainable hook,
forward passes with gradients, continuation log-probabilities, a history and a progress bar.

The model is never changed: its parameters stop requiring gradients for the call and get
their flags back after it, the optimizer holds only the steer's own parameters, and the
call guard removes every hook on the way out (an exception and a KeyboardInterrupt too).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from steerlab._version import __version__
from steerlab.core.concepts import Preference
from steerlab.core.errors import SteerError
from steerlab.core.positions import Positions, position_mask, prompt_span
from steerlab.core.request import Request
from steerlab.core.scalars import flag
from steerlab.core.sites import Site, resolve
from steerlab.engine.batch import Batch
from steerlab.engine.context import ForwardContext
from steerlab.engine.guard import Call, calling
from steerlab.engine.local import LocalEngine
from steerlab.train.data import Row, data_sha256
from steerlab.vectors.vector import Provenance, SteeringVector

Edit = Callable[[torch.Tensor], torch.Tensor]  # [batch, seq, d] -> the steered activation


class TrainingError(SteerError):
    """Training stopped: a loss that is not finite (the step is named)."""


@dataclass
class History:
    """What a training run recorded: the loss per step, and a held-out loss per epoch.

    Attributes:
        method: "bipo" or "reft".
        loss: the training loss after each optimizer step.
        epoch: the epoch of each step.
        held_out: ``(step, loss)`` on the held-out data after each epoch, where given.
        tokens: tokens fed through the model (forward passes with gradients).
        seconds: wall time of the run.
    """

    method: str
    loss: list[float] = field(default_factory=list)
    epoch: list[int] = field(default_factory=list)
    held_out: list[tuple[int, float]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.loss)

    @property
    def last_loss(self) -> float:
        return self.loss[-1] if self.loss else math.nan

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def __repr__(self) -> str:
        held = f", held-out {self.held_out[-1][1]:.4g}" if self.held_out else ""
        return (f"History({self.method}: {self.steps} steps, loss {self.loss[0]:.4g} -> "
                f"{self.last_loss:.4g}{held}, {self.tokens_per_second:.0f} tokens/s)"
                if self.loss else f"History({self.method}: no steps)")  # fmt: skip


def local_engine(lm: Any) -> LocalEngine:
    """The model's in-process engine; vLLM serves trained steers but does not train them."""
    engine = getattr(lm, "engine", None)
    if not isinstance(engine, LocalEngine):
        kind = getattr(engine, "kind", type(engine).__name__)
        raise SteerError(f"Training needs an in-process model (hf, hooked or bridge); this one "
                         f"runs on {kind!r}. Train on a local copy, save the steer, and use "
                         "it there: vLLM takes trained steers, it does not train them.")  # fmt: skip
    return engine


@contextmanager
def frozen_call(engine: LocalEngine, description: str) -> Iterator[Call]:
    """Hold the model for one training call with its parameters frozen; on every exit the
    guard removes the call's hooks and the parameters get their ``requires_grad`` back."""
    with calling(engine.models(), description) as call:
        params = [p for m in engine.models() for p in m.parameters()]
        flags = [p.requires_grad for p in params]
        try:
            for p in params:
                p.requires_grad_(False)
            yield call
        finally:
            for p, flag in zip(params, flags):
                p.requires_grad_(flag)


def check_site(engine: LocalEngine, site: Any) -> Site:
    if not isinstance(site, str):
        raise SteerError(f"site must be a site name such as 'blocks.2.hook_resid_pre'; got "
                         f"{site!r:.60}.")  # fmt: skip
    return resolve(site, engine.sites())


def attach_edit(engine: LocalEngine, site: Site, call: Call, positions: Positions,
                edit: Callable[[], Edit | None]) -> None:  # fmt: skip
    """Hook ``edit()`` (None: leave the forward alone) in at ``site`` for this call, on the
    tokens ``positions`` names (the core's rule, spans counted on each row's prompt)."""

    def apply(act: torch.Tensor, context: ForwardContext,
              placed: tuple[torch.Tensor, ...]) -> torch.Tensor | None:  # fmt: skip
        fn = edit()
        if fn is None:
            return None
        _, pos, generated = placed
        span = context.prompt_lengths(act.device) if prompt_span(positions) else None
        mask = position_mask(positions, pos, generated, span)  # [batch, seq]
        return torch.where(mask[..., None], fn(act).to(act.dtype), act)

    engine.backend.attach(site, call.hook(apply))


def continuation_logprobs(engine: LocalEngine, call: Call, rows: Sequence[Row],
                          grad: bool) -> tuple[torch.Tensor, int]:  # fmt: skip
    """Each row's summed log-probability of its continuation given its prompt ``[rows]``,
    and the tokens fed. A row's prompt, not its continuation, is what a span counts."""
    requests = [Request(row.ids) for row in rows]
    batch = Batch(engine.backend, requests, None, engine.pad_id, use_cache=False)
    batch.prompt_len = torch.tensor([len(row.prompt) for row in rows])
    logits = batch.forward(call, last_only=False, grad=grad)  # [rows, seq, vocab]
    logp = logits.float().log_softmax(-1)[:, :-1]  # predicts columns 1..seq-1
    targets = batch.tokens[:, 1:].to(logp.device)
    picked = logp.gather(-1, targets[..., None])[..., 0]  # [rows, seq - 1]
    width = batch.tokens.shape[1]
    column = torch.arange(1, width)[None]  # the target's column
    first = torch.tensor([width - len(row.continuation) for row in rows])[:, None]
    scored = (column >= first).to(picked.device)
    return (picked * scored).sum(-1), int(batch.mask.sum())


def take_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, history: History,
              epoch: int, fed: int, bar: Any, *, clip: Sequence[torch.Tensor] = (),
              schedule: Any = None) -> None:  # fmt: skip
    """One optimizer step on ``loss`` (refused when not finite), recorded in ``history`` and
    on the progress bar; ``clip`` names parameters whose gradient norm is clipped at 1."""
    check_finite(loss, history.steps + 1, epoch + 1)
    optimizer.zero_grad()
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(list(clip), 1.0)
    optimizer.step()
    check_parameters(optimizer, history.steps + 1, epoch + 1)
    if schedule is not None:
        schedule.step()
    history.loss.append(float(loss.detach()))
    history.epoch.append(epoch + 1)
    history.tokens += fed
    bar.set_postfix(loss=f"{history.last_loss:.4f}")
    bar.update()


def progress_bar(total: int, desc: str, show: bool) -> Any:
    """A tqdm bar (the notebook's where one runs), or a stand-in that does nothing."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not flag(show, "progress"), leave=True)


def check_finite(loss: torch.Tensor, step: int, epoch: int) -> None:
    """Stop at a loss that is not finite. At step 1 no update has happened yet, so the lr
    played no part: the steer's starting size (``init``, ``factors``) or the data did."""
    if not bool(torch.isfinite(loss)):
        why = ("Try a smaller lr." if step > 1 else "This is before any update, so not the "
               "lr: the steer's starting size (init, factors) overflowed the model's forward, "
               "or the data did; try smaller factors or init.")  # fmt: skip
        raise TrainingError(f"The loss is {float(loss.detach())} at step {step} (epoch {epoch}): "
                            f"training stopped there, and the model is untouched. {why}")  # fmt: skip


def check_parameters(optimizer: torch.optim.Optimizer, step: int, epoch: int) -> None:
    """Stop at the first step that leaves a parameter not finite, or so large that its norm
    is not (an lr too large): the steer is never returned with a value that is not finite
    (a vector of norm inf steers every activation to inf), as a loss that is not finite
    stops training too. Every trainer (BiPO, RePS, LoReFT) steps through here."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not finite_steer(p):
                raise TrainingError(f"Step {step} (epoch {epoch}) left the steer's parameters "
                                    f"not finite, or of a norm past float32 (lr={group['lr']:g}): "
                                    "training stopped there, and the model is untouched. Try a "
                                    "smaller lr.")  # fmt: skip


def finite_steer(tensor: torch.Tensor) -> bool:
    """Every value finite, and the norm too, in float32 (the type a steer trains in).

    >>> finite_steer(torch.ones(4)), finite_steer(torch.full((4,), 1e30))
    (True, False)
    """
    values = tensor.detach().float()
    return bool(torch.isfinite(values).all()) and bool(torch.isfinite(values.norm()))


def batches(n: int, size: int, generator: torch.Generator) -> list[list[int]]:
    """One epoch's shuffled index batches (the seed decides the order)."""
    order = torch.randperm(n, generator=generator).tolist()
    return [order[i : i + size] for i in range(0, n, size)]


def step_count(n: int, batch_size: int, epochs: int) -> int:
    """Optimizer steps in ``epochs`` passes over ``n`` items, a step per batch (the last batch
    of an epoch may be short).

    >>> step_count(10, 4, 2)
    6
    """
    return epochs * -(-n // batch_size)


def decaying_adamw(params: Iterable[torch.Tensor], lr: float,
                   steps: int) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:  # fmt: skip
    """AxBench's optimizer for RePS: AdamW without weight decay, its learning rate falling
    linearly from ``lr`` towards 0 over ``steps`` (step the schedule after each step)."""
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / steps)


def timed(history: History) -> Callable[[], None]:
    started = time.perf_counter()

    def stop() -> None:
        history.seconds = time.perf_counter() - started

    return stop


def trained_vector(lm: Any, method: str, tensors: dict[str, torch.Tensor],
                   pairs: Sequence[Preference], history: History,
                   **settings: Any) -> SteeringVector:  # fmt: skip
    """The vector a trainer returns, with its provenance: the method, the data's sha256, the
    settings and the run's steps and last loss."""
    training = {**settings, "steps": history.steps, "last_loss": history.last_loss}
    provenance = Provenance(
        model=lm.name, model_config_sha256=getattr(lm, "config_sha256", ""),
        revision=lm.revision or "", backend=lm.engine.kind, method=method,
        data_sha256=data_sha256(pairs), n_positive=len(pairs), n_negative=len(pairs),
        steerlab_version=__version__, training=json.dumps(training),
    )  # fmt: skip
    return SteeringVector({site: t.detach().clone() for site, t in tensors.items()}, 1.0,
                          provenance)  # fmt: skip
