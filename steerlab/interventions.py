"""What a steer does to an activation, and where in the sequence it does it.

An operation is a small typed callable (``Add``, ``Ablate``, ``Clamp``); a
``Steer`` binds one to a site, a vector, strengths and positions. ``alpha`` is
always a strength: 0 leaves the activation bit-identical, for every operation.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import torch

if TYPE_CHECKING:
    from steerlab.vectors.vector import SteeringVector

Positions = Literal["all", "prompt", "generated"] | int


class SteerError(ValueError):
    """A steer that cannot be applied to this model or input."""


class Operation(Protocol):
    def __call__(
        self,
        act: torch.Tensor,  # [n, d_model], the rows and positions being steered
        direction: torch.Tensor,  # [d_model]
        alpha: torch.Tensor,  # [n, 1]
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class Add:
    """``act + alpha * v``: activation addition (ActAdd / CAA)."""

    def __call__(self, act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor):
        return act + alpha * direction


@dataclass(frozen=True)
class Ablate:
    """Remove ``alpha`` times the component along ``v`` (alpha 1 projects it out)."""

    def __call__(self, act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor):
        unit = direction / direction.norm()
        return act - alpha * (act @ unit)[:, None] * unit


@dataclass(frozen=True)
class Clamp:
    """Move the projection on ``v`` towards ``value`` (alpha 1 sets it exactly)."""

    value: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise SteerError(f"Clamp value must be finite; got {self.value!r}.")

    def __call__(self, act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor):
        unit = direction / direction.norm()
        return act + alpha * (self.value - act @ unit)[:, None] * unit


def _as_alphas(alpha: float | Sequence[float] | torch.Tensor) -> tuple[float, ...]:
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.flatten().tolist()
    if isinstance(alpha, numbers.Real):
        values: tuple[float, ...] = (float(alpha),)
    else:
        values = tuple(float(a) for a in alpha)  # type: ignore[union-attr]
    if not values:
        raise SteerError("alpha is empty: give a number or a non-empty list of numbers.")
    if not all(math.isfinite(a) for a in values):
        raise SteerError(f"alpha must be finite; got {list(values)}.")
    return values


@dataclass(frozen=True)
class Steer:
    """One intervention: ``op`` applied at ``site`` with ``vector`` and strength ``alpha``.

    ``alpha`` may be a list: each prompt then runs once per alpha, in one batch.
    ``positions`` is ``"all"``, ``"prompt"``, ``"generated"``, or an int k meaning
    every token from index k on, counted from each row's first real token.

    >>> steer = Steer("blocks.2.hook_resid_pre", torch.ones(128), alpha=[0.0, 4.0])
    """

    site: str
    vector: torch.Tensor
    alpha: tuple[float, ...] = field(default=(1.0,))
    positions: Positions = "all"
    op: Operation = field(default_factory=Add)

    def __init__(
        self,
        site: str,
        vector: torch.Tensor | SteeringVector,
        alpha: float | Sequence[float] | torch.Tensor = 1.0,
        positions: Positions = "all",
        op: Operation | None = None,
    ) -> None:
        from steerlab.vectors.vector import SteeringVector  # here: vectors imports this module

        if isinstance(vector, SteeringVector):  # its direction at site; its scale joins alpha
            alpha = [vector.scale * a for a in _as_alphas(alpha)]
            vector = vector.direction_at(site)
        if not isinstance(vector, torch.Tensor):
            raise SteerError(
                f"vector must be a torch.Tensor or a SteeringVector, got {type(vector).__name__}"
                " (for a numpy array: torch.as_tensor(array, dtype=torch.float32))."
            )
        if vector.ndim != 1:
            raise SteerError(f"vector must be 1-D [d_model]; got shape {tuple(vector.shape)}.")
        if not torch.isfinite(vector).all():
            raise SteerError("vector has NaN or inf values.")
        if isinstance(positions, bool) or not (
            positions in ("all", "prompt", "generated")
            or (isinstance(positions, int) and positions >= 0)
        ):
            raise SteerError(
                f"positions must be 'all', 'prompt', 'generated' or an int >= 0; got {positions!r}."
            )
        op = op or Add()
        if not isinstance(op, Add) and float(vector.norm()) == 0.0:
            raise SteerError(f"{type(op).__name__} needs a non-zero direction.")
        object.__setattr__(self, "site", site)
        object.__setattr__(self, "vector", vector.detach())
        object.__setattr__(self, "alpha", _as_alphas(alpha))
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "op", op)

    def __repr__(self) -> str:
        alphas = self.alpha[0] if len(self.alpha) == 1 else list(self.alpha)
        return (
            f"Steer({self.site!r}, vector[{self.vector.shape[0]}] |v|={self.vector.norm():.3g}, "
            f"alpha={alphas}, positions={self.positions!r}, op={self.op!r})"
        )

    def steers(self) -> list[Steer]:
        return [self]


def position_mask(
    positions: Positions,
    pos: torch.Tensor,  # [batch, seq]: index from the row's first real token, -1 on pads
    prompt_len: torch.Tensor,  # [batch]
) -> torch.Tensor:  # [batch, seq] bool
    """Which tokens a steer touches. Pads are never steered."""
    real = pos >= 0
    if positions == "all":
        return real
    if positions == "prompt":
        return real & (pos < prompt_len[:, None])
    if positions == "generated":
        return pos >= prompt_len[:, None]
    return pos >= positions
