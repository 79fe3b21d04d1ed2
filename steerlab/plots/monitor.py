"""A monitor's trace: the projection a generation read at every new token, row by row."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from steerlab.core.scalars import list_of
from steerlab.plots.theme import PALETTE


def monitor(out: Any, name: str, *, rows: list[int] | None = None,
            title: str | None = None) -> go.Figure:  # fmt: skip
    """Monitor ``name``'s projection at each new token of each row of ``out``.

    Rows without steering (every alpha 0) are the baseline: when the batch has both kinds
    they sit in a left panel beside the steered rows, on one y scale, and a prompt's rows
    share a colour in both. A row whose condition was decided says whether it fired.

    Args:
        out: a ``Generation`` made with ``monitor={name: ...}``.
        name: the monitor.
        rows: which rows (all when None).
        title: figure title; the monitor and its site when None.

    >>> v = torch.ones(128)
    >>> out = lm.generate("Once", sl.Steer("blocks.1.hook_resid_pre", v, [0, 2]),
    ...                   max_new_tokens=4, monitor={"ones": ("blocks.1.hook_resid_pre", v)})
    >>> [panel.name for panel in sl.plots.monitor(out, "ones").data]
    ['row 0 (prompt 0)', 'row 1 (prompt 0, α 2)']
    """
    if name not in out.monitors:
        raise KeyError(f"No monitor named {name!r} in this generation; it has "
                       f"{sorted(out.monitors)}.")  # fmt: skip
    trace = out.monitors[name]
    chosen = list(range(len(out))) if rows is None else list_of(rows, "rows")
    base = [r for r in chosen if not any(out.alphas[r])]
    steered = [r for r in chosen if any(out.alphas[r])]
    panels = [("baseline", base), ("steered", steered)] if base and steered else [("", chosen)]
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[p for p, _ in panels] if len(panels) > 1 else None)  # fmt: skip
    for col, (_, members) in enumerate(panels, start=1):
        for r in members:
            values = [v for v in trace.generated[r].tolist() if not math.isnan(v)]
            fig.add_trace(go.Scatter(
                x=list(range(len(values))), y=values, mode="lines+markers", name=_label(out, r),
                line={"color": PALETTE[out.prompt_index[r] % len(PALETTE)]},
                hovertemplate=f"{_label(out, r)}<br>token %{{x}}: %{{y:.3f}}<extra></extra>",
            ), row=1, col=col)  # fmt: skip
        fig.update_xaxes(title_text="new token", row=1, col=col)
    fig.update_yaxes(title_text=f"{name}: h·v/|v|", row=1, col=1)
    default = f"monitor {name!r} at {trace.site}"
    fig.update_layout(title_text=default if title is None else title)
    return fig


def _label(out: Any, r: int) -> str:
    parts = [f"prompt {out.prompt_index[r]}"]
    if any(out.alphas[r]):
        parts.append("α " + ", ".join(f"{a:g}" for a in out.alphas[r]))
    if out.fired is not None and not math.isnan(float(out.condition_scores[r])):
        parts.append("fired" if bool(out.fired[r]) else "not fired")
    return f"row {r} ({', '.join(parts)})"
