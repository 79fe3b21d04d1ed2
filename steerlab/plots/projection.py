"""Each token's residual projected on a steering direction, layer by layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch

from steerlab.plots import _data


def project(acts: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """Scalar projection of ``acts [..., d_model]`` on the unit vector along ``direction``.

    >>> project(torch.tensor([[3.0, 4.0]]), torch.tensor([0.0, 2.0]))
    tensor([4.])
    """
    direction = direction.detach().to("cpu", torch.float32)
    norm = direction.norm()
    if norm == 0:
        raise ValueError("direction has zero norm")
    return acts @ (direction / norm)


def projection_heatmap(
    cache: Mapping[str, torch.Tensor],
    direction: torch.Tensor | Mapping[str, torch.Tensor],
    *,
    row: int = 0,
    site_kind: str = "resid_post",
    tokens: Sequence[Sequence[str]] | None = None,
    mask: torch.Tensor | None = None,
) -> go.Figure:
    """Layers × tokens heatmap of each token's residual projected on the unit direction.

    Args:
        cache: Site name -> ``[batch, pos, d_model]`` activations.
        direction: One ``[d_model]`` direction used at every ``site_kind`` site, or a mapping
            site -> direction, which plots exactly the mapping's sites found in the cache.
        row: Which batch row.
        site_kind: Site kind used with a single direction, e.g. ``resid_pre``.
        tokens: Token strings per row; defaults to ``cache.str_tokens`` when present.
        mask: ``[batch, pos]`` with 1 for real tokens; defaults to ``cache.attention_mask``.

    Returns:
        A one-trace heatmap figure, diverging colours centred on 0, tokens on the x-axis.

    >>> acts = {f"blocks.{L}.hook_resid_post": torch.randn(1, 3, 8) for L in range(2)}
    >>> projection_heatmap(acts, torch.randn(8)).data[0].y
    (0, 1)
    """
    sites = _sites(cache, direction, site_kind)
    first = _data.activation(cache, sites[0].name)
    real = _data.cache_mask(cache, mask, *first.shape[:2])
    positions = _data.real_positions(real, row)
    labels = _data.row_labels(_data.cache_tokens(cache, tokens), row, positions)

    z = []
    for site in sites:
        unit = direction[site.name] if isinstance(direction, Mapping) else direction
        z.append(project(_data.activation(cache, site.name)[row, positions], unit).tolist())
    one_kind = len({s.kind for s in sites}) == 1
    y_labels = [str(s.layer) if one_kind else f"{s.layer} {s.kind}" for s in sites]

    heat = go.Heatmap(
        z=z,
        x=list(range(len(positions))),
        y=[s.layer for s in sites] if one_kind else y_labels,
        colorscale="RdBu_r",
        zmid=0,
        colorbar={"title": {"text": "projection"}},
        customdata=[labels] * len(sites),
        hovertemplate="layer %{y}, token %{customdata}<br>%{z:.3f}<extra></extra>",
    )
    fig = go.Figure(heat)
    kind_text = sites[0].kind if one_kind else "residual"
    which = f" (prompt {row})" if real.shape[0] > 1 else ""
    fig.update_layout(title_text=f"{kind_text} projected on the steering direction{which}")
    fig.update_xaxes(title_text="token", **_data.token_ticks(labels))
    fig.update_yaxes(title_text="layer", type="category" if not one_kind else None, dtick=1)
    return fig


def _sites(
    cache: Mapping[str, torch.Tensor],
    direction: torch.Tensor | Mapping[str, torch.Tensor],
    site_kind: str,
) -> list[_data.Site]:
    if isinstance(direction, Mapping):
        parsed = [_data.parse_site(name) for name in direction if name in cache]
        sites = sorted((s for s in parsed if s is not None), key=lambda s: (s.layer, s.kind))
        if not sites:
            raise ValueError(f"none of the direction's sites {list(direction)} is cached")
        return sites
    sites = _data.sites_of_kind(cache, site_kind)
    if not sites:
        raise ValueError(f"no blocks.{{L}}.hook_{site_kind} sites in cache: {sorted(cache)}")
    return sites
