"""Steering vectors: the value (``SteeringVector``), extraction, files and sweeps.

>>> vec = extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
>>> lm.generate("Once upon a time", steer=vec * 4, max_new_tokens=8).text
[', there was a happy joy. The']
"""

from steerlab.vectors.conditions import FoundCondition, find_condition
from steerlab.vectors.extract import extract
from steerlab.vectors.io import VectorFileError
from steerlab.vectors.methods import (
    MeanDiff,
    Method,
    PCADiff,
    Probe,
    SinglePair,
    mean_diff,
    pca_diff,
    probe,
    single_pair,
)
from steerlab.vectors.sweep import SweepResult, sweep
from steerlab.vectors.vector import Provenance, SteeringVector

__all__ = [
    "FoundCondition",
    "MeanDiff",
    "Method",
    "PCADiff",
    "Probe",
    "Provenance",
    "SinglePair",
    "SteeringVector",
    "SweepResult",
    "VectorFileError",
    "extract",
    "find_condition",
    "mean_diff",
    "pca_diff",
    "probe",
    "single_pair",
    "sweep",
]
