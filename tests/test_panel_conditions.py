"""The panel's "steer only when" row and its monitor strip, on a tiny random GPT-2.

Expected values come from the engine's own conditions and monitors (``lm.generate`` with
``when=`` and ``monitor=``), built here from the raw tensor, not through the panel.
"""

from __future__ import annotations

import pytest
import torch

import steerlab as sl
from steerlab.widgets import SteeringPanel

FIRES, QUIET = "The quick brown fox", "A lazy dog sleeps under the old bridge"
STEER_SITE, COND_SITE = "blocks.1.hook_resid_pre", "blocks.0.hook_resid_post"
NEW = 8


@pytest.fixture(scope="module")
def lm(tiny_dirs) -> sl.SteerableModel:
    return sl.load(tiny_dirs["gpt2"], backend="hf")


@pytest.fixture(scope="module")
def vec() -> torch.Tensor:
    return 4 * torch.randn(64, generator=torch.Generator().manual_seed(3))


def engine_scores(lm, vec, prompts: list[str]) -> list[float]:
    cond = sl.Condition(COND_SITE, vec, threshold=0.0)
    steer = sl.Steer(STEER_SITE, vec, alpha=6.0, when=cond)
    return lm.generate(prompts, steer, max_new_tokens=1).condition_scores.tolist()


@pytest.fixture(scope="module")
def threshold(lm, vec) -> float:
    """Half way between the two prompts' scores, so that FIRES fires and QUIET does not
    (compare "above" or "below", whichever order the random model gives them)."""
    fires, quiet = engine_scores(lm, vec, [FIRES, QUIET])
    assert fires != quiet
    return (fires + quiet) / 2


def compare_for(lm, vec) -> str:
    fires, quiet = engine_scores(lm, vec, [FIRES, QUIET])
    return "above" if fires > quiet else "below"


def make_panel(lm, vectors, **kw) -> SteeringPanel:
    kw = {"prompt": FIRES, "layer": 1, "alpha": 6.0, "max_new_tokens": NEW, "debounce": 0, **kw}
    return SteeringPanel(lm, vectors, **kw)


def set_condition(panel, threshold, compare, layer=0) -> None:
    c = panel.controls
    c.threshold.value, c.compare.value, c.condition_layer.value = threshold, compare, layer
    c.condition.value = "v"


def test_the_condition_gates_the_steered_row_and_says_whether_it_fired(lm, vec, threshold):
    compare = compare_for(lm, vec)
    panel = make_panel(lm, {"v": vec})
    set_condition(panel, threshold, compare)
    cond = sl.Condition(COND_SITE, vec, threshold=threshold, compare=compare)
    for prompt, fired in ((FIRES, True), (QUIET, False)):
        panel.controls.prompt.value = prompt
        steer = sl.Steer(STEER_SITE, vec, alpha=[0.0, 6.0], when=cond)
        want = lm.generate(prompt, steer, max_new_tokens=NEW)
        assert panel.error is None
        assert [panel.baseline_text, panel.steered_text] == want.text
        assert bool(want.fired[1]) is fired
        assert (panel.steered_text != panel.baseline_text) is fired
        label = panel.fired_label.value
        assert label.startswith("<span") and ("did not fire" not in label) == fired
        assert f"score {float(want.condition_scores[1]):.3f}" in label
        assert f"only when v at {COND_SITE} (cosine {compare}" in panel.steered_title.value
        assert lm.hook_count() == 0
    panel.controls.condition.value = ""  # always: steers again, and the label goes
    assert panel.steered_text != panel.baseline_text and panel.fired_label.value == ""
    assert panel.record()["vector"] == "v" and "condition" not in panel.record()
    panel.close()


def test_a_prompt_that_does_not_fire_is_the_unsteered_text(lm, vec, threshold):
    panel = make_panel(lm, {"v": vec}, prompt=QUIET)
    set_condition(panel, threshold, compare_for(lm, vec))
    assert "did not fire" in panel.fired_label.value
    assert panel.steered_text == lm.generate(QUIET, max_new_tokens=NEW).text[0]
    record = panel.record()
    assert record["condition_site"] == COND_SITE and record["threshold"] == threshold
    panel.close()


def test_condition_and_monitor_changes_rerun_only_the_steered_row(lm, vec, threshold):
    panel = make_panel(lm, {"v": vec, "w": -vec}, layer=2)
    baseline = panel.baseline_text
    c = panel.controls
    set_condition(panel, threshold, compare_for(lm, vec))
    changes = [
        (c.threshold, threshold + 0.5),
        (c.compare, "below" if c.compare.value == "above" else "above"),
        (c.condition_layer, 1),
        (c.monitor, "w"),
        (c.condition, "w"),
        (c.monitor, ""),
        (c.condition, ""),
    ]
    for control, value in changes:
        renders = panel.render_count
        control.value = value
        assert panel.render_count == renders + 1, (control.description, panel.error)
    assert panel.baseline_runs == 1 and panel.baseline_text == baseline
    assert lm.hook_count() == 0
    panel.close()


def test_a_condition_after_a_prompt_touching_steer_is_an_error_in_the_panel(lm, vec):
    panel = make_panel(lm, {"v": vec})  # positions "all" touch the prompt
    set_condition(panel, 0.0, "above", layer=2)  # read after the steer at layer 1
    assert panel.error is not None and "blocks.2.hook_resid_post" in panel.error
    assert "comes after" in panel.error_box.value and panel.fired_label.value == ""
    panel.controls.positions.value = "generated"  # decided at prefill: any site works
    assert panel.error is None and "score" in panel.fired_label.value
    assert lm.hook_count() == 0
    panel.close()


