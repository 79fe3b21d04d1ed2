"""``SteeringPanel``: baseline and steered completions that regenerate as the controls move."""

from __future__ import annotations

import html
import json
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from steerlab.core import SteerError
from steerlab.core.prompts import encode
from steerlab.core.reads import score
from steerlab.core.reft import LoReFT
from steerlab.core.results import Generation
from steerlab.core.sites import Site
from steerlab.exporting import export_button
from steerlab.features import SAE
from steerlab.model import SteerableModel
from steerlab.vectors import SteeringVector
from steerlab.widgets.completions import completions_button
from steerlab.widgets.controls import POSITIONS, build_controls, hook_kinds
from steerlab.widgets.debounce import Debouncer
from steerlab.widgets.figure import pair_norms_figure, token_strip
from steerlab.widgets.runner import (
    FEATURE,
    PanelRequest,
    PanelSteer,
    VectorLike,
    baseline_key,
    check_vector,
    monitor_direction,
    panel_steer,
    stream_rows,
)

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PANE_BORDER, STALE_BORDER = "1px solid #ddd", "1px dashed #b00020"
STALE_NOTE = "⚠ not current: the last run failed; this is the previous result"
CLAMP_SITE_TIP = "a clamp acts at the SAE's own site"
TRAINED_SITE_TIP = "a trained LoReFT acts at the site it was trained at"
TRAINED_POSITIONS_TIP = "a trained LoReFT acts on the positions it was trained on"
# The panes and their titles at a text's line height, not a widget row's 28 px (five lines
# of a long steered title took 140 px).
PANEL_CSS = (
    "<style>.steerlab-panel :is(.steerlab-pane-title, .steerlab-pane) .widget-html-content "
    "{ line-height: 1.45; }</style>"
)
HINT = (
    "<i>Drag the <b>alpha</b> slider (or click it and press ← →): the steered completion "
    "regenerates beside the baseline.</i>"
)


@dataclass(frozen=True)
class BaselineRun:
    """The unsteered row of a finished run, kept while nothing that feeds it changes.

    ``activations`` holds the sites the run captured (every residual site, the SAE's and
    a monitored steering site)."""

    key: tuple[object, ...]
    text: str
    tokens: list[int]
    activations: dict[str, torch.Tensor]  # site -> [1, pos, d_model]


def format_alpha(alpha: float) -> str:
    """Alpha for display: at most 4 decimals, no float noise (the exact value stays in records).

    >>> format_alpha(5.0000000000000036), format_alpha(-0.25), format_alpha(1 / 3)
    ('5', '-0.25', '0.3333')
    """
    return f"{round(alpha, 4) + 0.0:g}"  # + 0.0 turns -0.0 into 0.0


def next_free_stem(stem: str) -> str:
    """``{stem}_{n:03d}`` for the smallest n with no file of any suffix, so exports never
    overwrite one another.

    >>> next_free_stem("/nonexistent/panel_norms")
    '/nonexistent/panel_norms_001'
    """
    folder, name = Path(stem).parent, Path(stem).name
    n = 1
    while any(folder.glob(f"{name}_{n:03d}.*")):
        n += 1
    return f"{stem}_{n:03d}"


