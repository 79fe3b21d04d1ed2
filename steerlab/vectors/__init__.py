"""Steering vectors: the value (``SteeringVector``), extraction, files and sweeps.

>>> vec = extract(lm, ["I love it"], ["I hate it"], ["blocks.2.hook_resid_pre"])  # doctest: +SKIP
>>> lm.generate("Today", steer=vec * 4)  # doctest: +SKIP
"""

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
    "mean_diff",
    "pca_diff",
    "probe",
    "single_pair",
    "sweep",
]
