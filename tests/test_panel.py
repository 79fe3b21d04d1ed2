"""The live steering panel, driven through its Python state on a tiny random GPT-2."""

from __future__ import annotations

import html
import json
import re
import threading
import time
import warnings

import pytest
import torch

import steerlab as sl
from steerlab.plots import mean_norms
from steerlab.widgets import Debouncer, SteeringPanel

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def lm(tiny_dirs) -> sl.SteerableModel:
    """A tiny random GPT-2 (d_model 64, 3 layers) on the plain HF backend."""
    return sl.load(tiny_dirs["gpt2"], backend="hf")


@pytest.fixture
def vec() -> torch.Tensor:
    return 4 * torch.randn(64, generator=torch.Generator().manual_seed(3))


def make_panel(lm, vectors, **kw) -> SteeringPanel:
    kw = {"prompt": PROMPT, "layer": 1, "max_new_tokens": 8, "debounce": 0, **kw}
    return SteeringPanel(lm, vectors, **kw)


def test_slider_change_updates_panes_and_figure(lm, vec):
    panel = make_panel(lm, {"v": vec}, alpha=0.0)
    assert panel.render_count == 1 and panel.baseline_text == panel.steered_text
    baseline_before = panel.baseline_text

    panel.controls.alpha.value = 6.0

    site = "blocks.1.hook_resid_pre"
    expected = lm.generate(PROMPT, sl.Steer(site, vec, alpha=[0.0, 6.0]), max_new_tokens=8)
    assert panel.render_count == 2 and panel.rendered_alpha == 6.0
    assert [panel.baseline_text, panel.steered_text] == expected.text
    assert panel.baseline_text == baseline_before  # the baseline row is not steered
    assert panel.steered_text != panel.baseline_text
    assert lm.generate(PROMPT, max_new_tokens=8).text[0] == panel.baseline_text
    assert html.escape(expected.text[1]) in panel.steered_pane.value
    # The figure's steered lines are the norms of a steered pass over the prompt.
    resid = [s for s in lm.sites() if ".hook_resid_" in s]
    steered = lm.run_with_cache(PROMPT, resid, steer=sl.Steer(site, vec, alpha=6.0))
    traces = {t.name: t for t in panel.figure.data}
    _, norms = mean_norms(steered, "resid_post")
    assert list(traces["resid_post (steered)"].y) == pytest.approx(norms)
    _, base = mean_norms(lm.run_with_cache(PROMPT, resid), "resid_post")
    assert list(traces["resid_post"].y) == pytest.approx(base)
    assert list(traces["resid_post"].y) != pytest.approx(norms)
    first_trace = panel.figure.data[0]
    panel.controls.layer.value = 2
    assert panel.figure.data[0] is first_trace  # updated in place, not rebuilt
    assert panel.rendered.site == "blocks.2.hook_resid_pre"


def test_hundred_rapid_changes_render_only_the_last(lm, vec):
    panel = make_panel(lm, {"v": vec}, debounce=0.05)
    renders, last_id = panel.render_count, panel._latest
    for i in range(100):
        panel.controls.alpha.value = round(-10 + i * 0.2, 1)
    assert panel.wait(timeout=30)
    assert panel.render_count == renders + 1
    assert panel.rendered_alpha == pytest.approx(-10 + 99 * 0.2)
    assert panel.rendered.request_id == last_id + 100
    rendered = [rid for rid, outcome in panel.history if outcome == "rendered"]
    assert rendered[-1] == last_id + 100 and len(rendered) == 2
    assert lm.hook_count() == 0


class SlowModel:
    """The model, with a pause after every streamed token and a log of tokens per stream."""

    def __init__(self, lm: sl.SteerableModel) -> None:
        self._lm = lm
        self.steps: list[int] = []
        self.first_token = threading.Event()
        self.pause = 0.0

    def __getattr__(self, name):
        return getattr(self._lm, name)

    def stream(self, *args, **kwargs):
        self.steps.append(0)
        for step in self._lm.stream(*args, **kwargs):
            self.steps[-1] += 1
            self.first_token.set()
            time.sleep(self.pause)
            yield step


