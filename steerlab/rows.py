"""A checked request laid out as rows: prompts x alphas, prompt-major, with their steers.

Everything here runs before the model is touched, so bad input fails before any compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from steerlab.generation.prompts import Batch, Prompt, PromptError, encode, normalise
from steerlab.intervene import check_steers, expand_rows
from steerlab.interventions import Steer
from steerlab.sites import Site

if TYPE_CHECKING:
    from steerlab.model import SteerableModel


class SteersLike(Protocol):
    """Anything that turns into steers, such as a ``SteeringVector`` times an alpha."""

    def steers(self) -> list[Steer]: ...


SteerArg = Steer | SteersLike | Sequence[Steer] | None


def _steers(steer: SteerArg) -> list[Steer]:
    if steer is None:
        return []
    if hasattr(steer, "steers"):
        return steer.steers()
    return [s for item in steer for s in _steers(item)]


@dataclass(frozen=True)
class Rows:
    """Checked prompts laid out as rows (prompt x alpha, prompt-major), with their steers."""

    prompts: list[Prompt]
    batch: Batch
    steers: list[tuple[Site, Steer, torch.Tensor]]  # each with its alpha on every row
    prompt_index: list[int]
    alphas: list[tuple[float, ...]]


def lay_out(
    lm: SteerableModel,
    prompts: Prompt | Sequence[Prompt],
    steer: SteerArg,
    *,
    chat: bool,
    new_tokens: int,
) -> Rows:
    """Check prompts and steers against ``lm`` and lay out the rows; nothing runs.

    >>> lay_out(lm, ["Hi"], Steer(site, v, alpha=[0, 4]), chat=False, new_tokens=8).alphas  # doctest: +SKIP
    [(0.0,), (4.0,)]
    """
    prompts = normalise(prompts)
    steers = _steers(steer)
    sites = check_steers(lm.backend, steers)
    prompt_index, alphas = expand_rows(len(prompts), steers)
    encoded = [encode(lm.tokenizer, p, chat=chat) for p in prompts]
    for i, row in enumerate(encoded):
        if not row:
            raise PromptError(f"Prompt {i} encodes to no tokens.")
    _check_length(encoded, new_tokens, lm.backend.n_ctx)
    batch = Batch.left_pad([encoded[p] for p in prompt_index], lm.pad_id)
    attached = [
        (site, steer, torch.tensor([a[i] for a in alphas]))
        for i, (site, steer) in enumerate(zip(sites, steers))
    ]
    return Rows(prompts, batch, attached, prompt_index, alphas)


def _check_length(rows: list[list[int]], new: int, n_ctx: int | None) -> None:
    longest = max(len(r) for r in rows)
    if n_ctx is not None and longest + new > n_ctx:
        raise PromptError(
            f"The longest prompt has {longest} tokens; with max_new_tokens={new} that is "
            f"{longest + new}, beyond this model's context window of {n_ctx}."
        )
