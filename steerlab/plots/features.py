"""SAE features over a prompt's tokens: the top features as a heatmap, one feature as a trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from steerlab.core.scalars import flag
from steerlab.plots._data import display_token, token_ticks
from steerlab.plots._token_heatmap import token_heatmap
from steerlab.plots.theme import PALETTE

if TYPE_CHECKING:
    from steerlab.features import FeatureActivations

BASELINE_COLOUR = "#999999"


def features(
    acts: FeatureActivations,
    *,
    row: int = 0,
    n: int = 10,
    title: str | None = None,
    skip_bos: bool = True,
) -> go.Figure:
    """Heatmap of prompt ``row``'s ``n`` top features: tokens down, features across.

    Features are ranked by their largest activation anywhere in the prompt (largest first);
    each cell is the feature's exact activation at that token. Pads are left out, and so is
    a leading BOS token by default (as the panel's picker does): its features are the
    strongest of almost every prompt and would fill the top ``n``.

    Args:
        acts: from ``features(lm, prompts, sae)``.
        row: which prompt.
        n: how many features (at most the ``k`` kept per token).
        title: figure title; the site and prompt when ``None``.
        skip_bos: leave a leading BOS token out of the ranking and the rows.

    Returns:
        A one-trace heatmap figure; hover shows token, feature and value.

    >>> acts = lm.features("Once upon a time", sl.load_sae("steerlab-tiny-sae"))
    >>> z = sl.plots.features(acts, n=8).data[0].z
    >>> len(z), len(z[0])  # tokens (the BOS left out), features
    (4, 8)
    """
    skip = acts.leading_bos(row) if flag(skip_bos, "skip_bos") else 0
    top = acts.prompt_top(row, n, skip=skip)
    positions = acts.real_positions(row)[skip:]
    labels = [display_token(acts.str_tokens[row][p]) for p in positions]
    z = acts.columns(top)[row, positions].float().cpu()  # [pos, n]
    names = [str(i) for i in top]  # categories, so the ranked order is kept
    fig = token_heatmap(z.tolist(), names, labels, column="feature", colorscale="Viridis", zmin=0)
    default = f"SAE features at {acts.sae.site}" + (
        f" (prompt {row})" if acts.attention_mask.shape[0] > 1 else ""
    )
    fig.update_layout(title_text=default if title is None else title)
    left_out = ", BOS left out" if skip else ""
    fig.update_xaxes(title_text=f"feature (top {len(top)} by peak activation{left_out})",
                     type="category")  # fmt: skip
    return fig


def feature_trace(
    acts: FeatureActivations,
    i: int,
    baseline: FeatureActivations | None = None,
    *,
    row: int = 0,
    title: str | None = None,
) -> go.Figure:
    """Feature ``i``'s activation at each token of prompt ``row``; with ``baseline``, both.

    With a baseline (say the same text unsteered, ``acts`` steered) the two traces sit one
    above the other, baseline on top, on one activation scale, each under its own tokens.
    Each panel is named in its y axis title, not above it, where the rotated token labels
    of the panel above would print over its name. When both have the same tokens (the same
    text, steered and not) the labels are written once, under the lower panel; otherwise
    each panel has its own, with room between them.

    Args:
        acts: the activations to show (the steered ones, when comparing).
        i: the feature.
        baseline: activations to compare with, e.g. ``features(lm, text, sae)`` unsteered.
        row: which prompt, in both.
        title: figure title; the feature and site when ``None``.

    Returns:
        A bar figure: one panel, or two (baseline, steered) sharing the y range.

    >>> sae = sl.load_sae("steerlab-tiny-sae")
    >>> plain = lm.features("Once upon a time", sae)
    >>> steered = lm.features("Once upon a time", sae, steer=sae.feature(13) * 8)
    >>> len(sl.plots.feature_trace(steered, 13, baseline=plain).data)  # baseline, steered
    2
    """
    panels = [("activation", acts, PALETTE[0])]
    if baseline is not None:
        panels = [("baseline", baseline, BASELINE_COLOUR), ("steered", acts, PALETTE[0])]
    traces = []
    for name, source, colour in panels:
        positions = source.real_positions(row)
        labels = [display_token(source.str_tokens[row][p]) for p in positions]
        values = source.feature(i)[row, positions].float().cpu().tolist()
        traces.append((name, labels, values, colour))
    top = max((max(v, default=0.0) for _, _, v, _ in traces), default=0.0) or 1.0
    shared = len(traces) == 2 and traces[0][1] == traces[1][1]
    spacing = 0.08 if shared or len(traces) == 1 else 0.3
    fig = make_subplots(rows=len(traces), cols=1, shared_xaxes=shared, vertical_spacing=spacing)
    for n, (name, labels, values, colour) in enumerate(traces, start=1):
        fig.add_trace(
            go.Bar(
                x=list(range(len(values))), y=values, name=name, marker_color=colour,
                customdata=labels, hovertemplate=f"{name}: token %{{customdata}}<br>%{{y:.3f}}<extra></extra>",
            ),
            row=n, col=1,
        )  # fmt: skip
        ticks = token_ticks(labels, max_ticks=32, max_chars=8)
        if shared and n < len(traces):
            ticks["showticklabels"] = False
        fig.update_xaxes(**ticks, row=n, col=1)
        axis_title = f"{name}<br>activation" if baseline is not None else "activation"
        fig.update_yaxes(title_text=axis_title, range=[0, 1.05 * top], row=n, col=1)
    default = f"feature {i} at {acts.sae.site}"
    fig.update_layout(title_text=default if title is None else title, showlegend=False,
                      height=None if len(traces) == 1 else 560)  # fmt: skip
    fig.update_xaxes(title_text="token", row=len(traces), col=1)
    return fig