def test_stale_run_stops_and_is_not_rendered(lm, vec):
    slow = SlowModel(lm)
    panel = make_panel(slow, {"v": vec}, debounce=0.01, max_new_tokens=60)
    slow.first_token.clear()
    slow.pause = 0.02
    panel.controls.max_new_tokens.value = 100  # about 2 s of tokens: cancelled halfway
    assert slow.first_token.wait(timeout=10)
    stale_id = panel._latest
    slow.pause = 0.0
    panel.controls.alpha.value = -3.0
    assert panel.wait(timeout=30)
    outcomes = dict(panel.history)
    assert outcomes[stale_id] == "cancelled" and outcomes[stale_id + 1] == "rendered"
    assert slow.steps[1] < 100  # the stale stream stopped early
    assert panel.rendered_alpha == -3.0 and panel.rendered.max_new_tokens == 100
    assert lm.hook_count() == 0
    assert panel.hooks_label.value.endswith(": 0")


def test_errors_show_in_the_panel_and_the_next_change_works(lm, vec, monkeypatch):
    two_sites = sl.SteeringVector({"blocks.0.hook_resid_pre": vec, "blocks.2.hook_resid_pre": vec})
    panel = make_panel(lm, {"v": vec, "short": torch.randn(7), "two": two_sites})
    good_text = panel.steered_text

    panel.controls.vector.value = "short"  # wrong d_model
    assert "d_model=64" in panel.error and "d_model=64" in panel.error_box.value
    assert panel.steered_text == good_text and lm.hook_count() == 0
    assert html.escape(good_text) in panel.steered_pane.value  # last good result stays

    panel.controls.vector.value = "two"  # no direction at layer 1
    assert "no direction at blocks.1.hook_resid_pre" in panel.error

    panel.controls.layer.value = 2  # a site it has: works, and the error is cleared
    assert panel.error is None and panel.error_box.value == ""
    assert panel.rendered.vector == "two"

    def broken(*args, **kwargs):
        raise RuntimeError("boom in the callback")

    monkeypatch.setattr(lm, "stream", broken)
    panel.controls.alpha.value = 5.0
    assert panel.error == "RuntimeError: boom in the callback"
    assert "boom in the callback" in panel.error_box.value
    monkeypatch.undo()
    panel.controls.alpha.value = 5.5
    assert panel.error is None and panel.rendered_alpha == 5.5
    assert [o for _, o in panel.history].count("error") == 3


def test_hook_count_is_zero_when_idle(lm, vec):
    panel = make_panel(lm, {"v": vec})
    assert lm.hook_count() == 0
    assert panel.hooks_label.value == "steerlab hooks on model: 0"


def test_steering_vector_and_sampling_controls(lm, vec):
    sv = sl.SteeringVector({"blocks.2.hook_resid_pre": vec})
    panel = make_panel(lm, {"sv": sv}, layer=None)
    assert panel.controls.layer.value == 2  # taken from the vector
    panel.controls.temperature.value = 1.0
    panel.controls.seed.value = 7
    expected = lm.generate(
        PROMPT, sv.steers(alpha=[0.0, 4.0]), max_new_tokens=8, temperature=1.0, seed=7
    )
    assert [panel.baseline_text, panel.steered_text] == expected.text


