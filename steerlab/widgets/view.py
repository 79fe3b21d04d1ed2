"""The panel's widgets and their layout: the panes, the strips, the figure and the status line."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from steerlab.exporting import export_button
from steerlab.widgets.completions import completions_button
from steerlab.widgets.condition_row import only_when
from steerlab.widgets.controls import Controls
from steerlab.widgets.runner import FEATURE, PanelRequest, PanelSteer, format_alpha

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PANE_BORDER, STALE_BORDER = "1px solid #ddd", "1px dashed #b00020"
STALE_NOTE = "⚠ not current: the last run failed; this is the previous result"
HINT = (
    "<i>Drag the <b>alpha</b> slider (or click it and press ← →): the steered completion "
    "regenerates beside the baseline.</i>"
)
# The panes and their titles at a text's line height, not a widget row's 28 px (five lines
# of a long steered title took 140 px).
PANEL_CSS = (
    "<style>.steerlab-panel :is(.steerlab-pane-title, .steerlab-pane) .widget-html-content "
    "{ line-height: 1.45; }</style>"
)
_WRAP = {"flex_flow": "row wrap"}


class PanelView:
    """Every widget the panel shows, laid out; methods write into them.

    Args:
        controls: the panel's input widgets.
        features: show the SAE feature picker and the feature strip.
        hooks: the model's hook count, for the first status line.
        record: the rendered run's record, for the completions export.
        export_stem: a fresh path stem for an export of a kind ("norms", "completions").
        on_top_feature: called with a top-feature button when it is clicked.
    """

    def __init__(self, controls: Controls, *, features: bool, hooks: int,
                 record: Callable[[], Any], export_stem: Callable[[str], str],
                 on_top_feature: Callable[[widgets.Button], None]) -> None:  # fmt: skip
        self.hint = _classed(widgets.HTML(HINT), "steerlab-hint")
        self.error_box = _classed(widgets.HTML(""), "steerlab-error")
        self.hooks_label = _classed(widgets.Label(f"steerlab hooks on model: {hooks}"),
                                    "steerlab-hooks")  # fmt: skip
        self.status_label = _classed(widgets.Label(""), "steerlab-status")
        # A plain figure, updated in place and shown through an Output widget as plotly JSON:
        # JupyterLab's plotly renderer draws it at the panel's width on any screen. (A
        # FigureWidget drew empty axes with plotly 7.1 and anywidget 0.11 in JupyterLab 4.6.)
        self.figure = go.Figure(
            layout={"autosize": True, "height": 460, "margin": {"l": 60, "r": 20, "t": 50}}
        )
        self.figure_view = _classed(widgets.Output(layout=widgets.Layout(width="100%")),
                                    "steerlab-figure")  # fmt: skip
        self.strip_view = _classed(widgets.Output(layout=widgets.Layout(width="100%")),
                                   "steerlab-feature-strip")  # fmt: skip
        self.monitor_view = _classed(
            widgets.Output(layout=widgets.Layout(width="100%", display="none")),
            "steerlab-monitor-strip",
        )
        self.fired_label = _classed(widgets.HTML("", layout=widgets.Layout(margin="0 0 0 1em")),
                                    "steerlab-fired")  # fmt: skip
        self.top_buttons = [widgets.Button(layout=widgets.Layout(width="auto")) for _ in range(8)]
        for button in self.top_buttons:
            button.add_class("steerlab-top-feature")
            button.on_click(on_top_feature)
        self.top_feature_box = _classed(widgets.HBox(self.top_buttons, layout=_WRAP),
                                        "steerlab-top-features")  # fmt: skip
        picker = self._picker(controls) if features else None
        exports = widgets.HBox([
            export_button(self.figure, lambda: export_stem("norms")),
            completions_button(record, lambda: export_stem("completions")),
        ], layout=_WRAP)  # fmt: skip
        separator = widgets.Label("│", layout=widgets.Layout(margin="0 0.8em"))
        self.widget = widgets.VBox(
            [
                self.hint,
                controls.box(picker, self.fired_label),
                self.error_box,
                self._panes(),
                *([self.strip_view] if features else []),
                self.monitor_view,
                self.figure_view,
                exports,
                widgets.HBox([self.hooks_label, separator, self.status_label], layout=_WRAP),
            ],
            layout=widgets.Layout(width="100%", max_width="1400px"),
        )
        self.widget.add_class("steerlab-panel")

    def _panes(self) -> widgets.GridBox:
        """Titles in one grid row and panes in the next, so that both panes start level
        however many lines the steered title takes; the baseline title sits on its pane."""
        self.baseline_pane = _pane("steerlab-baseline")
        self.steered_pane = _pane("steerlab-steered")
        self.baseline_title = widgets.HTML("<b>baseline</b> · no steering")
        self.steered_title = _classed(widgets.HTML("<b>steered</b>"), "steerlab-steered-title")
        for title in (self.baseline_title, self.steered_title):
            title.add_class("steerlab-pane-title")
        self.baseline_title.layout.align_self = "flex-end"
        css = widgets.HTML(PANEL_CSS, layout=widgets.Layout(display="none"))  # no grid cell
        panes = widgets.GridBox(
            [self.baseline_title, self.steered_title, self.baseline_pane, self.steered_pane, css],
            layout=widgets.Layout(grid_template_columns="minmax(0, 1fr) minmax(0, 1fr)",
                                  grid_gap="0 8px", width="100%"),
        )  # fmt: skip
        return _classed(panes, "steerlab-panes")

    def _picker(self, controls: Controls) -> widgets.VBox:
        picker = widgets.VBox([
            widgets.HBox([controls.feature, controls.feature_op], layout=_WRAP),
            widgets.HBox([widgets.Label("top features of this prompt:"),
                          self.top_feature_box], layout=_WRAP),
        ])  # fmt: skip
        return _classed(picker, "steerlab-feature-picker")

    def show_texts(
        self, prompt: str, texts: list[str], panes: tuple[widgets.HTML, ...] | None = None
    ) -> None:
        """Write ``texts`` into ``panes`` (both by default; one steered text for one pane)."""
        panes = (self.baseline_pane, self.steered_pane) if panes is None else panes
        texts = texts[-len(panes) :]
        for pane, text in zip(panes, texts, strict=True):
            pane.value = (
                f"<div style='white-space:pre-wrap;font-family:monospace'>"
                f"<span style='color:#888'>{html.escape(prompt)}</span>{html.escape(text)}</div>"
            )

    def show_error(self, message: str) -> None:
        self.fired_label.value = ""
        self.error_box.value = (
            f"<div style='color:#b00020;white-space:pre-wrap'>⚠ {html.escape(message)}</div>"
        )

    def mark_stale(self, *, baseline: bool, steered: bool) -> None:
        """Say on each pane whether it shows the current controls' result."""
        panes = ((self.baseline_title, self.baseline_pane, baseline),
                 (self.steered_title, self.steered_pane, steered))  # fmt: skip
        for title, pane, stale in panes:
            text = title.value.split(" <span class='steerlab-stale-note'")[0]
            if stale:
                text += (
                    f" <span class='steerlab-stale-note' style='color:#b00020'>{STALE_NOTE}</span>"
                )
            title.value = text
            if stale:
                pane.add_class("steerlab-stale")
                pane.layout.border = STALE_BORDER
            else:
                pane.remove_class("steerlab-stale")
                pane.layout.border = PANE_BORDER

    def update_figure(self, fresh: go.Figure) -> None:
        """Update the traces in place (same shapes) or replace them (first run, new kinds),
        then redraw the view."""
        with self.figure.batch_update():
            if len(self.figure.data) == len(fresh.data):
                for trace, new in zip(self.figure.data, fresh.data):
                    values = new.to_plotly_json()
                    values.pop("type", None)
                    trace.update(values, overwrite=True)
            else:
                self.figure.data = ()
                self.figure.add_traces(list(fresh.data))
            layout = fresh.layout.to_plotly_json()
            for key in ("template", "annotations", "shapes"):
                layout.pop(key, None)
            self.figure.layout.update(layout)
            # Lists are replaced, not merged: the "no difference" note and the prompt/generated
            # divider come and go with alpha.
            self.figure.layout.annotations = fresh.layout.annotations
            self.figure.layout.shapes = fresh.layout.shapes
        # Replace the view's output; safe from the debouncer's thread (no ``with``).
        self.figure_view.outputs = plotly_output(self.figure, "steerlab panel figure")

    def show_strip(self, view: widgets.Output, figure: go.Figure | None, text: str) -> None:
        """Show ``figure`` in a strip's view, or hide the view for ``None``."""
        view.outputs = () if figure is None else plotly_output(figure, text)
        if view is self.monitor_view:
            view.layout.display = "none" if figure is None else None


