"""What a steer does to an activation: small typed operations that are also plain data.

An operation is a frozen dataclass with a ``name`` and numeric parameters, so it can cross
a process boundary as ``{"name": "clamp", "value": 2.0}`` (``to_data`` / ``op_from_data``).
``alpha`` is always a strength: 0 leaves the activation bit-identical, for every operation.

Every built-in operation is one class in this package, and nothing else: subclassing ``Op``
(``base.py``) registers its data form, and its ``form()`` (add the vector, or move the
projection on the unit direction into ``[low, high]``) is what table-driven engines (the
compiled step, vLLM's fused layouts) read, so a new operation runs on every engine without
engine code. ``basic.py`` holds Add, Ablate, Clamp and Cap; ``feature.py`` FeatureClamp;
``rotate.py`` Rotate; ``data.py`` the plain-data forms.
"""

from steerlab.core.errors import SteerError
from steerlab.core.ops.base import (
    OPS,
    STRENGTHS,
    TERMS,
    Bound,
    Form,
    Op,
    Operation,
    TensorKey,
    TensorValue,
    _number,
    fingerprints_kept,
    is_zero,
    own_copy,
    project,
    tensor_fingerprint,
    unit,
    wide_dtype,
)
from steerlab.core.ops.basic import Ablate, Add, Cap, Clamp
from steerlab.core.ops.data import (
    bind,
    dtype_named,
    form_of,
    op_from_data,
    op_tensors,
    op_to_data,
    operand,
)
from steerlab.core.ops.feature import FeatureClamp
from steerlab.core.ops.rotate import Rotate

__all__ = [
    "OPS", "STRENGTHS", "Ablate", "Add", "Bound", "Cap", "Clamp", "FeatureClamp", "Form", "Op",
    "Operation", "Rotate", "SteerError", "TERMS", "TensorKey", "TensorValue", "_number", "bind",
    "dtype_named", "fingerprints_kept", "form_of", "is_zero", "op_from_data", "op_tensors", "op_to_data", "operand",
    "own_copy", "project", "tensor_fingerprint", "unit", "wide_dtype",
]  # fmt: skip
