"""Reads: a number per position from the activation at a site, and what is built on them.

A *read* is a small function of the activation ``h`` at a site and a direction ``c``:

- ``"projection"``: ``h·c/|c|``;
- ``"cosine"``: CAST's ``cos(h, tanh(P h))`` with ``P = c cᵀ / (c·c)``.

With a reduction over the prompt and a comparator, a read becomes a gate, a ``Condition``:
``read="mean"`` scores the mean of the prompt's activations, ``"last"`` its last token's,
both decided once per row at prefill and kept with the row; ``"token"`` gates each
position by its own score, in the same forward. ``any_of`` / ``all_of`` combine them. A
projection recorded at every token is a *readout*: a ``Monitor`` (``core/monitors.py``).

Every engine scores with ``score`` and decides with ``Gate.decide``, so they cannot
disagree on what a condition means.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from steerlab.core.directions import check_read_direction, direction_of, read_wire_form
from steerlab.core.errors import SteerError
from steerlab.core.ops import (
    TensorKey,
    TensorValue,
    dtype_named,
    is_zero,
    tensor_fingerprint,
    unit,
    wide_dtype,
)
from steerlab.core.scalars import as_real
from steerlab.core.sites import Site

COMPARES = ("above", "below")
READS = ("mean", "last", "token")
SCORES = ("cosine", "projection")
PROMPT_READS = ("mean", "last")  # decided once per row, at prefill


def score(h: torch.Tensor, direction: torch.Tensor, kind: str) -> torch.Tensor:
    """The read ``kind`` of each row of ``h [n, d]`` along ``direction [d]``: ``[n]`` in
    float32 (at least).

    >>> score(torch.tensor([[3.0, 4.0]]), torch.tensor([2.0, 0.0]), "projection")
    tensor([3.])
    """
    wide = wide_dtype(h.dtype)
    return score_along(h.to(wide), unit(direction.to(h.device), wide), kind)


def score_along(h: torch.Tensor, u: torch.Tensor, kind: str) -> torch.Tensor:
    """``score`` from the unit direction ``u [d]``, with ``h [n, d]`` already in ``u``'s
    dtype: for a reader that keeps ``u`` (``Condition.scores``)."""
    along = h @ u  # [n]
    if kind == "projection":
        return along
    projected = torch.tanh(along[:, None] * u)  # tanh(P h) [n, d]
    norms = h.norm(dim=-1) * projected.norm(dim=-1)
    cos = (h * projected).sum(-1) / norms
    return torch.where(norms > 0, cos, torch.zeros_like(cos))


def _choice(value: object, what: str, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise SteerError(f"{what} must be one of {list(allowed)}; got {value!r:.60}.", what)
    return value


@dataclass(frozen=True, eq=False)
class Condition(TensorValue):
    """Steer a row only when its prompt reads as ``direction`` (CAST's condition).

    Args:
        site: where the condition reads the activation (before any steer at that site,
            after steers at earlier ones).
        direction: ``[d_model]``, a tensor or a steering vector (its direction at ``site``).
        threshold: the score a row is compared with.
        compare: ``"above"`` fires when the score is above the threshold, ``"below"`` when
            it is below.
        read: ``"mean"`` of the prompt's activations (every token the call feeds before its
            first new token, BOS included, pads excluded), its ``"last"`` token, or
            ``"token"``: each position gated by its own score. A per-token gate decides
            per position, so a result reports no row decision for it (``out.fired`` and
            ``out.condition_scores`` are None when a call's only conditions are
            per-token); monitor the same direction at the site to see its read.
        score: ``"cosine"`` (CAST) or ``"projection"`` (``h·c/|c|``).

    What the scores measure: ``"cosine"`` is CAST's ``cos(h, tanh(P h))`` with
    ``P = c cᵀ / (c·c)``. Its numerator is ``Σ hᵢ tanh(a uᵢ)`` with ``a = h·u`` and
    ``u = c/|c|``, and ``x tanh x >= 0``: it grows with how far ``h`` lies along the *axis*
    of ``c``, either way, so it does not tell ``c`` from ``-c`` (a "sad" prompt can score
    above a "happy" one on a happy direction). ``"projection"`` is signed: use it when the
    condition should mean "reads as ``c``, not as ``-c``" (thresholds are then in the
    activations' units, not in [-1, 1]).

    >>> cond = Condition("blocks.1.hook_resid_post", torch.ones(128), threshold=0.2)
    >>> cond
    Condition(blocks.1.hook_resid_post: mean cosine above 0.2)
    """

    kind: ClassVar[str] = "condition"
    site: str
    direction: torch.Tensor
    threshold: float = 0.0
    compare: str = "above"
    read: str = "mean"
    score: str = "cosine"

    def __init__(self, site: str, direction: Any, threshold: float = 0.0, compare: str = "above",
                 read: str = "mean", score: str = "cosine") -> None:  # fmt: skip
        if not isinstance(site, str):
            raise SteerError(f"Condition site must be a site name; got {site!r:.60}.", "site")
        if not isinstance(direction, torch.Tensor) and not isinstance(direction, list):
            direction, _ = direction_of(direction, site)
        number = as_real(threshold)
        if number is None:
            raise SteerError(f"Condition threshold must be a finite number; got {threshold!r}.",
                             "threshold")  # fmt: skip
        object.__setattr__(self, "site", site)
        object.__setattr__(self, "direction", direction)
        object.__setattr__(self, "threshold", number)
        object.__setattr__(self, "compare", _choice(compare, "compare", COMPARES))
        object.__setattr__(self, "read", _choice(read, "read", READS))
        object.__setattr__(self, "score", _choice(score, "score", SCORES))
        try:
            self.__post_init__()
        except SteerError as error:
            raise SteerError(str(error), "vector") from None
        d = self.direction
        if d.ndim != 1:
            raise SteerError(f"Condition direction must be 1-D [d_model]; got shape "
                             f"{tuple(d.shape)}.", "vector")  # fmt: skip
        if is_zero(d):
            raise SteerError("Condition direction is empty or has zero norm: it reads nothing.",
                             "vector")  # fmt: skip

    def _label(self) -> str:
        return "Condition"

    # --- as a gate -----------------------------------------------------------------------

    def leaves(self) -> list[Condition]:
        return [self]

    @property
    def depth(self) -> int:
        """How deep ``any_of`` / ``all_of`` nest above this gate: 0 for a condition."""
        return 0

    @property
    def per_token(self) -> bool:
        return self.read == "token"

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        """This condition's score of each row of ``h [n, d]``: ``[n]`` (``score``, with its
        unit direction made once per device and dtype, ``unit_on``)."""
        wide = wide_dtype(h.dtype)
        return score_along(h.to(wide), self.unit_on("direction", h.device, wide), self.score)

    def fires(self, scores: torch.Tensor) -> torch.Tensor:
        """Which scores fire: ``[n]`` bool (a NaN score never does)."""
        return scores > self.threshold if self.compare == "above" else scores < self.threshold

    def decide(self, scores: Mapping[Condition, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(fired, score)`` from the scores of every leaf, by leaf."""
        mine = scores[self]
        return self.fires(mine), mine

    def check(self, sites: Sequence[str], d_model: int) -> None:
        """Against a model: a site it has, a direction of its width."""
        check_read_direction(self.site, self.direction, sites, d_model,
                             f"Condition direction at {self.site}", "vector")  # fmt: skip

    def to_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        """The wire form: ``{"site", "vector", "threshold", "compare", "read", "score"}``."""
        return read_wire_form(self.fields_data(tensor_key))

    def __repr__(self) -> str:
        return (f"Condition({self.site}: {self.read} {self.score} {self.compare} "
                f"{self.threshold:g})")  # fmt: skip


