"""The steerability trade-off: concept against fluency, one point per alpha, with intervals."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from steerlab.core.scalars import flag
from steerlab.plots.theme import PALETTE, apply

_LABELS = {"concept": "concept score", "judge": "judge score (harmonic mean, 0-2)",
           "instruction": "instruction following (0-2)", "fluency": "judged fluency (0-2)",
           "kl": "KL to unsteered (first token)", "length": "length (tokens)",
           "perplexity": "perplexity under the unsteered model"}  # fmt: skip
_LOG_SPAN = 30.0  # a log x axis once the largest perplexity is this many times the smallest
_LABEL_ROOM = 0.16  # headroom above the highest bar, as a share of the y span: its α label


def steerability_tradeoff(
    summary: Iterable[Mapping[str, Any]], *, y: str = "concept", x: str = "perplexity",
    log_x: bool | None = None, title: str | None = None,
) -> go.Figure:  # fmt: skip
    """``y`` (the concept) against ``x`` (the fluency cost), one point per alpha in alpha
    order, each labelled with its alpha and carrying its intervals as error bars both ways.
    The unsteered point (alpha 0) is ringed.

    Args:
        summary: per-alpha dicts with ``alpha``, ``x``, ``y`` and their ``_low``/``_high``
            bounds, as ``SteerabilityResult.summary`` gives them.
        y, x: the metrics on each axis.
        log_x: log-scale x; by default once x spans 30x (perplexity blows up at large alpha).
        title: the figure's title.

    >>> fig = steerability_tradeoff([{"alpha": 0.0, "concept": 0.5, "perplexity": 3.0},
    ...                              {"alpha": 4.0, "concept": 0.9, "perplexity": 6.0}])
    >>> list(fig.data[0].x), list(fig.data[0].text)
    ([3.0, 6.0], ['α=0', 'α=4'])
    """
    rows = sorted((r for r in summary if _finite(r.get(x)) and _finite(r.get(y))),
                  key=lambda r: r["alpha"])  # fmt: skip
    if not rows:
        raise ValueError(f"No alpha has both {x!r} and {y!r} to plot.")
    xs, ys = [float(r[x]) for r in rows], [float(r[y]) for r in rows]
    if log_x is None:
        log_x = min(xs) > 0 and max(xs) / min(xs) >= _LOG_SPAN
    else:
        log_x = flag(log_x, "log_x")
    colour = PALETTE[0]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="lines+markers+text", name="steered",
        text=[f"α={r['alpha']:g}" for r in rows], textposition="top center", cliponaxis=False,
        line={"color": colour}, marker={"size": 8},
        error_x=_bars(rows, x, colour), error_y=_bars(rows, y, colour),
        hovertemplate=f"%{{text}}<br>{x} %{{x:.3g}}<br>{y} %{{y:.3g}}<extra></extra>",
    ))  # fmt: skip
    base = [r for r in rows if r["alpha"] == 0]
    if base:
        fig.add_trace(go.Scatter(
            x=[float(base[0][x])], y=[float(base[0][y])], mode="markers", name="unsteered",
            marker={"size": 16, "color": "rgba(0,0,0,0)", "line": {"color": PALETTE[1], "width": 2}},
            hoverinfo="skip",
        ))  # fmt: skip
    apply(fig)
    fig.update_layout(
        xaxis_title=_LABELS.get(x, x) + (" (log)" if log_x else ""),
        yaxis_title=_LABELS.get(y, y), xaxis_type="log" if log_x else "linear",
        title=title or "Steerability: concept against fluency per alpha",
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 0, "yanchor": "bottom",
                "yref": "container"},
        yaxis_range=y_range(rows, y), showlegend=True,
    )  # fmt: skip
    return fig


def y_range(rows: list[Mapping[str, Any]], y: str) -> list[float]:
    """The y axis from the lowest interval to the highest, with room above it for the
    ``α=`` labels that sit over each point (plotly sizes an axis to the data alone).

    >>> y_range([{"concept": 0.0}, {"concept": 1.0, "concept_high": 1.0}], "concept")
    [-0.05, 1.16]
    """
    bars = _bars(rows, y, "")
    highs = [float(r[y]) + up for r, up in zip(rows, bars["array"])]
    lows = [float(r[y]) - down for r, down in zip(rows, bars["arrayminus"])]
    top, bottom = max(highs), min(lows)
    span = (top - bottom) or max(abs(top), 1.0)
    return [round(bottom - 0.05 * span, 6), round(top + _LABEL_ROOM * span, 6)]


def steerability(result: Any, *, x: str = "perplexity", y: str | None = None,
                 log_x: bool | None = None) -> go.Figure:  # fmt: skip
    """The trade-off figure of a ``SteerabilityResult``: its headline metric (the concept
    score, or a judge's harmonic mean) against perplexity, with its intervals.

    >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> res = sl.evals.steerability(lm, vec, "Once upon a time", [0, 4], max_new_tokens=8,
    ...                             n_boot=100, progress=False)
    >>> sl.plots.steerability(res).layout.xaxis.title.text
    'perplexity under the unsteered model (log)'
    """
    level = f"{result.level:.0%}"
    return steerability_tradeoff(
        result.summary, y=y or result.headline, x=x, log_x=log_x,
        title=f"Steerability per alpha ({level} bootstrap intervals)",
    )  # fmt: skip


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _bars(rows: list[Mapping[str, Any]], key: str, colour: str) -> dict[str, Any]:
    def gap(r: Mapping[str, Any], side: str) -> float:
        bound = r.get(f"{key}_{side}")
        if not isinstance(bound, (int, float)) or not math.isfinite(bound):
            return 0.0
        return float(bound) - float(r[key]) if side == "high" else float(r[key]) - float(bound)

    return {
        "type": "data",
        "symmetric": False,
        "color": colour,
        "thickness": 1,
        "array": [gap(r, "high") for r in rows],
        "arrayminus": [gap(r, "low") for r in rows],
    }
