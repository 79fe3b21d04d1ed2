"""Which values count as one int or one real number: THE rule for every int or float setting.

Python ints and floats, numpy's integer and float scalars, 0-d arrays and tensors, fractions
and decimals are numbers alike (``np.int64(3)`` is as good a ``max_new_tokens`` as ``3``); a
bool is never a number here, and a float is never an int. Each is returned as a plain ``int`` or ``float``, so nothing
downstream sees numpy or torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from decimal import Decimal
from typing import TypeGuard

import numpy as np
import torch

from steerlab.core.errors import SteerError


def as_int(value: object) -> int | None:
    """``value`` as a plain int when it is one integer, else None (bools and floats too).

    >>> import numpy as np
    >>> as_int(np.int64(3)), as_int(torch.tensor(3)), as_int(True), as_int(3.0)
    (3, 3, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if _scalar_tensor(value) and not value.is_floating_point():
        return int(value)
    if _scalar_array(value) and value.dtype.kind in "iu":
        return int(value)
    return None


def as_real(value: object, *, nan: bool = False) -> float | None:
    """``value`` as a plain float when it is one finite real number, else None (bools too).

    With ``nan``, a NaN is a number too (where it means "no value", as a scorer's "no
    evidence"); infinities never are.

    >>> import numpy as np
    >>> as_real(np.float32(0.5)), as_real(torch.tensor(2)), as_real(False), as_real(float("nan"))
    (0.5, 2.0, None, None)
    >>> as_real(np.float32("nan"), nan=True)
    nan
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (numbers.Real, Decimal)) or _scalar_tensor(value) or _scalar_array(value):
        try:
            number = float(value)  # type: ignore[arg-type]
        except OverflowError:  # an int or a fraction past float's range
            return None
        return number if math.isfinite(number) or (nan and math.isnan(number)) else None
    return None


def _scalar_tensor(value: object) -> TypeGuard[torch.Tensor]:
    """A 0-d tensor of real numbers (not bool, not complex)."""
    return (
        isinstance(value, torch.Tensor)
        and value.ndim == 0
        and value.dtype != torch.bool
        and not value.is_complex()
    )


def _scalar_array(value: object) -> TypeGuard[np.ndarray]:
    """A 0-d numpy array of real numbers (ints or floats; not bool, not complex)."""
    return isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf"


def real_list(value: object, what: str) -> list[float]:
    """``value`` as a non-empty list of finite real numbers, each a plain float: THE rule
    for a list of numbers such as a grid of factors. A list, tuple, range, array or 1-d
    tensor; each item a number as ``as_real`` reads it. Refused by name otherwise: an
    empty list, a string, an item that is not a finite real number (an int past float's
    range included).

    >>> import numpy as np
    >>> real_list([np.float32(2.0), np.int64(4), 0.5], "factors")
    [2.0, 4.0, 0.5]
    >>> real_list([1, float("inf")], "factors")
    Traceback (most recent call last):
    ...
    steerlab.core.errors.SteerError: factors must be finite real numbers; got inf at [1].
    """
    if isinstance(value, (np.ndarray, torch.Tensor)):
        if value.ndim != 1:
            raise SteerError(f"{what} must be a list of numbers; got an array of shape "
                             f"{tuple(value.shape)}.", what)  # fmt: skip
        value = list(value)
    elif isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SteerError(f"{what} must be a list of numbers; got {type(value).__name__} "
                         f"{value!r:.60}.", what)  # fmt: skip
    if not len(value):
        raise SteerError(f"{what} is empty: give at least one number.", what)
    out = []
    for i, item in enumerate(value):
        number = as_real(item)
        if number is None:
            raise SteerError(f"{what} must be finite real numbers; got {_short(item)} at "
                             f"[{i}].", what)  # fmt: skip
        out.append(number)
    return out


def _short(value: object) -> str:
    """A value's repr, cut to 60 characters (an int of 400 digits, a long string)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def without_noise(value: float) -> float:
    """``value`` rounded to 15 significant digits: what a product or a slider's step adds in
    its last bits (``0.1 * 3``, ``8.000000000000004``) goes; every number of 15 digits or
    fewer, as people type them, stays exactly as it is.

    Used where an alpha is composed (scale x alpha, alpha x alpha, a slider's value), so the
    alpha that steers is the one that is shown and exported.

    >>> without_noise(0.1 * 3), without_noise(8.000000000000004), without_noise(1 / 3)
    (0.3, 8.0, 0.333333333333333)
    """
    return float(f"{value:.15g}")


def list_of(value: object, what: str) -> list:
    """``value`` as a list, where a list is meant: a list, tuple or other sequence (a range
    included). A bare string is refused by name, since ``list("abc")`` would split it into
    characters; so is anything that is not a sequence (a set, a dict, a number).

    >>> list_of(("a", "b"), "prompts")
    ['a', 'b']
    >>> list_of("blocks.1.hook_resid_post", "sites")
    Traceback (most recent call last):
    ...
    steerlab.core.errors.SteerError: sites must be a list; got the string 'blocks.1.hook_resid_post' (write ['blocks.1.hook_resid_post'] for one).
    """
    if isinstance(value, (str, bytes)):
        raise SteerError(f"{what} must be a list; got the string {value!r:.80} (write "
                         f"[{value!r:.80}] for one).", what)  # fmt: skip
    if not isinstance(value, Sequence):
        raise SteerError(f"{what} must be a list; got {type(value).__name__} {value!r:.60}.",
                         what)  # fmt: skip
    return list(value)


def as_flag(value: object) -> bool | None:
    """``value`` as a plain bool when it is ``True`` or ``False`` (numpy's ``bool_`` and a 0-d
    bool tensor too), else None: a string ("no", "yes") or a number (1, 0) is never read by
    its truth value, since ``bool("no")`` is True.

    >>> as_flag(True), as_flag(np.bool_(False)), as_flag(torch.tensor(True)), as_flag("no"), as_flag(1)
    (True, False, True, None, None)
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype == torch.bool:
        return bool(value)
    return None


def flag(value: object, what: str) -> bool:
    """``value`` as a plain bool, or a ``SteerError`` naming ``what``: THE rule for every
    boolean option (``chat``, ``use_cache``, ``suppress`` ...), ``as_flag``'s.

    >>> flag(False, "chat")
    False
    >>> flag("no", "chat")
    Traceback (most recent call last):
    ...
    steerlab.core.errors.SteerError: chat must be True or False; got the str 'no'.
    """
    read = as_flag(value)
    if read is None:
        raise SteerError(f"{what} must be True or False; got the {type(value).__name__} "
                         f"{value!r:.60}.", what)  # fmt: skip
    return read
