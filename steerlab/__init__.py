"""steerlab: a Jupyter-first toolkit for steering language models.

The core (loading, steering, generation, vectors) never imports plotly or ipywidgets;
``sl.plots``, ``sl.export`` and ``sl.SteeringPanel`` load them on first use.

>>> import steerlab as sl
>>> lm = sl.load("steerlab-tiny")
>>> lm.generate("Once upon a time", max_new_tokens=5).text
[', there was a little']
"""

from importlib import import_module as _import_module
from typing import Any as _Any

from steerlab import stats
from steerlab._version import __version__ as __version__
from steerlab.amplify import amplify
from steerlab.backends.parity import ParityError, ParityWarning
from steerlab.backends.tl import CoordinatesWarning
from steerlab.chat import ChatSession
from steerlab.core import Ablate, Add, Cap, Clamp, LoReFT, Rotate, Steer, SteerError
from steerlab.core.activations import Activations
from steerlab.core.monitors import Monitor
from steerlab.core.reads import Condition, all_of, any_of
from steerlab.core.results import Generation, MonitorTrace, Step
from steerlab.core.sites import SiteError
from steerlab.features import SAE, FeatureActivations, load_sae
from steerlab.loading import load, wrap
from steerlab.model import SteerableModel
from steerlab.vectors import (
    SteeringVector,
    SweepResult,
    VectorFileError,
    extract,
    find_condition,
    mean_diff,
    pca_diff,
    probe,
    single_pair,
    sweep,
)

# Notebook-layer names, imported on first access so `import steerlab` stays light.
_LAZY = {
    "plots": ("steerlab.plots", None),
    "train": ("steerlab.train", None),
    "Preference": ("steerlab.train", "Preference"),
    "Example": ("steerlab.train", "Example"),
    "evals": ("steerlab.evals", None),
    "export": ("steerlab.exporting", "export"),
    "use_paper_theme": ("steerlab.plots", "use_paper_theme"),
    "export_button": ("steerlab.exporting", "export_button"),
    "SteeringPanel": ("steerlab.widgets", "SteeringPanel"),
    "connect": ("steerlab.client", "connect"),
    "ChatPanel": ("steerlab.widgets.chat_panel", "ChatPanel"),
}


def __getattr__(name: str) -> _Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'steerlab' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = _import_module(module_name)
    return module if attribute is None else getattr(module, attribute)


def __dir__() -> list[str]:
    """The public names, lazy ones included, so ``sl.exp<TAB>`` completes to ``export``."""
    return sorted([*__all__, "__version__"])


__all__ = [
    "SAE",
    "Ablate",
    "Activations",
    "Add",
    "Cap",
    "ChatSession",
    "Clamp",
    "Condition",
    "CoordinatesWarning",
    "FeatureActivations",
    "Generation",
    "LoReFT",
    "Monitor",
    "MonitorTrace",
    "ParityError",
    "ParityWarning",
    "Rotate",
    "SiteError",
    "Steer",
    "SteerError",
    "SteerableModel",
    "SteeringVector",
    "Step",
    "SweepResult",
    "VectorFileError",
    "all_of",
    "amplify",
    "any_of",
    "extract",
    "find_condition",
    "load_sae",
    "load",
    "mean_diff",
    "pca_diff",
    "probe",
    "single_pair",
    "stats",
    "sweep",
    "wrap",
    *_LAZY,
]
