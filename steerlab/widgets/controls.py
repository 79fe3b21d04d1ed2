"""The panel's input widgets, built from a model and a set of vectors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import ipywidgets as widgets

from steerlab.core.scalars import without_noise
from steerlab.core.sites import Site
from steerlab.widgets.runner import CONDITION_KIND, PanelRequest

_WIDE = widgets.Layout(width="100%")
_STYLE = {"description_width": "6.5em"}
# Each control fills its column and the columns wrap under each other on a narrow screen,
# so nothing is clipped beside JupyterLab's file browser.
_FILL = {"width": "auto", "max_width": "40em"}
_COLUMN = {"flex": "1 1 250px", "min_width": "230px", "margin": "0 8px 0 0"}
_ROW = {"flex_flow": "row wrap", "align_items": "center"}
ALWAYS, NO_MONITOR = "(always)", "(none)"
POSITIONS = [("all", "all"), ("prompt", "prompt"), ("generated", "generated")] + [
    (f"from token {k}", k) for k in (1, 2, 4, 8, 16)
]
# CAST's cosine is blind to the sign: cos(-h, tanh(-Ph)) = cos(h, tanh(Ph)), as tanh is odd.
CONDITION_TIP = (
    "steer only prompts whose mean residual scores above (or below) the threshold on CAST's "
    "cosine cos(h, tanh(Ph)), P the projection onto this vector's axis. The cosine says how "
    "much of h lies along that axis, either way: a prompt opposite the vector scores as high "
    "as one along it. For a signed read along the direction, use "
    "sl.Condition(site, v, score='projection') (h·v/|v|) in code."
)


@dataclass
class Controls:
    """One widget per input; ``request(i)`` reads them all into a ``PanelRequest``."""

    prompt: widgets.Textarea
    vector: widgets.Dropdown
    layer: widgets.IntSlider
    hook: widgets.Dropdown
    alpha: widgets.FloatSlider
    positions: widgets.Dropdown
    temperature: widgets.FloatSlider
    top_k: widgets.IntSlider
    top_p: widgets.FloatSlider
    seed: widgets.IntText
    max_new_tokens: widgets.IntSlider
    feature: widgets.IntText  # used when the vector is the SAE's feature
    feature_op: widgets.ToggleButtons
    condition: widgets.Dropdown  # "steer only when": a vector name, "" for always
    condition_layer: widgets.Dropdown
    threshold: widgets.FloatText
    compare: widgets.ToggleButtons
    monitor: widgets.Dropdown  # "" for no monitor strip

    def all(self) -> list[widgets.ValueWidget]:
        return [getattr(self, f.name) for f in fields(self)]

    def request(self, request_id: int) -> PanelRequest:
        values = {f.name: getattr(self, f.name).value for f in fields(self)}
        for f in fields(self):  # a slider step's last-bit noise goes where values are read
            if isinstance(getattr(self, f.name), widgets.FloatSlider):
                values[f.name] = without_noise(values[f.name])
        return PanelRequest(request_id=request_id, **values)

    def set_vector_names(self, names: Sequence[str]) -> None:
        """Offer ``names`` in the condition and monitor dropdowns, keeping a choice that
        is still offered (else: always, no monitor)."""
        for dropdown, none in ((self.condition, ALWAYS), (self.monitor, NO_MONITOR)):
            current = dropdown.value
            dropdown.options = [(none, "")] + [(n, n) for n in names]
            dropdown.value = current if current in names else ""

    def box(
        self, features: widgets.Widget | None = None, fired: widgets.Widget | None = None
    ) -> widgets.VBox:
        """The controls in two columns; ``features`` (the SAE feature picker) goes under
        the steering column; under both, the "steer only when" row (``fired`` at its end)
        and the monitor row."""
        inline = (self.prompt, self.feature, self.feature_op, *self.condition_row())
        for control in self.all():
            if control not in inline:
                control.layout = widgets.Layout(**_FILL)
        extra = [] if features is None else [features]
        steering = widgets.VBox(
            [self.vector, self.layer, self.hook, self.alpha, self.positions, self.monitor, *extra],
            layout=widgets.Layout(**_COLUMN),
        )
        sampling = widgets.VBox(
            [self.temperature, self.top_k, self.top_p, self.seed, self.max_new_tokens],
            layout=widgets.Layout(**_COLUMN),
        )
        columns = widgets.HBox([steering, sampling], layout=widgets.Layout(flex_flow="row wrap"))
        when = widgets.HBox(
            [*self.condition_row(), *([] if fired is None else [fired])],
            layout=widgets.Layout(**_ROW),
        )
        when.add_class("steerlab-condition-row")
        return widgets.VBox([self.prompt, columns, when])

    def condition_row(self) -> tuple[widgets.Widget, ...]:
        return (self.condition, self.condition_layer, self.compare, self.threshold)


def hook_kinds(sites: Sequence[str]) -> list[str]:
    """Per-layer site kinds of a model, in forward order (``hook_embed`` has no layer).

    >>> hook_kinds(["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_mlp_out"])
    ['hook_resid_pre', 'hook_mlp_out']
    """
    kinds: list[str] = []
    for name in sites:
        site = Site.parse(name)
        if site.layer is not None and site.kind not in kinds:
            kinds.append(site.kind)
    return kinds


def build_controls(
    *,
    prompt: str,
    vector_names: Sequence[str],
    n_layers: int,
    kinds: Sequence[str],
    layer: int,
    hook: str,
    alpha: float,
    alpha_range: tuple[float, float],
    max_new_tokens: int,
    d_sae: int = 1,
) -> Controls:
    """The panel's widgets, at the given starting values (the condition reads the layer
    before ``layer``, so that it comes before the steer; no condition, no monitor)."""

    def slider(cls, description, value, lo, hi, step, **kw):
        return cls(
            value=value,
            min=lo,
            max=hi,
            step=step,
            description=description,
            continuous_update=True,
            style=_STYLE,
            **kw,
        )

    return Controls(
        prompt=widgets.Textarea(
            value=prompt,
            description="prompt",
            continuous_update=False,
            rows=2,
            layout=_WIDE,
            style=_STYLE,
        ),
        vector=widgets.Dropdown(options=list(vector_names), description="vector", style=_STYLE),
        layer=slider(widgets.IntSlider, "layer", layer, 0, n_layers - 1, 1),
        hook=widgets.Dropdown(
            options=list(kinds), value=hook, description="hook point", style=_STYLE
        ),
        alpha=slider(widgets.FloatSlider, "alpha", alpha, *alpha_range, 0.5, readout_format=".1f"),
        positions=widgets.Dropdown(
            options=POSITIONS,
            value="all",
            description="positions",
            style=_STYLE,
        ),
        temperature=slider(widgets.FloatSlider, "temperature", 0.0, 0.0, 2.0, 0.05),
        top_k=slider(widgets.IntSlider, "top_k (0: off)", 0, 0, 100, 1),
        top_p=slider(widgets.FloatSlider, "top_p", 1.0, 0.05, 1.0, 0.05),
        seed=widgets.IntText(value=0, description="seed", style=_STYLE),
        max_new_tokens=slider(widgets.IntSlider, "max tokens", max_new_tokens, 1, 200, 1),
        # Unbounded on purpose: a bounded box snaps 512 to 511 without a word; the run checks
        # the index and an index outside the SAE is an error in the panel.
        feature=widgets.IntText(
            value=0,
            description="feature",
            tooltip=f"an SAE feature, 0 to {d_sae - 1}",
            style=_STYLE,
            layout=widgets.Layout(width="14em"),
        ),  # fmt: skip
        feature_op=widgets.ToggleButtons(
            options=[("add", "add"), ("clamp", "clamp")],
            value="add",
            tooltips=[
                "add alpha x the feature's decoder row",
                "set the feature to alpha, keeping the SAE's error",
            ],
            style={"button_width": "6em", "description_width": "6.5em"},
            description="feature op",
        ),  # fmt: skip
        **_condition_controls(vector_names, n_layers, layer),
    )


def _condition_controls(vector_names: Sequence[str], n_layers: int,
                        layer: int) -> dict[str, widgets.Widget]:  # fmt: skip
    """The "steer only when" row's widgets and the monitor dropdown: no condition, no
    monitor, and the condition reading the layer before ``layer`` (before the steer)."""
    return {
        "condition": widgets.Dropdown(
            options=[(ALWAYS, "")] + [(n, n) for n in vector_names],
            value="",
            description="steer only when",
            tooltip=CONDITION_TIP,
            style={"description_width": "8.5em"},
            layout=widgets.Layout(width="16em"),
        ),  # fmt: skip
        # A dropdown, not a slider: the row stays one line beside JupyterLab's file browser.
        "condition_layer": widgets.Dropdown(
            options=list(range(n_layers)),
            value=max(layer - 1, 0),  # resid_post of layer L-1 comes before the steer at L
            description="at layer",
            tooltip=f"the condition reads blocks.{{layer}}.{CONDITION_KIND}",
            style={"description_width": "4em"},
            layout=widgets.Layout(width="8.5em"),
        ),  # fmt: skip
        "compare": widgets.ToggleButtons(
            options=[("above", "above"), ("below", "below")],
            value="above",
            tooltips=["fires when the score is above the threshold", "… below the threshold"],
            style={"button_width": "5em"},
        ),  # fmt: skip
        # No label: the row reads "steer only when v at layer 1 [above|below] 0.1".
        "threshold": widgets.FloatText(
            value=0.0,
            step=0.01,
            tooltip="the threshold the prompt's score is compared with",
            layout=widgets.Layout(width="5.5em"),
        ),  # fmt: skip
        "monitor": widgets.Dropdown(
            options=[(NO_MONITOR, "")] + [(n, n) for n in vector_names],
            value="",
            description="monitor",
            tooltip="show this vector's projection h·v/|v| at the steering site, per token",
            style=_STYLE,
        ),
    }
