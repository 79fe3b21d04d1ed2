"""What one panel run computes, as plain functions of a ``PanelRequest`` (no widgets here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from steerlab.core import Positions, Steer, SteerError
from steerlab.core.results import Generation
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


def check_vector(name: str, vector: object) -> None:
    """Raise ``SteerError`` unless ``vector`` can be offered in a panel under ``name``.

    Its size is checked when it is used, so that a wrong one shows inside the panel.

    >>> check_vector("v", [1.0, 2.0])
    Traceback (most recent call last):
    ...
    steerlab.core.errors.SteerError: Vector 'v' must be a SteeringVector or a 1-D torch.Tensor, not list.
    """
    if not isinstance(name, str) or not name:
        raise SteerError(f"A vector's name must be a non-empty string; got {name!r}.")
    if isinstance(vector, SteeringVector):
        return
    if not isinstance(vector, torch.Tensor) or vector.ndim != 1:
        shape = f" of shape {tuple(vector.shape)}" if isinstance(vector, torch.Tensor) else ""
        raise SteerError(
            f"Vector {name!r} must be a SteeringVector or a 1-D torch.Tensor, "
            f"not {type(vector).__name__}{shape}."
        )


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


QUEUE_S = 60.0  # a panel run queues this long behind another call on the model, then fails


def stream_pair(
    lm: SteerableModel,
    request: PanelRequest,
    steer: Steer,
    is_current: Callable[[], bool],
    capture: Sequence[str] = (),
) -> Iterator[tuple[list[str], Generation | None]]:
    """Yield ``([baseline, steered] texts so far, None)`` per token, then the final generation.

    Stops as soon as ``is_current()`` is false; the stream is closed on the way out, which
    takes its hooks off the model. Yields nothing more after a stop. ``capture`` names sites
    whose activations the final generation keeps, over the prompt and the new tokens.
    """
    steps = lm.stream(
        request.prompt,
        steer,
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_k=request.top_k or None,
        top_p=request.top_p,
        seed=request.seed,
        capture=capture,
        wait=QUEUE_S,
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
