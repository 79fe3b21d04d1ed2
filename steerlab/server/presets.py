"""Steering presets: a model name that stands for the served model steered by one vector.

``steerlab serve MODEL --preset calm=calm.safetensors@4`` serves ``calm`` beside ``MODEL``.
A request whose ``model`` is ``calm`` runs exactly as if its ``steering`` field began with
that vector at alpha 4: how a harness that cannot send extra fields (lm-eval's scoring
path) evaluates a steered model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from steerlab.core.rows import as_steers
from steerlab.core.steer import Steer, at_alphas
from steerlab.vectors.vector import SteeringVector

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")


class PresetError(ValueError):
    """A ``--preset`` that cannot be served."""


@dataclass(frozen=True)
class Preset:
    """``vector`` at ``alpha``, served under ``name``.

    ``vector`` is a steering vector (every site, its scale included), or a ``Steer`` or a
    list of them (any op), whose alphas ``alpha`` multiplies.
    """

    name: str
    vector: SteeringVector | Steer | Sequence[Steer]
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise PresetError(f"Preset name {self.name!r}: 1-64 letters, digits, '_', '.', "
                              "':' or '-'.")  # fmt: skip
        if not math.isfinite(self.alpha):
            raise PresetError(f"Preset {self.name!r}: alpha must be finite.")
        if not self.steers():
            raise PresetError(f"Preset {self.name!r} has no steer.")

    def steers(self) -> list[Steer]:
        """The steers a ``steering`` entry naming this vector at this alpha gives."""
        if isinstance(self.vector, SteeringVector):
            return self.vector.steers(self.alpha)
        return at_alphas(as_steers(self.vector), [self.alpha])

    @property
    def sites(self) -> list[str]:
        return [s.site for s in self.steers()]


def check_names(served: str, names: Sequence[str]) -> None:
    """Each preset name is given once, and none is the served model's own name.

    >>> check_names("steerlab-tiny", ["calm", "happy"])  # fine
    >>> check_names("steerlab-tiny", ["calm", "calm"])  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    PresetError: Preset 'calm' is given twice: preset names must differ from each other.
    """
    seen: set[str] = set()
    for name in names:
        if name == served:
            raise PresetError(f"Preset {name!r} is the served model's own name: preset names "
                              "must differ from the model's.")  # fmt: skip
        if name in seen:
            raise PresetError(f"Preset {name!r} is given twice: preset names must differ from "
                              "each other.")  # fmt: skip
        seen.add(name)


def parse_preset(text: str) -> tuple[str, str, float]:
    """``NAME=VECTOR_FILE@ALPHA`` as ``(name, path, alpha)``.

    >>> parse_preset("calm=vectors/calm.safetensors@-4")
    ('calm', 'vectors/calm.safetensors', -4.0)
    """
    name, eq, rest = text.partition("=")
    path, at, alpha = rest.rpartition("@")
    if not eq or not at or not path:
        raise PresetError(f"--preset {text!r}: write NAME=VECTOR_FILE@ALPHA.")
    if not _NAME.match(name):
        raise PresetError(f"--preset {text!r}: a name is 1-64 letters, digits, '_', '.', ':' "
                          "or '-'.")  # fmt: skip
    try:
        value = float(alpha)
    except ValueError:
        raise PresetError(f"--preset {text!r}: ALPHA must be a number; got {alpha!r}.") from None
    if not math.isfinite(value):
        raise PresetError(f"--preset {text!r}: ALPHA must be finite.")
    return name, path, value
