"""``Steer``: one intervention, and where in the sequence it acts.

A ``Steer`` binds an operation to a site, a vector, strengths and positions. It is a
value: equal steers compare equal and hash alike, whatever tensor object holds the vector.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from steerlab.core.directions import DirectionSource, direction_of
from steerlab.core.errors import ModelMismatchWarning, user_stacklevel
from steerlab.core.identity import ModelId, model_id
from steerlab.core.ops import (
    Add,
    Op,
    Operation,
    SteerError,
    is_zero,
    op_from_data,
    op_to_data,
    tensor_fingerprint,
)
from steerlab.core.positions import (
    Positions,
    _as_positions,
    touches_prompt,
)
from steerlab.core.reads import Gate, as_gate, check_gate_order, gate_from_data
from steerlab.core.scalars import without_noise
from steerlab.core.sites import resolve


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


def steers_at(
    source: torch.Tensor | DirectionSource,
    site: str | None,
    alpha: float | Sequence[float] = 1.0,
    positions: Positions = "all",
    op: Operation | None = None,
    *,
    lend: bool = True,
    when: Gate | None = None,
) -> list[Steer]:
    """THE rule from a vector to steers, for every caller (vectors, the server, the panel).

    ``site`` None steers at every site the source has; a site it has uses that direction;
    with ``lend``, a source with one site lends its direction to any other site. A
    ``SteeringVector``'s scale joins ``alpha`` (``direction_of``); a tensor needs a site.
    ``when`` conditions every steer made.

    >>> v = torch.ones(2)
    >>> [s.site for s in steers_at(v, "blocks.0.hook_resid_pre")]
    ['blocks.0.hook_resid_pre']
    """
    if isinstance(source, torch.Tensor):
        if site is None:
            raise SteerError("A plain tensor has no site of its own: give the site to steer at.")
        return [Steer(site, source, alpha, positions, op, when=when)]
    sites = list(source.sites)
    if site is None:
        return [Steer(s, source, alpha, positions, op, when=when) for s in sites]
    if site not in sites:
        if not (lend and len(sites) == 1):
            raise SteerError(f"This vector has no direction at {site}; it has {sites}.")
        direction, scale = direction_of(source, sites[0])
        steer = Steer(site, direction, [without_noise(scale * a) for a in _as_alphas(alpha)],
                      positions, op,
                      made_for=_made_for(source), when=when)  # fmt: skip
        return [steer]
    return [Steer(site, source, alpha, positions, op, when=when)]


def _made_for(vector: object) -> ModelId:
    """The model a vector, feature or operation was made on: its own ``made_for`` (a
    ``ModelId``, as a ``LoReFT`` reads from its provenance), else its provenance's model;
    empty when unknown. ``warn_other_model`` compares it with the model steered."""
    own = getattr(vector, "made_for", None)
    if isinstance(own, ModelId):
        return own
    provenance = getattr(vector, "provenance", None)
    return ModelId(str(getattr(provenance, "model", "") or ""),
                   str(getattr(provenance, "model_config_sha256", "") or ""))  # fmt: skip


def _as_model_id(made_for: object) -> ModelId:
    if not isinstance(made_for, (ModelId, str)):
        raise SteerError(f"made_for must be a model name or a ModelId; got {made_for!r:.60}.")
    return model_id(made_for)


def warn_other_model(steer: Steer, model: object) -> None:
    """Warn when ``steer``'s direction was made on another model than ``model`` (a model, a
    ``ModelId`` or a name): same width perhaps, but a direction in one model's residual
    stream means nothing in another's (``warn_made_elsewhere``)."""
    warn_made_elsewhere(steer.made_for, model, f"The steer at {steer.site}")


def warn_made_elsewhere(made_for: ModelId, model: object, subject: str, *, verb: str = "made",
                        category: type[Warning] = ModelMismatchWarning) -> None:  # fmt: skip
    """THE check for anything made on one model and used on another (a vector, a trained
    LoReFT, an SAE): warn when ``made_for`` and ``model`` differ, saying what differs (the
    names, or, for one name, the configs: ``ModelId.difference``); nothing where unknown.

    The warning points at the user's line, however deep in steerlab the check ran.

    >>> warn_made_elsewhere(ModelId("steerlab-tiny"), "steerlab-tiny", "This vector")
    """
    this = model_id(model)
    difference = made_for.difference(this)
    if difference is not None:
        warnings.warn(
            f"{subject} was {verb} on {made_for.name!r}; this model is {this.name!r}: "
            f"{difference}. What one model learned or measured means nothing in another's "
            "activations.",
            category,
            stacklevel=user_stacklevel(),
        )


