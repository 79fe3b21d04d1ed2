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

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, ClassVar, NamedTuple, Protocol

import torch

from steerlab.core.errors import SteerError
from steerlab.core.sae import ARCHITECTURE_NAMES, encode
from steerlab.core.scalars import as_int, as_real

__all__ = [
    "OPS", "STRENGTHS", "Ablate", "Add", "Cap", "Clamp", "FeatureClamp", "Form", "Op", "Operation",
    "Rotate", "SteerError", "TERMS", "TensorValue", "tensor_fingerprint",
]  # fmt: skip

TensorKey = Callable[[torch.Tensor], str]


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """A short content hash of a tensor: equal values, shape and dtype give equal ones.

    Vectors and an operation's tensors travel once, under this key, where an engine keeps
    them (vLLM's workers).
    """
    data = tensor.detach().to("cpu").contiguous()
    digest = hashlib.sha256(f"{data.dtype}:{tuple(data.shape)}".encode())
    digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()[:16]


def own_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU, contiguous, in memory of its own: what goes into a safetensors
    file or message, which refuses tensors that share memory (``R[0]`` beside ``R``)."""
    return tensor.detach().to("cpu", copy=True).contiguous()


class Operation(Protocol):
    """Any callable of this shape steers in-process; ``Op`` subclasses also travel as data."""

    def __call__(
        self,
        act: torch.Tensor,  # [n, d_model], the rows and positions being steered
        direction: torch.Tensor,  # [d_model]
        alpha: torch.Tensor,  # [n, 1]
    ) -> torch.Tensor: ...


class Form(NamedTuple):
    """An operation as table data: one number (or ``[d_model]`` tensor) per term.

    At a steered token, with ``v`` the steer's vector, ``u = v / |v|``, ``a = act · u`` and
    ``α`` the row's alpha::

        act + add·α·v
            + proj·α·(clip(a, low, high) - a)·u
            + feat·α·(value - f)·v,   f = relu(p)·[p > threshold],  p = act · encoder + bias
            + the turn of act's component in the plane of u and toward (when rot is set):
              from its angle φ to φ + rot·α·(angle − φ) along the shorter arc, its length
              kept (only where a = act · u > 0 when ``adaptive``)

    Every field is a column of the compiled step's table (``engine/compiled/tables.py``
    derives them from these fields; the fields named in ``STRENGTHS`` are stored times α),
    so a new term is new fields here and its arithmetic in the step, and nothing else.
    Add sets ``add``; the projection operations set ``proj`` and say where the projection
    goes; a feature clamp sets ``feat`` and reads its SAE feature (``encoder`` ``[d_model]``,
    ``bias`` with ``b_dec`` folded in, ``threshold``, ``value``); a rotation sets ``rot``,
    its plane's second direction ``toward`` (unit), the target ``angle`` in radians and
    ``adaptive`` (1.0 or 0.0).
    """

    add: float = 0.0
    proj: float = 0.0
    low: float = 0.0
    high: float = 0.0
    feat: float = 0.0
    encoder: torch.Tensor | None = None
    bias: float = 0.0
    threshold: float = 0.0
    value: float = 0.0
    rot: float = 0.0
    toward: torch.Tensor | None = None
    angle: float = 0.0
    adaptive: float = 0.0


STRENGTHS = ("add", "proj", "feat", "rot")  # Form's terms that alpha multiplies
TERMS = STRENGTHS  # a table step computes only the terms its batch uses


OPS: dict[str, type[Op]] = {}


def is_zero(vector: torch.Tensor) -> bool:
    """Whether a direction points nowhere: no entries, or all of them 0.

    >>> is_zero(torch.empty(0)), is_zero(torch.zeros(3)), is_zero(torch.tensor([0.0, 1e-30]))
    (True, True, False)
    """
    return vector.numel() == 0 or float(vector.abs().amax()) == 0.0


def unit(direction: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``direction / |direction|``, computed in float32 (at least) after scaling by the
    largest entry, so that norms near float32's limits (1e±20 and beyond) neither overflow
    nor underflow; returned in ``dtype`` (``direction``'s own when None). Normalise first,
    then cast: a float16 copy of a 1e20 vector is all inf.

    >>> unit(torch.tensor([3e20, 4e20])).tolist()
    [0.6000000238418579, 0.800000011920929]
    >>> unit(torch.tensor([3e-20, 4e-20]), torch.float16).tolist()
    [0.60009765625, 0.7998046875]
    """
    wide = direction.to(torch.promote_types(direction.dtype, torch.float32))
    peak = wide.abs().amax()
    scaled = wide / peak
    return (scaled / scaled.norm()).to(dtype or direction.dtype)


