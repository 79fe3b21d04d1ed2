"""Operations as plain data: ``op_to_data`` / ``op_from_data``, their tensors, and what an
engine multiplies (``operand``, ``bind``, ``form_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from steerlab.core.errors import SteerError
from steerlab.core.ops.base import (
    OPS,
    Bound,
    Form,
    Op,
    Operation,
    TensorKey,
    _tensor,
    dtype_named,
    tensor_fingerprint,
    unit,
)


def op_to_data(op: Operation, tensor_key: TensorKey | None = None) -> dict[str, Any]:
    """An operation as plain data; an operation steerlab does not know cannot be sent.

    Tensor parameters become lists of floats, or ``tensor_key(tensor)`` when given (where
    an engine keeps tensors by key: see ``op_tensors``).

    >>> from steerlab.core.ops import Clamp
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


def bind(op: Operation, direction: torch.Tensor) -> Bound:
    """``op`` with its operand fixed, as ``(act, alpha) -> act`` (``Op.bound``): what an
    engine that keeps a steer across forwards calls at each. A custom callable binds
    nothing ahead."""
    if isinstance(op, Op):
        return op.bound(direction)
    return lambda act, alpha: op(act, direction, alpha)


def form_of(op: Operation) -> Form | None:
    """An operation's table form, or None for a custom callable or an operation that is not
    of that shape (it runs eagerly)."""
    return op.form() if isinstance(op, Op) and OPS.get(op.name) is type(op) else None
