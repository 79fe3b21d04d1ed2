"""What a chat session's cache saved, turn by turn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from steerlab.plots.theme import PALETTE


def session_stats(stats: object, *, title: str = "Tokens per turn") -> go.Figure:
    """Stacked bars per turn: tokens fed (prefilled) and tokens reused from the cache.

    Args:
        stats: ``chat.stats`` (anything with ``to_dict()``), or its columns as a mapping.
        title: the figure's title.

    >>> chat = lm.chat()
    >>> _ = chat.say("Hi!", max_new_tokens=4)
    >>> [trace.name for trace in session_stats(chat.stats).data]
    ['reused from cache', 'prefilled', 'generated']
    """
    columns: Mapping[str, Sequence] = stats.to_dict() if hasattr(stats, "to_dict") else stats  # type: ignore[assignment]
    turns = [f"turn {t}" if t else "system" for t in columns["turn"]]
    fig = go.Figure()
    fig.add_bar(x=turns, y=list(columns["reused"]), name="reused from cache",
                marker_color=PALETTE[0])  # fmt: skip
    fig.add_bar(x=turns, y=list(columns["prefilled"]), name="prefilled", marker_color=PALETTE[1])
    fig.add_bar(x=turns, y=list(columns["generated"]), name="generated", marker_color=PALETTE[2])
    fig.update_layout(
        barmode="stack", title=title, yaxis_title="tokens", legend_traceorder="normal"
    )
    return fig
