"""What a steerlab model in Inspect AI is given: its ``-M`` arguments, checked before any load.

``inspect eval task.py --model steerlab/steerlab-tiny -M steer=happy.safetensors@4`` and
``sl.evals.inspect_model(lm, steer=vec, alpha=4)`` both come here. ``steer=FILE@ALPHA``
means what a server's ``--preset NAME=FILE@ALPHA`` means (``server/presets.py`` parses and
loads both): a steering vector, or a ``.reft.safetensors`` LoReFT, at that alpha. The
provider itself (``inspect_provider.py``) imports Inspect; this module does not, so
``import steerlab.evals`` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steerlab.core.errors import SteerError
from steerlab.core.rows import as_steers
from steerlab.core.steer import Steer
from steerlab.loading import BACKENDS, load
from steerlab.model import SteerableModel
from steerlab.server.presets import PresetError, load_file, parse_file_alpha, scaled
from steerlab.vectors.vector import SteeringVector

KEYS = ("steer", "alpha", "backend", "device", "dtype", "window_ms", "batch_size", "lm")
DEFAULT_BACKEND = "hf"  # as ``steerlab serve``
DEFAULT_WINDOW_MS = 20.0  # Inspect's samples call from one event loop, a hop apart
DEFAULT_BATCH = 64  # rows per engine call, and Inspect's concurrent calls (max_connections)


class InspectArgError(ValueError):
    """A ``-M`` argument (a model argument) the steerlab provider cannot take."""


@dataclass
class SteerSource:
    """One ``steer`` argument: a file at an alpha, or a value given in-process."""

    alpha: float
    path: str = ""  # FILE@ALPHA
    value: Any = None  # a SteeringVector, a Steer or a list of them

    def load(self, lm: SteerableModel) -> tuple[list[Steer], str]:
        """Its steers on ``lm``, and a line saying what they are (for Inspect's log)."""
        held = load_file(self.path, lm) if self.path else self.value
        steers = scaled(held, self.alpha)
        return steers, _describe(held, self.path, self.alpha)


@dataclass
class ModelArgs:
    """The provider's model arguments, checked."""

    steer: list[SteerSource] = field(default_factory=list)
    backend: str = DEFAULT_BACKEND
    device: str | None = None
    dtype: str | None = None
    window_ms: float = DEFAULT_WINDOW_MS
    batch_size: int = DEFAULT_BATCH
    lm: SteerableModel | None = None

    def model(self, name: str) -> SteerableModel:
        """The model: the one given in-process, else ``name`` loaded (``sl.load``)."""
        if self.lm is not None:
            return self.lm
        return load(name, self.backend, device=self.device, dtype=self.dtype)  # type: ignore[arg-type]


def parse_args(args: dict[str, Any], cli_steers: Sequence[str] = ()) -> ModelArgs:
    """``args`` (Inspect's model_args) checked, every file found, before anything loads.

    ``cli_steers`` are the ``-M steer=`` values of the command line, in order: Inspect keeps
    only the last of a repeated ``-M`` key, so the provider reads them all from the command
    and passes them here; used when the last of them is the ``steer`` received.

    >>> parse_args({"steer": "happy.safetensors@4"})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    InspectArgError: -M steer='happy.safetensors@4': no such file.
    """
    unknown = sorted(set(args) - set(KEYS))
    if unknown:
        raise InspectArgError(f"-M {unknown[0]}: the steerlab provider takes "
                              f"{', '.join(KEYS[:-1])}; got {unknown[0]!r}.")  # fmt: skip
    out = ModelArgs()
    lm = args.get("lm")
    if lm is not None and not isinstance(lm, SteerableModel):
        raise InspectArgError(f"-M lm: a loaded SteerableModel, given in-process "
                              f"(sl.evals.inspect_model); got {type(lm).__name__}.")  # fmt: skip
    out.lm = lm
    backend = args.get("backend", DEFAULT_BACKEND)
    if backend not in BACKENDS:
        raise InspectArgError(f"-M backend={backend!r}: one of {', '.join(BACKENDS)}.")
    if lm is not None and "backend" in args:
        raise InspectArgError("-M backend: the model is already loaded; leave backend out.")
    out.backend = backend
    for key in ("device", "dtype"):
        value = args.get(key)
        if value is not None and not isinstance(value, str):
            raise InspectArgError(f"-M {key}={value!r}: a name, such as 'cpu' or 'bfloat16'.")
        setattr(out, key, value)
    out.window_ms = _number(args, "window_ms", DEFAULT_WINDOW_MS, 0, 10_000)
    batch = _number(args, "batch_size", DEFAULT_BATCH, 1, 4096)
    if batch != int(batch):
        raise InspectArgError(f"-M batch_size={batch!r}: a whole number of rows.")
    out.batch_size = int(batch)
    out.steer = _steers(args.get("steer"), args.get("alpha"), cli_steers)
    return out


def _number(args: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = args.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and low <= value <= high)
    ):
        raise InspectArgError(f"-M {key}={value!r}: a number from {low:g} to {high:g}.")
    return float(value)


def _steers(given: Any, alpha: Any, cli_steers: Sequence[str]) -> list[SteerSource]:
    if given is None:
        if alpha is not None:
            raise InspectArgError("-M alpha: there is no steer to scale.")
        return []
    listed = list(given) if isinstance(given, (list, tuple)) else [given]
    if isinstance(given, str) and cli_steers and cli_steers[-1] == given:
        listed = list(cli_steers)  # -M steer=a@4 -M steer=b@-2: both, not the last alone
    if not listed:
        raise InspectArgError("-M steer: an empty list; leave steer out for none.")
    files = [s for s in listed if isinstance(s, str)]
    if files and len(files) < len(listed):
        raise InspectArgError("-M steer: give files (FILE@ALPHA) or values, not both.")
    if files:
        if alpha is not None:
            raise InspectArgError("-M alpha: a file's alpha is written after it "
                                  "(steer=FILE@ALPHA).")  # fmt: skip
        return [_file(text) for text in files]
    factor = 1.0 if alpha is None else alpha
    if (
        isinstance(factor, bool)
        or not isinstance(factor, (int, float))
        or not math.isfinite(factor)
    ):
        raise InspectArgError(f"-M alpha={alpha!r}: a finite number.")
    for value in listed:
        if not isinstance(value, SteeringVector):
            try:
                as_steers(value)
            except SteerError as error:
                raise InspectArgError(f"-M steer: {error}") from None
    return [SteerSource(float(factor), value=v) for v in listed]


def _file(text: str) -> SteerSource:
    try:
        path, alpha = parse_file_alpha(text, f"-M steer={text!r}")
    except PresetError as error:
        raise InspectArgError(str(error)) from None
    if not Path(path).is_file():
        raise InspectArgError(f"-M steer={text!r}: no such file {path!r}.")
    return SteerSource(alpha, path=path)


def _describe(held: Any, path: str, alpha: float) -> str:
    """``happy.safetensors@4 (sha256 1f2e...)``: the file (or the value) and its alpha."""
    if isinstance(held, SteeringVector):
        what = path or f"SteeringVector({held.provenance.method or 'unknown method'})"
        return f"{what}@{alpha:g} (sha256 {held.sha256[:16]})"
    steers = as_steers(held)
    what = path or " + ".join(f"{type(s.op).__name__} at {s.site}" for s in steers)
    return f"{what}@{alpha:g}"