def check_steer(site: str, vector: torch.Tensor, sites: Sequence[str], d_model: int,
                when: Gate | None = None, positions: Positions = "all") -> None:  # fmt: skip
    """The one check of a steer against a model: a site it has, a vector of its width, and
    a condition (``when``) whose every part reads a site it has, at its width, decided
    before the steer acts on ``positions`` (``check_gate_order``). Existence comes first:
    a site the model lacks is named as such, not as out of order.

    Raises:
        SiteError: the model has no such site (naming the closest ones).
        SteerError: the vector's length is not the model's ``d_model``, or the condition
            would be decided after the steer acts.
    """
    resolve(site, list(sites))
    if vector.shape[0] != d_model:
        raise SteerError(
            f"Vector for {site} has size {vector.shape[0]}, but this model has d_model={d_model}."
        )
    if when is None:
        return
    for condition in when.leaves():
        condition.check(sites, d_model)
    check_gate_order(when, site, touches_prompt=touches_prompt(positions))


class SteerKey(NamedTuple):
    """A steer less its alpha: what the rows sharing one steer have in common, and what
    every engine's plan groups them by. ``vector`` is the tensor in-process (compared, like
    any tensor in a key, by identity) or its content key where tensors travel by key (vLLM's
    workers)."""

    site: str
    vector: torch.Tensor | str
    positions: Positions
    op: Operation
    gate: Gate | None


