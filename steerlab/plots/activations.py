"""Cached activations of one site and row: positions × dimensions, all or the top-k."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch

from steerlab.plots import _data
from steerlab.plots._token_heatmap import token_heatmap


def top_dims(acts: torch.Tensor, k: int) -> list[int]:
    """Indices of the ``k`` dimensions with the largest mean |activation|, largest first.

    Args:
        acts: ``[pos, d_model]`` activations of the positions to rank over.
        k: How many dimensions to keep.

    >>> top_dims(torch.tensor([[0.0, -3.0, 1.0], [0.0, 1.0, 1.0]]), 2)
    [1, 2]
    """
    return torch.topk(acts.abs().mean(dim=0), k=min(k, acts.shape[-1])).indices.tolist()


def activation_heatmap(
    cache: Mapping[str, torch.Tensor],
    site: str,
    *,
    row: int = 0,
    top_k: int | None = None,
    tokens: Sequence[Sequence[str]] | None = None,
    mask: torch.Tensor | None = None,
) -> go.Figure:
    """Heatmap of one site's activations for one row: tokens down, dimensions across.

    Padded positions are left out. With ``top_k``, only the ``k`` dimensions with the largest
    mean |activation| over the row's real tokens are shown, largest first.

    Args:
        cache: Site name -> ``[batch, pos, d_model]`` activations.
        site: Which site, e.g. ``blocks.2.hook_resid_post``.
        row: Which batch row.
        top_k: Keep only this many dimensions; all when ``None``.
        tokens: Token strings per row; defaults to ``cache.str_tokens`` when present.
        mask: ``[batch, pos]`` with 1 for real tokens; defaults to ``cache.attention_mask``.

    Returns:
        A one-trace heatmap figure, diverging colours centred on 0.

    >>> acts = {"blocks.0.hook_resid_post": torch.randn(1, 3, 16)}
    >>> len(activation_heatmap(acts, "blocks.0.hook_resid_post", top_k=4).data[0].x)
    4
    """
    acts = _data.activation(cache, site)  # [batch, pos, d_model]
    real = _data.cache_mask(cache, mask, *acts.shape[:2])
    positions = _data.real_positions(real, row)
    labels = _data.row_labels(_data.cache_tokens(cache, tokens), row, positions)
    z = acts[row, positions]  # [pos, d_model]

    if top_k is None:
        dims: list[int] | list[str] = list(range(z.shape[-1]))
        x_title = "dimension"
    else:
        keep = top_dims(z, top_k)
        z = z[:, keep]
        dims = [str(d) for d in keep]  # categories, so the ranked order is kept
        x_title = f"dimension (top {len(keep)} by mean |activation|)"

    fig = token_heatmap(z.tolist(), dims, labels, column="dim", colorscale="RdBu_r", zmid=0)
    fig.update_layout(title_text=site + (f" (prompt {row})" if real.shape[0] > 1 else ""))
    fig.update_xaxes(title_text=x_title, type="category" if top_k is not None else None)
    return fig
