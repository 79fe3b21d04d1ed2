"""What a steer does to an activation: small typed operations that are also plain data.

An operation is a frozen dataclass with a ``name`` and numeric parameters, so it can cross
a process boundary as ``{"name": "clamp", "value": 2.0}`` (``to_data`` / ``op_from_data``).
``alpha`` is always a strength: 0 leaves the activation bit-identical, for every operation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

import torch


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

    name: ClassVar[str] = "add"

    def __call__(self, act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor):
        return act + alpha * direction


@dataclass(frozen=True)
class Ablate:
    """Remove ``alpha`` times the component along ``v`` (alpha 1 projects it out)."""

    name: ClassVar[str] = "ablate"

    def __call__(self, act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor):
        unit = direction / direction.norm()
        return act - alpha * (act @ unit)[:, None] * unit


@dataclass(frozen=True)
class Clamp:
    """Move the projection on ``v`` towards ``value`` (alpha 1 sets it exactly)."""

    name: ClassVar[str] = "clamp"
    value: float

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise SteerError(f"Clamp value must be a number; got {self.value!r}.")
        if not math.isfinite(self.value):
            raise SteerError(f"Clamp value must be finite; got {self.value!r}.")

    def __call__(self, act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor):
        unit = direction / direction.norm()
        return act + alpha * (self.value - act @ unit)[:, None] * unit


OPS: dict[str, type] = {op.name: op for op in (Add, Ablate, Clamp)}


def op_to_data(op: Operation) -> dict[str, Any]:
    """An operation as plain data; an operation steerlab does not know cannot be sent.

    >>> op_to_data(Clamp(2.0))
    {'name': 'clamp', 'value': 2.0}
    """
    name = getattr(op, "name", None)
    if not (isinstance(name, str) and OPS.get(name) is type(op)):
        raise SteerError(
            f"The operation {op!r} is a custom callable: it runs in-process, but an engine that "
            "takes steers as data (a server, vLLM) only knows Add, Ablate and Clamp."
        )
    return {"name": name, **asdict(op)}  # type: ignore[call-overload]


def op_from_data(data: dict[str, Any]) -> Operation:
    """The operation ``data`` names; unknown names and parameters are refused."""
    if not isinstance(data, dict) or data.get("name") not in OPS:
        raise SteerError(f"op must name one of {sorted(OPS)}; got {data!r}.")
    params = {k: v for k, v in data.items() if k != "name"}
    try:
        return OPS[data["name"]](**params)
    except TypeError as err:
        raise SteerError(f"Bad parameters for op {data['name']!r}: {params!r}.") from err
