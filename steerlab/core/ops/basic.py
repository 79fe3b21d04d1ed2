"""The four operations on one direction: ``Add``, ``Ablate``, ``Clamp`` and ``Cap``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from steerlab.core.errors import SteerError
from steerlab.core.ops.base import Form, Op, _number


@dataclass(frozen=True, eq=False)
class Add(Op):
    """``act + alpha * v``: activation addition (ActAdd / CAA)."""

    name: ClassVar[str] = "add"

    def form(self) -> Form:
        return Form(add=1.0)


@dataclass(frozen=True, eq=False)
class Ablate(Op):
    """Remove ``alpha`` times the component along ``v`` (alpha 1 projects it out)."""

    name: ClassVar[str] = "ablate"
    directional: ClassVar[bool] = True

    def form(self) -> Form:
        return Form(proj=1.0)


@dataclass(frozen=True, eq=False)
class Clamp(Op):
    """Move the projection on ``v`` towards ``value`` (alpha 1 sets it exactly)."""

    name: ClassVar[str] = "clamp"
    directional: ClassVar[bool] = True
    value: float

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "value", _number(self.value, "Clamp value"))

    def form(self) -> Form:
        return Form(proj=1.0, low=float(self.value), high=float(self.value))


@dataclass(frozen=True, eq=False)
class Cap(Op):
    """Cap the projection on ``v`` into ``[low, high]`` (either bound may be None).

    Projection capping, as in the persona-vector and "assistant axis" work: the component
    along the unit direction is clipped into the range, and alpha scales the correction
    (alpha 1 clips exactly; a projection already inside the range is left alone).

    >>> Cap(high=2.0)(torch.tensor([[3.0, 1.0]]), torch.tensor([1.0, 0.0]), torch.ones(1, 1))
    tensor([[2., 1.]])
    """

    name: ClassVar[str] = "cap"
    directional: ClassVar[bool] = True
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        low = None if self.low is None else _number(self.low, "Cap low")
        high = None if self.high is None else _number(self.high, "Cap high")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        if low is None and high is None:
            raise SteerError("Cap needs a low bound, a high bound, or both.")
        if low is not None and high is not None and low > high:
            raise SteerError(f"Cap low ({low}) is above high ({high}).")

    def form(self) -> Form:
        low = -math.inf if self.low is None else float(self.low)
        high = math.inf if self.high is None else float(self.high)
        return Form(proj=1.0, low=low, high=high)
