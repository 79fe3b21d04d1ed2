"""``Steer``: one intervention, and where in the sequence it acts.

A ``Steer`` binds an operation to a site, a vector, strengths and positions. It is a
value: equal steers compare equal and hash alike, whatever tensor object holds the vector.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal, Protocol

import torch

from steerlab.core.errors import ModelMismatchWarning, user_stacklevel
from steerlab.core.ops import Add, Op, Operation, SteerError, op_to_data, tensor_fingerprint
from steerlab.core.sites import resolve

Positions = Literal["all", "prompt", "generated"] | int


def _as_alphas(alpha: Any) -> tuple[float, ...]:
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.flatten().tolist()
    if isinstance(alpha, (str, bytes, dict, set, bool)):
        raise SteerError(
            f"alpha must be a number or a list of numbers; got {type(alpha).__name__} {alpha!r}."
        )
    if isinstance(alpha, numbers.Real):
        items = [alpha]
    else:
        try:
            items = list(alpha)
        except TypeError:
            raise SteerError(
                f"alpha must be a number or a list of numbers; got {alpha!r}."
            ) from None
        if not all(isinstance(a, numbers.Real) and not isinstance(a, bool) for a in items):
            raise SteerError(f"alpha must hold numbers only; got {items!r}.")
    if not items:
        raise SteerError("alpha is empty: give a number or a non-empty list of numbers.")
    try:
        values = tuple(float(a) for a in items)
    except OverflowError:
        raise SteerError(f"alpha is too large for a float: {items!r:.80}.") from None
    if not all(math.isfinite(a) for a in values):
        raise SteerError(f"alpha must be finite; got {list(values)}.")
    return values


def _as_positions(positions: Any) -> Positions:
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        positions = int(positions)  # numpy integers are ints too
    if isinstance(positions, bool) or not (
        positions in ("all", "prompt", "generated")
        or (isinstance(positions, int) and positions >= 0)
    ):
        raise SteerError(
            f"positions must be 'all', 'prompt', 'generated' or an int >= 0; got {positions!r}."
        )
    return positions


def _as_vector(vector: torch.Tensor) -> torch.Tensor:
    """A steering vector as a dense, finite, 1-D float tensor; refused otherwise, by name."""
    if vector.layout != torch.strided:
        raise SteerError(f"vector must be a dense tensor; got layout {vector.layout}: .to_dense().")
    if vector.device.type == "meta":
        raise SteerError("vector is on the meta device: it has no values to steer with.")
    if vector.ndim != 1:
        raise SteerError(f"vector must be 1-D [d_model]; got shape {tuple(vector.shape)}.")
    if vector.dtype == torch.bool or vector.is_complex():
        raise SteerError(f"vector must hold real numbers; got {vector.dtype}.")
    if not vector.is_floating_point():
        vector = vector.to(torch.float32)  # an integer vector steers as its float32 value
    elif vector.dtype.itemsize == 1:
        raise SteerError(
            f"vector has dtype {vector.dtype}, which no model computes in: use .float()."
        )
    if not torch.isfinite(vector).all():
        raise SteerError("vector has NaN or inf values.")
    return vector.detach()


# A vector's content key is the tensor rule of ``core.ops``: one hash for every tensor that
# travels (vectors and an operation's own tensors alike).
vector_fingerprint = tensor_fingerprint


class DirectionSource(Protocol):
    """A vector with a direction per site and a scale, such as a ``SteeringVector``."""

    @property
    def scale(self) -> float: ...

    def direction_at(self, site: str) -> torch.Tensor: ...


def direction_of(vector: torch.Tensor | DirectionSource, site: str) -> tuple[torch.Tensor, float]:
    """The one rule from a vector to a steer: ``(direction at site, scale)``.

    A ``SteeringVector``'s scale always goes to alpha and never into the direction, so an
    Ablate, Clamp or Cap sees the same direction whatever the vector's scale; a tensor has
    scale 1.
    """
    if isinstance(vector, torch.Tensor):
        return vector, 1.0
    if hasattr(vector, "direction_at") and hasattr(vector, "scale"):
        return vector.direction_at(site), float(vector.scale)
    raise SteerError(
        f"vector must be a torch.Tensor or a SteeringVector, got {type(vector).__name__}"
        " (for a numpy array: torch.as_tensor(array, dtype=torch.float32))."
    )


def source_model(vector: object) -> str:
    """The model a vector or feature was made on, from its provenance ("" when unknown)."""
    return str(getattr(getattr(vector, "provenance", None), "model", "") or "")


def same_model(a: str, b: str, *, aliases: Sequence[str] = ("-small", "-base")) -> bool:
    """Loose match of model names: one path's last part contains the other's (either empty: True).

    >>> same_model("gpt2-small", "gpt2"), same_model("steerlab-tiny", "/x/steerlab-tiny")
    (True, True)
    """
    x, y = (PurePath(name).name.lower() for name in (a, b))
    if not x or not y:
        return True
    for alias in aliases:
        x, y = x.removesuffix(alias), y.removesuffix(alias)
    return x in y or y in x


def warn_other_model(steer: Steer, model: str) -> None:
    """Warn when ``steer``'s direction was made on another model than ``model``: same width
    perhaps, but a direction in one model's residual stream means nothing in another's."""
    if not same_model(steer.made_for, model):
        warnings.warn(
            f"The steer at {steer.site} was made on {steer.made_for!r}; this model is "
            f"{model!r}. A direction from one model's residual stream means nothing in another's.",
            ModelMismatchWarning,
            stacklevel=user_stacklevel(),
        )


def check_steer(site: str, vector: torch.Tensor, sites: Sequence[str], d_model: int) -> None:
    """The one check of a steer against a model: a site it has, a vector of its width.

    Raises:
        SiteError: the model has no such site (naming the closest ones).
        SteerError: the vector's length is not the model's ``d_model``.
    """
    resolve(site, list(sites))
    if vector.shape[0] != d_model:
        raise SteerError(
            f"Vector for {site} has size {vector.shape[0]}, but this model has d_model={d_model}."
        )


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
    made_for: str = ""  # the model the direction was made on, when its source says

    def __init__(
        self,
        site: str,
        vector: torch.Tensor | DirectionSource,
        alpha: float | Sequence[float] | torch.Tensor = 1.0,
        positions: Positions = "all",
        op: Operation | None = None,
        *,
        made_for: str | None = None,
    ) -> None:
        """``made_for`` names the model the direction was made on; by default the vector's
        provenance says (``dataclasses.replace`` passes it on)."""
        if not isinstance(site, str):
            raise SteerError(f"site must be a site name string; got {type(site).__name__}.")
        source = source_model(vector) if made_for is None else str(made_for)
        vector, scale = direction_of(vector, site)
        alphas = _as_alphas(alpha)
        if scale != 1.0:
            alphas = _as_alphas([scale * a for a in alphas])
        vector = _as_vector(vector)
        positions = _as_positions(positions)
        op = Add() if op is None else op
        if not callable(op) or isinstance(op, type):
            raise SteerError(f"op must be an operation such as sl.Add(); got {op!r}.")
        if not isinstance(op, Add) and float(vector.float().abs().amax()) == 0.0:
            raise SteerError(f"{type(op).__name__} needs a non-zero direction.")
        if isinstance(op, Op):
            op.check_width(vector.shape[0])
        object.__setattr__(self, "site", site)
        object.__setattr__(self, "vector", vector)
        object.__setattr__(self, "alpha", alphas)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "made_for", source)

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

    def to_data(self, *, vector_key: str | None = None) -> dict[str, Any]:
        """This steer in the wire format (``steer_data``), every alpha included."""
        return steer_data(self.site, self.vector, list(self.alpha), self.positions, self.op,
                          vector_key=vector_key)  # fmt: skip

    def fingerprint(self) -> str:
        """What this steer does, minus its alphas, as a short hash (site, vector, op, positions).

        Custom operations have no data form; they fingerprint by identity.
        """
        try:
            op = repr(sorted(op_to_data(self.op, tensor_fingerprint).items()))
        except SteerError:
            op = f"custom:{id(self.op)}"
        text = f"{self.site}|{vector_fingerprint(self.vector)}|{self.positions}|{op}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def at_alphas(steers: Sequence[Steer], alphas: Sequence[float]) -> list[Steer]:
    """The steers with each alpha in ``alphas`` multiplying their own: one row per alpha.

    This is what an alpha means for a steer that already has one (``vector.steers(a)``
    multiplies the vector's scale the same way). A steer with a list of alphas is refused.

    >>> [s.alpha for s in at_alphas([Steer("s", torch.ones(2), 2.0)], [0, 3])]
    [(0.0, 6.0)]
    """
    out = []
    for s in steers:
        if len(s.alpha) != 1:
            raise SteerError(f"{s!r} already carries a list of alphas; give it one alpha "
                             "(or none) and pass the list on its own.")  # fmt: skip
        scaled = Steer(s.site, s.vector, [s.alpha[0] * float(a) for a in alphas], s.positions,
                       s.op)  # fmt: skip
        object.__setattr__(scaled, "made_for", s.made_for)
        out.append(scaled)
    return out


def position_form(positions: Positions) -> tuple[bool, bool, int]:
    """A positions rule as data: ``(on prompt tokens, on generated tokens, from index)``.

    >>> position_form("generated"), position_form(5)
    ((False, True, 0), (True, True, 5))
    """
    if positions == "all":
        return True, True, 0
    if positions == "prompt":
        return True, False, 0
    if positions == "generated":
        return False, True, 0
    return True, True, int(positions)


def touched(on_prompt: Any, on_generated: Any, from_pos: Any, pos: Any, generated: Any) -> Any:
    """Which tokens a positions rule in its data form touches. Pads (``pos < 0``) never.

    Elementwise over torch tensors or numpy arrays alike (the compiled step passes
    per-row tensors, vLLM's worker numpy arrays), so every engine shares this one rule.
    """
    kind = (generated & on_generated) | (~generated & on_prompt)
    return (pos >= 0) & (pos >= from_pos) & kind


def position_mask(
    positions: Positions,
    pos: Any,  # [batch, seq]: index from the row's first real token, -1 on pads
    generated: Any,  # [batch, seq] bool: the token was produced by the model
) -> Any:  # [batch, seq] bool
    """Which tokens a steer touches: THE position rule, for every engine.

    ``"all"`` every real token, ``"prompt"`` tokens not produced by the model,
    ``"generated"`` tokens it produced, an int ``k`` tokens from index ``k`` on. Pads are
    never steered. Works on torch tensors and numpy arrays.

    >>> position_mask(2, torch.tensor([[-1, 0, 1, 2, 3]]), torch.zeros(1, 5, dtype=torch.bool))
    tensor([[False, False, False,  True,  True]])
    """
    return touched(*position_form(positions), pos, generated)


def steer_data(site: str, vector: torch.Tensor, alpha: float | list[float], positions: Positions,
               op: Operation, *, vector_key: str | None = None) -> dict[str, Any]:  # fmt: skip
    """THE wire format of a steer, for the server's clients and vLLM's workers alike.

    ``{"site", "vector", "alpha", "positions", "op"}``: the vector as floats, or as
    ``vector_key`` where vectors travel once by key; the op as ``op_to_data`` gives it
    (a custom callable is refused, with why), its tensors (a ``FeatureClamp``'s encoder)
    as floats or, with ``vector_key``, by ``tensor_fingerprint`` too.

    >>> steer_data("blocks.0.hook_resid_pre", torch.ones(2), 4.0, "all", Add())["op"]
    {'name': 'add'}
    """
    values: Any = vector_key if vector_key is not None else vector.float().tolist()
    by_key = tensor_fingerprint if vector_key is not None else None  # op tensors travel alike
    return {"site": site, "vector": values, "alpha": alpha, "positions": positions,
            "op": op_to_data(op, by_key)}  # fmt: skip
