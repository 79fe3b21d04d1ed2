"""The operation base: ``Op`` (a frozen dataclass of tensors and numbers that is also plain
data), its table ``Form``, and the vector helpers every operation uses.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, ClassVar, NamedTuple, Protocol

import torch

from steerlab.core.errors import SteerError
from steerlab.core.scalars import as_real

TensorKey = Callable[[torch.Tensor], str]
Bound = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (act, alpha) -> act


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """A short content hash of a tensor: equal values, shape and dtype give equal ones.

    Vectors and an operation's tensors travel once, under this key, where an engine keeps
    them (vLLM's workers). Inside ``fingerprints_kept`` each tensor is hashed once.
    """
    kept = _KEPT.get()
    hit = None if kept is None else kept.get(id(tensor))
    if hit is not None and hit[0] is tensor:
        return hit[1]
    data = tensor.detach().to("cpu").contiguous()
    digest = hashlib.sha256(f"{data.dtype}:{tuple(data.shape)}".encode())
    digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    key = digest.hexdigest()[:16]
    if kept is not None:
        kept[id(tensor)] = (tensor, key)  # the tensor held: its id is not reused meanwhile
    return key


_KEPT: ContextVar[dict[int, tuple[torch.Tensor, str]] | None] = ContextVar(
    "fingerprints", default=None
)


@contextmanager
def fingerprints_kept() -> Iterator[None]:
    """Inside, ``tensor_fingerprint`` hashes each tensor once, by identity: for steerlab's
    own code that writes no tensor and calls no user code (a call's rows made into what an
    engine sends, each row's steer hashed three times otherwise)."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


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

    Every field is a column of the table-driven engines' tables (``core/ops/table.py``
    fills a row from these fields; the fields named in ``STRENGTHS`` are times α), so a new
    term is new fields here and its arithmetic in ``core/ops/table.py``, and nothing else.
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

    @property
    def terms(self) -> tuple[str, ...]:
        """The terms this form sets (``STRENGTHS`` not 0): what a table computes for it."""
        return tuple(t for t in STRENGTHS if getattr(self, t))


STRENGTHS = ("add", "proj", "feat", "rot")  # Form's terms that alpha multiplies
TERMS = STRENGTHS  # a table step computes only the terms its batch uses


OPS: dict[str, type[Op]] = {}


def is_zero(vector: torch.Tensor) -> bool:
    """Whether a direction points nowhere: no entries, or all of them 0.

    >>> is_zero(torch.empty(0)), is_zero(torch.zeros(3)), is_zero(torch.tensor([0.0, 1e-30]))
    (True, True, False)
    """
    return vector.numel() == 0 or float(vector.abs().amax()) == 0.0


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` widened to float32 at least: what directions, planes and reads (a
    condition's score, a monitor's value) are computed in.

    >>> wide_dtype(torch.bfloat16), wide_dtype(torch.float64)
    (torch.float32, torch.float64)
    """
    return torch.promote_types(dtype, torch.float32)


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
    wide = direction.to(wide_dtype(direction.dtype))
    peak = wide.abs().amax()
    scaled = wide / peak
    return (scaled / scaled.norm()).to(dtype or direction.dtype)


def project(act: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor,
            low: float, high: float) -> torch.Tensor:  # fmt: skip
    """Move each row's projection on ``direction`` ``alpha`` of the way into ``[low, high]``."""
    return project_unit(act, unit(direction), alpha, low, high)


def project_unit(act: torch.Tensor, u: torch.Tensor, alpha: torch.Tensor, low: float,
                 high: float) -> torch.Tensor:  # fmt: skip
    """``project`` along ``u``, ``unit`` of the direction already."""
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

    def unit_on(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``unit`` of the tensor field ``name`` on ``device`` in ``dtype``, made once per
        device and dtype: a read's direction, read at every step."""
        key = (name, device, dtype)
        if key not in self._units:
            self._units[key] = unit(self.on(device)[name], dtype)
        return self._units[key]

    @cached_property
    def _units(self) -> dict[tuple[str, torch.device, torch.dtype], torch.Tensor]:
        return {}

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle carries: the fields, not this process's caches (a
        string's hash differs between processes; device copies are made again)."""
        return {k: v for k, v in self.__dict__.items() if k not in _CACHES}

    @cached_property
    def _identity(self) -> tuple[Any, ...]:
        data = self.fields_data(tensor_fingerprint if self.tensor_fields() else None)
        return tuple(sorted((k, _hashable(v)) for k, v in data.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorValue):
            return NotImplemented
        return type(self) is type(other) and self._identity == other._identity

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:  # a worker looks a condition up at every step
        return hash(self._identity)


@dataclass(frozen=True, eq=False)
class Op(TensorValue):
    """Base of steerlab's operations: subclassing registers the name for ``op_from_data``.

    Tensor fields, equality, hashing, per-device copies and the data form come from
    ``TensorValue``. A subclass gives its ``name``, its fields, a ``form()`` (or
    ``__call__`` when it has none; ``bound`` when part of it depends on the direction
    alone) and, where it needs them, ``check`` (against a steer's
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

    @cached_property
    def _form(self) -> Form | None:  # an op's fields never change (it is frozen)
        return self.form()

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        return self.bound(direction)(act, alpha)

    def bound(self, direction: torch.Tensor) -> Bound:
        """``(act, alpha) -> self(act, direction, alpha)``, the same arithmetic, with what
        depends on ``direction`` alone (a projection's unit, a rotation's plane) made once
        here: an engine that keeps a steer across forwards binds it once and calls this at
        each. An operation with arithmetic of its own (``__call__``) binds nothing ahead
        unless it says so (``Rotate``)."""
        if type(self).__call__ is not Op.__call__:
            return lambda act, alpha: self(act, direction, alpha)
        form = self._form
        assert form is not None, f"{type(self).__name__} without a form defines __call__"
        if form.add:
            return lambda act, alpha: act + alpha * direction
        u = unit(direction)
        return lambda act, alpha: project_unit(act, u, alpha, form.low, form.high)

    def check(self, site: str, vector: torch.Tensor) -> None:
        """Refuse a steer at ``site`` with ``vector`` ``[d_model]`` that this operation's own
        data does not fit (raise ``SteerError`` saying why)."""

    def to_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        """Parameters by name, after the op's ``name`` (``fields_data``)."""
        return {"name": self.name, **self.fields_data(tensor_key)}


_CACHES = ("_hash", "_moved", "_units")  # a TensorValue's caches that stay in one process


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def _number(value: Any, what: str) -> float:
    """``value`` as a plain float: one finite real number, as ``core.scalars.as_real`` reads
    it (numpy's and 0-d tensors' too); refused by name otherwise.

    >>> import numpy as np
    >>> _number(np.float32(0.5), "Clamp value")
    0.5
    """
    number = as_real(value)
    if number is not None:
        return number
    item = value.item() if getattr(value, "ndim", None) == 0 else value  # a 0-d tensor's
    if isinstance(item, numbers.Real) and not isinstance(item, bool):
        raise SteerError(f"{what} must be finite; got {value!r:.60}.")
    raise SteerError(f"{what} must be a number; got {value!r:.60}.")


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
