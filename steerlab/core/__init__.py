"""The core: plain values and the rules every engine shares (internal; see ``steerlab``).

Sites, operations, ``Steer`` with its position rule, the request and its wire format,
prompt encoding, rows, results, errors and hook tagging. Nothing here runs a model or
imports an engine, a backend, plotly or ipywidgets.
"""

from steerlab.core.ops import (
    Ablate,
    Add,
    Cap,
    Clamp,
    Operation,
    Rotate,
    SteerError,
    op_from_data,
    op_to_data,
)
from steerlab.core.positions import Positions, position_mask
from steerlab.core.reft import LoReFT
from steerlab.core.steer import Steer

__all__ = [
    "Ablate",
    "Add",
    "Cap",
    "Clamp",
    "LoReFT",
    "Operation",
    "Positions",
    "Rotate",
    "Steer",
    "SteerError",
    "op_from_data",
    "op_to_data",
    "position_mask",
]
