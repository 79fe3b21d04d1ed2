"""The panel's SAE feature parts: the prompt's top features to pick from, and the strip of
the chosen feature's activation per generated token, baseline against steered."""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go

from steerlab.core.results import Generation
from steerlab.features import SAE
from steerlab.model import SteerableModel
from steerlab.widgets.figure import token_strip
from steerlab.widgets.runner import BaselineRun


def top_features(lm: SteerableModel, sae: SAE, prompt: str, n: int) -> list[int]:
    """The prompt's ``n`` strongest features, by peak activation over its tokens (a BOS
    token left out)."""
    acts = lm.features(prompt, sae, k=n)
    return acts.prompt_top(0, n, skip=acts.leading_bos(0))


def feature_strip(sae: SAE, feature: int, baseline: BaselineRun, generation: Generation,
                  decode: Callable[[list[int]], str]) -> go.Figure:  # fmt: skip
    """Feature ``feature`` at each generated token that was fed back, both rows: read from
    the captured activations at the SAE's site, at the token's own position (the last
    token is never fed)."""
    assert generation.activations is not None
    site = sae.site
    n_prompt = len(generation.prompt_tokens[-1])
    rows = [(baseline.activations[site][0], baseline.tokens),
            (generation.activations[site][-1], generation.tokens[-1])]  # fmt: skip
    values, tokens = [], []
    for acts, new in rows:
        fed = acts[n_prompt : n_prompt + max(len(new) - 1, 0)]  # [values, d_model]
        values.append(sae.encode(fed)[:, feature].float().tolist() if len(fed) else [])
        tokens.append([decode([t]) for t in new[: len(fed)]])
    title = f"feature {feature} at {site}, per generated token"
    return token_strip(values, tokens, title=title, measure="activation")
