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
from typing import TYPE_CHECKING

from steerlab.core.reft import LoReFT
from steerlab.core.rows import as_steers
from steerlab.core.steer import Steer, at_alphas
from steerlab.vectors.vector import SteeringVector

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

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
        return scaled(self.vector, self.alpha)

    @property
    def sites(self) -> list[str]:
        return [s.site for s in self.steers()]


def scaled(vector: SteeringVector | Steer | Sequence[Steer], alpha: float) -> list[Steer]:
    """``vector`` at ``alpha``: a steering vector's steers at that alpha (its scale
    included), or each steer's alphas multiplied by it.

    >>> [s.alpha for s in scaled(Steer("blocks.1.hook_resid_pre", torch.ones(4), alpha=2), 3)]
    [(6.0,)]
    """
    if isinstance(vector, SteeringVector):
        return vector.steers(alpha)
    return at_alphas(as_steers(vector), [alpha])


def load_file(path: str, lm: SteerableModel) -> SteeringVector | list[Steer]:
    """What a ``VECTOR_FILE`` holds, checked against ``lm``: a LoReFT's steers for a
    ``.reft.safetensors`` file, else a steering vector (safetensors or ``.gguf``)."""
    if path.endswith(".reft.safetensors"):
        return LoReFT.load(path, model=lm).steers()
    return SteeringVector.load(path, model=lm)


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
    where = f"--preset {text!r}"
    name, eq, rest = text.partition("=")
    if not eq:
        raise PresetError(f"{where}: write NAME=VECTOR_FILE@ALPHA.")
    path, value = parse_file_alpha(rest, where, form="NAME=VECTOR_FILE@ALPHA")
    if not _NAME.match(name):
        raise PresetError(f"{where}: a name is 1-64 letters, digits, '_', '.', ':' or '-'.")
    return name, path, value


def parse_file_alpha(text: str, where: str, form: str = "VECTOR_FILE@ALPHA") -> tuple[str, float]:
    """``VECTOR_FILE@ALPHA`` as ``(path, alpha)``: the file is everything before the last
    ``@`` (a path may hold one), the alpha a finite number. ``where`` names the argument in
    the error (``--preset 'calm=...'``, ``-M steer='...'``); ``form`` is what to write.

    >>> parse_file_alpha("dir/v@x.safetensors@-2.5", "-M steer")
    ('dir/v@x.safetensors', -2.5)
    """
    path, at, alpha = text.rpartition("@")
    if not at or not path:
        raise PresetError(f"{where}: write {form}.")
    try:
        value = float(alpha)
    except ValueError:
        raise PresetError(f"{where}: ALPHA must be a number; got {alpha!r}.") from None
    if not math.isfinite(value):
        raise PresetError(f"{where}: ALPHA must be finite.")
    return path, value
