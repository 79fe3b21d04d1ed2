"""What a steer does to an activation: small typed operations that are also plain data.

An operation is a frozen dataclass with a ``name`` and numeric parameters, so it can cross
a process boundary as ``{"name": "clamp", "value": 2.0}`` (``to_data`` / ``op_from_data``).
``alpha`` is always a strength: 0 leaves the activation bit-identical, for every operation.

Every built-in operation is one class here, and nothing else: subclassing ``Op`` registers
its data form, and its ``form()`` (add the vector, or move the projection on the unit
direction into ``[low, high]``) is what table-driven engines (the compiled step, vLLM's
fused layouts) read, so a new operation runs on every engine without engine code.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

import torch

from steerlab.core.errors import SteerError

__all__ = ["OPS", "Ablate", "Add", "Cap", "Clamp", "Form", "Op", "Operation", "SteerError"]


class Operation(Protocol):
    """Any callable of this shape steers in-process; ``Op`` subclasses also travel as data."""

    def __call__(
        self,
        act: torch.Tensor,  # [n, d_model], the rows and positions being steered
        direction: torch.Tensor,  # [d_model]
        alpha: torch.Tensor,  # [n, 1]
    ) -> torch.Tensor: ...


class Form(NamedTuple):
    """An operation as table data: ``act + add·α·v + (1 - add)·α·(clip(a, low, high) - a)·u``.

    ``a = act · u`` is the projection on the unit direction ``u``. Add sets ``add``; the
    projection operations leave it off and say where the projection goes.
    """

    add: bool
    low: float
    high: float


OPS: dict[str, type[Op]] = {}


def unit(direction: torch.Tensor) -> torch.Tensor:
    """``direction / |direction|``, computed in float32 (at least) after scaling by the
    largest entry, so that norms near float32's limits (1e±20 and beyond) neither overflow
    nor underflow; returned in ``direction``'s dtype.

    >>> unit(torch.tensor([3e20, 4e20])).tolist()
    [0.6000000238418579, 0.800000011920929]
    """
    wide = direction.to(torch.promote_types(direction.dtype, torch.float32))
    peak = wide.abs().amax()
    scaled = wide / peak
    return (scaled / scaled.norm()).to(direction.dtype)


def project(act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor,
            low: float, high: float) -> torch.Tensor:  # fmt: skip
    """Move each row's projection on ``direction`` ``alpha`` of the way into ``[low, high]``."""
    u = unit(direction)
    along = act @ u  # [n]
    return act + alpha * (along.clamp(low, high) - along)[:, None] * u


@dataclass(frozen=True)
class Op:
    """Base of steerlab's operations: subclassing registers the name for ``op_from_data``."""

    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        OPS[cls.name] = cls

    def form(self) -> Form:
        raise NotImplementedError

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        add, low, high = self.form()
        if add:
            return act + alpha * direction
        return project(act, direction, alpha, low, high)

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


def _number(value: Any, what: str, *, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SteerError(f"{what} must be a number; got {value!r}.")
    if finite and not math.isfinite(value):
        raise SteerError(f"{what} must be finite; got {value!r}.")
    return float(value)


@dataclass(frozen=True)
class Add(Op):
    """``act + alpha * v``: activation addition (ActAdd / CAA)."""

    name: ClassVar[str] = "add"

    def form(self) -> Form:
        return Form(True, -math.inf, math.inf)


@dataclass(frozen=True)
class Ablate(Op):
    """Remove ``alpha`` times the component along ``v`` (alpha 1 projects it out)."""

    name: ClassVar[str] = "ablate"

    def form(self) -> Form:
        return Form(False, 0.0, 0.0)


@dataclass(frozen=True)
class Clamp(Op):
    """Move the projection on ``v`` towards ``value`` (alpha 1 sets it exactly)."""

    name: ClassVar[str] = "clamp"
    value: float

    def __post_init__(self) -> None:
        _number(self.value, "Clamp value")

    def form(self) -> Form:
        return Form(False, float(self.value), float(self.value))


@dataclass(frozen=True)
class Cap(Op):
    """Cap the projection on ``v`` into ``[low, high]`` (either bound may be None).

    Projection capping, as in the persona-vector and "assistant axis" work: the component
    along the unit direction is clipped into the range, and alpha scales the correction
    (alpha 1 clips exactly; a projection already inside the range is left alone).

    >>> Cap(high=2.0)(torch.tensor([[3.0, 1.0]]), torch.tensor([1.0, 0.0]), torch.ones(1, 1))
    tensor([[2., 1.]])
    """

    name: ClassVar[str] = "cap"
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        low = None if self.low is None else _number(self.low, "Cap low")
        high = None if self.high is None else _number(self.high, "Cap high")
        if low is None and high is None:
            raise SteerError("Cap needs a low bound, a high bound, or both.")
        if low is not None and high is not None and low > high:
            raise SteerError(f"Cap low ({low}) is above high ({high}).")

    def form(self) -> Form:
        low = -math.inf if self.low is None else float(self.low)
        high = math.inf if self.high is None else float(self.high)
        return Form(False, low, high)


def op_to_data(op: Operation) -> dict[str, Any]:
    """An operation as plain data; an operation steerlab does not know cannot be sent.

    >>> op_to_data(Clamp(2.0))
    {'name': 'clamp', 'value': 2.0}
    """
    if not (isinstance(op, Op) and OPS.get(op.name) is type(op)):
        raise SteerError(
            f"The operation {op!r} is a custom callable: it runs in-process, but an engine that "
            f"takes steers as data (a server, vLLM, the compiled step) only knows {sorted(OPS)}."
        )
    return op.to_data()


def op_from_data(data: dict[str, Any] | str) -> Op:
    """The operation ``data`` names (a name alone for one without parameters); unknown
    names and parameters are refused.

    >>> op_from_data({"name": "cap", "high": 1.5})
    Cap(low=None, high=1.5)
    """
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, dict) or data.get("name") not in OPS:
        raise SteerError(f"op must name one of {sorted(OPS)}; got {data!r}.")
    params = {k: v for k, v in data.items() if k != "name"}
    try:
        return OPS[data["name"]](**params)
    except TypeError as err:
        raise SteerError(f"Bad parameters for op {data['name']!r}: {params!r}.") from err


def form_of(op: Operation) -> Form | None:
    """An operation's table form, or None for a custom callable (it runs eagerly)."""
    return op.form() if isinstance(op, Op) and OPS.get(op.name) is type(op) else None
