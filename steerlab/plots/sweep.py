"""Sweep results as alpha × layer heatmaps, one subplot per metric."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from steerlab.core.scalars import list_of

# Higher score is better (viridis, bright is high); perplexity and KL are costs (reversed).
_COLOURSCALES = {"score": "Viridis", "perplexity": "Viridis_r", "kl": "Viridis_r"}
# Perplexity is a ratio: one degenerate cell (600 beside 5-20) flattens a linear scale.
_LOG_CANDIDATES = ("perplexity",)
_LOG_SPAN = 30.0  # automatic log scale once the largest cell is this many times the smallest
_NICE = (1, 2, 5)


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
    log_scale: Sequence[str] | None = None,
) -> go.Figure:
    """Heatmaps of sweep metrics over steering strength (alpha) and layer, side by side.

    Args:
        records: A list of dicts with keys ``alpha``, ``layer``, ``site`` and the metrics, or a
            pandas DataFrame with those columns.
        metrics: Which metrics to draw, one subplot each.
        site: Keep only records of this hook kind (``"hook_resid_pre"``) or full site name;
            required when the records hold several hook kinds. Sites that differ only in
            their layer are the layer axis.
        log_scale: Metrics coloured on a log scale (their colour bar is labelled in the
            metric's own units). By default perplexity, once its largest cell is 30 times
            its smallest; pass ``()`` for linear colours everywhere.

    Returns:
        A figure with one heatmap per metric, each cell labelled with its value; missing
        (alpha, layer) cells are left blank.

    >>> rows = [{"alpha": a, "layer": 1, "site": "s", "score": a, "perplexity": 9.0}
    ...         for a in (0.0, 4.0)]
    >>> sweep_heatmaps(rows).data[0].z
    ([0.0], [4.0])
    """
    metrics = list_of(metrics, "metrics")
    log_scale = None if log_scale is None else list_of(log_scale, "log_scale")
    rows = _as_records(records)
    kinds = sorted({_kind(str(r["site"])) for r in rows if "site" in r})
    if site is not None:
        rows = [r for r in rows if site in (r.get("site"), _kind(str(r.get("site"))))]
    elif len(kinds) > 1:
        raise ValueError(f"records hold several hook kinds {kinds}; pass site= to pick one")
    if not rows:
        raise ValueError("no sweep records to plot" + (f" for site {site!r}" if site else ""))

    log = _log_metrics(rows, metrics) if log_scale is None else set(log_scale)
    fig = make_subplots(
        rows=1, cols=len(metrics), subplot_titles=list(metrics), horizontal_spacing=0.2
    )
    for i, metric in enumerate(metrics):
        alphas, layers, grid = sweep_grid(rows, metric)
        axis = fig.layout["xaxis" if i == 0 else f"xaxis{i + 1}"]
        right = axis.domain[1] + 0.01  # one colourbar per subplot, just right of it
        fig.add_trace(
            _heatmap(metric, alphas, layers, grid, right, metric in log), row=1, col=i + 1
        )
        fig.update_xaxes(title_text="layer", type="category", row=1, col=i + 1)
        # One "alpha" title, on the left: another would sit on the previous colour bar.
        fig.update_yaxes(title_text="alpha" if i == 0 else None, type="category", row=1, col=i + 1)
    label = site or (kinds[0] if kinds else None)
    fig.update_layout(title_text="steering sweep" + (f" at {label}" if label else ""))
    return fig


def _heatmap(
    metric: str,
    alphas: list[float],
    layers: list[int],
    grid: list[list[float | None]],
    colorbar_x: float,
    log: bool,
) -> go.Heatmap:
    """One metric's heatmap, its value written in every cell; log10 colours when ``log``."""
    colorbar: dict[str, Any] = {
        "title": {"text": metric, "side": "right"},
        "x": colorbar_x,
        "len": 0.9,
        "thickness": 14,
    }
    z: list[list[float | None]] = grid
    if log:
        z = [[None if v is None else math.log10(v) for v in row] for row in grid]
        ticks = _log_ticks([v for row in grid for v in row if v is not None])
        colorbar.update(
            title={"text": f"{metric} (log scale)", "side": "right"},
            tickvals=[math.log10(t) for t in ticks],
            ticktext=[f"{t:g}" for t in ticks],
        )
    return go.Heatmap(
        z=z,
        x=layers,
        y=alphas,
        text=[[_cell_text(v) for v in row] for row in grid],
        texttemplate="%{text}",
        customdata=grid,
        colorscale=_COLOURSCALES.get(metric, "Viridis"),
        colorbar=colorbar,
        name=metric,
        hovertemplate=f"layer %{{x}}, alpha %{{y}}<br>{metric} %{{customdata:.3g}}<extra></extra>",
    )


def _log_metrics(rows: list[Mapping[str, Any]], metrics: Sequence[str]) -> set[str]:
    """Metrics to colour on a log scale: perplexity when its cells span a factor of 30."""
    chosen = set()
    for metric in metrics:
        if metric not in _LOG_CANDIDATES:
            continue
        values = [float(r[metric]) for r in rows if metric in r and float(r[metric]) > 0]
        if values and max(values) >= _LOG_SPAN * min(values):
            chosen.add(metric)
    return chosen


def _log_ticks(values: list[float]) -> list[float]:
    """1-2-5 ticks covering ``values``, e.g. [5, 10, 20, 50, 100, 200, 500] for 6..600.

    >>> _log_ticks([6.0, 600.0])
    [10.0, 20.0, 50.0, 100.0, 200.0, 500.0]
    """
    lo, hi = min(values), max(values)
    ticks = []
    for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        ticks += [m * 10.0**decade for m in _NICE if lo <= m * 10.0**decade <= hi]
    return ticks or [lo, hi]


def _cell_text(value: float | None) -> str:
    """A cell's number: two decimals below 10, one below 100, none above; blank if missing."""
    if value is None or math.isnan(value):
        return ""
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f}"


def _kind(site: str) -> str:
    """``blocks.3.hook_resid_pre`` -> ``hook_resid_pre``: the part shared across layers."""
    return site.rsplit(".", 1)[-1]


def _as_records(records: Any) -> list[Mapping[str, Any]]:
    if hasattr(records, "to_dict"):  # a pandas DataFrame, without importing pandas here
        return list(records.to_dict("records"))
    return list(records)
