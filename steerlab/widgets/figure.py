"""The panel's figure: residual norms of the baseline and steered rows of one generation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from steerlab.plots import mean_norms
from steerlab.plots._data import display_token, resid_kinds, sites_of_kind
from steerlab.plots.norms import add_norm_heatmap, legend_below
from steerlab.plots.theme import PALETTE

HEATMAP_KIND = "resid_post"


def pair_norms_figure(
    activations: Mapping[str, torch.Tensor],
    prompt_tokens: list[int],
    new_tokens: list[list[int]],
    decode: Callable[[list[int]], str],
    alpha: float,
) -> go.Figure:
    """Mean norms over the prompt per layer, and the norm change token by token.

    Left: the mean residual norm per layer over the prompt, baseline solid and steered
    dashed. Right: ‖steered row‖ − ‖baseline row‖ at ``resid_post``, layer by layer, over
    the prompt and the generated tokens, a dotted line where generation starts. Past the
    prompt the two rows may hold different tokens (the steer changed them); the labels and
    the hover text name both.

    Args:
        activations: Site -> ``[2, pos, d_model]`` captured during the generation (rows:
            baseline, steered; one prompt, so no padding), e.g. ``Generation.activations``.
        prompt_tokens: The prompt's token ids.
        new_tokens: Each row's generated token ids.
        decode: Token ids -> text, e.g. ``tokenizer.decode``.
        alpha: The steered row's alpha; at 0 the heatmap says there is no difference.

    Returns:
        A figure with a line chart (left) and a heatmap (right).
    """
    kinds = resid_kinds(activations)
    if not kinds:
        raise ValueError(f"no blocks.{{L}}.hook_resid_* sites captured: {sorted(activations)}")
    n_prompt = len(prompt_tokens)
    captured = next(iter(activations.values())).shape[1]
    length = min(captured, n_prompt + min(len(row) for row in new_tokens))  # last token unfed
    kind = HEATMAP_KIND if HEATMAP_KIND in kinds else kinds[-1]

    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.36, 0.64],
        horizontal_spacing=0.12,
        subplot_titles=(
            "mean ‖x‖₂, prompt",
            f"{kind}: steered − baseline",
        ),
    )
    _add_mean_norms(fig, activations, kinds, n_prompt)
    sites = sites_of_kind(activations, kind)
    norms_by_row = torch.stack(
        [activations[s.name][:, :length].float().norm(dim=-1) for s in sites], dim=1
    )  # [2, layer, pos]
    z = (norms_by_row[1] - norms_by_row[0]).tolist()
    steered_ids = [*prompt_tokens, *new_tokens[1]][:length]
    baseline_ids = [*prompt_tokens, *new_tokens[0]][:length]
    labels = [display_token(decode([t])) for t in steered_ids]
    no_difference = (
        "no difference at alpha 0" if alpha == 0 else "no difference: steered = baseline"
    )
    # At alpha 0 the two rows are the same run; batched rows may still differ in the last bit.
    add_norm_heatmap(
        fig,
        [s.layer for s in sites],
        z,
        labels,
        difference=True,
        no_difference=no_difference,
        blank=True if alpha == 0 else None,
        max_ticks=16,  # the panel may be narrow (a laptop with the file browser open)
    )
    heat = fig.data[-1]
    heat.customdata = [
        [_pair_label(decode, s, b) for s, b in zip(steered_ids, baseline_ids, strict=True)]
    ] * len(sites)
    if heat.visible and length > n_prompt:
        fig.add_vline(x=n_prompt - 0.5, line={"dash": "dot", "color": "#333333"}, row=1, col=2)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="mean ‖x‖₂", row=1, col=1)
    fig.update_xaxes(title_text="prompt ┆ generated tokens (steered row)", row=1, col=2)
    legend_below(fig)
    return fig


def _pair_label(decode: Callable[[list[int]], str], steered: int, baseline: int) -> str:
    if steered == baseline:
        return display_token(decode([steered]))
    return f"{display_token(decode([steered]))} (baseline {display_token(decode([baseline]))})"


def token_strip(
    values: list[list[float]], tokens: list[list[str]], *, title: str, measure: str,
    signed: bool = False,
) -> go.Figure:  # fmt: skip
    """A value per generated token, baseline row above, steered row below.

    Args:
        values: Per row (baseline, steered), the value at each generated token.
        tokens: The matching token texts, for the hover and the tick labels.
        title: The figure's title (what is read, and where).
        measure: What the values are, for the colour bar and the hover ("activation").
        signed: Values of either sign (a projection): a diverging scale centred on 0;
            otherwise a scale from 0 (an SAE feature's activation).
    """
    width = max((len(v) for v in values), default=0)
    z = [v + [None] * (width - len(v)) for v in values]
    labels = [[display_token(t) for t in row] + [""] * (width - len(row)) for row in tokens]
    top = max((max(map(abs, v), default=0.0) for v in values), default=0.0) or 1.0
    scale = ({"colorscale": "RdBu", "reversescale": True, "zmid": 0} if signed
             else {"colorscale": "Viridis", "zmin": 0, "zmax": top})  # fmt: skip
    heat = go.Heatmap(
        z=z, x=list(range(width)), y=["baseline", "steered"], customdata=labels, **scale,
        xgap=1, ygap=2, colorbar={"title": {"text": measure}, "thickness": 12, "len": 1.2},
        hovertemplate="%{y}, token %{x} %{customdata}<br>" + measure
        + ": %{z:.3f}<extra></extra>",
    )  # fmt: skip
    fig = go.Figure(heat)
    fig.update_layout(
        title_text=title, height=190, margin={"l": 70, "r": 20, "t": 40, "b": 40}, autosize=True,
    )  # fmt: skip
    fig.update_xaxes(title_text="generated token", showgrid=False)
    fig.update_yaxes(autorange="reversed", showgrid=False)
    return fig


def _add_mean_norms(fig: go.Figure, activations: Mapping[str, torch.Tensor], kinds: list[str],
                    n_prompt: int) -> None:  # fmt: skip
    """The left chart: each kind's mean norm per layer over the prompt, baseline solid and
    steered dashed."""
    captured = next(iter(activations.values())).shape[1]
    prompt_only = torch.zeros(1, captured, dtype=torch.bool)
    prompt_only[:, :n_prompt] = True
    for i, name in enumerate(kinds):
        colour = {"color": PALETTE[i % len(PALETTE)]}
        for row, suffix, line in ((0, "", colour), (1, " (steered)", {**colour, "dash": "dash"})):
            one_row = {s: a[row : row + 1] for s, a in activations.items()}
            layers, norms = mean_norms(one_row, name, prompt_only)
            fig.add_trace(
                go.Scatter(x=layers, y=norms, name=f"{name}{suffix}", line=line), row=1, col=1
            )


def panel_figure(baseline: dict[str, torch.Tensor], baseline_tokens: list[int],
                 generation: Any, decode: Callable[[list[int]], str],
                 alpha: float) -> go.Figure:  # fmt: skip
    """The panel's figure of a run: ``pair_norms_figure`` of the kept baseline's captured
    activations (site -> ``[1, pos, d_model]``) and the run's steered (last) row."""
    if generation.activations is None:
        raise RuntimeError("the generation kept no activations for the panel's figure")
    steered = {s: a[-1:] for s, a in generation.activations.items()}
    length = min(next(iter(baseline.values())).shape[1], next(iter(steered.values())).shape[1])
    pair = {s: torch.cat([baseline[s][:, :length], steered[s][:, :length]]) for s in steered}
    return pair_norms_figure(pair, generation.prompt_tokens[-1],
                             [baseline_tokens, generation.tokens[-1]], decode, alpha)  # fmt: skip