@dataclass(frozen=True)
class Combined:
    """Conditions combined into one decision: ``AnyOf`` fires where any part fires,
    ``AllOf`` where every part does. The score of a row is the score of the part that
    decided it: the first part that fired (``AnyOf``) or did not (``AllOf``), else the
    first part."""

    conditions: tuple[Gate, ...]
    depth: int = field(init=False, repr=False, compare=False)
    kind: ClassVar[str] = ""
    fires_on_any: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", _check_parts(self.conditions, self.kind))

    def leaves(self) -> list[Condition]:
        return list(dict.fromkeys(c for part in self.conditions for c in part.leaves()))

    @property
    def per_token(self) -> bool:
        return self.conditions[0].per_token

    def decide(self, scores: Mapping[Condition, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return _combine([c.decide(scores) for c in self.conditions], want=self.fires_on_any)

    def to_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        return {self.kind: [c.to_data(tensor_key) for c in self.conditions]}

    def __repr__(self) -> str:
        return f"{self.kind}({', '.join(map(repr, self.conditions))})"


@dataclass(frozen=True, repr=False)
class AnyOf(Combined):
    """Fires when any of its conditions fires (CAST's multi-condition OR)."""

    kind: ClassVar[str] = "any_of"
    fires_on_any: ClassVar[bool] = True


@dataclass(frozen=True, repr=False)
class AllOf(Combined):
    """Fires when all of its conditions fire."""

    kind: ClassVar[str] = "all_of"
    fires_on_any: ClassVar[bool] = False


Gate = Condition | AnyOf | AllOf


# The deepest any_of / all_of nesting a gate may have: far more than a decision needs, and
# shallow enough that every walk over a gate (deciding it, its data form) stays well within
# Python's recursion limit.
MAX_DEPTH = 32


def _check_parts(parts: object, kind: str) -> int:
    """Refuse parts that are not gates, nesting past ``MAX_DEPTH`` and mixed per-token and
    prompt reads; the combined gate's depth."""
    if not isinstance(parts, tuple) or not parts:
        raise SteerError(f"{kind} needs at least one condition.", "when")
    for part in parts:
        if not isinstance(part, (Condition, AnyOf, AllOf)):
            raise SteerError(f"{kind} takes sl.Condition values (or any_of / all_of of them); "
                             f"got {part!r:.60}.", "when")  # fmt: skip
    depth = 1 + max(p.depth for p in parts)  # each part's depth was checked when it was made
    _check_depth(depth)
    if len({p.per_token for p in parts}) > 1:
        raise SteerError(f"{kind} mixes read='token' with a prompt read: a gate is either "
                         "decided once per row or per position, not both.", "when")  # fmt: skip
    return depth


def _check_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SteerError(f"when nests any_of / all_of {depth} deep; the most is {MAX_DEPTH}. "
                         "any_of(any_of(a, b), c) is any_of(a, b, c): flatten the gate.",
                         "when")  # fmt: skip


def _combine(decided: list[tuple[torch.Tensor, torch.Tensor]],
             want: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    fired = torch.stack([f for f, _ in decided])  # [parts, ...]
    scores = torch.stack([s for _, s in decided])
    hit = fired if want else ~fired
    outcome = hit.any(0) if want else ~hit.any(0)
    first = torch.where(
        hit.any(0), hit.long().argmax(0), torch.zeros_like(hit[0], dtype=torch.long)
    )
    return outcome, scores.gather(0, first[None])[0]


def any_of(*conditions: Gate) -> AnyOf:
    """A gate that fires when any of ``conditions`` fires.

    >>> c = Condition("blocks.0.hook_resid_post", torch.ones(4))
    >>> any_of(c, Condition("blocks.1.hook_resid_post", torch.ones(4), compare="below"))
    any_of(Condition(blocks.0.hook_resid_post: mean cosine above 0), Condition(blocks.1.hook_resid_post: mean cosine below 0))
    """
    return AnyOf(tuple(conditions))


def all_of(*conditions: Gate) -> AllOf:
    """A gate that fires when every one of ``conditions`` fires."""
    return AllOf(tuple(conditions))


def as_gate(when: object) -> Gate | None:
    """``when=`` as a gate (None for none); anything else is refused by type."""
    if when is None or isinstance(when, (Condition, AnyOf, AllOf)):
        return when
    raise SteerError(f"when must be an sl.Condition, or sl.any_of / sl.all_of of them; got "
                     f"{type(when).__name__} {when!r:.60}.", "when")  # fmt: skip


def prompt_score(c: Condition, total: torch.Tensor, count: torch.Tensor,
                 last: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """THE score of a prompt condition from what an engine summed over each row's prompt:
    ``total [rows, d]`` and ``count [rows]`` of the tokens read (float32), and the ``last``
    token's activation ``[rows, d]``. NaN where a row read no token (it never fires).

    >>> c = Condition("blocks.0.hook_resid_post", torch.tensor([1.0, 0.0]), score="projection")
    >>> prompt_score(c, torch.tensor([[4.0, 2.0]]), torch.tensor([2.0]), torch.zeros(1, 2))
    tensor([2.])
    """
    h = last if c.read == "last" else total / count.clamp(min=1)[:, None]
    return c.scores(h).masked_fill(count == 0, float("nan"))


def reported_gate(gates: Iterable[Gate | None]) -> Gate | None:
    """The gate whose decision a row reports (``fired``, ``condition_score``), from its
    steers' gates in order: the first prompt gate; None when it has none."""
    return next((g for g in gates if g is not None and not g.per_token), None)


def check_gate_order(gate: Gate, steer_site: str, touches_prompt: bool) -> None:
    """A gate must be decided before the steer it gates acts.

    A per-token gate is scored in the same forward, so its site must come at or before the
    steer's site; a prompt gate is decided at prefill, so only a steer that touches the
    prompt needs its condition's site at or before its own.
    """
    try:
        at = Site.parse(steer_site).forward_order
    except Exception:  # an unknown site: the model's own check names it
        return
    for leaf in gate.leaves():
        if not (gate.per_token or touches_prompt):
            continue
        try:
            read_at = Site.parse(leaf.site).forward_order
        except Exception:
            continue
        if read_at > at:
            why = ("read='token' gates each position by its score in the same forward"
                   if gate.per_token else
                   "a steer that touches the prompt needs its condition decided before it "
                   "acts; with positions='generated' any site works")  # fmt: skip
            raise SteerError(f"The condition at {leaf.site} comes after the steer at "
                             f"{steer_site} in the forward: {why}.", "when")  # fmt: skip


def gate_from_data(data: object, vectors: Any = None, depth: int = 0) -> Gate:
    """A gate from its wire form: ``{"site", "vector", "threshold", "compare", "read",
    "score"}``, or ``{"any_of": [...]}`` / ``{"all_of": [...]}``, nested.

    ``vectors(name_or_key, site)`` resolves a string ``vector`` (a named vector, or a key
    where tensors travel once); without it only float lists are taken. ``depth`` is how
    deep ``data`` sits in the gate being read (nesting past ``MAX_DEPTH`` is refused).

    Raises:
        SteerError: with ``field`` naming the key at fault.
    """
    if not isinstance(data, Mapping):
        raise SteerError("when must be an object: a condition, or any_of / all_of.", "when")
    for kind, make in (("any_of", any_of), ("all_of", all_of)):
        if kind in data:
            parts = data[kind]
            if set(data) != {kind} or not isinstance(parts, list):
                raise SteerError(f"{kind} must be the only key, with a list of conditions.",
                                 f"when.{kind}")  # fmt: skip
            _check_depth(depth + 1)
            return make(*(gate_from_data(p, vectors, depth + 1) for p in parts))
    keys = ("site", "vector", "threshold", "compare", "read", "score", "dtype")
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise SteerError(f"unknown key {unknown[0]!r} in a condition; the keys are "
                         f"{list(keys[:-1])}, or any_of / all_of.", f"when.{unknown[0]}")  # fmt: skip
    for key in ("site", "vector"):
        if key not in data:
            raise SteerError(f"a condition needs {key!r}.", f"when.{key}")
    vector = data["vector"]
    if isinstance(vector, str):
        if vectors is None:
            raise SteerError("a condition's vector must be a list of floats here.", "when.vector")
        vector = vectors(vector, data["site"])
    elif not isinstance(vector, list):
        raise SteerError("a condition's vector must be a name or a list of floats.", "when.vector")
    elif any(isinstance(x, bool) or not isinstance(x, numbers.Real) for x in vector):
        bad = next(x for x in vector if isinstance(x, bool) or not isinstance(x, numbers.Real))
        raise SteerError(f"a condition's vector must be a list of numbers; it holds {bad!r} "
                         "(a JSON true or false is not a number).", "when.vector")  # fmt: skip
    elif "dtype" in data:
        try:
            vector = torch.tensor(vector, dtype=dtype_named(data["dtype"]))
        except (TypeError, ValueError, RuntimeError):
            raise SteerError(
                "a condition's vector must be a list of numbers.", "when.vector"
            ) from None
    params = {k: data[k] for k in ("threshold", "compare", "read", "score") if k in data}
    try:
        return Condition(data["site"], vector, **params)
    except SteerError as error:
        raise SteerError(str(error), f"when.{error.field or 'vector'}") from None


def gate_tensors(gate: Gate) -> dict[str, torch.Tensor]:
    """A gate's directions by ``tensor_fingerprint``, to send ahead of ``to_data(key)``."""
    return {tensor_fingerprint(c.direction): c.direction for c in gate.leaves()}