def plotly_output(figure: go.Figure, text: str) -> tuple[dict[str, Any], ...]:
    """``figure`` as an Output widget's outputs: plotly JSON, drawn by JupyterLab's renderer.

    Not ``responsive``: plotly's responsive mode sizes the plot from its container when it
    first draws, and a container that has no height yet (a panel output drawn at 1024 px)
    gave a plot 0 px tall until the window was resized. The layout's height holds, and
    JupyterLab still resizes the plot with its output area.
    """
    spec = json.loads(figure.to_json())
    spec["config"] = {"responsive": False, "displaylogo": False}
    return ({"output_type": "display_data", "data": {PLOTLY_MIME: spec, "text/plain": text},
             "metadata": {}},)  # fmt: skip


def steered_title(request: PanelRequest, plan: PanelSteer) -> str:
    """Site, positions, vector (and where it came from), op and alpha."""
    vector = html.escape(request.vector)
    if plan.lent_from is not None:
        vector += (
            f" <span class='steerlab-lent' style='color:#b35900'>"
            f"(extracted at {plan.lent_from})</span>"
        )
    if request.vector == FEATURE:
        vector = html.escape(plan.label) + vector.removeprefix(html.escape(request.vector))
        if request.feature_op == "clamp":
            return (
                f"<b>steered</b> · {request.site} · positions {request.positions} · "
                f"clamp {vector} to {format_alpha(request.alpha)}"
            )
    op = getattr(plan.steer.op, "name", "") or type(plan.steer.op).__name__.lower()
    return (
        f"<b>steered</b> · {request.site} · positions {request.positions} · "
        f"vector {vector} · {op} · {_alpha(request.alpha)}{only_when(request)}"
    )


def _alpha(alpha: float) -> str:
    """The title's alpha, as "α = 4", kept on one line wherever the title wraps."""
    return f"<span style='white-space:nowrap'>α = {format_alpha(alpha)}</span>"


def _classed(widget: Any, css_class: str) -> Any:
    widget.add_class(css_class)
    return widget


def _pane(css_class: str) -> widgets.HTML:
    pane = widgets.HTML("", layout=widgets.Layout(border=PANE_BORDER, padding="4px"))
    pane.add_class("steerlab-pane")
    pane.add_class(css_class)
    return pane
