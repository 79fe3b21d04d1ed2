"""The panel's monitor strip: the engine's own readouts (``out.monitors``) of a vector's
projection ``h·v/|v|`` at the steering site, baseline against steered, per generated token.

A run that computes the baseline row monitors every readable vector at every site the kept
baseline should answer for, so that choosing a monitor later reruns the steered row alone.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence

import plotly.graph_objects as go
import torch

from steerlab.core.results import Generation
from steerlab.vectors import SteeringVector
from steerlab.widgets.figure import token_strip
from steerlab.widgets.runner import (
    PanelRequest,
    Readouts,
    VectorLike,
    lent_direction,
    monitor_direction,
)
from steerlab.widgets.trained import readable


def monitor_name(vector: str, site: str) -> str:
    """The engine's name for the monitor of ``vector`` at ``site``."""
    return f"{vector} @ {site}"


def residual_sites(sites: Iterable[str]) -> list[str]:
    """The residual stream's sites, in order: what a run captures and monitors."""
    return [s for s in sites if ".hook_resid_" in s]


def monitored(sites: Sequence[str], d_model: int, vectors: Mapping[str, VectorLike],
              request: PanelRequest, *, baseline: bool) -> list[tuple[str, str]]:  # fmt: skip
    """The (vector, site) pairs a run monitors: computing the baseline, every readable
    vector of the model's size at every residual site it steers at (a multi-site vector at
    its own sites), so that the kept baseline answers a later choice of monitor; else, and
    always, the chosen monitor at the steering site (a bad one for the engine to refuse)."""
    chosen = [(request.monitor, request.site)] if request.monitor else []
    if not baseline:
        return chosen
    pairs = [(n, s) for n in readable(vectors) for s in residual_sites(sites)
             if _size(vectors[n]) == d_model and _reads_at(vectors[n], s)]  # fmt: skip
    return pairs + [p for p in chosen if p not in pairs]


def _size(vector: VectorLike) -> int:
    return vector.d_model if isinstance(vector, SteeringVector) else int(vector.shape[-1])  # type: ignore[union-attr]


def _reads_at(vector: VectorLike, site: str) -> bool:
    """Whether the steering rule gives ``vector`` a direction at ``site`` (``steers_at``)."""
    return not isinstance(vector, SteeringVector) or len(vector.sites) == 1 or site in vector.sites


def reads_monitor(readouts: Readouts, request: PanelRequest) -> bool:
    """Whether ``readouts`` hold ``request``'s monitor (True with none chosen)."""
    return not request.monitor or (request.monitor, request.site) in readouts


def run_monitors(vectors: Mapping[str, VectorLike],
                 pairs: Iterable[tuple[str, str]]) -> dict[str, tuple[str, torch.Tensor]]:  # fmt: skip
    """``monitor=`` for ``lm.stream``: each vector at each site of ``pairs``, by the
    steering rule's direction there (a one-site vector lends its direction)."""
    return {monitor_name(n, s): (s, lent_direction(vectors[n], s)) for n, s in pairs}


def row_readouts(generation: Generation, row: int, pairs: Iterable[tuple[str, str]],
                 n_tokens: int) -> Readouts:  # fmt: skip
    """Row ``row``'s readouts of each ``(vector, site)`` the run monitored: at the position
    whose forward chose each of its ``n_tokens`` new tokens."""
    traces = generation.monitors
    return {(n, s): traces[monitor_name(n, s)].generated[row, :n_tokens].tolist()
            for n, s in pairs if monitor_name(n, s) in traces}  # fmt: skip


def monitor_figure(request: PanelRequest, vectors: Mapping[str, VectorLike],
                   rows: Sequence[tuple[list[float], list[int]]],
                   decode: Callable[[list[int]], str]) -> go.Figure | None:  # fmt: skip
    """The strip for ``request``'s monitor: ``rows`` are (readouts, new tokens) of the
    baseline and the steered row; ``None`` with no monitor."""
    if monitor_direction(request, vectors) is None:  # checks the name
        return None
    values = [list(v) for v, _ in rows]
    tokens = [[decode([t]) for t in new[: len(v)]] for v, new in rows]
    title = f"monitor {request.monitor}: h·v/|v| at {request.site}, per generated token"
    return token_strip(values, tokens, title=html.escape(title), measure="projection",
                       signed=True)  # fmt: skip
