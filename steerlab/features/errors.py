"""The errors of ``steerlab.features``: a bad SAE folder, config, input or index."""

from __future__ import annotations

from steerlab.core.scalars import as_int


class SAEError(ValueError):
    """An SAE steerlab cannot read or use: a missing file, an unsupported config, a bad index.

    Raised before any compute, with the file, key or value that is wrong in the message.
    """


class SAEUnavailableError(ImportError, SAEError):
    """An SAE that needs something this environment lacks: sae-lens, or a reachable hub."""


def int_in(value: object, what: str, low: int, high: int, hint: str = "") -> int:
    """``value`` as a plain int in ``[low, high]`` (numpy ints and 0-d tensors too).

    Raises:
        SAEError: a float, a bool, or an int out of range, naming ``what``.

    >>> import numpy as np
    >>> int_in(np.int64(3), "top(k)", 1, 16)
    3
    """
    number = as_int(value)
    if number is None:
        raise SAEError(f"{what} must be an int in [{low}, {high}]{hint}; got {value!r}.")
    if not low <= number <= high:
        raise SAEError(f"{what} {number} is out of range [{low}, {high}]{hint}.")
    return number
