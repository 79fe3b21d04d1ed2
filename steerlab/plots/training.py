"""A training run's curves: the loss per step, and the held-out loss per epoch if given."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from steerlab.plots.theme import PALETTE, apply


def training(history: Any, *, title: str | None = None) -> go.Figure:
    """The loss after each optimizer step, with the held-out loss (where ``sl.train`` was
    given held-out data) as markers at the step each epoch ended.

    Args:
        history: an ``sl.train`` ``History`` (anything with ``loss``, ``held_out`` and
            ``method``).
        title: the figure's title; by default the method's.

    >>> from steerlab.train import History
    >>> fig = training(History("reft", loss=[3.0, 2.0, 1.5], held_out=[(3, 1.8)]))
    >>> [list(t.y) for t in fig.data]
    [[3.0, 2.0, 1.5], [1.8]]
    """
    loss = [float(x) for x in history.loss]
    if not loss:
        raise ValueError("This history has no steps to plot.")
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=list(range(1, len(loss) + 1)), y=loss, mode="lines", name="training loss",
        line={"color": PALETTE[0]}, hovertemplate="step %{x}<br>loss %{y:.4g}<extra></extra>",
    ))  # fmt: skip
    if history.held_out:
        steps, values = zip(*history.held_out)
        fig.add_trace(go.Scatter(
            x=list(steps), y=[float(v) for v in values], mode="lines+markers",
            name="held-out loss", line={"color": PALETTE[1], "dash": "dot"},
            hovertemplate="step %{x}<br>held-out %{y:.4g}<extra></extra>",
        ))  # fmt: skip
    fig.update_layout(title=title or f"{history.method} training", xaxis_title="step",
                      yaxis_title="loss")  # fmt: skip
    return apply(fig)
