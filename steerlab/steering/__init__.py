"""Steering: what a steer is (``Steer``, operations as data) and applying it to a forward."""

from steerlab.steering.ops import (
    Ablate,
    Add,
    Clamp,
    Operation,
    SteerError,
    op_from_data,
    op_to_data,
)
from steerlab.steering.steer import Positions, Steer, position_mask

__all__ = [
    "Ablate",
    "Add",
    "Clamp",
    "Operation",
    "Positions",
    "Steer",
    "SteerError",
    "op_from_data",
    "op_to_data",
    "position_mask",
]
