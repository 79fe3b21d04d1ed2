"""Sweep results as alpha × layer heatmaps, one subplot per metric."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

# Higher score is better (viridis, bright is high); perplexity and KL are costs (reversed).
_COLOURSCALES = {"score": "Viridis", "perplexity": "Viridis_r", "kl": "Viridis_r"}


def sweep_grid(
    records: Iterable[Mapping[str, Any]], metric: str
) -> tuple[list[float], list[int], list[list[float | None]]]:
    """Alphas, layers and the ``[alpha, layer]`` grid of one metric, repeats averaged.

    >>> sweep_grid([{"alpha": 1.0, "layer": 2, "score": 0.5}], "score")
    ([1.0], [2], [[0.5]])
    """
    cells: dict[tuple[float, int], list[float]] = defaultdict(list)
    for record in records:
        cells[float(record["alpha"]), int(record["layer"])].append(float(record[metric]))
    alphas = sorted({a for a, _ in cells})
    layers = sorted({layer for _, layer in cells})
    grid = [
        [sum(v) / len(v) if (v := cells.get((a, layer))) else None for layer in layers]
        for a in alphas
    ]
    return alphas, layers, grid


def sweep_heatmaps(
    records: Any,
    *,
    metrics: Sequence[str] = ("score", "perplexity"),
    site: str | None = None,
) -> go.Figure:
    """Heatmaps of sweep metrics over steering strength (alpha) and layer, side by side.

    Args:
        records: A list of dicts with keys ``alpha``, ``layer``, ``site`` and the metrics, or a
            pandas DataFrame with those columns.
        metrics: Which metrics to draw, one subplot each.
        site: Keep only records of this hook kind (``"hook_resid_pre"``) or full site name;
            required when the records hold several hook kinds. Sites that differ only in
            their layer are the layer axis.

    Returns:
        A figure with one heatmap per metric; missing (alpha, layer) cells are left blank.

    >>> rows = [{"alpha": a, "layer": 1, "site": "s", "score": a, "perplexity": 9.0}
    ...         for a in (0.0, 4.0)]
    >>> sweep_heatmaps(rows).data[0].z
    ([0.0], [4.0])
    """
    rows = _as_records(records)
    kinds = sorted({_kind(str(r["site"])) for r in rows if "site" in r})
    if site is not None:
        rows = [r for r in rows if site in (r.get("site"), _kind(str(r.get("site"))))]
    elif len(kinds) > 1:
        raise ValueError(f"records hold several hook kinds {kinds}; pass site= to pick one")
    if not rows:
        raise ValueError("no sweep records to plot" + (f" for site {site!r}" if site else ""))

    fig = make_subplots(
        rows=1, cols=len(metrics), subplot_titles=list(metrics), horizontal_spacing=0.15
    )
    for i, metric in enumerate(metrics):
        alphas, layers, grid = sweep_grid(rows, metric)
        axis = fig.layout["xaxis" if i == 0 else f"xaxis{i + 1}"]
        right = axis.domain[1] + 0.01  # one colourbar per subplot, just right of it
        fig.add_trace(
            go.Heatmap(
                z=grid,
                x=layers,
                y=alphas,
                colorscale=_COLOURSCALES.get(metric, "Viridis"),
                colorbar={"title": {"text": metric}, "x": right, "len": 0.9},
                name=metric,
                hovertemplate=f"layer %{{x}}, alpha %{{y}}<br>{metric} %{{z:.3g}}<extra></extra>",
            ),
            row=1,
            col=i + 1,
        )
        fig.update_xaxes(title_text="layer", type="category", row=1, col=i + 1)
        fig.update_yaxes(title_text="alpha", type="category", row=1, col=i + 1)
    label = site or (kinds[0] if kinds else None)
    fig.update_layout(title_text="steering sweep" + (f" at {label}" if label else ""))
    return fig


def _kind(site: str) -> str:
    """``blocks.3.hook_resid_pre`` -> ``hook_resid_pre``: the part shared across layers."""
    return site.rsplit(".", 1)[-1]


def _as_records(records: Any) -> list[Mapping[str, Any]]:
    if hasattr(records, "to_dict"):  # a pandas DataFrame, without importing pandas here
        return list(records.to_dict("records"))
    return list(records)