def test_export_completions_and_display(lm, vec, tmp_path):
    panel = make_panel(lm, {"v": vec}, export_stem=str(tmp_path / "run"))
    panel.controls.alpha.value = 5.0000000000000036  # float noise, as a slider's step leaves it
    record = panel.record()
    assert record["steered"] == panel.steered_text and record["site"] == "blocks.1.hook_resid_pre"
    fmt, button, status = panel.widget.children[-2].children[1].children
    for suffix in ("json", "json", "txt"):
        fmt.value = suffix
        button.click()
        assert status.value.startswith("saved")
    stem = "run_completions_blocks.1.hook_resid_pre_a5"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{stem}_001.json",
        f"{stem}_002.json",  # a second export never overwrites the first
        f"{stem}_003.txt",
    ]
    exported = json.loads((tmp_path / f"{stem}_001.json").read_text())
    # the noise is gone where the request is made: the alpha that steered is the one exported
    assert exported == record and repr(exported["alpha"]) == "5.0"
    assert "5.0," in (tmp_path / f"{stem}_001.json").read_text()
    text = (tmp_path / f"{stem}_003.txt").read_text()
    assert "alpha: 5\n" in text and panel.steered_text in text
    assert panel.steered_title.value.endswith(">α = 5</span>")  # kept on one line, no noise
    assert panel.figure.layout.meta["steerlab_panel"]["alpha"] == 5.0
    assert panel.rendered is not None and panel.rendered.alpha == 5.0
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == repr(panel) and "renders=2" in repr(panel)
    assert "alpha=5," in repr(panel)
    assert sl.SteeringPanel is SteeringPanel


def test_figure_exports_get_a_fresh_name_each_time(lm, vec, tmp_path):
    panel = make_panel(lm, {"v": vec}, export_stem=str(tmp_path / "run"))
    fmt, button, status = panel.widget.children[-2].children[0].children
    fmt.value = "html"
    button.click()
    button.click()
    stem = "run_norms_blocks.1.hook_resid_pre_a4"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{stem}_001.html", f"{stem}_002.html"]
    assert '"alpha":4.0' in (tmp_path / f"{stem}_002.html").read_text()


class CountingModel:
    """The model, with the alphas of each stream's steer logged."""

    def __init__(self, lm: sl.SteerableModel) -> None:
        self._lm = lm
        self.alphas: list[tuple[float, ...]] = []

    def __getattr__(self, name):
        return getattr(self._lm, name)

    def stream(self, prompts, steer, **kwargs):
        self.alphas.append(steer.alpha)
        return self._lm.stream(prompts, steer, **kwargs)


def test_the_baseline_holds_still_across_alpha_layer_and_vector_changes(lm, vec):
    counting = CountingModel(lm)
    panel = make_panel(counting, {"v": vec, "w": -vec}, alpha=2.0)
    assert counting.alphas == [(0.0, 2.0)] and panel.baseline_runs == 1
    pane_before, text_before = panel.baseline_pane.value, panel.baseline_text

    panel.controls.alpha.value = 6.0
    panel.controls.layer.value = 2
    panel.controls.vector.value = "w"
    panel.controls.positions.value = "generated"
    assert counting.alphas[1:] == [(6.0,), (6.0,), (6.0,), (6.0,)]  # the steered row alone
    assert panel.baseline_pane.value == pane_before and panel.baseline_text == text_before
    assert panel.baseline_runs == 1
    site = "blocks.2.hook_resid_pre"
    expected = lm.generate(
        PROMPT, sl.Steer(site, -vec, alpha=[0.0, 6.0], positions="generated"), max_new_tokens=8
    )
    assert [panel.baseline_text, panel.steered_text] == expected.text
    # The figure pairs the kept baseline with the new steered row, as one batch would.
    resid = [s for s in lm.sites() if ".hook_resid_" in s]
    _, base = mean_norms(lm.run_with_cache(PROMPT, resid), "resid_post")
    traces = {t.name: t for t in panel.figure.data}
    assert list(traces["resid_post"].y) == pytest.approx(base)

    for control, value in [
        (panel.controls.seed, 3),
        (panel.controls.max_new_tokens, 9),
        (panel.controls.temperature, 0.5),
        (panel.controls.prompt, "A cat"),
    ]:
        runs = panel.baseline_runs
        control.value = value  # feeds the baseline: it reruns beside the steered row
        assert panel.baseline_runs == runs + 1 and counting.alphas[-1] == (0.0, 6.0)
    expected = lm.generate(
        "A cat",
        sl.Steer(site, -vec, alpha=[0.0, 6.0], positions="generated"),
        max_new_tokens=9,
        temperature=0.5,
        seed=3,
    )
    assert [panel.baseline_text, panel.steered_text] == expected.text


