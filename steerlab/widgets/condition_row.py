"""The panel's "steer only when" row: what its label and the steered title say of a run."""

from __future__ import annotations

import html

from steerlab.core.results import Generation
from steerlab.widgets.runner import PanelRequest


def fired_label(request: PanelRequest, generation: Generation) -> str:
    """Whether the steered row's condition fired for the prompt, and on what score ("" with
    no condition)."""
    fired_rows, scores = generation.fired, generation.condition_scores
    if not request.condition or fired_rows is None or scores is None:
        return ""
    fired = bool(fired_rows[-1])
    colour = "#1b7a1b" if fired else "#777"
    text = "fired" if fired else "did not fire"
    return f"<span style='color:{colour}'><b>{text}</b> · score {float(scores[-1]):.3f}</span>"


def only_when(request: PanelRequest) -> str:
    """The steered title's condition clause ("" with none)."""
    if not request.condition:
        return ""
    return (
        f" · only when {html.escape(request.condition)} at {request.condition_site} "
        f"(cosine {request.compare} {request.threshold:g})"
    )
