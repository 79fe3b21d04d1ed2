"""From a vector to a direction at a site: THE rule every steer, condition and monitor uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from steerlab.core.errors import SteerError
from steerlab.core.sites import resolve


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


def check_read_direction(site: str, direction: torch.Tensor, sites: Sequence[str], d_model: int,
                         what: str, field: str) -> None:  # fmt: skip
    """A condition's or a monitor's direction against a model: ``site`` is one of its
    ``sites`` and ``direction`` is ``[d_model]`` (``what`` names the direction in the
    error, ``field`` the request field to blame).

    >>> check_read_direction("blocks.0.hook_resid_post", torch.ones(3), ["blocks.0.hook_resid_post"], 4, "Monitor 'm'", "monitor")
    Traceback (most recent call last):
    steerlab.core.errors.SteerError: Monitor 'm' has 3 values; this model has d_model=4.
    """
    resolve(site, list(sites))
    width = direction.shape[0]
    if width != d_model:
        raise SteerError(f"{what} has {width} values; this model has d_model={d_model}.", field)


def read_wire_form(fields: dict[str, Any]) -> dict[str, Any]:
    """A condition's or a monitor's fields (``fields_data``) as they travel: the direction
    under the key ``"vector"``, as a steer's."""
    fields["vector"] = fields.pop("direction")
    return fields