def project(act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor,
            low: float, high: float) -> torch.Tensor:  # fmt: skip
    """Move each row's projection on ``direction`` ``alpha`` of the way into ``[low, high]``."""
    u = unit(direction)
    along = act @ u  # [n]
    return act + alpha * (along.clamp(low, high) - along)[:, None] * u


@dataclass(frozen=True, eq=False)
class TensorValue:
    """A frozen dataclass whose tensor fields are handled by the base: the value base of
    operations (``Op``) and of reads such as a steer's condition (``core.reads``).

    Declare subclasses ``@dataclass(frozen=True, eq=False)``: equality and hashing come from
    here, by the data form with tensors by content (``tensor_fingerprint``), so two values
    with equal tensors are equal whatever objects hold them. Fields annotated as tensors
    get, from the base alone:

    - conversion: nested lists of numbers become tensors (float32, or ``dtype=`` in the
      data form), and every tensor field takes the first one's dtype; each must be dense,
      real and finite;
    - ``on(device)``: the tensors moved to a device, once per device;
    - the data form: lists of floats, or content keys where tensors travel once by key
      (``op_tensors``), plus their ``dtype``.

    Subclasses that check their fields in ``__post_init__`` call ``super().__post_init__()``
    first.
    """

    def __post_init__(self) -> None:
        kind: torch.dtype | None = None
        for name in self.tensor_fields():
            value = getattr(self, name)
            if value is None:
                continue
            tensor = _tensor(value, f"{self._label()} {name}", kind)
            kind = kind or tensor.dtype
            object.__setattr__(self, name, tensor)

    def _label(self) -> str:
        return type(self).__name__

    @classmethod
    def tensor_fields(cls) -> tuple[str, ...]:
        """The fields that hold tensors (annotated ``torch.Tensor``), in declaration order."""
        return tuple(f.name for f in fields(cls) if "Tensor" in str(f.type))

    def fields_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        """Fields by name; tensors as nested lists, or as ``tensor_key(t)`` where tensors
        travel once by key, with their ``dtype``."""
        data: dict[str, Any] = {}
        kind = None
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                kind = kind or str(value.dtype).removeprefix("torch.")
                value = tensor_key(value) if tensor_key is not None else value.tolist()
            data[f.name] = value
        if kind is not None:
            data["dtype"] = kind
        return data

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor parameters, by name."""
        return {f.name: v for f in fields(self) if isinstance(v := getattr(self, f.name),
                                                               torch.Tensor)}  # fmt: skip

    def on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The tensor parameters on ``device``, moved once per device."""
        moved = self._moved
        if device not in moved:
            moved[device] = {n: t.to(device) for n, t in self.tensors().items()}
        return moved[device]

    @cached_property
    def _moved(self) -> dict[torch.device, dict[str, torch.Tensor]]:
        return {}

    @cached_property
    def _identity(self) -> tuple[Any, ...]:
        data = self.fields_data(tensor_fingerprint if self.tensor_fields() else None)
        return tuple(sorted((k, _hashable(v)) for k, v in data.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorValue):
            return NotImplemented
        return type(self) is type(other) and self._identity == other._identity

    def __hash__(self) -> int:
        return hash(self._identity)


@dataclass(frozen=True, eq=False)
class Op(TensorValue):
    """Base of steerlab's operations: subclassing registers the name for ``op_from_data``.

    Tensor fields, equality, hashing, per-device copies and the data form come from
    ``TensorValue``. A subclass gives its ``name``, its fields, a ``form()`` (or
    ``__call__`` when it has none) and, where it needs them, ``check`` (against a steer's
    site and width) and ``__post_init__`` checks (call ``super().__post_init__()`` first).
    """

    name: ClassVar[str] = ""
    directional: ClassVar[bool] = False  # it reads only the unit direction of its vector

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        OPS[cls.name] = cls

    def _label(self) -> str:
        return self.name

    def form(self) -> Form | None:
        """The operation as table data, or None when it is not of that shape (it then runs
        eagerly, as a custom callable does)."""
        raise NotImplementedError

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        form = self.form()
        assert form is not None, f"{type(self).__name__} without a form defines __call__"
        if form.add:
            return act + alpha * direction
        return project(act, direction, alpha, form.low, form.high)

    def check(self, site: str, vector: torch.Tensor) -> None:
        """Refuse a steer at ``site`` with ``vector`` ``[d_model]`` that this operation's own
        data does not fit (raise ``SteerError`` saying why)."""

    def to_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        """Parameters by name, after the op's ``name`` (``fields_data``)."""
        return {"name": self.name, **self.fields_data(tensor_key)}


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def _number(value: Any, what: str, *, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SteerError(f"{what} must be a number; got {value!r:.60}.")
    if isinstance(value, int) and abs(value) > _LARGEST_FLOAT:  # float() would overflow
        raise SteerError(f"{what} must be finite; got {value!r:.60} (past a float's range).")
    if finite and not math.isfinite(value):
        raise SteerError(f"{what} must be finite; got {value!r}.")
    return float(value)


_LARGEST_FLOAT = int(torch.finfo(torch.float64).max)


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
        _number(self.value, "Clamp value")

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
        if low is None and high is None:
            raise SteerError("Cap needs a low bound, a high bound, or both.")
        if low is not None and high is not None and low > high:
            raise SteerError(f"Cap low ({low}) is above high ({high}).")

    def form(self) -> Form:
        low = -math.inf if self.low is None else float(self.low)
        high = math.inf if self.high is None else float(self.high)
        return Form(proj=1.0, low=low, high=high)


@dataclass(frozen=True, eq=False)
class FeatureClamp(Op):
    """Set SAE feature ``index`` to ``value`` and keep the SAE's reconstruction error.

    At each steered token ``x <- x + alpha * (value - f(x)) * v``, with ``v`` the steer's
    vector (the feature's decoder row ``W_dec[index]``) and ``f(x)`` the feature's
    activation as the SAE itself encodes ``x`` (``core.sae.encode``). Alpha 1 moves the
    decoder's output exactly as setting the feature to ``value`` would; alpha 0 leaves ``x``
    untouched. A topk SAE that rescales by the decoder norms (``decoder_norms``) divides the
    shift by ``|W_dec[index]|``, as its decode divides the activations.

    A ``standard`` or ``jumprelu`` feature needs only its encoder column, bias and threshold:
    ``encoder`` is ``W_enc[:, index]`` ``[d_in]`` and ``bias`` ``b_enc[index]``. A ``topk``
    feature depends on every feature, so ``encoder`` is the whole ``W_enc [d_in, d_sae]``
    and ``bias`` the whole ``b_enc``. ``b_dec_in`` is what the SAE subtracts from its input
    (``b_dec``, or zeros). ``site`` is the SAE's site, when known: the feature means
    nothing elsewhere, so a steer at another site is refused. Build one with
    ``sae.clamp(i, value)``; ``sae`` is the SAE's content hash, for provenance. Its table
    form reads the feature, so the compiled step holds standard and jumprelu clamps; a
    topk clamp has none and runs eagerly.
    """

    name: ClassVar[str] = "feature_clamp"
    value: float
    index: int
    encoder: torch.Tensor
    bias: torch.Tensor
    b_dec_in: torch.Tensor
    architecture: str = "standard"
    threshold: float = 0.0
    k: int | None = None
    decoder_norms: torch.Tensor | None = None
    sae: str = ""
    site: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURE_NAMES:
            raise SteerError(
                f"feature_clamp architecture must be one of {list(ARCHITECTURE_NAMES)}; "
                f"got {self.architecture!r}."
            )
        index = self.index
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise SteerError(f"feature_clamp index must be an int >= 0; got {index!r}.")
        super().__post_init__()
        for name in ("sae", "site"):
            if not isinstance(getattr(self, name), str):
                raise SteerError(f"feature_clamp {name} must be a string.")
        object.__setattr__(self, "value", _number(self.value, "feature_clamp value"))
        object.__setattr__(self, "threshold", _number(self.threshold, "feature_clamp threshold"))
        self._check_shapes()

    def _check_shapes(self) -> None:
        encoder, bias, b_dec_in = self.encoder, self.bias, self.b_dec_in
        whole = self.architecture == "topk"
        want = {"encoder": 2 if whole else 1, "bias": 1 if whole else 0, "b_dec_in": 1}
        for label, t in (("encoder", encoder), ("bias", bias), ("b_dec_in", b_dec_in)):
            if t.ndim != want[label]:
                raise SteerError(
                    f"feature_clamp {label} must be {want[label]}-D for a {self.architecture} "
                    f"SAE; got shape {tuple(t.shape)}."
                )
        if b_dec_in.shape[0] != encoder.shape[0]:
            raise SteerError(
                f"feature_clamp b_dec_in has {b_dec_in.shape[0]} entries; the encoder reads "
                f"{encoder.shape[0]}."
            )
        if not whole:
            if self.k is not None or self.decoder_norms is not None:
                raise SteerError(f"k and decoder_norms are topk settings, not {self.architecture}.")
            return
        d_sae, k, norms = encoder.shape[1], self.k, self.decoder_norms
        if bias.shape[0] != d_sae or not 0 <= self.index < d_sae:
            raise SteerError(
                f"feature_clamp: encoder has {d_sae} features, bias {bias.shape[0]}, "
                f"index {self.index}."
            )
        if type(k) is not int or not 1 <= k <= d_sae:
            raise SteerError(f"feature_clamp of a topk SAE needs k in [1, {d_sae}]; got {k!r}.")
        if norms is not None and (tuple(norms.shape) != (d_sae,) or not (norms > 0).all()):
            raise SteerError(f"feature_clamp decoder_norms must be [{d_sae}], positive.")

    def form(self) -> Form | None:
        """A standard or jumprelu feature as table data (``b_dec`` folded into the bias);
        None for topk, whose feature depends on every other (it runs eagerly)."""
        if self.architecture == "topk":
            return None
        wide = torch.promote_types(self.encoder.dtype, torch.float32)
        bias = self.bias.to(wide) - self.b_dec_in.to(wide) @ self.encoder.to(wide)
        threshold = self.threshold if self.architecture == "jumprelu" else 0.0
        return Form(feat=1.0, low=-math.inf, high=math.inf, encoder=self.encoder,
                    bias=float(bias), threshold=threshold, value=self.value)  # fmt: skip

    def check(self, site: str, vector: torch.Tensor) -> None:
        d_model = vector.shape[0]
        if self.site and site != self.site:
            raise SteerError(
                f"This feature clamp reads a feature of an SAE trained at {self.site}; it cannot "
                f"steer at {site}. Use the SAE's site, or add its decoder row with sl.Add()."
            )
        if self.encoder.shape[0] != d_model:
            raise SteerError(
                f"feature_clamp's encoder reads {self.encoder.shape[0]} dimensions, but the "
                f"steer's vector has {d_model}: the SAE and the vector do not match."
            )

    def feature(self, act: torch.Tensor) -> torch.Tensor:
        """The feature's activation at each row of ``act [n, d_in]``: ``[n]``."""
        t = self.on(act.device)
        encoder, bias, b_dec_in = t["encoder"], t["bias"], t["b_dec_in"]
        if self.architecture == "topk":
            f = encode(act, encoder, bias, b_dec_in, "topk", k=self.k,
                       decoder_norms=t.get("decoder_norms"))  # fmt: skip
            return f[:, self.index]
        threshold = torch.tensor(self.threshold, dtype=encoder.dtype, device=act.device)
        return encode(act, encoder[:, None], bias[None], b_dec_in, self.architecture,
                      threshold=threshold)[:, 0]  # fmt: skip

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        shift = self.value - self.feature(act)  # [n], in the SAE's dtype
        norms = self.on(act.device).get("decoder_norms")
        if norms is not None:  # a rescaling topk SAE decodes f / |W_dec[i]|
            shift = shift / norms[self.index]
        shift = shift.to(act.dtype)
        return act + alpha * shift[:, None] * direction

    def __repr__(self) -> str:
        sae = f", sae={self.sae[:12]}" if self.sae else ""
        return f"FeatureClamp({self.architecture} feature {self.index} -> {self.value:g}{sae})"


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
        if not isinstance(self.adaptive, bool):
            raise SteerError(f"Rotate adaptive must be True or False; got {self.adaptive!r}.")
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
        kind = torch.promote_types(direction.dtype, torch.float32)
        b1 = unit(direction.to(kind))
        toward = unit(self.on(direction.device)["toward"].to(kind))
        rest = toward - (toward @ b1) * b1
        if float(rest.norm()) < 1e-4:
            return None
        return b1, rest / rest.norm()

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        plane = self._plane(direction)
        assert plane is not None, "Steer checks the plane when it is made"
        b1, b2 = plane
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


_DTYPES = ("float16", "bfloat16", "float32", "float64")


def dtype_named(name: object) -> torch.dtype:
    """A tensor dtype named in data: one a model computes in (not float8, not integers)."""
    if not isinstance(name, str) or name not in _DTYPES:
        raise SteerError(f"dtype must name a torch floating dtype, one of {list(_DTYPES)}; got "
                         f"{name!r:.60}.")  # fmt: skip
    return getattr(torch, name)


def _tensor(value: Any, what: str, dtype: torch.dtype | None) -> torch.Tensor:
    """A tensor parameter, in ``dtype`` (float32 for lists, a tensor's own dtype when None),
    from a tensor or nested lists of numbers; finite, dense and real."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.device.type == "meta":
            raise SteerError(f"{what} must be a dense tensor with values.")
        if not value.is_floating_point() or value.dtype.itemsize == 1:
            raise SteerError(f"{what} must be float16, bfloat16, float32 or float64; got "
                             f"{value.dtype}.")  # fmt: skip
        tensor = value.detach() if dtype is None else value.detach().to(dtype)
    else:
        try:
            tensor = torch.tensor(value, dtype=dtype or torch.float32)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise SteerError(f"{what} must be numbers; got {value!r:.80}.") from None
    if not torch.isfinite(tensor).all():
        raise SteerError(f"{what} has NaN or inf values.")
    return tensor


def op_to_data(op: Operation, tensor_key: TensorKey | None = None) -> dict[str, Any]:
    """An operation as plain data; an operation steerlab does not know cannot be sent.

    Tensor parameters become lists of floats, or ``tensor_key(tensor)`` when given (where
    an engine keeps tensors by key: see ``op_tensors``).

    >>> op_to_data(Clamp(2.0))
    {'name': 'clamp', 'value': 2.0}
    """
    if not (isinstance(op, Op) and OPS.get(op.name) is type(op)):
        raise SteerError(
            f"The operation {op!r} is a custom callable: it runs in-process, but an engine that "
            f"takes steers as data (a server, vLLM, the compiled step) only knows {sorted(OPS)}."
        )
    return op.to_data(tensor_key)


def op_tensors(op: Operation) -> dict[str, torch.Tensor]:
    """An operation's tensors by ``tensor_fingerprint``: what to send ahead of a
    ``to_data(tensor_fingerprint)``."""
    if not isinstance(op, Op):
        return {}
    return {tensor_fingerprint(t): t for t in op.tensors().values()}


def op_from_data(data: dict[str, Any] | str,
                 tensors: Mapping[str, torch.Tensor] | None = None) -> Op:  # fmt: skip
    """The operation ``data`` names (a name alone for one without parameters); unknown
    names and parameters are refused. A string where a tensor goes is looked up in
    ``tensors`` (the keys ``op_tensors`` gives).

    >>> op_from_data({"name": "cap", "high": 1.5})
    Cap(low=None, high=1.5)
    """
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, dict) or data.get("name") not in OPS:
        raise SteerError(f"op must name one of {sorted(OPS)}; got {data!r}.")
    cls = OPS[data["name"]]
    params = {k: v for k, v in data.items() if k != "name"}
    held = cls.tensor_fields()
    if tensors is not None:
        params = {k: tensors[v] if k in held and isinstance(v, str) and v in tensors else v
                  for k, v in params.items()}  # fmt: skip
    if held and "dtype" in params:  # every tensor parameter in the dtype the data names
        kind = dtype_named(params.pop("dtype"))
        params = {k: _tensor(v, f"{cls.name} {k}", kind) if k in held and v is not None else v
                  for k, v in params.items()}  # fmt: skip
    try:
        return cls(**params)
    except TypeError as err:
        raise SteerError(f"Bad parameters for op {data['name']!r}: {params!r:.200}.") from err


def operand(op: Operation, vector: torch.Tensor, dtype: torch.dtype,
            device: torch.device | str | None = None) -> torch.Tensor:  # fmt: skip
    """A steer's vector as ``op`` uses it, in ``dtype`` on ``device``, for every engine.

    An operation that reads only the unit direction (``Op.directional``: the projections,
    a rotation) gets ``unit(vector)`` normalised in float32 before the cast: a 1e20 or 1e-20 vector would be inf or 0 in
    float16. Every other operation gets the vector itself, cast.
    """
    if isinstance(op, Op) and op.directional:
        return unit(vector, dtype).to(device)
    return vector.to(device, dtype)


def form_of(op: Operation) -> Form | None:
    """An operation's table form, or None for a custom callable or an operation that is not
    of that shape (it runs eagerly)."""
    return op.form() if isinstance(op, Op) and OPS.get(op.name) is type(op) else None
