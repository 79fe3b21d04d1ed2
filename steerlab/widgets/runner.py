"""What one panel run computes, as plain functions of a ``PanelRequest`` (no widgets here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass

import torch

from steerlab.activations import Activations
from steerlab.generation.result import Generation
from steerlab.interventions import Positions, Steer, SteerError
from steerlab.model import SteerableModel
from steerlab.vectors import SteeringVector

VectorLike = SteeringVector | torch.Tensor


@dataclass(frozen=True)
class PanelRequest:
    """Every input of one run, read off the controls when it was asked for."""

    request_id: int
    prompt: str
    vector: str
    layer: int
    hook: str  # a site kind, e.g. "hook_resid_pre"
    alpha: float
    positions: Positions
    temperature: float
    top_k: int  # 0 means no top-k cut
    top_p: float
    seed: int
    max_new_tokens: int

    @property
    def site(self) -> str:
        return f"blocks.{self.layer}.{self.hook}"

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "site": self.site}


def direction_at(vector: VectorLike, site: str) -> torch.Tensor:
    """The ``[d_model]`` tensor to add at ``site``.

    A tensor is used at whatever site is chosen. A ``SteeringVector`` gives its direction at
    ``site`` (scale included); one with a single site lends that direction to any site.

    >>> direction_at(torch.ones(3), "blocks.0.hook_resid_pre").tolist()
    [1.0, 1.0, 1.0]
    """
    if isinstance(vector, torch.Tensor):
        return vector
    if isinstance(vector, SteeringVector):
        if site in vector.directions:
            return vector[site]
        if len(vector.sites) == 1:
            return vector[vector.sites[0]]
        raise SteerError(f"This vector has no direction at {site}; it has {vector.sites}.")
    raise SteerError(
        f"A panel vector must be a SteeringVector or a torch.Tensor, not {type(vector).__name__}."
    )


def pair_steer(request: PanelRequest, vectors: Mapping[str, VectorLike]) -> Steer:
    """One steer with alphas ``[0, alpha]``: rows ``[baseline, steered]`` in one batch."""
    if request.vector not in vectors:
        raise SteerError(f"No vector named {request.vector!r}; the panel has {sorted(vectors)}.")
    direction = direction_at(vectors[request.vector], request.site)
    return Steer(request.site, direction, alpha=[0.0, request.alpha], positions=request.positions)


def stream_pair(
    lm: SteerableModel,
    request: PanelRequest,
    steer: Steer,
    is_current: Callable[[], bool],
) -> Iterator[tuple[list[str], Generation | None]]:
    """Yield ``([baseline, steered] texts so far, None)`` per token, then the final generation.

    Stops as soon as ``is_current()`` is false; the stream is closed on the way out, which
    takes its hooks off the model. Yields nothing more after a stop.
    """
    steps = lm.stream(
        request.prompt,
        steer,
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_k=request.top_k or None,
        top_p=request.top_p,
        seed=request.seed,
    )
    last = None
    try:
        for step in steps:
            if not is_current():
                return
            last = step
            yield step.text, None
    finally:
        close = getattr(steps, "close", None)  # a generator: closing it takes its hooks off
        if close is not None:
            close()
    if last is not None:
        yield last.text, last.result()


def norm_caches(
    lm: SteerableModel, request: PanelRequest, steer: Steer
) -> tuple[Activations, Activations]:
    """Residual-stream activations on the prompt without and with the steer (alpha ``alpha``)."""
    sites = [s for s in lm.sites() if ".hook_resid_" in s]
    single = Steer(steer.site, steer.vector, request.alpha, steer.positions, steer.op)
    return (
        lm.run_with_cache(request.prompt, sites),
        lm.run_with_cache(request.prompt, sites, steer=single),
    )