def test_max_tokens_stops_at_the_context_window_minus_the_prompt(lm, vec):
    from steerlab.core.prompts import encode

    panel = make_panel(lm, {"v": vec})
    slider = panel.controls.max_new_tokens
    n_prompt = len(encode(lm.tokenizer, PROMPT, chat=False))
    assert slider.max == lm.n_ctx - n_prompt
    slider.value = slider.max  # the longest completion that fits runs without an error
    assert panel.error is None and panel.rendered.max_new_tokens == lm.n_ctx - n_prompt
    renders = panel.render_count
    longer = PROMPT + " jumps over the lazy dog" * 3
    panel.controls.prompt.value = longer
    n_longer = len(encode(lm.tokenizer, longer, chat=False))
    assert slider.max == slider.value == lm.n_ctx - n_longer < lm.n_ctx - n_prompt
    assert panel.error is None and panel.render_count == renders + 1  # one run, not two


def test_a_failed_run_marks_the_panes_as_not_current(lm, vec):
    panel = make_panel(lm, {"v": vec, "short": torch.randn(7)})
    panel.controls.vector.value = "short"  # steered only: the baseline is still current
    assert "steerlab-stale" in panel.steered_pane._dom_classes
    assert "not current" in panel.steered_title.value
    assert "steerlab-stale" not in panel.baseline_pane._dom_classes
    assert "not current" not in panel.baseline_title.value
    panel.controls.seed.value = 1  # feeds the baseline too: now both panes are old
    for pane in (panel.baseline_pane, panel.steered_pane):
        assert "steerlab-stale" in pane._dom_classes
    for title in (panel.baseline_title, panel.steered_title):
        assert "not current" in title.value
    panel.controls.vector.value = "v"
    for pane in (panel.baseline_pane, panel.steered_pane):
        assert "steerlab-stale" not in pane._dom_classes
    assert "not current" not in panel.baseline_title.value + panel.steered_title.value


def test_the_title_says_what_steers_and_a_lent_vector_warns_once(lm, vec):
    sv = 3 * sl.SteeringVector({"blocks.2.hook_resid_pre": vec})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        panel = make_panel(lm, {"happy": sv}, layer=2)
        assert panel.steered_title.value == (
            "<b>steered</b> · blocks.2.hook_resid_pre · positions all · vector happy · add · "
            "<span style='white-space:nowrap'>α = 4</span>"
        )
        assert not [w for w in caught if "extracted at" in str(w.message)]
        panel.controls.layer.value = 1
        panel.controls.alpha.value = 5.0
        panel.controls.layer.value = 0
        panel.controls.layer.value = 1
    messages = [str(w.message) for w in caught if "extracted at" in str(w.message)]
    assert messages == [
        "Vector 'happy' was extracted at blocks.2.hook_resid_pre; the panel applies its "
        f"direction at blocks.{layer}.hook_resid_pre, where it was never measured."
        for layer in (1, 0)
    ]
    assert "(extracted at blocks.2.hook_resid_pre)" in panel.steered_title.value
    assert "blocks.1.hook_resid_pre · positions all" in panel.steered_title.value
    # The scale goes into alpha; the direction is the vector's own, unscaled.
    site = "blocks.1.hook_resid_pre"
    expected = lm.generate(PROMPT, sl.Steer(site, vec, alpha=[0.0, 15.0]), max_new_tokens=8)
    assert [panel.baseline_text, panel.steered_text] == expected.text
    assert panel.generation.alphas[-1] == (15.0,)


def test_debouncer_calls_once_after_a_burst():
    calls: list[int] = []
    debouncer = Debouncer(calls.append, delay=0.05)
    for i in range(20):
        debouncer.trigger(i)
    assert debouncer.join(timeout=5)
    assert calls == [19]
    with pytest.raises(ValueError):
        Debouncer(calls.append, delay=-1)


