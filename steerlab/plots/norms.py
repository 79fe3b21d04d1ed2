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

    heat_title = "‖steered‖ − ‖baseline‖" if steered is not None else "‖x‖₂"
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.4, 0.6],
        horizontal_spacing=0.12,
        subplot_titles=("mean L2 norm per layer", f"{heatmap_kind} {heat_title}, row {row}"),
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
    heat = go.Heatmap(
        z=z,
        x=list(range(len(positions))),
        y=layers,
        colorscale="RdBu_r" if steered is not None else "Viridis",
        zmid=0 if steered is not None else None,
        colorbar={"title": {"text": "Δ‖x‖₂" if steered is not None else "‖x‖₂"}},
        customdata=[labels] * len(layers),
        hovertemplate="layer %{y}, token %{customdata}<br>%{z:.3f}<extra></extra>",
    )
    fig.add_trace(heat, row=1, col=2)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="mean ‖x‖₂ over tokens", row=1, col=1)
    fig.update_xaxes(
        title_text="token", tickvals=list(range(len(labels))), ticktext=labels, row=1, col=2
    )
    fig.update_yaxes(title_text="layer", dtick=1, row=1, col=2)
    fig.update_layout(legend={"orientation": "h", "x": 0, "y": -0.25, "yanchor": "top"})
    return fig


def _line_colour(i: int) -> str:
    # Fixed, so that the baseline and steered lines of one kind share a colour under any template.
    return PALETTE[i % len(PALETTE)]
