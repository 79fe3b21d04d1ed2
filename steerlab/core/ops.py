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

__all__ = [
    "OPS", "Ablate", "Add", "Cap", "Clamp", "FeatureClamp", "FeatureRead", "Form", "Op", "Operation",
    "SteerError", "tensor_fingerprint",
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


class Operation(Protocol):
    """Any callable of this shape steers in-process; ``Op`` subclasses also travel as data."""

    def __call__(
        self,
        act: torch.Tensor,  # [n, d_model], the rows and positions being steered
        direction: torch.Tensor,  # [d_model]
        alpha: torch.Tensor,  # [n, 1]
    ) -> torch.Tensor: ...


class FeatureRead(NamedTuple):
    """A single SAE feature as table data: ``f = relu(p)·[p > threshold]`` with
    ``p = act · encoder + bias``; the steer adds ``α·(value - f)·v``."""

    encoder: torch.Tensor  # [d_model]
    bias: float  # b_enc[i], less what subtracting b_dec from the input takes off
    threshold: float
    value: float


class Form(NamedTuple):
    """An operation as table data: ``act + add·α·v + (1 - add)·α·(clip(a, low, high) - a)·u``.

    ``a = act · u`` is the projection on the unit direction ``u``. Add sets ``add``; the
    projection operations leave it off and say where the projection goes. A feature clamp
    leaves the projection alone (``low, high = -inf, inf``) and reads its ``feature``.
    """

    add: bool
    low: float
    high: float
    feature: FeatureRead | None = None


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

    def check_width(self, d_model: int) -> None:
        """Refuse a steer whose vector width does not fit the operation's own data."""

    def to_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        """Parameters by name; tensors as nested lists, or as ``tensor_key(t)`` where
        tensors travel once by key."""
        data: dict[str, Any] = {"name": self.name}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = tensor_key(value) if tensor_key is not None else value.tolist()
            data[f.name] = value
        return data

    def tensors(self) -> dict[str, torch.Tensor]:
        """The operation's tensor parameters, by name (none for the projection ops)."""
        return {f.name: v for f in fields(self) if isinstance(v := getattr(self, f.name),
                                                               torch.Tensor)}  # fmt: skip


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
    (``b_dec``, or zeros). Build one with ``sae.clamp(i, value)``; ``sae`` is the SAE's
    content hash, for provenance. Tensors travel by content key where an engine keeps them
    (vLLM's workers), and as lists of floats in a request body. Its table form reads the
    feature (``FeatureRead``), so the compiled step holds standard and jumprelu clamps;
    a topk clamp has none and runs eagerly.
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

    def __init__(self, value: float, index: int, encoder: Any, bias: Any, b_dec_in: Any,
                 architecture: str = "standard", threshold: float = 0.0, k: int | None = None,
                 decoder_norms: Any = None, sae: str = "",
                 dtype: str | None = None) -> None:  # fmt: skip
        if architecture not in ARCHITECTURE_NAMES:
            raise SteerError(
                f"feature_clamp architecture must be one of {list(ARCHITECTURE_NAMES)}; "
                f"got {architecture!r}."
            )
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise SteerError(f"feature_clamp index must be an int >= 0; got {index!r}.")
        encoder = _tensor(encoder, "encoder", None if dtype is None else _dtype(dtype))
        kind = encoder.dtype
        bias, b_dec_in = _tensor(bias, "bias", kind), _tensor(b_dec_in, "b_dec_in", kind)
        whole = architecture == "topk"
        want = {"encoder": 2 if whole else 1, "bias": 1 if whole else 0, "b_dec_in": 1}
        for label, t in (("encoder", encoder), ("bias", bias), ("b_dec_in", b_dec_in)):
            if t.ndim != want[label]:
                raise SteerError(
                    f"feature_clamp {label} must be {want[label]}-D for a {architecture} SAE; "
                    f"got shape {tuple(t.shape)}."
                )
        if b_dec_in.shape[0] != encoder.shape[0]:
            raise SteerError(
                f"feature_clamp b_dec_in has {b_dec_in.shape[0]} entries; the encoder reads "
                f"{encoder.shape[0]}."
            )
        if whole:
            d_sae = encoder.shape[1]
            if bias.shape[0] != d_sae or not 0 <= index < d_sae:
                raise SteerError(
                    f"feature_clamp: encoder has {d_sae} features, bias {bias.shape[0]}, "
                    f"index {index}."
                )
            if type(k) is not int or not 1 <= k <= d_sae:
                raise SteerError(f"feature_clamp of a topk SAE needs k in [1, {d_sae}]; got {k!r}.")
            if decoder_norms is not None:
                decoder_norms = _tensor(decoder_norms, "decoder_norms", kind)
                if tuple(decoder_norms.shape) != (d_sae,) or not (decoder_norms > 0).all():
                    raise SteerError(f"feature_clamp decoder_norms must be [{d_sae}], positive.")
        elif k is not None or decoder_norms is not None:
            raise SteerError(f"k and decoder_norms are topk settings, not {architecture}.")
        values = {
            "value": _number(value, "feature_clamp value"), "index": index,
            "encoder": encoder, "bias": bias, "b_dec_in": b_dec_in, "architecture": architecture,
            "threshold": _number(threshold, "feature_clamp threshold"), "k": k,
            "decoder_norms": decoder_norms, "sae": str(sae),
        }  # fmt: skip
        for name, v in values.items():
            object.__setattr__(self, name, v)

    def form(self) -> Form | None:
        """A standard or jumprelu feature as a ``FeatureRead`` (``b_dec`` folded into the
        bias); None for topk, whose feature depends on every other (it runs eagerly)."""
        if self.architecture == "topk":
            return None
        wide = torch.promote_types(self.encoder.dtype, torch.float32)
        bias = self.bias.to(wide) - self.b_dec_in.to(wide) @ self.encoder.to(wide)
        threshold = self.threshold if self.architecture == "jumprelu" else 0.0
        read = FeatureRead(self.encoder, float(bias), threshold, self.value)
        return Form(False, -math.inf, math.inf, read)

    def check_width(self, d_model: int) -> None:
        if self.encoder.shape[0] != d_model:
            raise SteerError(
                f"feature_clamp's encoder reads {self.encoder.shape[0]} dimensions, but the "
                f"steer's vector has {d_model}: the SAE and the vector do not match."
            )

    def to_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        return {
            **super().to_data(tensor_key),
            "dtype": str(self.encoder.dtype).removeprefix("torch."),
        }

    def feature(self, act: torch.Tensor) -> torch.Tensor:
        """The feature's activation at each row of ``act [n, d_in]``: ``[n]``."""
        encoder, bias, b_dec_in, norms = self._on(act.device)
        if self.architecture == "topk":
            f = encode(act, encoder, bias, b_dec_in, "topk", k=self.k, decoder_norms=norms)
            return f[:, self.index]
        threshold = torch.tensor(self.threshold, dtype=encoder.dtype, device=act.device)
        return encode(act, encoder[:, None], bias[None], b_dec_in, self.architecture,
                      threshold=threshold)[:, 0]  # fmt: skip

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        shift = self.value - self.feature(act)  # [n], in the SAE's dtype
        norms = self._on(act.device)[3]
        if norms is not None:  # a rescaling topk SAE decodes f / |W_dec[i]|
            shift = shift / norms[self.index]
        shift = shift.to(act.dtype)
        return act + alpha * shift[:, None] * direction

    def _on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The encoder's tensors on ``device``, moved once per device."""
        moved = self._moved
        if device not in moved:
            moved[device] = tuple(
                t.to(device) if t is not None else None
                for t in (self.encoder, self.bias, self.b_dec_in, self.decoder_norms)
            )
        return moved[device]

    @cached_property
    def _moved(self) -> dict[torch.device, tuple[Any, ...]]:
        return {}

    @cached_property
    def _identity(self) -> tuple[Any, ...]:
        return tuple(sorted(self.to_data(tensor_fingerprint).items(), key=lambda kv: kv[0]))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FeatureClamp):
            return NotImplemented
        return self._identity == other._identity

    def __hash__(self) -> int:
        return hash(self._identity)

    def __repr__(self) -> str:
        sae = f", sae={self.sae[:12]}" if self.sae else ""
        return f"FeatureClamp({self.architecture} feature {self.index} -> {self.value:g}{sae})"


def _dtype(name: str) -> torch.dtype:
    kind = getattr(torch, str(name), None)
    if not isinstance(kind, torch.dtype) or not kind.is_floating_point:
        raise SteerError(f"dtype must name a torch floating dtype such as 'float32'; got {name!r}.")
    return kind


def _tensor(value: Any, what: str, dtype: torch.dtype | None) -> torch.Tensor:
    """A tensor parameter, in ``dtype`` (float32 for lists, a tensor's own dtype when None),
    from a tensor or nested lists of numbers; finite, dense and real."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.device.type == "meta":
            raise SteerError(f"feature_clamp {what} must be a dense tensor with values.")
        if not value.is_floating_point():
            raise SteerError(f"feature_clamp {what} must be floating point; got {value.dtype}.")
        tensor = value.detach() if dtype is None else value.detach().to(dtype)
    else:
        try:
            tensor = torch.tensor(value, dtype=dtype or torch.float32)
        except (TypeError, ValueError, RuntimeError):
            raise SteerError(f"feature_clamp {what} must be numbers; got {value!r:.80}.") from None
    if not torch.isfinite(tensor).all():
        raise SteerError(f"feature_clamp {what} has NaN or inf values.")
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
    params = {k: v for k, v in data.items() if k != "name"}
    if tensors is not None:
        params = {k: tensors[v] if isinstance(v, str) and v in tensors else v
                  for k, v in params.items()}  # fmt: skip
    try:
        return OPS[data["name"]](**params)
    except TypeError as err:
        raise SteerError(f"Bad parameters for op {data['name']!r}: {params!r}.") from err


def form_of(op: Operation) -> Form | None:
    """An operation's table form, or None for a custom callable or an operation that is not
    of that shape (it runs eagerly)."""
    return op.form() if isinstance(op, Op) and OPS.get(op.name) is type(op) else None
