"""``SteeringPanel``: baseline and steered completions that regenerate as the controls move."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from steerlab.core import SteerError
from steerlab.core.prompts import encode
from steerlab.core.results import Generation
from steerlab.core.sites import Site
from steerlab.features import SAE
from steerlab.model import SteerableModel
from steerlab.widgets.controls import build_controls, hook_kinds
from steerlab.widgets.debounce import Debouncer
from steerlab.widgets.feature_strip import top_features
from steerlab.widgets.panel_run import PanelRun
from steerlab.widgets.runner import (
    FEATURE,
    BaselineRun,
    PanelRequest,
    VectorLike,
    check_panel,
    check_vector,
    default_layer,
    format_alpha,
    next_free_stem,
)
from steerlab.widgets.site_lock import SiteLock
from steerlab.widgets.trained import readable, trained_entry
from steerlab.widgets.view import PanelView


class SteeringPanel(PanelRun):
    """A live panel: move a control and the baseline and steered completions regenerate.

    Both completions use the same seed, so they differ only by the steer. The baseline holds
    still: it reruns (in one batch with the steered row, ``alpha=[0, alpha]``) only when what
    feeds it changes (prompt, sampling, seed, max tokens); a change of vector, layer, site,
    positions or alpha reruns the steered row alone. Changes are debounced; a run made stale
    by a newer change stops at its next token, and only the latest request is rendered.
    Errors show in the panel, and a pane from an earlier run is marked as not current (the
    baseline only when the failed change fed it).
    The max-tokens slider stops at the context window minus the prompt's tokens.

    With ``sae``, the vector dropdown also offers ``"SAE feature"``: a feature picker (an
    index box, and the top features of the prompt to click) chooses the feature, which
    either adds alpha times its decoder row or clamps the feature to alpha (at the SAE's
    site). A strip under the completions shows the chosen feature's activation at each
    generated token, baseline against steered. In clamp mode the layer and hook point
    controls move to the SAE's site and are disabled. A feature index outside the SAE is
    an error in the panel, not a silent change of feature.

    "Steer only when" gates the steered row with a CAST condition (``sl.Condition``): the
    chosen vector's direction, the prompt's mean cosine at ``blocks.{L}.hook_resid_post``,
    above or below a threshold. CAST's cosine is blind to the vector's sign (a prompt
    opposite it scores as high as one along it); ``sl.Condition(..., score="projection")``
    is the signed read, in code. A label beside it says whether the prompt fired it and on
    what score. A row that does not fire is the unsteered row. The baseline row has alpha
    0, so a condition leaves it unchanged, and changing the condition reruns the steered
    row alone. A bad combination (a condition after a steer that touches the prompt) is an
    error in the panel.

    "monitor" shows a strip under the completions: the chosen vector's projection
    ``h·v/|v|`` at the steering site, the activation the next layer sees (after the
    steer), at the position whose forward chose each generated token, as
    ``lm.generate(..., monitor=)`` reads it; baseline against steered. The values are the
    engine's own readouts (``out.monitors``): a run that computes the baseline monitors
    every vector at every residual site, so choosing a monitor later does not rerun the
    baseline (unless the kept one did not read it: a hook point other than a residual one,
    or a vector added or replaced since).

    Args:
        lm: the model to steer.
        vectors: name -> ``SteeringVector`` or ``[d_model]`` tensor, offered in a dropdown
            (may be empty with an ``sae``).
        prompt: the starting prompt.
        layer: starting layer; defaults to the first vector's layer, else the middle one.
        hook: starting site kind, one of those in ``lm.sites()``.
        alpha: starting strength; ``alpha_range`` and ``alpha_step`` shape its slider.
        max_new_tokens: starting completion length.
        debounce: seconds to wait after the last change before running (0: run at once,
            in the caller's thread).
        export_stem: path stem for the figure and completions exports.
        sae: an ``SAE`` whose features steer and are shown (``sl.load_sae``).
        feature: start on this SAE feature (selected in the vector dropdown).

    >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> panel = SteeringPanel(lm, {"joy": vec}, prompt="Once upon a time", max_new_tokens=8)
    >>> panel.controls.alpha.value = 4.0
    >>> panel.wait()
    True
    >>> panel.steered_text
    ', there was a happy joy. The'
    >>> panel.close()
    >>> SteeringPanel(lm, sae=sl.load_sae("steerlab-tiny-sae")).close()
    """

    def __init__(
        self,
        lm: SteerableModel,
        vectors: Mapping[str, VectorLike] | None = None,
        prompt: str = "Once upon a time",
        *,
        layer: int | None = None,
        hook: str = "hook_resid_pre",
        alpha: float = 4.0,
        alpha_range: tuple[float, float] = (-20.0, 20.0),
        alpha_step: float = 0.5,
        max_new_tokens: int = 30,
        debounce: float = 0.05,
        export_stem: str = "steerlab_panel",
        sae: SAE | None = None,
        feature: int | None = None,
    ) -> None:
        vectors = {} if vectors is None else vectors
        check_panel(lm, vectors, sae)
        self.lm = lm
        self.sae = sae
        self.vectors = dict(vectors)
        sae_site = None if sae is None else Site.parse(sae.site)
        if not vectors and sae_site is not None:  # start on the SAE's own site
            layer = sae_site.layer if layer is None else layer
            hook = sae_site.kind
        self.controls = build_controls(
            prompt=prompt,
            vector_names=self._vector_options(),
            n_layers=lm.n_layers,
            kinds=hook_kinds(lm.sites()),
            layer=default_layer(lm, self.vectors, layer),
            hook=hook,
            alpha=alpha,
            alpha_range=alpha_range,
            max_new_tokens=max_new_tokens,
            d_sae=1 if sae is None else sae.d_sae,
        )
        self.controls.set_vector_names(readable(self.vectors))
        self.controls.alpha.step = alpha_step
        if feature is not None:
            if sae is None:
                raise ValueError("feature= picks an SAE feature: give sae= too.")
            self.controls.vector.value = FEATURE
            sae.feature(feature)  # SAEError for an index out of range
            self.controls.feature.value = int(feature)
        self._fit_max_tokens()
        self._start(export_stem, debounce)

    def _start(self, export_stem: str, debounce: float) -> None:
        """The panel's state and view, then the first run."""
        self.baseline_text = ""
        self.steered_text = ""
        self.render_count = 0
        self.rendered: PanelRequest | None = None
        self.generation: Generation | None = None
        self.error: str | None = None
        self.baseline: BaselineRun | None = None
        self.baseline_runs = 0  # runs that (re)computed the baseline row
        self.lent_warned: set[tuple[str, str, str]] = set()  # (vector, from site, to site)
        self.top_features: list[int] = []  # the prompt's strongest SAE features
        self._top_prompt: str | None = None
        self.strip: go.Figure | None = None  # the chosen feature per generated token
        self.monitor_strip: go.Figure | None = None  # the monitored projection per token
        self._export_stem = export_stem
        self.history: list[tuple[int, str]] = []  # (request id, rendered|cancelled|error|skipped)
        self._latest = 0
        self._muted = False  # True while add_vector swaps the dropdown's options
        self._closed = False
        self._site_lock = SiteLock(self.controls)
        self._run_lock = threading.Lock()
        self._debouncer = Debouncer(self._run, debounce)
        self._sync_site_controls()
        self._show(PanelView(self.controls, features=self.sae is not None,
                             hooks=self.lm.hook_count(), record=self.record,
                             export_stem=self.export_stem, on_top_feature=self._on_top_feature))  # fmt: skip
        for control in self.controls.all():
            control.observe(self._on_change, names="value")
        self.refresh()

    def _show(self, view: PanelView) -> None:
        """Take ``view``'s widgets as the panel's own."""
        self.view = view
        self.widget, self.hint, self.error_box = view.widget, view.hint, view.error_box
        self.hooks_label, self.status_label = view.hooks_label, view.status_label
        self.figure, self.figure_view = view.figure, view.figure_view
        self.baseline_pane, self.steered_pane = view.baseline_pane, view.steered_pane
        self.baseline_title, self.steered_title = view.baseline_title, view.steered_title
        self.strip_view, self.monitor_view = view.strip_view, view.monitor_view
        self.fired_label, self.top_buttons = view.fired_label, view.top_buttons

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

        >>> panel = SteeringPanel(lm, {"ones": torch.ones(lm.d_model)}, max_new_tokens=2)
        >>> panel.add_vector("twos", 2 * torch.ones(lm.d_model))
        >>> list(panel.vectors)
        ['ones', 'twos']
        >>> panel.close()
        """
        check_vector(name, vector)
        replaced = name in self.vectors
        self.vectors[name] = vector
        if replaced and self.baseline is not None:  # what the kept baseline read of the old one
            kept = {k: v for k, v in self.baseline.readouts.items() if k[0] != name}
            self.baseline = replace(self.baseline, readouts=kept)
        dropdown = self.controls.vector
        current, self._muted = dropdown.value, True
        try:  # new options reset the selection: put it back without a run
            dropdown.options = self._vector_options()
            dropdown.value = current
            self.controls.set_vector_names(readable(self.vectors))
        finally:
            self._muted = False
        if select and dropdown.value != name:
            dropdown.value = name  # observed: a debounced rerun
        elif replaced and dropdown.value == name:
            self._debouncer.trigger(self._next_request())

    def remove_vector(self, name: str) -> None:
        """Take a vector out of the running panel: its data and its dropdown entry.

        If it is selected, the first remaining entry is selected and the completions
        regenerate with it.

        Raises:
            SteerError: For a name the panel does not offer, or its last vector (with no
                SAE feature to fall back on), before the panel changes.

        >>> panel = SteeringPanel(lm, {"ones": torch.ones(lm.d_model),
        ...                            "wrong size": torch.ones(7)}, max_new_tokens=2)
        >>> panel.remove_vector("wrong size")
        >>> list(panel.vectors), panel.controls.vector.options
        (['ones'], ('ones',))
        >>> panel.close()
        """
        if name not in self.vectors:
            raise SteerError(f"No vector named {name!r}; the panel has {sorted(self.vectors)}.")
        if len(self.vectors) == 1 and self.sae is None:
            raise SteerError(f"{name!r} is the panel's only vector; add another one first.")
        del self.vectors[name]
        dropdown = self.controls.vector
        selected, self._muted = dropdown.value == name, True
        current = dropdown.value
        reads = name in (self.controls.condition.value, self.controls.monitor.value)
        try:  # new options reset the selection: put it back without a run
            dropdown.options = self._vector_options()
            dropdown.value = dropdown.options[0] if selected else current
            self.controls.set_vector_names(readable(self.vectors))  # its condition/monitor: off
        finally:
            self._muted = False
        if selected:
            self._sync_site_controls()
        if selected or reads:
            self._debouncer.trigger(self._next_request())

    def _vector_options(self) -> list[str]:
        return list(self.vectors) + ([FEATURE] if self.sae is not None else [])

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

    def _on_change(self, change: dict[str, Any]) -> None:
        if self._muted or self._closed:
            return
        owner = change.get("owner")
        if owner is self.controls.prompt:
            self._fit_max_tokens()
        if owner is self.controls.vector or owner is self.controls.feature_op:
            self._sync_site_controls()
        self._debouncer.trigger(self._next_request())

    def _fit_max_tokens(self) -> None:
        """Cap max tokens at the context window minus the prompt (at least 1, so that a
        prompt too long for the window reaches the run and shows its error)."""
        n_ctx = self.lm.n_ctx
        if n_ctx is None:
            return
        n_prompt = len(encode(self.lm.tokenizer, self.controls.prompt.value, chat=False))
        slider, self._muted = self.controls.max_new_tokens, True
        try:  # a clamped value is part of this change, not a run of its own
            slider.max = max(1, n_ctx - n_prompt)
        finally:
            self._muted = False

    def _sync_site_controls(self) -> None:
        """Lock the site and position controls the chosen steer fixes (``SiteLock``); part
        of the change that switched the mode, not a run of its own."""
        controls = self.controls
        clamping = (self.sae is not None and controls.vector.value == FEATURE
                    and controls.feature_op.value == "clamp")  # fmt: skip
        muted, self._muted = self._muted, True
        try:
            self._site_lock.sync(trained_entry(self.vectors, controls.vector.value),
                                 self.sae.site if clamping and self.sae else None)  # fmt: skip
        finally:
            self._muted = muted

    # --- SAE features -------------------------------------------------------------------

    def _show_top_features(self, prompt: str) -> None:
        """Buttons for the prompt's strongest features; a click picks that feature.
        Recomputed when the prompt changes."""
        if self.sae is None or prompt == self._top_prompt:
            return
        self.top_features = top_features(self.lm, self.sae, prompt, len(self.top_buttons))
        self._top_prompt = prompt
        for k, button in enumerate(self.top_buttons):  # fixed buttons, relabelled
            shown = k < len(self.top_features)
            button.description = str(self.top_features[k]) if shown else ""
            button.tooltip = f"steer with feature {button.description}" if shown else ""
            button.layout.display = None if shown else "none"

    def _on_top_feature(self, button: widgets.Button) -> None:
        if button.description:
            self._pick_feature(int(button.description))

    def _pick_feature(self, i: int) -> None:
        """Steer with feature ``i`` (one rerun, whichever controls change)."""
        muted, self._muted = self._muted, True
        try:
            self.controls.feature.value = i
            self.controls.vector.value = FEATURE
        finally:
            self._muted = muted
        self._sync_site_controls()
        self._debouncer.trigger(self._next_request())

    def export_stem(self, kind: str) -> str:
        """A fresh path stem for an export of the rendered run: site, alpha and a counter.

        >>> panel = SteeringPanel(lm, {"ones": torch.ones(lm.d_model)}, max_new_tokens=2)
        >>> panel.wait()
        True
        >>> panel.export_stem("norms")
        'steerlab_panel_norms_blocks.2.hook_resid_pre_a4_001'
        >>> panel.close()
        """
        r = self.rendered
        where = "" if r is None else f"_{r.site}_a{format_alpha(r.alpha)}"
        return next_free_stem(f"{self._export_stem}_{kind}{where}")

    # --- display ------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = repr(self)
        return data

    def __repr__(self) -> str:
        r = self.rendered
        where = f"{r.site}, alpha={format_alpha(r.alpha)}" if r else "nothing rendered"
        return (
            f"SteeringPanel({self.lm.name or type(self.lm.model).__name__}, "
            f"vectors={list(self.vectors)}, {where}, renders={self.render_count})"
        )