@dataclass(frozen=True, eq=False)
class Steer:
    """One intervention: ``op`` applied at ``site`` with ``vector`` and strength ``alpha``.

    ``alpha`` may be a list: each prompt then runs once per alpha, in one batch.
    ``positions`` is ``"all"``, ``"prompt"`` (tokens a user or system supplied),
    ``"generated"`` (tokens the model produced), an int k meaning every token from
    index k on, counted from each row's first real token, or a span of each row's prompt:
    ``"first:k"``, ``"last:k"`` or ``"first:k+last:k"`` (``position_mask``).

    >>> steer = Steer("blocks.2.hook_resid_pre", torch.ones(128), alpha=[0.0, 4.0])
    """

    site: str
    vector: torch.Tensor
    alpha: tuple[float, ...] = field(default=(1.0,))
    positions: Positions = "all"
    op: Operation = field(default_factory=Add)
    made_for: ModelId = field(default_factory=ModelId)  # the model the direction was made on
    when: Gate | None = None  # steer only the rows (or positions) where this gate fires

    def __init__(
        self,
        site: str,
        vector: torch.Tensor | DirectionSource,
        alpha: float | Sequence[float] | torch.Tensor = 1.0,
        positions: Positions = "all",
        op: Operation | None = None,
        when: Gate | None = None,
        *,
        made_for: ModelId | str | None = None,
    ) -> None:
        """``made_for`` names the model the direction was made on; by default the vector's
        provenance says (``dataclasses.replace`` passes it on). ``when`` is a condition
        (``sl.Condition``, ``sl.any_of``, ``sl.all_of``): the steer acts only on rows whose
        prompt fires it (or, with ``read="token"``, only at positions that do)."""
        if not isinstance(site, str):
            raise SteerError(f"site must be a site name string; got {type(site).__name__}.")
        source = _made_for(vector) if made_for is None else _as_model_id(made_for)
        if made_for is None and not source.name:  # an op trained on a model says which
            source = _made_for(op)
        vector, scale = direction_of(vector, site)
        alphas = _as_alphas(alpha)
        if scale != 1.0:
            alphas = _as_alphas([without_noise(scale * a) for a in alphas])
        vector = _as_vector(vector)
        positions = _as_positions(positions)
        op = Add() if op is None else op
        if not callable(op) or isinstance(op, type):
            raise SteerError(f"op must be an operation such as sl.Add(); got {op!r}.")
        if not isinstance(op, Add) and is_zero(vector):
            raise SteerError(f"{type(op).__name__} needs a non-zero direction.")
        if isinstance(op, Op):
            op.check(site, vector)
        gate = as_gate(when)  # its order against the steer is checked with the model's sites
        object.__setattr__(self, "site", site)
        object.__setattr__(self, "vector", vector)
        object.__setattr__(self, "alpha", alphas)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "made_for", source)
        object.__setattr__(self, "when", gate)

    def _key(self) -> tuple[Any, ...]:
        return (self.site, vector_fingerprint(self.vector), self.alpha, self.positions, self.op,
                self.when)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Steer):
            return NotImplemented
        return (
            (self.site, self.alpha, self.positions, self.op, self.when)
            == (other.site, other.alpha, other.positions, other.op, other.when)
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
            f"alpha={alphas}, positions={self.positions!r}, op={self.op!r}"
            + (f", when={self.when!r})" if self.when is not None else ")")
        )

    def steers(self) -> list[Steer]:
        return [self]

    def check(self, sites: Sequence[str], d_model: int) -> None:
        """This steer against a model with ``sites`` and ``d_model`` (``check_steer``)."""
        check_steer(self.site, self.vector, sites, d_model, self.when, self.positions)

    @classmethod
    def of(cls, steer: Steer, alpha: float) -> Steer:
        """``steer`` at the one strength ``alpha``: what one row of a request carries
        (``Request.steers``). Nothing is checked again: ``steer`` was."""
        one = object.__new__(cls)
        for name in ("site", "vector", "positions", "op", "made_for", "when"):
            object.__setattr__(one, name, getattr(steer, name))
        object.__setattr__(one, "alpha", (float(alpha),))
        return one

    @property
    def key(self) -> SteerKey:
        """This steer less its alphas (``SteerKey``)."""
        return SteerKey(self.site, self.vector, self.positions, self.op, self.when)

    @property
    def vector_key(self) -> str:
        """The vector's content key (``vector_fingerprint``)."""
        return vector_fingerprint(self.vector)

    def mark(self) -> str:
        """A one-alpha steer as ``fingerprint@alpha``: THE mark of what a row's steer did,
        for every cache key (a chat's, a scored prompt's, a shared prefix's, vLLM's salt)."""
        assert len(self.alpha) == 1, "a row's steer carries one alpha"
        return steer_mark(self.fingerprint(), self.alpha[0])

    def to_data(self, *, vector_key: str | None = None) -> dict[str, Any]:
        """This steer in the wire format (``steer_data``), every alpha included."""
        return steer_data(self.site, self.vector, list(self.alpha), self.positions, self.op,
                          vector_key=vector_key, when=self.when)  # fmt: skip

    def fingerprint(self) -> str:
        """What this steer does, minus its alphas, as a short hash (site, vector, op,
        positions, condition).

        Custom operations have no data form; they fingerprint by identity.
        """
        return steer_fingerprint(self.site, self.vector, self.positions, self.op, self.when)


def steer_mark(fingerprint: str, alpha: float) -> str:
    """``fingerprint@alpha``: what a steer at one alpha did (``Steer.mark``)."""
    return f"{fingerprint}@{alpha!r}"


def steer_fingerprint(site: str, vector: torch.Tensor, positions: Positions, op: Operation,
                      when: Gate | None) -> str:  # fmt: skip
    """THE fingerprint of a steer less its alphas (``Steer.fingerprint``, and an engine
    plan's steers): site, vector content, positions, op and condition, as a short hash."""
    try:
        op_text = repr(sorted(op_to_data(op, tensor_fingerprint).items()))
    except SteerError:
        op_text = f"custom:{id(op)}"
    text = f"{site}|{vector_fingerprint(vector)}|{positions}|{op_text}"
    if when is not None:
        text += f"|{sorted(when.to_data(tensor_fingerprint).items())!r}"
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
        out.append(replace(s, alpha=tuple(without_noise(s.alpha[0] * float(a)) for a in alphas)))
    return out


