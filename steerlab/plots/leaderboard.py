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
    its bootstrap interval, and a marker per concept at that concept's test score, each
    concept a little above or below the bar's middle so equal scores never hide each other.
    A cell marked degenerate (most texts empty or one and the same) is drawn as a cross, and
    its method's bar says how many.

    Args:
        result: a ``BenchmarkResult`` (its ``leaderboard`` and ``table``).
        title: the figure's title.

    >>> from types import SimpleNamespace as NS
    >>> board = [{"method": "prompt", "score": 1.5, "low": 1.2, "high": 1.8, "concepts": 1}]
    >>> table = [{"method": "prompt", "concept": "the sea", "score": 1.5, "factor": 1.0}]
    >>> fig = leaderboard(NS(leaderboard=board, table=table))
    >>> list(fig.layout.yaxis.ticktext), list(fig.data[0].x)
    (['prompt'], [1.5])
    """
    board = [r for r in result.leaderboard if _finite(r["score"])][::-1]  # best at the top
    if not board:
        raise ValueError("The leaderboard has no method with a test score to plot.")
    methods = [r["method"] for r in board]
    row = {m: float(y) for y, m in enumerate(methods)}  # numeric rows, so markers can dodge
    fig = go.Figure()
    fig.add_trace(go.Bar(
        y=list(row.values()), x=[r["score"] for r in board], orientation="h",
        name="mean over concepts", marker={"color": PALETTE[0], "opacity": 0.75},
        error_x={"type": "data", "symmetric": False, "color": "#333",
                 "array": [_gap(r["high"], r["score"]) for r in board],
                 "arrayminus": [_gap(r["score"], r["low"]) for r in board]},
        customdata=methods, hovertemplate="%{customdata}: %{x:.3f}<extra></extra>",
    ))  # fmt: skip
    concepts = list(dict.fromkeys(r["concept"] for r in result.table))
    for i, concept in enumerate(concepts):
        rows = {r["method"]: r for r in result.table if r["concept"] == concept}
        shown = [m for m in methods if m in rows and _finite(rows[m]["score"])]
        dodge = _dodge(i, len(concepts))
        fig.add_trace(go.Scatter(
            y=[row[m] + dodge for m in shown], x=[rows[m]["score"] for m in shown],
            mode="markers", name=concept, cliponaxis=False,
            marker={"color": PALETTE[(i + 1) % len(PALETTE)], "size": 10,
                    "symbol": [_DEGENERATE if rows[m].get("degenerate") else
                               ["circle", "diamond", "square", "triangle-up"][i % 4]
                               for m in shown],
                    "line": {"width": 1, "color": "white"}},
            customdata=[[m, rows[m]["factor"]] for m in shown],
            hovertemplate=f"{concept}<br>%{{customdata[0]}}: %{{x:.3f}} at factor "
                          "%{customdata[1]:g}<extra></extra>",
        ))  # fmt: skip
    for record in board:  # cells whose texts are mostly one text (or empty): say so on the bar
        if record.get("degenerate"):
            fig.add_annotation(x=record["score"], y=row[record["method"]], xanchor="left",
                               showarrow=False, font={"size": 11},
                               text=f" ✕ {record['degenerate']} degenerate")  # fmt: skip
    fig.update_layout(
        title=title or "Which steer works: judged score on held-out instructions",
        xaxis={"title": "score (harmonic mean of concept, instruction, fluency; 0-2)",
               "range": [0, 2.05]},
        yaxis={"title": None, "automargin": True, "tickvals": list(row.values()),
               "ticktext": methods, "range": [-0.6, len(methods) - 0.4], "zeroline": False},
        legend={"orientation": "h", "yref": "container", "y": 0.02, "x": 0},
        height=120 + 44 * len(methods), margin={"b": 110},
    )  # fmt: skip
    return apply(fig)


def _dodge(i: int, n: int) -> float:
    """Concept ``i`` of ``n``'s offset from its method's row (at most 30% of a row either
    side), so that concepts with equal scores stay side by side, not on top of each other.

    >>> [_dodge(i, 2) for i in range(2)]
    [0.15, -0.15]
    """
    if n < 2:
        return 0.0
    half = min(0.3, 0.15 * (n - 1))
    return round(half - 2 * half * i / (n - 1), 12)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _gap(a: float, b: float) -> float:
    return a - b if _finite(a) and _finite(b) else 0.0
