"""A prompt's tokens down, named columns across: the heatmap the activation and SAE-feature
figures share, with the token and the column in every cell's hover."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from steerlab.plots._data import token_ticks


def token_heatmap(z: list[list[float]], columns: Sequence[int | str], labels: Sequence[str], *,
                  column: str, colorscale: str, **zrange: float) -> go.Figure:  # fmt: skip
    """A one-trace figure of ``z [tokens, columns]``, the first token at the top.

    ``column`` names a column in the hover (``"dim"``, ``"feature"``); ``zrange`` holds
    plotly's ``zmid`` / ``zmin``. Callers set the title and the x axis.

    >>> fig = token_heatmap([[1.0, 2.0]], ["3", "7"], ["a"], column="dim", colorscale="Viridis")
    >>> fig.data[0].hovertemplate
    'token %{customdata}, dim %{x}<br>%{z:.3f}<extra></extra>'
    """
    heat = go.Heatmap(
        z=z,
        x=columns,
        y=list(range(len(labels))),
        colorscale=colorscale,
        **zrange,
        colorbar={"title": {"text": "activation"}},
        customdata=[[label] * len(columns) for label in labels],
        hovertemplate=f"token %{{customdata}}, {column} %{{x}}<br>%{{z:.3f}}<extra></extra>",
    )
    fig = go.Figure(heat)
    ticks = {**token_ticks(list(labels), max_ticks=32, max_chars=10), "tickangle": 0}
    fig.update_yaxes(title_text="token", autorange="reversed", **ticks)  # read top to bottom
    return fig
