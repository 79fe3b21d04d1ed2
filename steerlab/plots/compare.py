"""Steered vs baseline continuations, token by token, with the log-prob change."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from steerlab.core.scalars import list_of
from steerlab.plots._data import display_token, shorten

CELL_CHARS = 7  # longer tokens are cut in the cells (hover shows them whole)

DIFF_OUTLINE = "#000000"


def token_comparison(
    baseline_tokens: Sequence[str],
    steered_tokens: Sequence[str],
    logprob_change: Sequence[float],
    *,
    title: str | None = None,
) -> go.Figure:
    """Two aligned rows of tokens, baseline above steered, coloured by the log-prob change.

    The steered row is coloured by ``logprob_change`` (diverging, centred on 0); the baseline
    row stays neutral. Positions where the two tokens differ are outlined in black.

    Args:
        baseline_tokens: Token strings generated without steering.
        steered_tokens: Token strings generated with steering.
        logprob_change: Per steered token, log p(steered) − log p(baseline) of that token.
        title: Figure title; a count of differing tokens when ``None``.

    Returns:
        A one-trace heatmap figure with the tokens written in its cells.

    >>> fig = token_comparison([" a", " cat"], [" a", " dog"], [0.0, 1.5])
    >>> len(fig.layout.shapes)
    1
    """
    baseline_tokens = list_of(baseline_tokens, "baseline_tokens")
    steered_tokens = list_of(steered_tokens, "steered_tokens")
    logprob_change = list_of(logprob_change, "logprob_change")
    if len(logprob_change) != len(steered_tokens):
        raise ValueError(
            f"{len(logprob_change)} log-prob changes for {len(steered_tokens)} steered tokens"
        )
    width = max(len(baseline_tokens), len(steered_tokens))
    base = [*baseline_tokens, *[""] * (width - len(baseline_tokens))]
    steer = [*steered_tokens, *[""] * (width - len(steered_tokens))]
    change = [*map(float, logprob_change), *[math.nan] * (width - len(steered_tokens))]
    differs = [i for i in range(width) if base[i] != steer[i]]

    z = [[0.0] * width, change]  # baseline row stays at the neutral middle colour
    text = [
        [shorten(display_token(t), CELL_CHARS) if t else "" for t in base],
        [shorten(display_token(t), CELL_CHARS) if t else "" for t in steer],
    ]
    hover = [
        [f"baseline {display_token(t)}" for t in base],
        [
            f"steered {display_token(t)}<br>Δ log p = {c:+.3f}"
            for t, c in zip(steer, change, strict=True)
        ],
    ]
    limit = max((abs(c) for c in change if not math.isnan(c)), default=1.0) or 1.0
    heat = go.Heatmap(
        z=z,
        x=list(range(width)),
        y=["baseline", "steered"],
        text=text,
        texttemplate="%{text}",
        textfont={"size": 11},  # fixed: plotly's automatic size shrinks to fit the longest
        hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>",
        colorscale="RdBu",
        zmin=-limit,
        zmax=limit,
        xgap=2,
        ygap=2,
        colorbar={"title": {"text": "Δ log p"}},
    )
    fig = go.Figure(heat)
    for i in differs:
        fig.add_shape(
            type="rect",
            x0=i - 0.5,
            x1=i + 0.5,
            y0=-0.5,
            y1=1.5,
            line={"color": DIFF_OUTLINE, "width": 2},
        )
    fig.update_layout(
        title_text=title if title is not None else f"{len(differs)} of {width} tokens differ",
        height=260,
    )
    fig.update_xaxes(title_text="generated token position", dtick=1)
    fig.update_yaxes(autorange="reversed")
    return fig


def steering_comparison(
    lm: Any, generation: Any, baseline_row: int = 0, steered_row: int = 1
) -> go.Figure:
    """``token_comparison`` for two rows of one generation, log-prob change computed.

    The change is, per steered token, its log-probability under the steered run (recorded
    during generation) minus under the unsteered model (one scoring pass). Generate both
    rows in one call with one seed (``alpha=[0, a]``) so they share random numbers.

    >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> out = lm.generate("Once upon a time", vec.steers(alpha=[0.0, 4.0]), max_new_tokens=6)
    >>> len(steering_comparison(lm, out).data)
    1
    """
    from steerlab.vectors.scoring import completion_logprobs

    steered = generation.tokens[steered_row]
    (unsteered,) = completion_logprobs(lm, [generation.prompt_tokens[steered_row]], [steered])
    change = [s - u for s, u in zip(generation.logprobs[steered_row], unsteered)]
    words = [
        [lm.tokenizer.decode([t]) for t in generation.tokens[r]]
        for r in (baseline_row, steered_row)
    ]
    alpha = generation.alphas[steered_row]
    return token_comparison(words[0], words[1], change,
                            title=f"steered (alpha {', '.join(f'{a:g}' for a in alpha)}) vs baseline")  # fmt: skip
