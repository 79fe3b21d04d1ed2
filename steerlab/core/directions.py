"""From a vector to a direction at a site: THE rule every steer, condition and monitor uses."""

from __future__ import annotations

from typing import Protocol

import torch

from steerlab.core.errors import SteerError


class DirectionSource(Protocol):
    """A vector with a direction per site and a scale, such as a ``SteeringVector``."""

    @property
    def scale(self) -> float: ...

    @property
    def sites(self) -> list[str]: ...

    def direction_at(self, site: str) -> torch.Tensor: ...


def direction_of(vector: torch.Tensor | DirectionSource, site: str) -> tuple[torch.Tensor, float]:
    """The one rule from a vector to a steer: ``(direction at site, scale)``.

    A ``SteeringVector``'s scale always goes to alpha and never into the direction, so an
    Ablate, Clamp or Cap sees the same direction whatever the vector's scale; a tensor has
    scale 1.
    """
    if isinstance(vector, torch.Tensor):
        return vector, 1.0
    if hasattr(vector, "direction_at") and hasattr(vector, "scale"):
        return vector.direction_at(site), float(vector.scale)
    raise SteerError(
        f"vector must be a torch.Tensor or a SteeringVector, got {type(vector).__name__}"
        " (for a numpy array: torch.as_tensor(array, dtype=torch.float32))."
    )
