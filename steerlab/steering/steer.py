"""``Steer``: one intervention, and where in the sequence it acts.

A ``Steer`` binds an operation to a site, a vector, strengths and positions. It is a
value: equal steers compare equal and hash alike, whatever tensor object holds the vector.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from steerlab.steering.ops import Add, Operation, SteerError, op_to_data

if TYPE_CHECKING:
    from steerlab.vectors.vector import SteeringVector

Positions = Literal["all", "prompt", "generated"] | int


def _as_alphas(alpha: Any) -> tuple[float, ...]:
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.flatten().tolist()
    if isinstance(alpha, (str, bytes, dict, set, bool)):
        raise SteerError(
            f"alpha must be a number or a list of numbers; got {type(alpha).__name__} {alpha!r}."
        )
    if isinstance(alpha, numbers.Real):
        values: tuple[float, ...] = (float(alpha),)
    else:
        try:
            items = list(alpha)
        except TypeError:
            raise SteerError(
                f"alpha must be a number or a list of numbers; got {alpha!r}."
            ) from None
        if not all(isinstance(a, numbers.Real) and not isinstance(a, bool) for a in items):
            raise SteerError(f"alpha must hold numbers only; got {items!r}.")
        values = tuple(float(a) for a in items)
    if not values:
        raise SteerError("alpha is empty: give a number or a non-empty list of numbers.")
    if not all(math.isfinite(a) for a in values):
        raise SteerError(f"alpha must be finite; got {list(values)}.")
    return values


def _check_positions(positions: Any) -> None:
    if isinstance(positions, bool) or not (
        positions in ("all", "prompt", "generated")
        or (isinstance(positions, int) and positions >= 0)
    ):
        raise SteerError(
            f"positions must be 'all', 'prompt', 'generated' or an int >= 0; got {positions!r}."
        )


def vector_fingerprint(vector: torch.Tensor) -> str:
    """A short content hash of a vector: equal values and dtype give equal fingerprints."""
    data = vector.detach().to("cpu").contiguous()
    digest = hashlib.sha256(str(data.dtype).encode())
    digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Steer:
    """One intervention: ``op`` applied at ``site`` with ``vector`` and strength ``alpha``.

    ``alpha`` may be a list: each prompt then runs once per alpha, in one batch.
    ``positions`` is ``"all"``, ``"prompt"`` (tokens a user or system supplied),
    ``"generated"`` (tokens the model produced), or an int k meaning every token from
    index k on, counted from each row's first real token.

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

        if not isinstance(site, str):
            raise SteerError(f"site must be a site name string; got {type(site).__name__}.")
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
        if not vector.is_floating_point():
            raise SteerError(f"vector must be floating point; got {vector.dtype}.")
        if not torch.isfinite(vector).all():
            raise SteerError("vector has NaN or inf values.")
        _check_positions(positions)
        op = Add() if op is None else op
        if not callable(op) or isinstance(op, type):
            raise SteerError(f"op must be an operation such as sl.Add(); got {op!r}.")
        if not isinstance(op, Add) and float(vector.norm()) == 0.0:
            raise SteerError(f"{type(op).__name__} needs a non-zero direction.")
        object.__setattr__(self, "site", site)
        object.__setattr__(self, "vector", vector.detach())
        object.__setattr__(self, "alpha", _as_alphas(alpha))
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "op", op)

    def _key(self) -> tuple[Any, ...]:
        return (self.site, vector_fingerprint(self.vector), self.alpha, self.positions, self.op)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Steer):
            return NotImplemented
        return (
            (self.site, self.alpha, self.positions, self.op)
            == (other.site, other.alpha, other.positions, other.op)
            and self.vector.dtype == other.vector.dtype
            and self.vector.shape == other.vector.shape
            and bool(torch.equal(self.vector.cpu(), other.vector.cpu()))
        )

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        alphas = self.alpha[0] if len(self.alpha) == 1 else list(self.alpha)
        return (
            f"Steer({self.site!r}, vector[{self.vector.shape[0]}] |v|={self.vector.norm():.3g}, "
            f"alpha={alphas}, positions={self.positions!r}, op={self.op!r})"
        )

    def steers(self) -> list[Steer]:
        return [self]

    def fingerprint(self) -> str:
        """What this steer does, minus its alphas, as a short hash (site, vector, op, positions).

        Custom operations have no data form; they fingerprint by identity.
        """
        try:
            op = repr(sorted(op_to_data(self.op).items()))
        except SteerError:
            op = f"custom:{id(self.op)}"
        text = f"{self.site}|{vector_fingerprint(self.vector)}|{self.positions}|{op}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def position_mask(
    positions: Positions,
    pos: torch.Tensor,  # [batch, seq]: index from the row's first real token, -1 on pads
    generated: torch.Tensor,  # [batch, seq] bool: the token was produced by the model
) -> torch.Tensor:  # [batch, seq] bool
    """Which tokens a steer touches. Pads are never steered."""
    real = pos >= 0
    if positions == "all":
        return real
    if positions == "prompt":
        return real & ~generated
    if positions == "generated":
        return real & generated
    return pos >= positions
