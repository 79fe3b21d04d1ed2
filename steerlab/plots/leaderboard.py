"""The benchmark's leaderboard: each method's mean test score over concepts, with its
interval, and each concept's own score beside it."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from steerlab.plots.theme import PALETTE, apply

_DEGENERATE = "x"  # a concept's marker where most of the cell's texts are one text or empty


def leaderboard(result: Any, *, title: str | None = None) -> go.Figure:
    """Horizontal bars, best method on top: the mean test score over concepts (0-2) with
    its bootstrap interval, and a marker per concept at that concept's test score. A cell
    marked degenerate (most texts empty or one and the same) is drawn as a cross, and its
    method's bar says how many.

    Args:
        result: a ``BenchmarkResult`` (its ``leaderboard`` and ``table``).
        title: the figure's title.

    >>> from types import SimpleNamespace as NS
    >>> board = [{"method": "prompt", "score": 1.5, "low": 1.2, "high": 1.8, "concepts": 1}]
    >>> table = [{"method": "prompt", "concept": "the sea", "score": 1.5, "factor": 1.0}]
    >>> fig = leaderboard(NS(leaderboard=board, table=table))
    >>> list(fig.data[0].y), list(fig.data[0].x)
    (['prompt'], [1.5])
    """
    board = [r for r in result.leaderboard if _finite(r["score"])][::-1]  # best at the top
    if not board:
        raise ValueError("The leaderboard has no method with a test score to plot.")
    methods = [r["method"] for r in board]
    fig = go.Figure()
    fig.add_trace(go.Bar(
        y=methods, x=[r["score"] for r in board], orientation="h", name="mean over concepts",
        marker={"color": PALETTE[0], "opacity": 0.75},
        error_x={"type": "data", "symmetric": False, "color": "#333",
                 "array": [_gap(r["high"], r["score"]) for r in board],
                 "arrayminus": [_gap(r["score"], r["low"]) for r in board]},
        hovertemplate="%{y}: %{x:.3f}<extra></extra>",
    ))  # fmt: skip
    concepts = list(dict.fromkeys(r["concept"] for r in result.table))
    for i, concept in enumerate(concepts):
        rows = {r["method"]: r for r in result.table if r["concept"] == concept}
        shown = [m for m in methods if m in rows and _finite(rows[m]["score"])]
        fig.add_trace(go.Scatter(
            y=shown, x=[rows[m]["score"] for m in shown], mode="markers", name=concept,
            cliponaxis=False,
            marker={"color": PALETTE[(i + 1) % len(PALETTE)], "size": 10,
                    "symbol": [_DEGENERATE if rows[m].get("degenerate") else
                               ["circle", "diamond", "square", "triangle-up"][i % 4]
                               for m in shown],
                    "line": {"width": 1, "color": "white"}},
            customdata=[rows[m]["factor"] for m in shown],
            hovertemplate=f"{concept}<br>%{{y}}: %{{x:.3f}} at factor %{{customdata:g}}"
                          "<extra></extra>",
        ))  # fmt: skip
    for row in board:  # cells whose texts are mostly one text (or empty): say so on the bar
        if row.get("degenerate"):
            fig.add_annotation(x=row["score"], y=row["method"], xanchor="left", showarrow=False,
                               text=f" ✕ {row['degenerate']} degenerate", font={"size": 11})  # fmt: skip
    fig.update_layout(
        title=title or "Which steer works: judged score on held-out instructions",
        xaxis={"title": "score (harmonic mean of concept, instruction, fluency; 0-2)",
               "range": [0, 2.05]},
        yaxis={"title": None, "automargin": True},
        legend={"orientation": "h", "yref": "container", "y": 0.02, "x": 0},
        height=120 + 44 * len(methods), margin={"b": 110},
    )  # fmt: skip
    return apply(fig)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _gap(a: float, b: float) -> float:
    return a - b if _finite(a) and _finite(b) else 0.0
