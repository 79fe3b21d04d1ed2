"""steerlab's own errors: each a ``ValueError``, raised before any compute."""

from __future__ import annotations

import os
import sys
from types import FrameType


class SteerError(ValueError):
    """A steer that cannot be applied to this model or input; ``field`` names the key of
    the steer's data form at fault, when it was read from data (``steer_from_data``)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SiteError(ValueError):
    """An unknown or out-of-range hook site."""


class FamilyError(ValueError):
    """A model family (HF ``model_type``) that the part of steerlab asked has no facts for,
    or a family record whose facts contradict each other."""


class PromptError(ValueError):
    """Prompts that cannot be run."""


class ContextError(PromptError):
    """A call that would run past the model's context window."""


class SamplingError(ValueError):
    """A decoding setting out of its range; ``field`` names the ``Sampling`` field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ModelMismatchWarning(UserWarning):
    """A direction made on one model (a vector, an SAE feature) used on another."""


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first line outside steerlab, the
    user's, however deep inside steerlab it is raised: ``warnings.warn(message, category,
    stacklevel=user_stacklevel())``.

    >>> user_stacklevel()  # called from outside steerlab: the caller's own line
    1
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame: FrameType | None = sys._getframe(1)  # the function that warns: level 1
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


class NonFiniteError(FloatingPointError):
    """A step whose logits hold NaN or inf; the message names the setting that made them."""
