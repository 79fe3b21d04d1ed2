"""steerlab: a Jupyter-first toolkit for steering language models.

>>> import steerlab as sl
>>> lm = sl.load("steerlab-tiny")  # doctest: +SKIP
"""

from steerlab.activations import Activations
from steerlab.generation.result import Generation, Step
from steerlab.interventions import Ablate, Add, Clamp, Steer, SteerError
from steerlab.loading import load, wrap
from steerlab.model import SteerableModel
from steerlab.sites import SiteError

__version__ = "0.1.0"

__all__ = [
    "Ablate",
    "Activations",
    "Add",
    "Clamp",
    "Generation",
    "SiteError",
    "Steer",
    "SteerError",
    "SteerableModel",
    "Step",
    "load",
    "wrap",
]