def test_positions_from_token_k_and_top_k_controls(lm, vec):
    panel = make_panel(lm, {"v": vec})
    panel.controls.positions.value = 2
    panel.controls.temperature.value = 1.0
    panel.controls.top_k.value = 5
    panel.controls.seed.value = 11
    site = "blocks.1.hook_resid_pre"
    expected = lm.generate(PROMPT, sl.Steer(site, vec, alpha=[0.0, 4.0], positions=2),
                           max_new_tokens=8, temperature=1.0, top_k=5, seed=11)  # fmt: skip
    assert [panel.baseline_text, panel.steered_text] == expected.text
    assert panel.rendered.positions == 2 and panel.rendered.top_k == 5


def _heatmap(panel: SteeringPanel):
    return next(t for t in panel.figure.data if t.type == "heatmap")


def test_alpha_zero_heatmap_is_a_note_not_an_empty_box(lm, vec):
    panel = make_panel(lm, {"v": vec}, alpha=0.0)
    notes = [a.text for a in panel.figure.layout.annotations]
    assert "no difference at alpha 0" in notes
    assert _heatmap(panel).visible is False and _heatmap(panel).showscale is False
    panel.controls.alpha.value = 4.0
    assert "no difference at alpha 0" not in [a.text for a in panel.figure.layout.annotations]
    assert _heatmap(panel).visible is True and _heatmap(panel).showscale is True
    panel.controls.alpha.value = 0.0  # and back: the note returns on the same figure
    assert "no difference at alpha 0" in [a.text for a in panel.figure.layout.annotations]


def test_heatmap_covers_prompt_and_generated_tokens(lm, vec):
    panel = make_panel(lm, {"v": vec}, alpha=6.0)
    out = panel.generation
    n_prompt = len(out.prompt_tokens[1])
    heat = _heatmap(panel)
    # Every fed token: the prompt, then the new tokens but the last (never fed back).
    width = n_prompt + min(len(t) for t in out.tokens) - 1
    assert len(heat.z[0]) == width > n_prompt
    assert "row 0" not in " ".join(a.text for a in panel.figure.layout.annotations)
    # Over the prompt the change equals two separate passes through the model.
    site = "blocks.2.hook_resid_post"
    plain = lm.run_with_cache(PROMPT, [site])[site][0]
    steered = lm.run_with_cache(PROMPT, [site], steer=sl.Steer("blocks.1.hook_resid_pre", vec, 6.0))
    expected = (steered[site][0].norm(dim=-1) - plain.norm(dim=-1)).tolist()
    layer_2 = list(heat.y).index(2)
    assert list(heat.z[layer_2][:n_prompt]) == pytest.approx(expected, abs=1e-4)


def test_remove_vector_takes_a_demo_vector_out_of_the_dropdown(lm, vec):
    """Tutorial 4 adds a wrong-size vector to show an error, then takes it out again."""
    panel = make_panel(lm, {"v": vec, "w": -vec})
    panel.add_vector("wrong size", torch.ones(lm.d_model + 1))
    assert panel.error is not None and "d_model" in panel.error
    renders = panel.render_count
    panel.remove_vector("wrong size")  # selected: the first vector steers again
    assert list(panel.controls.vector.options) == ["v", "w"] and "wrong size" not in panel.vectors
    assert panel.controls.vector.value == "v" and panel.error is None
    assert panel.render_count == renders + 1 and panel.rendered.vector == "v"
    panel.remove_vector("w")  # not selected: no run
    assert list(panel.controls.vector.options) == ["v"] and panel.render_count == renders + 1
    with pytest.raises(sl.SteerError, match="No vector named 'w'"):
        panel.remove_vector("w")
    with pytest.raises(sl.SteerError, match="only vector"):
        panel.remove_vector("v")
    assert list(panel.controls.vector.options) == ["v"]


