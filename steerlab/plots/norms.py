"""Residual-stream norms: mean L2 norm per layer, and per token for one row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from steerlab.plots import _data
from steerlab.plots.theme import PALETTE


def mean_norms(
    cache: Mapping[str, torch.Tensor], kind: str, mask: torch.Tensor | None = None
) -> tuple[list[int], list[float]]:
    """Layers and mean L2 norm over real tokens of every row, for one site kind.

    >>> acts = {"blocks.0.hook_resid_pre": torch.ones(1, 2, 4)}
    >>> mean_norms(acts, "resid_pre")
    ([0], [2.0])
    """
    layers, norms = [], []
    for site in _data.sites_of_kind(cache, kind):
        acts = _data.activation(cache, site.name)  # [batch, pos, d_model]
        real = _data.cache_mask(cache, mask, *acts.shape[:2])
        layers.append(site.layer)
        norms.append(acts.norm(dim=-1)[real].mean().item())
    return layers, norms


def _row_norms(
    cache: Mapping[str, torch.Tensor], kind: str, row: int, positions: list[int]
) -> tuple[list[int], list[list[float]]]:
    """Layers and the ``[layer, position]`` L2 norms of one row at the kept positions."""
    sites = _data.sites_of_kind(cache, kind)
    rows = [_data.activation(cache, s.name)[row, positions].norm(dim=-1).tolist() for s in sites]
    return [s.layer for s in sites], rows


def residual_norms(
    cache: Mapping[str, torch.Tensor],
    *,
    steered: Mapping[str, torch.Tensor] | None = None,
    row: int = 0,
    heatmap_kind: str = "resid_post",
    tokens: Sequence[Sequence[str]] | None = None,
    mask: torch.Tensor | None = None,
) -> go.Figure:
    """Mean residual norm per layer (one line per site kind) beside a layers × tokens heatmap.

    With ``steered``, the steered norms are overlaid as dashed lines and the heatmap shows
    steered minus baseline. Padded positions (mask 0) are left out of means and heatmap.

    Args:
        cache: Site name -> ``[batch, pos, d_model]`` activations, e.g. ``blocks.2.hook_resid_pre``.
        steered: A second cache of the same prompts and shapes, run with steering.
        row: Which batch row the heatmap shows.
        heatmap_kind: Site kind for the heatmap; the last kind in the cache if absent.
        tokens: Token strings per row; defaults to ``cache.str_tokens`` when present.
        mask: ``[batch, pos]`` with 1 for real tokens; defaults to ``cache.attention_mask``.

    Returns:
        A figure with a line chart (left) and a heatmap (right).

    >>> acts = {f"blocks.{L}.hook_resid_post": torch.randn(1, 3, 8) for L in range(2)}
    >>> residual_norms(acts).data[0].name
    'resid_post'
    """
    kinds = _data.resid_kinds(cache)
    if not kinds:
        raise ValueError(f"no blocks.{{L}}.hook_resid_* sites in cache: {sorted(cache)}")
    if heatmap_kind not in kinds:
        heatmap_kind = kinds[-1]
    first = _data.activation(cache, _data.sites_of_kind(cache, kinds[0])[0].name)
    real = _data.cache_mask(cache, mask, *first.shape[:2])
    positions = _data.real_positions(real, row)
    labels = _data.row_labels(_data.cache_tokens(cache, tokens), row, positions)

    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.4, 0.6],
        horizontal_spacing=0.14,
        subplot_titles=(
            "mean ‖x‖₂ per layer",
            f"{heatmap_kind}: {'‖steered‖ − ‖baseline‖' if steered is not None else '‖x‖₂'}"
            + (f" (prompt {row})" if real.shape[0] > 1 else ""),
        ),
    )
    for i, kind in enumerate(kinds):
        colour = {"color": _line_colour(i)}
        layers, norms = mean_norms(cache, kind, real)
        fig.add_trace(go.Scatter(x=layers, y=norms, name=kind, line=colour), row=1, col=1)
        if steered is not None:
            layers, norms = mean_norms(steered, kind, real)
            dashed = {**colour, "dash": "dash"}
            fig.add_trace(
                go.Scatter(x=layers, y=norms, name=f"{kind} (steered)", line=dashed), row=1, col=1
            )

    layers, z = _row_norms(cache, heatmap_kind, row, positions)
    if steered is not None:
        _, z_steered = _row_norms(steered, heatmap_kind, row, positions)
        z = (torch.tensor(z_steered) - torch.tensor(z)).tolist()
    add_norm_heatmap(fig, layers, z, labels, difference=steered is not None)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="mean ‖x‖₂ over tokens", row=1, col=1)
    legend_below(fig)
    return fig


def add_norm_heatmap(
    fig: go.Figure,
    layers: list[int],
    z: list[list[float]],
    labels: list[str],
    *,
    difference: bool,
    no_difference: str = "no difference: steered = baseline",
    blank: bool | None = None,
    max_ticks: int = 24,
    col: int = 2,
) -> None:
    """Draw a layers × tokens norm heatmap in subplot ``(1, col)`` of ``fig``, in place.

    A difference that is exactly zero everywhere (alpha 0, or a steer on positions that
    are not shown) is not drawn as a blank box with a meaningless colour bar: the trace is
    hidden and the subplot says ``no_difference`` instead (``blank=True`` forces this, for a
    caller that knows, such as alpha 0 in a batch whose rows differ by rounding only). The
    trace is always there, with
    ``visible`` and ``showscale`` set, so that a live figure can update it in place.

    >>> fig = make_subplots(rows=1, cols=2)
    >>> add_norm_heatmap(fig, [0], [[0.0]], ["a"], difference=True)
    >>> fig.layout.annotations[-1].text
    'no difference: steered = baseline'
    """
    if blank is None:
        blank = difference and all(v == 0 for row in z for v in row)
    heat = go.Heatmap(
        z=z,
        x=list(range(len(labels))),
        y=layers,
        colorscale="RdBu_r" if difference else "Viridis",
        zmid=0 if difference else None,
        colorbar={"title": {"text": "Δ‖x‖₂" if difference else "‖x‖₂"}, "len": 0.8},
        customdata=[labels] * len(layers),
        hovertemplate="layer %{y}, token %{customdata}<br>%{z:.3f}<extra></extra>",
        visible=not blank,
        showscale=not blank,
    )
    fig.add_trace(heat, row=1, col=col)
    fig.update_xaxes(
        title_text="token",
        visible=not blank,
        **_data.token_ticks(labels, max_ticks),
        row=1,
        col=col,
    )
    fig.update_yaxes(title_text="layer", dtick=1, visible=not blank, row=1, col=col)
    if blank:
        axis = fig.layout[f"xaxis{col}" if col > 1 else "xaxis"]
        fig.add_annotation(
            text=no_difference,
            x=sum(axis.domain) / 2,
            y=0.5,
            xref="paper",
            yref="paper",
            xanchor="center",
            showarrow=False,
            font={"color": "#555555"},
            name="no-difference",
        )


def legend_below(fig: go.Figure) -> None:
    """A horizontal legend under the plots, clear of the x-axis titles at any height.

    The legend sits at the bottom of the figure (container coordinates) and plotly grows the
    bottom margin to fit it, so it never lands on an axis title.
    """
    fig.update_layout(
        legend={
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
        },
        margin={"b": 100},
    )


def _line_colour(i: int) -> str:
    # Fixed, so that the baseline and steered lines of one kind share a colour under any template.
    return PALETTE[i % len(PALETTE)]