def steer_data(site: str, vector: torch.Tensor, alpha: float | list[float], positions: Positions,
               op: Operation, *, vector_key: str | None = None,
               when: Gate | None = None) -> dict[str, Any]:  # fmt: skip
    """THE wire format of a steer, for the server's clients and vLLM's workers alike.

    ``{"site", "vector", "alpha", "positions", "op"}`` (and ``"when"``, a condition's
    ``gate_from_data`` form, on a conditioned steer): the vector as floats, or as
    ``vector_key`` where vectors travel once by key; the op as ``op_to_data`` gives it
    (a custom callable is refused, with why), its tensors (a ``FeatureClamp``'s encoder)
    as floats or, with ``vector_key``, by ``tensor_fingerprint`` too.

    >>> steer_data("blocks.0.hook_resid_pre", torch.ones(2), 4.0, "all", Add())["op"]
    {'name': 'add'}
    """
    values: Any = vector_key if vector_key is not None else vector.float().tolist()
    by_key = tensor_fingerprint if vector_key is not None else None  # op tensors travel alike
    data = {"site": site, "vector": values, "alpha": alpha, "positions": positions,
            "op": op_to_data(op, by_key)}  # fmt: skip
    if when is not None:
        data["when"] = when.to_data(by_key)
    return data


@dataclass(frozen=True)
class SteerData:
    """One steer as read from the wire format, with the vector as the data gave it: a key
    or a name (a string, resolved by whoever holds the vectors) or floats. ``site`` and
    ``alpha`` may be None where the reader allows (a named vector's every site; a
    request-wide alpha list)."""

    site: str | None
    vector: str | list[float]
    alpha: float | list[float] | None
    positions: Positions
    op: Op
    when: Gate | None = None


_WIRE_KEYS = ("site", "vector", "alpha", "positions", "op", "when")


def steer_from_data(data: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None,
                    *, partial: bool = False, vectors: Any = None) -> SteerData:  # fmt: skip
    """THE reader of the wire format that ``steer_data`` writes: the server's requests and
    vLLM's workers both read steers here. The op is ``op_from_data``'s (its tensors looked
    up in ``tensors`` by key); positions and alphas are checked by the rules ``Steer``
    uses. ``partial`` lets ``site`` and ``alpha`` be absent (a request body's named vector).
    A ``"when"`` condition is ``gate_from_data``'s; a string vector in it is resolved by
    ``vectors(name, site)``, or looked up in ``tensors``.

    Raises:
        SteerError: a key is missing or unknown, or a value is not valid; ``field`` on the
            error names the key.

    >>> steer_from_data(steer_data("blocks.0.hook_resid_pre", torch.ones(2), 4.0, 2, Add())).positions
    2
    """
    if not isinstance(data, Mapping):
        raise SteerError(f"a steer must be an object with keys {list(_WIRE_KEYS)}.", "")
    unknown = sorted(set(data) - set(_WIRE_KEYS))
    if unknown:
        raise SteerError(f"unknown key {unknown[0]!r} in a steer; the keys are "
                         f"{list(_WIRE_KEYS)}.", unknown[0])  # fmt: skip
    required = ("vector",) if partial else ("site", "vector", "alpha")
    for key in required:
        if data.get(key) is None:
            raise SteerError(f"a steer needs {key!r}.", key)
    site, vector, alpha = data.get("site"), data["vector"], data.get("alpha")
    if site is not None and not isinstance(site, str):
        raise SteerError(f"site must be a string; got {site!r:.60}.", "site")
    if not isinstance(vector, (str, list)):
        raise SteerError("vector must be a name, a key or a list of floats.", "vector")
    alphas = None if alpha is None else alpha_from_data(alpha)
    try:
        positions = _as_positions(data.get("positions", "all"))
    except SteerError as error:
        raise SteerError(str(error), "positions") from None
    try:
        op = op_from_data(data.get("op", "add"), tensors)
    except SteerError as error:
        raise SteerError(str(error), "op") from None
    when = None
    if data.get("when") is not None:
        when = gate_from_data(data["when"], vectors or _by_key(tensors))
    if alphas is not None and not isinstance(alpha, (list, tuple)):
        return SteerData(site, vector, alphas[0], positions, op, when)
    return SteerData(site, vector, None if alphas is None else list(alphas), positions, op, when)


def alpha_from_data(alpha: Any) -> tuple[float, ...]:
    """A wire-format alpha (a number or numbers), checked by ``Steer``'s rule; field "alpha".

    >>> alpha_from_data(2)
    (2.0,)
    """
    try:
        return _as_alphas(alpha)
    except SteerError as error:
        raise SteerError(str(error), "alpha") from None


def _by_key(tensors: Mapping[str, torch.Tensor] | None) -> Any:
    def look_up(key: str, site: str) -> torch.Tensor:
        if tensors is None or key not in tensors:
            raise SteerError(f"a condition's vector {key!r:.40} is not a known key.", "vector")
        return tensors[key]

    return look_up
