"""How a panel request becomes what the panel shows: one run at a time, the baseline kept
while nothing that feeds it changes, the steered row streamed into its pane, then the
figure, the strips, the fired label and the title."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable

import ipywidgets as widgets
import plotly.graph_objects as go

from steerlab.core.results import Generation
from steerlab.features import SAE
from steerlab.model import SteerableModel
from steerlab.widgets.condition_row import fired_label
from steerlab.widgets.feature_strip import feature_strip
from steerlab.widgets.figure import panel_figure
from steerlab.widgets.monitor_strip import (
    monitor_figure,
    monitored,
    reads_monitor,
    residual_sites,
    row_readouts,
    run_monitors,
)
from steerlab.widgets.runner import (
    BaselineRun,
    PanelRequest,
    PanelSteer,
    VectorLike,
    baseline_key,
    monitor_direction,
    panel_steer,
    stream_rows,
)
from steerlab.widgets.view import PanelView, steered_title


class PanelRun:
    """The run half of ``SteeringPanel``: its state is the panel's (declared here)."""

    lm: SteerableModel
    sae: SAE | None
    vectors: dict[str, VectorLike]
    view: PanelView
    baseline: BaselineRun | None
    baseline_runs: int
    baseline_text: str
    steered_text: str
    render_count: int
    rendered: PanelRequest | None
    generation: Generation | None
    error: str | None
    history: list[tuple[int, str]]
    lent_warned: set[tuple[str, str, str]]
    strip: go.Figure | None
    monitor_strip: go.Figure | None
    hooks_label: widgets.Label
    status_label: widgets.Label
    steered_pane: widgets.HTML
    steered_title: widgets.HTML
    fired_label: widgets.HTML
    error_box: widgets.HTML
    strip_view: widgets.Output
    monitor_view: widgets.Output
    _latest: int
    _closed: bool
    _run_lock: threading.Lock
    _show_top_features: Callable[[str], None]

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
        cached = self._kept_baseline(request, key)
        alphas = [request.alpha] if cached else [0.0, request.alpha]
        plan = panel_steer(request, self.vectors, alphas, self.sae)
        self._warn_if_lent(request, plan)
        monitor_direction(request, self.vectors)  # an unknown monitor, before the run
        if self.sae is not None:
            self._show_top_features(request.prompt)
        self.view.show_texts(request.prompt, ["" if cached is None else cached.text, ""])
        pairs = monitored(self.lm.sites(), self.lm.d_model, self.vectors, request,
                          baseline=cached is None)  # fmt: skip
        monitors = run_monitors(self.vectors, pairs)
        generation = None
        stream = stream_rows(self.lm, request, plan.steer, lambda: self._is_current(request),
                             self._captured(), monitors)  # fmt: skip
        panes = None if cached is None else (self.steered_pane,)
        for step, (texts, final) in enumerate(stream):
            if step == 0:
                self.hooks_label.value = f"steerlab hooks on model: {self.lm.hook_count()}"
            self.view.show_texts(request.prompt, texts, panes=panes)
            generation = final
        if generation is None or not self._is_current(request):
            return "cancelled"
        if cached is None:
            cached = self._keep_baseline(key, generation, pairs)
        self._render(request, plan, cached, generation)
        return "rendered"

    def _render(self, request: PanelRequest, plan: PanelSteer, baseline: BaselineRun,
                generation: Generation) -> None:  # fmt: skip
        figure = panel_figure(baseline.activations, baseline.tokens, generation,
                              self.lm.tokenizer.decode, request.alpha)  # fmt: skip
        figure.layout.meta = {"steerlab_panel": request.as_dict()}  # exact alpha, for exports
        self.view.update_figure(figure)
        if self.sae is not None:
            self._show_feature_strip(baseline, generation, request)
        self._show_monitor_strip(baseline, generation, request)
        self.fired_label.value = fired_label(request, generation)
        self.baseline_text, self.steered_text = baseline.text, generation.text[-1]
        self.generation, self.rendered, self.error = generation, request, None
        self.error_box.value = ""
        self.view.mark_stale(baseline=False, steered=False)
        self.steered_title.value = steered_title(request, plan)
        self.render_count += 1

    def _captured(self) -> list[str]:
        """Sites whose activations a run keeps: every residual one (the figure) and the
        SAE's (the feature strip)."""
        capture = residual_sites(self.lm.sites())
        return capture + [s.site for s in [self.sae] if s is not None and s.site not in capture]

    def _kept_baseline(self, request: PanelRequest, key: tuple[object, ...]) -> BaselineRun | None:
        """The kept baseline, if what feeds it is unchanged and it read the chosen monitor
        (it did not at a site it did not monitor, or for a vector added or replaced since)."""
        kept = self.baseline
        if kept is None or kept.key != key or not reads_monitor(kept.readouts, request):
            return None
        return kept

    def _keep_baseline(self, key: tuple[object, ...], pair: Generation,
                       monitored: list[tuple[str, str]]) -> BaselineRun:  # fmt: skip
        if pair.activations is None:
            raise RuntimeError("the generation kept no activations for the panel's figure")
        self.baseline = BaselineRun(
            key,
            pair.text[0],
            pair.tokens[0],
            {site: acts[0:1] for site, acts in pair.activations.items()},
            row_readouts(pair, 0, monitored, len(pair.tokens[0])),
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

    def _show_feature_strip(self, baseline: BaselineRun, generation: Generation,
                            request: PanelRequest) -> None:  # fmt: skip
        assert self.sae is not None
        self.strip = feature_strip(self.sae, request.feature, baseline, generation,
                                   self.lm.tokenizer.decode)  # fmt: skip
        self.view.show_strip(self.strip_view, self.strip, f"feature {request.feature} strip")

    def _show_monitor_strip(self, baseline: BaselineRun, generation: Generation,
                            request: PanelRequest) -> None:  # fmt: skip
        """The engine's readouts of the monitored vector's ``h·v/|v|`` at the steering
        site, both rows: the kept baseline's, and this run's steered row."""
        rows = []
        if request.monitor:
            pair = (request.monitor, request.site)
            steered = row_readouts(generation, -1, [pair], len(generation.tokens[-1]))
            rows = [(baseline.readouts[pair], baseline.tokens),
                    (steered[pair], generation.tokens[-1])]  # fmt: skip
        self.monitor_strip = monitor_figure(request, self.vectors, rows, self.lm.tokenizer.decode)
        title = f"monitor {request.monitor}: h·v/|v| at {request.site}, per generated token"
        self.view.show_strip(self.monitor_view, self.monitor_strip, f"{title} strip")

    def _show_error(self, error: BaseException, request: PanelRequest) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.view.show_error(self.error)
        self._status("error")
        if self.rendered is not None:  # panes may hold a cancelled run's partial text
            self.view.show_texts(self.rendered.prompt, [self.baseline_text, self.steered_text])
        # The baseline pane is still current when the failed change left what feeds it alone.
        held = self.rendered is not None and baseline_key(self.rendered) == baseline_key(request)
        self.view.mark_stale(baseline=not held, steered=True)

    def _status(self, text: str) -> None:
        self.status_label.value = text