def test_add_vector_updates_dropdown_and_data_in_one_call(lm, vec):
    panel = make_panel(lm, {"v": vec})
    other = -vec
    panel.add_vector("minus v", other)
    assert list(panel.controls.vector.options) == ["v", "minus v"]
    assert panel.rendered.vector == "minus v"
    site = "blocks.1.hook_resid_pre"
    expected = lm.generate(PROMPT, sl.Steer(site, other, alpha=[0.0, 4.0]), max_new_tokens=8)
    assert [panel.baseline_text, panel.steered_text] == expected.text

    renders = panel.render_count
    panel.add_vector("later", 2 * vec, select=False)
    assert panel.controls.vector.value == "minus v" and panel.render_count == renders
    panel.add_vector("minus v", vec)  # replacing the selected vector reruns with the new data
    assert panel.render_count == renders + 1 and panel.steered_text != expected.text[1]
    with pytest.raises(sl.SteerError, match="SteeringVector, a 1-D torch.Tensor or an sl.LoReFT"):
        panel.add_vector("bad", [1.0, 2.0])
    assert "bad" not in panel.controls.vector.options and "bad" not in panel.vectors


def test_status_line_keeps_hooks_and_timing_apart(lm, vec):
    panel = make_panel(lm, {"v": vec})
    hooks, separator, status = panel.widget.children[-1].children
    assert hooks is panel.hooks_label and status is panel.status_label
    assert separator.value.strip() == "│"
    assert re.fullmatch(r"last run: request \d+ took \d+\.\d\d s", status.value)


def test_panel_layout_wraps_and_shows_a_hint(lm, vec):
    panel = make_panel(lm, {"v": vec})
    assert "Drag the <b>alpha</b> slider" in panel.widget.children[0].value
    columns = panel.controls.box().children[1]
    assert columns.layout.flex_flow == "row wrap"
    assert all(c.layout.min_width and "%" not in c.layout.min_width for c in columns.children)
    assert panel.figure.layout.autosize is True and panel.figure.layout.width is None


def test_figure_view_shows_the_current_figure_as_plotly_json(lm, vec):
    panel = make_panel(lm, {"v": vec}, alpha=0.0)
    panel.controls.alpha.value = 3.0
    (output,) = panel.figure_view.outputs
    shown = output["data"]["application/vnd.plotly.v1+json"]
    heat = next(t for t in shown["data"] if t["type"] == "heatmap")
    assert heat["visible"] is True
    assert [list(r) for r in heat["z"]] == [list(r) for r in _heatmap(panel).z]
    assert shown["config"]["responsive"] is False  # see plotly_output: drawn at 1024 px too


def test_a_closed_panel_starts_no_more_runs(lm, vec):
    panel = make_panel(lm, {"v": vec})
    runs = len(panel.history)
    panel.close()
    panel.controls.alpha.value = panel.controls.alpha.value + 1
    panel.refresh()
    assert [outcome for _, outcome in panel.history[runs:]] in ([], ["skipped"])
    assert panel.render_count == 1


def test_a_kernel_interrupt_does_not_leave_the_status_at_running(lm, vec, monkeypatch):
    panel = make_panel(lm, {"v": vec})

    def interrupted(request):
        raise KeyboardInterrupt

    monkeypatch.setattr(panel, "_generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        panel.refresh()
    assert "running" not in panel.status_label.value
    assert "interrupted" in panel.status_label.value and lm.hook_count() == 0


def test_the_panel_queues_behind_a_users_paused_stream(lm, vec):
    import threading

    panel = make_panel(lm, {"v": vec})
    renders = panel.render_count
    stream = lm.stream(PROMPT, max_new_tokens=3)
    next(stream)  # the user's call holds the model
    worker = threading.Thread(target=panel.refresh)
    worker.start()
    worker.join(1.0)
    assert worker.is_alive() and panel.render_count == renders  # waiting, not failing
    stream.close()
    worker.join(60)
    assert panel.render_count == renders + 1 and panel.error is None
