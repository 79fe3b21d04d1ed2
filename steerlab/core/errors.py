"""steerlab's own errors: each a ``ValueError``, raised before any compute."""

from __future__ import annotations


class SteerError(ValueError):
    """A steer that cannot be applied to this model or input; ``field`` names the key of
    the steer's data form at fault, when it was read from data (``steer_from_data``)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SiteError(ValueError):
    """An unknown or out-of-range hook site."""


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


class NonFiniteError(FloatingPointError):
    """A step whose logits hold NaN or inf; the message names the setting that made them."""