class SteeringPanel:
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
    ``lm.generate(..., monitor=)`` reads it; baseline against steered. It is read from
    the run's captured activations, so choosing a monitor does not rerun the baseline
    (unless the cached baseline did not capture that site: a hook point other than a
    residual one).

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
        if not vectors and sae is None:
            raise ValueError("SteeringPanel needs at least one vector, e.g. {'joy': vec}, or sae=.")
        for name, vector in vectors.items():
            check_vector(name, vector)
        if sae is not None:
            if not isinstance(sae, SAE):
                raise TypeError(f"sae must be an SAE (sl.load_sae); got {type(sae).__name__}.")
            if FEATURE in vectors:
                raise ValueError(
                    f"{FEATURE!r} names the SAE's feature; give the vector another name."
                )
            if sae.d_in != lm.d_model:
                raise ValueError(
                    f"The SAE reads {sae.d_in} dimensions; this model has d_model={lm.d_model}."
                )
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
            layer=_default_layer(lm, self.vectors, layer),
            hook=hook,
            alpha=alpha,
            alpha_range=alpha_range,
            max_new_tokens=max_new_tokens,
            d_sae=1 if sae is None else sae.d_sae,
        )
        self.controls.set_vector_names(self._directions())
        self.controls.alpha.step = alpha_step
        if feature is not None:
            if sae is None:
                raise ValueError("feature= picks an SAE feature: give sae= too.")
            self.controls.vector.value = FEATURE
            sae.feature(feature)  # SAEError for an index out of range
            self.controls.feature.value = int(feature)
        self._fit_max_tokens()
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
        # (layer, hook, positions) as the user left them when a steer locked them
        self._unlocked: tuple[int, str, Any] | None = None
        self._run_lock = threading.Lock()
        self._debouncer = Debouncer(self._run, debounce)
        self._sync_site_controls()
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

        >>> panel = SteeringPanel(lm, {"ones": torch.ones(lm.d_model)}, max_new_tokens=2)
        >>> panel.add_vector("twos", 2 * torch.ones(lm.d_model))
        >>> list(panel.vectors)
        ['ones', 'twos']
        >>> panel.close()
        """
        check_vector(name, vector)
        replaced = name in self.vectors
        self.vectors[name] = vector
        dropdown = self.controls.vector
        current, self._muted = dropdown.value, True
        try:  # new options reset the selection: put it back without a run
            dropdown.options = self._vector_options()
            dropdown.value = current
            self.controls.set_vector_names(self._directions())
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
            self.controls.set_vector_names(self._directions())  # its condition/monitor: off
        finally:
            self._muted = False
        if selected:
            self._sync_site_controls()
        if selected or reads:
            self._debouncer.trigger(self._next_request())

    def _directions(self) -> list[str]:
        """The vectors with a direction to read (a condition, a monitor): not a LoReFT."""
        return [n for n, v in self.vectors.items() if not isinstance(v, LoReFT)]

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
        """Lock the controls the chosen steer fixes itself, showing its own values: in clamp
        mode the layer and hook point (a clamp reads the SAE's own encoding); for a trained
        LoReFT those and the positions it was trained on. Leaving a lock puts back what the
        user had chosen before it. Part of the change that switched the mode, not a run of
        its own."""
        controls = self.controls
        trained = self.vectors.get(controls.vector.value)
        trained = trained if isinstance(trained, LoReFT) else None
        clamping = (self.sae is not None and controls.vector.value == FEATURE
                    and controls.feature_op.value == "clamp")  # fmt: skip
        own = trained.site if trained is not None else self.sae.site if clamping else None  # type: ignore[union-attr]
        muted, self._muted = self._muted, True
        try:
            if own is not None and self._unlocked is None:
                self._unlocked = (controls.layer.value, controls.hook.value,
                                  controls.positions.value)  # fmt: skip
            if own is not None:
                site = Site.parse(own)
                if site.layer is not None:
                    controls.layer.value = site.layer
                controls.hook.value = site.kind
            self._sync_positions(trained)
            if own is None and self._unlocked is not None:
                controls.layer.value, controls.hook.value, _ = self._unlocked
                self._unlocked = None
        finally:
            self._muted = muted
        tip = TRAINED_SITE_TIP if trained is not None else CLAMP_SITE_TIP
        for control in (controls.layer, controls.hook):
            control.disabled = own is not None
            control.tooltip = tip if own is not None else None

    def _sync_positions(self, trained: LoReFT | None) -> None:
        """A trained LoReFT's positions, as the one locked entry; else the usual choices, at
        the user's own choice from before any lock."""
        dropdown = self.controls.positions
        if trained is not None:
            label = f"{trained.positions} (trained)"
            dropdown.options = [(label, trained.positions)]
            dropdown.value = trained.positions
        elif dropdown.disabled:
            dropdown.options = POSITIONS
            dropdown.value = "all" if self._unlocked is None else self._unlocked[2]
        dropdown.disabled = trained is not None
        dropdown.tooltip = TRAINED_POSITIONS_TIP if trained is not None else None

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
                    self._show_error(error, request)
            finally:
                self.history.append((request.request_id, outcome))
                self.hooks_label.value = f"steerlab hooks on model: {self.lm.hook_count()}"
                seconds = time.perf_counter() - start
                if outcome == "rendered":
                    self._status(f"last run: request {request.request_id} took {seconds:.2f} s")
                elif outcome == "interrupted":
                    self._status(f"request {request.request_id} {outcome} after {seconds:.2f} s")

    def _generate(self, request: PanelRequest) -> str:
        key = baseline_key(request)
        capture = [s for s in self.lm.sites() if ".hook_resid_" in s]
        capture += [s for s in self._read_sites(request) if s not in capture]
        cached = self.baseline if self.baseline is not None and self.baseline.key == key else None
        if cached is not None and not set(self._read_sites(request)) <= set(cached.activations):
            cached = None  # a monitor at a site the kept baseline did not capture
        alphas = [request.alpha] if cached else [0.0, request.alpha]
        plan = panel_steer(request, self.vectors, alphas, self.sae)
        self._warn_if_lent(request, plan)
        if self.sae is not None:
            self._show_top_features(request.prompt)
        if cached is None:
            self._show_texts(request.prompt, ["", ""])
        else:
            self._show_texts(request.prompt, [cached.text, ""])
        generation = None
        stream = stream_rows(self.lm, request, plan.steer, lambda: self._is_current(request),
                             capture)  # fmt: skip
        for step, (texts, final) in enumerate(stream):
            if step == 0:
                self.hooks_label.value = f"steerlab hooks on model: {self.lm.hook_count()}"
            if cached is None:
                self._show_texts(request.prompt, texts)
            else:
                self._show_texts(request.prompt, texts, panes=(self.steered_pane,))
            generation = final
        if generation is None or not self._is_current(request):
            return "cancelled"
        if cached is None:
            cached = self._keep_baseline(key, generation)
        steered_text = generation.text[-1]
        figure = self._figure(cached, generation, request)
        figure.layout.meta = {"steerlab_panel": request.as_dict()}  # exact alpha, for exports
        self._update_figure(figure)
        if self.sae is not None:
            self._show_feature_strip(cached, generation, request)
        self._show_monitor_strip(cached, generation, request)
        self._show_fired(request, generation)
        self.baseline_text, self.steered_text = cached.text, steered_text
        self.generation, self.rendered, self.error = generation, request, None
        self.error_box.value = ""
        self._mark_stale(baseline=False, steered=False)
        self.steered_title.value = self._title(request, plan)
        self.render_count += 1
        return "rendered"

    def _keep_baseline(self, key: tuple[object, ...], pair: Generation) -> BaselineRun:
        if pair.activations is None:
            raise RuntimeError("the generation kept no activations for the panel's figure")
        self.baseline = BaselineRun(
            key,
            pair.text[0],
            pair.tokens[0],
            {site: acts[0:1] for site, acts in pair.activations.items()},
        )
        self.baseline_runs += 1
        return self.baseline

    def _warn_if_lent(self, request: PanelRequest, plan: PanelSteer) -> None:
        if plan.lent_from is None or plan.lent_from == request.site:
            return
        pair = (request.vector, plan.lent_from, request.site)
        if pair in self.lent_warned:
            return
        self.lent_warned.add(pair)
        warnings.warn(
            f"Vector {request.vector!r} was extracted at {plan.lent_from}; the panel applies "
            f"its direction at {request.site}, where it was never measured.",
            stacklevel=2,
        )

    def _title(self, request: PanelRequest, plan: PanelSteer) -> str:
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
            f"vector {vector} · {op} · {_alpha(request.alpha)}{_only_when(request)}"
        )

    # --- SAE features -------------------------------------------------------------------

    def _show_top_features(self, prompt: str, n: int = 8) -> None:
        """Buttons for the prompt's ``n`` strongest features (by peak activation over its
        tokens, a BOS token left out); a click picks that feature. Recomputed when the
        prompt changes."""
        if self.sae is None or prompt == self._top_prompt:
            return
        acts = self.lm.features(prompt, self.sae, k=n)
        skip = acts.leading_bos(0)
        self.top_features = acts.prompt_top(0, min(n, len(self.top_buttons)), skip=skip)
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

    def _read_sites(self, request: PanelRequest) -> list[str]:
        """Sites the strips read: the SAE's, and the steering site with a monitor."""
        sae = [] if self.sae is None else [self.sae.site]
        return sae + ([request.site] if request.monitor else [])

    def _show_feature_strip(self, baseline: BaselineRun, generation: Generation,
                            request: PanelRequest) -> None:  # fmt: skip
        """The chosen feature at each generated token that was fed back, both rows."""
        assert self.sae is not None
        sae, site, i = self.sae, self.sae.site, request.feature
        values, tokens = self._strip_rows(
            baseline, generation, site, lambda h: sae.encode(h)[:, i], chosen_at=False
        )
        title = f"feature {i} at {site}, per generated token"
        self.strip = token_strip(values, tokens, title=title, measure="activation")
        self.strip_view.outputs = plotly_output(self.strip, f"feature {i} strip")

    def _show_monitor_strip(self, baseline: BaselineRun, generation: Generation,
                            request: PanelRequest) -> None:  # fmt: skip
        """The monitored vector's projection ``h·v/|v|`` at the steering site, both rows,
        at the position whose forward chose each generated token (``MonitorTrace``'s)."""
        direction = monitor_direction(request, self.vectors)
        if direction is None:
            self.monitor_strip = None
            self.monitor_view.outputs = ()
            self.monitor_view.layout.display = "none"
            return
        values, tokens = self._strip_rows(
            baseline, generation, request.site, lambda h: score(h, direction, "projection"),
            chosen_at=True,
        )  # fmt: skip
        title = f"monitor {request.monitor}: h·v/|v| at {request.site}, per generated token"
        self.monitor_strip = token_strip(values, tokens, title=html.escape(title),
                                         measure="projection", signed=True)  # fmt: skip
        self.monitor_view.outputs = plotly_output(self.monitor_strip, f"{title} strip")
        self.monitor_view.layout.display = None

    def _strip_rows(self, baseline: BaselineRun, generation: Generation, site: str,
                    read: Any, *, chosen_at: bool) -> tuple[list[list[float]], list[list[str]]]:  # fmt: skip
        """``read`` ([n, d_model] -> [n]) of the captured activations at ``site`` for each
        row (baseline, steered), one value per generated token: at the token's own position
        (the token fed back; the last token is never fed), or with ``chosen_at`` at the
        position whose forward chose it (the last prompt token for the first)."""
        assert generation.activations is not None
        n_prompt = len(generation.prompt_tokens[-1])
        start = n_prompt - 1 if chosen_at else n_prompt
        rows = [(baseline.activations[site][0], baseline.tokens),
                (generation.activations[site][-1], generation.tokens[-1])]  # fmt: skip
        values, tokens = [], []
        for acts, new in rows:
            fed = acts[start : n_prompt + max(len(new) - 1, 0)]  # [values, d_model]
            values.append(read(fed).float().tolist() if len(fed) else [])
            tokens.append([self.lm.tokenizer.decode([t]) for t in new[: len(fed)]])
        return values, tokens

    def _show_fired(self, request: PanelRequest, generation: Generation) -> None:
        """Whether the steered row's condition fired for the prompt, and on what score."""
        fired_rows, scores = generation.fired, generation.condition_scores
        if not request.condition or fired_rows is None or scores is None:
            self.fired_label.value = ""
            return
        fired = bool(fired_rows[-1])
        value = float(scores[-1])
        colour = "#1b7a1b" if fired else "#777"
        text = "fired" if fired else "did not fire"
        self.fired_label.value = (
            f"<span style='color:{colour}'><b>{text}</b> · score {value:.3f}</span>"
        )

    def _figure(
        self, baseline: BaselineRun, generation: Generation, request: PanelRequest
    ) -> go.Figure:
        if generation.activations is None:
            raise RuntimeError("the generation kept no activations for the panel's figure")
        steered = {s: a[-1:] for s, a in generation.activations.items()}
        length = min(
            next(iter(baseline.activations.values())).shape[1],
            next(iter(steered.values())).shape[1],
        )
        pair = {
            s: torch.cat([baseline.activations[s][:, :length], steered[s][:, :length]])
            for s in steered
        }
        return pair_norms_figure(
            pair,
            generation.prompt_tokens[-1],
            [baseline.tokens, generation.tokens[-1]],
            self.lm.tokenizer.decode,
            request.alpha,
        )

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

    # --- view ---------------------------------------------------------------------------

    def _build_view(self, export_stem: str) -> None:
        self.baseline_pane = _pane("steerlab-baseline")
        self.steered_pane = _pane("steerlab-steered")
        self.baseline_title = widgets.HTML("<b>baseline</b> · no steering")
        self.steered_title = widgets.HTML("<b>steered</b>")
        self.steered_title.add_class("steerlab-steered-title")
        for title in (self.baseline_title, self.steered_title):
            title.add_class("steerlab-pane-title")
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
        # Titles in one grid row and panes in the next, so that both panes start level
        # however many lines the steered title takes; the baseline title sits on its pane.
        self.baseline_title.layout.align_self = "flex-end"
        css = widgets.HTML(PANEL_CSS, layout=widgets.Layout(display="none"))  # no grid cell
        panes = widgets.GridBox(
            [self.baseline_title, self.steered_title, self.baseline_pane, self.steered_pane, css],
            layout=widgets.Layout(grid_template_columns="minmax(0, 1fr) minmax(0, 1fr)",
                                  grid_gap="0 8px", width="100%"),
        )  # fmt: skip
        panes.add_class("steerlab-panes")
        wrap = widgets.Layout(flex_flow="row wrap")
        exports = widgets.HBox(
            [
                export_button(self.figure, lambda: self.export_stem("norms")),
                completions_button(self.record, lambda: self.export_stem("completions")),
            ],
            layout=wrap,
        )
        separator = widgets.Label("│", layout=widgets.Layout(margin="0 0.8em"))
        self.top_buttons = [widgets.Button(layout=widgets.Layout(width="auto")) for _ in range(8)]
        for button in self.top_buttons:
            button.add_class("steerlab-top-feature")
            button.on_click(self._on_top_feature)
        self.top_feature_box = widgets.HBox(self.top_buttons, layout=wrap)
        self.top_feature_box.add_class("steerlab-top-features")
        self.strip_view = widgets.Output(layout=widgets.Layout(width="100%"))
        self.strip_view.add_class("steerlab-feature-strip")
        self.monitor_view = widgets.Output(layout=widgets.Layout(width="100%", display="none"))
        self.monitor_view.add_class("steerlab-monitor-strip")
        self.fired_label = widgets.HTML("", layout=widgets.Layout(margin="0 0 0 1em"))
        self.fired_label.add_class("steerlab-fired")
        picker = None
        if self.sae is not None:
            picker = widgets.VBox([
                widgets.HBox([self.controls.feature, self.controls.feature_op], layout=wrap),
                widgets.HBox([widgets.Label("top features of this prompt:"),
                              self.top_feature_box], layout=wrap),
            ])  # fmt: skip
            picker.add_class("steerlab-feature-picker")
        self.widget = widgets.VBox(
            [
                self.hint,
                self.controls.box(picker, self.fired_label),
                self.error_box,
                panes,
                *([self.strip_view] if self.sae is not None else []),
                self.monitor_view,
                self.figure_view,
                exports,
                widgets.HBox([self.hooks_label, separator, self.status_label], layout=wrap),
            ],
            layout=widgets.Layout(width="100%", max_width="1400px"),
        )
        self.widget.add_class("steerlab-panel")

    def _show_texts(
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

    def _show_error(self, error: BaseException, request: PanelRequest) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.fired_label.value = ""
        self.error_box.value = (
            f"<div style='color:#b00020;white-space:pre-wrap'>⚠ {html.escape(self.error)}</div>"
        )
        self._status("error")
        if self.rendered is not None:  # panes may hold a cancelled run's partial text
            self._show_texts(self.rendered.prompt, [self.baseline_text, self.steered_text])
        # The baseline pane is still current when the failed change left what feeds it alone.
        held = self.rendered is not None and baseline_key(self.rendered) == baseline_key(request)
        self._mark_stale(baseline=not held, steered=True)

    def _mark_stale(self, *, baseline: bool, steered: bool) -> None:
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
        self.figure_view.outputs = plotly_output(self.figure, "steerlab panel figure")

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


def _alpha(alpha: float) -> str:
    """The title's alpha, as "α = 4", kept on one line wherever the title wraps."""
    return f"<span style='white-space:nowrap'>α = {format_alpha(alpha)}</span>"


def _only_when(request: PanelRequest) -> str:
    """The title's condition clause ("" with none)."""
    if not request.condition:
        return ""
    return (
        f" · only when {html.escape(request.condition)} at {request.condition_site} "
        f"(cosine {request.compare} {request.threshold:g})"
    )


def _pane(css_class: str) -> widgets.HTML:
    pane = widgets.HTML("", layout=widgets.Layout(border=PANE_BORDER, padding="4px"))
    pane.add_class("steerlab-pane")
    pane.add_class(css_class)
    return pane


def _default_layer(lm: SteerableModel, vectors: dict[str, VectorLike], layer: int | None) -> int:
    if layer is not None:
        if not 0 <= layer < lm.n_layers:
            raise ValueError(f"layer {layer} is out of range: this model has 0..{lm.n_layers - 1}.")
        return layer
    first = next(iter(vectors.values()))
    sites = first.sites if isinstance(first, SteeringVector) else (
        [first.site] if isinstance(first, LoReFT) else [])  # fmt: skip
    if sites and (found := Site.parse(sites[0]).layer) is not None:
        return found
    return lm.n_layers // 2
