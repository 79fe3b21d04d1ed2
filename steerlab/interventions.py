"""Kept for imports written before the steering package: see ``steerlab.steering``."""

from steerlab.steering import (  # noqa: F401
    Ablate,
    Add,
    Clamp,
    Operation,
    Positions,
    Steer,
    SteerError,
    position_mask,
)
