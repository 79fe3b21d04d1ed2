"""Notebook widgets: the live steering panel.

Imported lazily (``sl.SteeringPanel``): this package pulls in ipywidgets and plotly,
which the core never imports.
"""

from steerlab.widgets.debounce import Debouncer
from steerlab.widgets.panel import SteeringPanel
from steerlab.widgets.runner import PanelRequest

__all__ = ["Debouncer", "PanelRequest", "SteeringPanel"]