def test_the_monitor_strip_equals_the_engines_monitor(lm, vec):
    panel = make_panel(lm, {"v": vec, "m": torch.randn(64)}, alpha=0.0)
    monitor = {"m": (STEER_SITE, panel.vectors["m"])}
    panel.controls.monitor.value = "m"
    for alpha in (6.0, -3.0):  # the second run keeps the baseline
        panel.controls.alpha.value = alpha
        steer = sl.Steer(STEER_SITE, vec, alpha=[0.0, alpha])
        want = lm.generate(FIRES, steer, max_new_tokens=NEW, monitor=monitor).monitors["m"]
        got = panel.monitor_strip.data[0].z
        for row in (0, 1):
            assert list(got[row]) == pytest.approx(want.generated[row].tolist(), abs=1e-5)
    assert panel.baseline_runs == 1
    assert list(got[0]) != pytest.approx(list(got[1]), abs=1e-3)  # the steer moved it
    assert panel.monitor_view.layout.display is None
    panel.controls.monitor.value = ""
    assert panel.monitor_strip is None and panel.monitor_view.layout.display == "none"
    assert lm.hook_count() == 0
    panel.close()


def test_a_monitor_at_a_site_the_baseline_did_not_keep_recomputes_it_once(lm, vec):
    site = "blocks.1.hook_attn_out"
    if site not in lm.sites():
        pytest.skip(f"{site} is not a site of this backend")
    panel = make_panel(lm, {"v": vec}, hook="hook_attn_out")
    panel.controls.monitor.value = "v"
    assert panel.baseline_runs == 2  # the kept baseline had no activations at attn_out
    steer = sl.Steer(site, vec, alpha=[0.0, 6.0])
    want = lm.generate(FIRES, steer, max_new_tokens=NEW, monitor={"v": (site, vec)})
    got = panel.monitor_strip.data[0].z
    for row in (0, 1):
        assert list(got[row]) == pytest.approx(want.monitors["v"].generated[row].tolist(), rel=1e-6)
    panel.controls.alpha.value = 2.0
    assert panel.baseline_runs == 2
    panel.close()


def test_a_one_site_steering_vector_lends_its_direction_to_the_condition(lm, vec, threshold):
    sv = sl.SteeringVector({"blocks.2.hook_resid_pre": vec}, scale=3.0)
    compare = compare_for(lm, vec)
    with pytest.warns(UserWarning, match="extracted at blocks.2.hook_resid_pre"):
        panel = make_panel(lm, {"v": sv})  # the steer, too, is lent to layer 1
    panel.controls.positions.value = "generated"
    set_condition(panel, threshold, compare)
    steer = sl.Steer(STEER_SITE, sv.direction_at("blocks.2.hook_resid_pre"), alpha=[0.0, 18.0],
                     positions="generated",
                     when=sl.Condition(COND_SITE, vec, threshold=threshold, compare=compare))  # fmt: skip
    want = lm.generate(FIRES, steer, max_new_tokens=NEW)
    assert bool(want.fired[1]) and [panel.baseline_text, panel.steered_text] == want.text
    panel.close()


def test_removing_the_condition_vector_turns_the_condition_off(lm, vec, threshold):
    panel = make_panel(lm, {"v": vec, "w": -vec})
    set_condition(panel, threshold, compare_for(lm, vec))
    panel.controls.monitor.value = "v"
    runs = panel.render_count
    panel.remove_vector("v")
    assert panel.controls.condition.value == "" and panel.controls.monitor.value == ""
    assert panel.render_count == runs + 1 and panel.fired_label.value == ""
    assert [label for label, _ in panel.controls.condition.options] == ["(always)", "w"]
    panel.add_vector("u", vec, select=False)
    assert [label for label, _ in panel.controls.monitor.options] == ["(none)", "w", "u"]
    panel.close()


def test_a_trained_loreft_is_an_entry_that_steers_at_its_own_site(lm):
    """A LoReFT offered in the panel steers at the site it was trained at (the site
    controls follow it and lock), as ``lm.generate`` with it does; it is no condition or
    monitor vector; the baseline holds still."""
    import steerlab as sl

    torch.manual_seed(0)
    d, rank = lm.d_model, 2
    R = torch.linalg.qr(torch.randn(d, rank))[0].T.contiguous()  # orthonormal rows
    reft = sl.LoReFT("blocks.1.hook_resid_post", R, torch.randn(rank, d) * 0.3,
                     torch.randn(rank) * 2, positions="first:2+last:2")  # fmt: skip
    vec = torch.randn(d)
    panel = SteeringPanel(lm, {"v": vec, "sea": reft}, prompt="Once upon a time",
                          max_new_tokens=8, debounce=0, alpha=1.0)  # fmt: skip
    try:
        runs = panel.baseline_runs
        panel.controls.vector.value = "sea"
        assert panel.controls.layer.value == 1 and panel.controls.hook.value == "hook_resid_post"
        assert panel.controls.layer.disabled
        pair = sl.Steer(reft.site, reft.R[0], [0.0, 1.0], reft.positions, reft)
        want = lm.generate("Once upon a time", pair, max_new_tokens=8)
        assert panel.error is None and panel.steered_text == want.text[1]
        assert want.text[1] != want.text[0]  # it steers
        assert panel.baseline_runs == runs
        assert "sea" not in [v for _, v in panel.controls.condition.options]
        assert lm.hook_count() == 0
    finally:
        panel.close()
