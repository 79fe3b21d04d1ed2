"""``SteeringPanel``: baseline and steered completions that regenerate as the controls move."""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from steerlab.core.results import Generation
from steerlab.core.sites import Site
from steerlab.model import SteerableModel
from steerlab.plots import export_button
from steerlab.vectors import SteeringVector
from steerlab.widgets.completions import completions_button
from steerlab.widgets.controls import build_controls, hook_kinds
from steerlab.widgets.debounce import Debouncer
from steerlab.widgets.figure import pair_norms_figure
from steerlab.widgets.runner import (
    PanelRequest,
    VectorLike,
    check_vector,
    pair_steer,
    stream_pair,
)

PLOTLY_MIME = "application/vnd.plotly.v1+json"
HINT = (
    "<i>Drag the <b>alpha</b> slider (or click it and press ← →): the steered completion "
    "regenerates beside the baseline.</i>"
)


class SteeringPanel:
    """A live panel: move a control and the baseline and steered completions regenerate.

    Both completions come from one batch (``alpha=[0, alpha]``) with the same seed, so they
    differ only by the steer. Changes are debounced; a run made stale by a newer change stops
    at its next token, and only the latest request is rendered. Errors show in the panel.

    Args:
        lm: the model to steer.
        vectors: name -> ``SteeringVector`` or ``[d_model]`` tensor, offered in a dropdown.
        prompt: the starting prompt.
        layer: starting layer; defaults to the first vector's layer, else the middle one.
        hook: starting site kind, one of those in ``lm.sites()``.
        alpha: starting strength; ``alpha_range`` and ``alpha_step`` shape its slider.
        max_new_tokens: starting completion length.
        debounce: seconds to wait after the last change before running (0: run at once,
            in the caller's thread).
        export_stem: path stem for the figure and completions exports.

    >>> panel = SteeringPanel(lm, {"joy": vec}, prompt="Once upon a time")  # doctest: +SKIP
    >>> panel.controls.alpha.value = 6.0; panel.wait(); panel.steered_text  # doctest: +SKIP
    """

    def __init__(
        self,
        lm: SteerableModel,
        vectors: Mapping[str, VectorLike],
        prompt: str = "Once upon a time",
        *,
        layer: int | None = None,
        hook: str = "hook_resid_pre",
        alpha: float = 4.0,
        alpha_range: tuple[float, float] = (-20.0, 20.0),
        alpha_step: float = 0.5,
        max_new_tokens: int = 30,
        debounce: float = 0.15,
        export_stem: str = "steerlab_panel",
    ) -> None:
        if not vectors:
            raise ValueError("SteeringPanel needs at least one vector, e.g. {'joy': vec}.")
        for name, vector in vectors.items():
            check_vector(name, vector)
        self.lm = lm
        self.vectors = dict(vectors)
        self.controls = build_controls(
            prompt=prompt,
            vector_names=list(self.vectors),
            n_layers=lm.n_layers,
            kinds=hook_kinds(lm.sites()),
            layer=_default_layer(lm, self.vectors, layer),
            hook=hook,
            alpha=alpha,
            alpha_range=alpha_range,
            max_new_tokens=max_new_tokens,
        )
        self.controls.alpha.step = alpha_step
        self.baseline_text = ""
        self.steered_text = ""
        self.render_count = 0
        self.rendered: PanelRequest | None = None
        self.generation: Generation | None = None
        self.error: str | None = None
        self.history: list[tuple[int, str]] = []  # (request id, rendered|cancelled|error|skipped)
        self._latest = 0
        self._muted = False  # True while add_vector swaps the dropdown's options
        self._closed = False
        self._run_lock = threading.Lock()
        self._debouncer = Debouncer(self._run, debounce)
        self._build_view(export_stem)
        for control in self.controls.all():
            control.observe(self._on_change, names="value")
        self.refresh()

    # --- public -------------------------------------------------------------------------

    @property
    def rendered_alpha(self) -> float | None:
        return None if self.rendered is None else self.rendered.alpha

    def refresh(self) -> None:
        """Run the current controls now, in this thread, and render the result."""
        self._run(self._next_request())

    def add_vector(self, name: str, vector: VectorLike, *, select: bool = True) -> None:
        """Offer another vector (or replace one of the same name) in the running panel.

        Updates the data and the vector dropdown in one call; with ``select`` it is chosen
        and the completions regenerate with it.

        Args:
            name: The name shown in the dropdown.
            vector: A ``SteeringVector`` or a ``[d_model]`` tensor.
            select: Switch the panel to this vector now.

        Raises:
            SteerError: For a name that is not a string or a vector of the wrong type,
                before the panel changes. A vector of the wrong size shows its error in the
                panel when it is used, like any other run error.

        >>> panel.add_vector("calm", calm_vector)  # doctest: +SKIP
        """
        check_vector(name, vector)
        replaced = name in self.vectors
        self.vectors[name] = vector
        dropdown = self.controls.vector
        current, self._muted = dropdown.value, True
        try:  # new options reset the selection: put it back without a run
            dropdown.options = list(self.vectors)
            dropdown.value = current
        finally:
            self._muted = False
        if select and dropdown.value != name:
            dropdown.value = name  # observed: a debounced rerun
        elif replaced and dropdown.value == name:
            self._debouncer.trigger(self._next_request())

    def wait(self, timeout: float = 60.0) -> bool:
        """Block until the pending change (if any) has run; True unless ``timeout`` passed."""
        done = self._debouncer.join(timeout)
        with self._run_lock:  # a stale run still stopping
            return done

    def record(self) -> dict[str, Any] | None:
        """The rendered completions and the settings that made them (``None`` before any)."""
        if self.rendered is None:
            return None
        return {
            **self.rendered.as_dict(),
            "baseline": self.baseline_text,
            "steered": self.steered_text,
        }

    def close(self) -> None:
        """Stop any run in flight (it sees it is stale at its next token) and close the widgets.

        A closed panel starts no more runs, whatever its controls do.
        """
        self._closed = True
        self._latest += 1
        self._debouncer.cancel()
        self.widget.close()

    # --- running ------------------------------------------------------------------------

    def _next_request(self) -> PanelRequest:
        self._latest += 1
        return self.controls.request(self._latest)

    def _on_change(self, _change: dict[str, Any]) -> None:
        if self._muted or self._closed:
            return
        self._debouncer.trigger(self._next_request())

    def _is_current(self, request: PanelRequest) -> bool:
        return request.request_id == self._latest

    def _run(self, request: PanelRequest) -> None:
        # One run at a time: two runs would put their hooks on the same model together.
        with self._run_lock:
            if self._closed or not self._is_current(request):
                self.history.append((request.request_id, "skipped"))
                return
            start = time.perf_counter()
            self._status(f"running request {request.request_id} …")
            outcome = "interrupted"  # stays so if a KeyboardInterrupt (kernel interrupt) lands
            try:
                outcome = self._generate(request)
            except Exception as error:  # anything: show it in the panel, keep the panel alive
                outcome = "error"
                if self._is_current(request):
                    self._show_error(error)
            finally:
                self.history.append((request.request_id, outcome))
                self.hooks_label.value = f"steerlab hooks on model: {self.lm.hook_count()}"
                seconds = time.perf_counter() - start
                if outcome == "rendered":
                    self._status(f"last run: request {request.request_id} took {seconds:.2f} s")
                elif outcome == "interrupted":
                    self._status(f"request {request.request_id} {outcome} after {seconds:.2f} s")

    def _generate(self, request: PanelRequest) -> str:
        steer = pair_steer(request, self.vectors)
        generation = None
        resid = [s for s in self.lm.sites() if ".hook_resid_" in s]
        for step, (texts, final) in enumerate(
            stream_pair(self.lm, request, steer, lambda: self._is_current(request), resid)
        ):
            if step == 0:
                self.hooks_label.value = f"steerlab hooks on model: {self.lm.hook_count()}"
            self._show_texts(request.prompt, texts)
            generation = final
        if generation is None:
            return "cancelled"
        if not self._is_current(request):
            return "cancelled"
        self._update_figure(self._figure(generation, request))
        self.baseline_text, self.steered_text = generation.text
        self.generation, self.rendered, self.error = generation, request, None
        self.error_box.value = ""
        self.steered_title.value = f"<b>steered</b> · {request.site} · α = {request.alpha:g}"
        self.render_count += 1
        return "rendered"

    def _figure(self, generation: Generation, request: PanelRequest) -> go.Figure:
        if generation.activations is None:
            raise RuntimeError("the generation kept no activations for the panel's figure")
        return pair_norms_figure(
            generation.activations,
            generation.prompt_tokens[1],
            generation.tokens,
            self.lm.tokenizer.decode,
            request.alpha,
        )

    # --- view ---------------------------------------------------------------------------

    def _build_view(self, export_stem: str) -> None:
        self.baseline_pane = _pane("steerlab-baseline")
        self.steered_pane = _pane("steerlab-steered")
        self.baseline_title = widgets.HTML("<b>baseline</b> · α = 0")
        self.steered_title = widgets.HTML("<b>steered</b>")
        self.steered_title.add_class("steerlab-steered-title")
        self.hint = widgets.HTML(HINT)
        self.hint.add_class("steerlab-hint")
        self.error_box = widgets.HTML("")
        self.error_box.add_class("steerlab-error")
        self.hooks_label = widgets.Label(f"steerlab hooks on model: {self.lm.hook_count()}")
        self.hooks_label.add_class("steerlab-hooks")
        self.status_label = widgets.Label("")
        self.status_label.add_class("steerlab-status")
        # A plain figure, updated in place and shown through an Output widget as plotly JSON:
        # JupyterLab's plotly renderer draws it at the panel's width on any screen. (A
        # FigureWidget drew empty axes with plotly 7.1 and anywidget 0.11 in JupyterLab 4.6.)
        self.figure = go.Figure(
            layout={"autosize": True, "height": 460, "margin": {"l": 60, "r": 20, "t": 50}}
        )
        self.figure_view = widgets.Output(layout=widgets.Layout(width="100%"))
        self.figure_view.add_class("steerlab-figure")
        column = widgets.Layout(flex="1 1 320px", min_width="260px", margin="0 8px 0 0")
        panes = widgets.HBox(
            [
                widgets.VBox([self.baseline_title, self.baseline_pane], layout=column),
                widgets.VBox([self.steered_title, self.steered_pane], layout=column),
            ],
            layout=widgets.Layout(flex_flow="row wrap"),
        )
        wrap = widgets.Layout(flex_flow="row wrap")
        exports = widgets.HBox(
            [
                export_button(self.figure, f"{export_stem}_norms"),
                completions_button(self.record, f"{export_stem}_completions"),
            ],
            layout=wrap,
        )
        separator = widgets.Label("│", layout=widgets.Layout(margin="0 0.8em"))
        self.widget = widgets.VBox(
            [
                self.hint,
                self.controls.box(),
                self.error_box,
                panes,
                self.figure_view,
                exports,
                widgets.HBox([self.hooks_label, separator, self.status_label], layout=wrap),
            ],
            layout=widgets.Layout(width="100%", max_width="1400px"),
        )
        self.widget.add_class("steerlab-panel")

    def _show_texts(self, prompt: str, texts: list[str]) -> None:
        for pane, text in zip((self.baseline_pane, self.steered_pane), texts):
            pane.value = (
                f"<div style='white-space:pre-wrap;font-family:monospace'>"
                f"<span style='color:#888'>{html.escape(prompt)}</span>{html.escape(text)}</div>"
            )

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.error_box.value = (
            f"<div style='color:#b00020;white-space:pre-wrap'>⚠ {html.escape(self.error)}</div>"
        )
        self._status("error")
        if self.rendered is not None:  # panes may hold a cancelled run's partial text
            self._show_texts(self.rendered.prompt, [self.baseline_text, self.steered_text])

    def _status(self, text: str) -> None:
        self.status_label.value = text

    def _update_figure(self, fresh: go.Figure) -> None:
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
        self._show_figure()

    def _show_figure(self) -> None:
        """Replace the figure view's output; safe from the debouncer's thread (no ``with``)."""
        spec = json.loads(self.figure.to_json())
        spec["config"] = {"responsive": True, "displaylogo": False}
        self.figure_view.outputs = (
            {
                "output_type": "display_data",
                "data": {PLOTLY_MIME: spec, "text/plain": "steerlab panel figure"},
                "metadata": {},
            },
        )

    # --- display ------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = repr(self)
        return data

    def __repr__(self) -> str:
        r = self.rendered
        where = f"{r.site}, alpha={r.alpha:g}" if r else "nothing rendered"
        return (
            f"SteeringPanel({self.lm.name or type(self.lm.model).__name__}, "
            f"vectors={list(self.vectors)}, {where}, renders={self.render_count})"
        )


def _pane(css_class: str) -> widgets.HTML:
    pane = widgets.HTML("", layout=widgets.Layout(border="1px solid #ddd", padding="4px"))
    pane.add_class("steerlab-pane")
    pane.add_class(css_class)
    return pane


def _default_layer(lm: SteerableModel, vectors: dict[str, VectorLike], layer: int | None) -> int:
    if layer is not None:
        if not 0 <= layer < lm.n_layers:
            raise ValueError(f"layer {layer} is out of range: this model has 0..{lm.n_layers - 1}.")
        return layer
    first = next(iter(vectors.values()))
    if (
        isinstance(first, SteeringVector)
        and (found := Site.parse(first.sites[0]).layer) is not None
    ):
        return found
    return lm.n_layers // 2
