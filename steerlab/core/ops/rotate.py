"""``Rotate``: angular steering, the activation turned inside a plane to a target angle."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from steerlab.core.errors import SteerError
from steerlab.core.ops.base import Bound, Form, Op, is_zero, unit, wide_dtype
from steerlab.core.scalars import as_int, as_real, flag


def _degrees(value: Any, what: str) -> float:
    """An angle in degrees reduced exactly into ``(-360, 360)``, its sign kept: an int by
    integer arithmetic (``10**400`` included), a float by ``math.fmod``, which is exact in
    float64. Turning by the reduced angle is turning by the given one; the unreduced one,
    in radians and then float32, would be its rounding error (``1e10``) or not finite
    (``1e300``).

    >>> _degrees(10**400, "angle"), _degrees(1e10, "angle"), _degrees(-450, "angle")
    (280.0, 280.0, -90.0)
    """
    whole = as_int(value)
    if whole is not None:
        return float(abs(whole) % 360 * (1 if whole >= 0 else -1))
    number = as_real(value)
    if number is None:
        raise SteerError(f"{what} must be a finite number of degrees; got {value!r:.60}.")
    return math.fmod(number, 360.0)


@dataclass(frozen=True, eq=False)
class Rotate(Op):
    """Turn the activation inside a plane to ``angle`` degrees (angular steering, Vu and
    Nguyen 2025), keeping its norm.

    The plane is spanned by ``b1``, the steer's unit direction, and ``b2``, the unit part of
    ``toward`` orthogonal to it. At a steered token, with ``φ`` the angle from ``b1`` of the
    activation's component in the plane, that component turns to ``φ + alpha·(angle − φ)``
    along the shorter arc, its length kept; the rest of the activation is untouched. So
    alpha 0 changes nothing, alpha 1 sets the target angle exactly, and ``|h|`` is kept.
    ``adaptive`` turns only tokens whose projection on ``b1`` is positive. Its table form is
    the ``rot`` term: the compiled step turns in the same plane. ``angle`` is kept reduced
    into ``(-360, 360)`` (exactly, ``_degrees``): ``Rotate(370)`` is ``Rotate(10)``.

    >>> h = torch.tensor([[2.0, 0.0, 1.0]])
    >>> turn = Rotate(90.0, toward=[0.0, 1.0, 0.0])
    >>> turn(h, torch.tensor([1.0, 0.0, 0.0]), torch.ones(1, 1)).round(decimals=4)
    tensor([[0., 2., 1.]])
    """

    name: ClassVar[str] = "rotate"
    directional: ClassVar[bool] = True
    angle: float
    toward: torch.Tensor
    adaptive: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "angle", _degrees(self.angle, "Rotate angle"))
        object.__setattr__(self, "adaptive", flag(self.adaptive, "Rotate adaptive"))
        if self.toward.ndim != 1 or is_zero(self.toward):
            raise SteerError("Rotate toward must be a non-zero 1-D vector [d_model].")

    def form(self) -> Form:
        return Form(rot=1.0, toward=unit(self.toward), angle=math.radians(self.angle),
                    adaptive=float(self.adaptive))  # fmt: skip

    def check(self, site: str, vector: torch.Tensor) -> None:
        if self.toward.shape[0] != vector.shape[0]:
            raise SteerError(f"Rotate toward has {self.toward.shape[0]} values; the steer's "
                             f"vector has {vector.shape[0]}.")  # fmt: skip
        if self._plane(vector.to(self.toward.device)) is None:
            raise SteerError("Rotate toward is parallel to the steer's direction: the two span "
                             "no plane to turn in. Give a second, independent direction.")  # fmt: skip

    def _plane(self, direction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(b1, b2)`` in float32 (at least), or None when ``toward`` lies along ``b1``."""
        kind = wide_dtype(direction.dtype)
        b1 = unit(direction.to(kind))
        toward = unit(self.on(direction.device)["toward"].to(kind))
        rest = across(toward, b1)
        if float(rest.norm()) < 1e-4:
            return None
        return b1, rest / rest.norm()

    def bound(self, direction: torch.Tensor) -> Bound:
        """The turn in the plane of ``direction`` and ``toward``, the plane made once."""
        plane = self._plane(direction)
        assert plane is not None, "Steer checks the plane when it is made"
        return lambda act, alpha: self._turn(act, *plane, alpha)

    def _turn(self, act: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor,
              alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        h = act.to(b1.dtype)
        x, y = h @ b1, h @ b2  # [n]: the component in the plane
        radius, phi = torch.hypot(x, y), torch.atan2(y, x)
        turn = torch.remainder(math.radians(self.angle) - phi + math.pi, 2 * math.pi) - math.pi
        to = phi + alpha[:, 0].to(h.dtype) * turn  # the shorter arc, alpha of the way
        new = (
            h
            + (radius * torch.cos(to) - x)[:, None] * b1
            + (radius * torch.sin(to) - y)[:, None] * b2
        )
        if self.adaptive:
            new = torch.where((x > 0)[:, None], new, h)
        return new.to(act.dtype)

    def __repr__(self) -> str:
        kind = ", adaptive" if self.adaptive else ""
        return f"Rotate(angle={self.angle:g}, toward[{self.toward.shape[0]}]{kind})"


def across(toward: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
    """The part of ``toward`` orthogonal to the unit ``b1``: a rotation plane's second axis
    before it is normalised (``Rotate`` and the table form's ``plane`` both use it)."""
    return toward - (toward @ b1) * b1
