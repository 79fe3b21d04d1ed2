"""The steering panel with an SAE: the feature picker, add and clamp, the activation strip."""

from __future__ import annotations

import pytest
import torch

import steerlab as sl
from steerlab.widgets import SteeringPanel
from steerlab.widgets.runner import FEATURE

PROMPT = "Once upon a time"
NEW = 10


@pytest.fixture(scope="module")
def lm() -> sl.SteerableModel:
    return sl.load("steerlab-tiny", backend="hf")


@pytest.fixture(scope="module")
def sae() -> sl.SAE:
    return sl.load_sae("steerlab-tiny-sae")


def feature_panel(lm, sae, **kw) -> SteeringPanel:
    panel = SteeringPanel(lm, sae=sae, prompt=PROMPT, max_new_tokens=NEW, debounce=0, **kw)
    panel.controls.vector.value = FEATURE
    return panel


def test_an_sae_alone_starts_at_its_site_with_the_prompts_top_features(lm, sae):
    panel = SteeringPanel(lm, sae=sae, prompt=PROMPT, max_new_tokens=NEW, debounce=0)
    assert panel.controls.vector.options == (FEATURE,)
    assert panel.rendered is not None and panel.rendered.site == sae.site
    want = lm.features(PROMPT, sae, k=8).prompt_top(0, 8, skip=1)  # BOS left out
    assert panel.top_features == want
    assert [b.description for b in panel.top_buttons] == [str(i) for i in want]
    panel.controls.prompt.value = "The sea was calm"
    again = lm.features("The sea was calm", sae, k=8).prompt_top(0, 8, skip=1)
    assert panel.top_features == again
    assert lm.hook_count() == 0


def test_add_and_clamp_equal_the_same_steers_through_generate(lm, sae):
    panel = feature_panel(lm, sae)
    panel.controls.feature.value = 499
    panel.controls.alpha.value = 16.0
    add = lm.generate(PROMPT, sl.Steer(sae.site, sae.feature(499), alpha=[0.0, 16.0]),
                      max_new_tokens=NEW)  # fmt: skip
    assert [panel.baseline_text, panel.steered_text] == add.text
    assert ("vector feature 499 of steerlab-tiny-sae · add · <span style='white-space:nowrap'>"
            "α = 16</span>") in panel.steered_title.value  # fmt: skip

    panel.controls.feature_op.value = "clamp"
    panel.controls.alpha.value = 18.0
    clamp = lm.generate(PROMPT, sae.clamp(499, 18.0), max_new_tokens=NEW)
    assert panel.steered_text == clamp.text[0] != panel.baseline_text
    assert panel.baseline_text == add.text[0]  # the baseline held still
    assert "clamp feature 499 of steerlab-tiny-sae to 18" in panel.steered_title.value
    assert lm.hook_count() == 0


def test_a_top_feature_click_picks_it(lm, sae):
    panel = feature_panel(lm, sae)
    button = panel.top_buttons[2]
    button.click()
    panel.wait()
    assert panel.controls.feature.value == int(button.description)
    assert panel.rendered is not None and panel.rendered.feature == int(button.description)


def test_the_strip_reads_the_feature_at_each_generated_token(lm, sae):
    """Baseline row: the SAE's encoding of the unsteered residual, recomputed here by a
    plain transformers forward over the prompt and the generated tokens."""
    from transformers import AutoModelForCausalLM

    from steerlab.toy import asset_path

    panel = feature_panel(lm, sae)
    panel.controls.feature.value = 499
    panel.controls.feature_op.value = "clamp"
    panel.controls.alpha.value = 20.0
    assert panel.strip is not None
    baseline, steered = (list(t) for t in panel.strip.data[0].z)
    generation = lm.generate(PROMPT, max_new_tokens=NEW, capture=[sae.site])
    ids = [*generation.prompt_tokens[0], *generation.tokens[0]]
    n_prompt = len(generation.prompt_tokens[0])
    hf = AutoModelForCausalLM.from_pretrained(asset_path("steerlab-tiny"), dtype=torch.float32)
    with torch.no_grad():  # hidden_states[2] is block 2's input: blocks.2.hook_resid_pre
        resid = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[2]
    want = sae.encode(resid[0, n_prompt : len(ids) - 1])[:, 499]
    assert baseline[: len(want)] == pytest.approx(want.tolist(), abs=1e-4)
    assert steered != baseline  # the clamp moved the feature


def test_a_clamp_away_from_the_sae_site_is_an_error_in_the_panel(lm, sae):
    panel = feature_panel(lm, sae)
    panel.controls.feature_op.value = "clamp"
    panel.controls.layer.value = 1  # disabled in the browser; code can still move it
    assert panel.error is not None and "acts at the SAE's site" in panel.error
    assert lm.hook_count() == 0
    # A steered-only change: the baseline pane still shows the current baseline.
    assert "steerlab-stale" in panel.steered_pane._dom_classes
    assert "steerlab-stale" not in panel.baseline_pane._dom_classes
    assert "not current" not in panel.baseline_title.value


@pytest.mark.filterwarnings("ignore:Vector .* was extracted at")
def test_clamp_mode_puts_layer_and_hook_at_the_sae_site_and_disables_them(lm, sae):
    vector = sl.SteeringVector({"blocks.0.hook_resid_pre": torch.ones(128)})
    panel = SteeringPanel(lm, {"ones": vector}, sae=sae, prompt=PROMPT, max_new_tokens=NEW,
                          debounce=0, layer=0, hook="hook_resid_post")  # fmt: skip
    layer, hook = panel.controls.layer, panel.controls.hook
    panel.controls.vector.value = FEATURE
    assert not layer.disabled and not hook.disabled  # add lends the decoder row anywhere
    runs = panel.render_count
    panel.controls.feature_op.value = "clamp"
    assert layer.disabled and hook.disabled
    assert f"blocks.{layer.value}.{hook.value}" == sae.site
    assert panel.error is None and panel.render_count == runs + 1  # one run for the switch
    assert panel.rendered is not None and panel.rendered.site == sae.site
    panel.controls.feature_op.value = "add"
    assert not layer.disabled and not hook.disabled
    panel.controls.feature_op.value = "clamp"
    panel.controls.vector.value = "ones"  # clamp applies to SAE features only
    assert not layer.disabled and not hook.disabled


def test_clamp_mode_from_the_start_disables_the_site_controls(lm, sae):
    panel = SteeringPanel(lm, sae=sae, prompt=PROMPT, max_new_tokens=NEW, debounce=0)
    assert not panel.controls.layer.disabled
    panel.controls.feature_op.value = "clamp"
    assert panel.controls.layer.disabled and panel.controls.hook.disabled


def test_a_feature_past_the_sae_width_is_an_error_not_a_snap(lm, sae):
    panel = feature_panel(lm, sae)
    panel.controls.feature.value = 7
    good = panel.steered_text
    panel.controls.feature.value = sae.d_sae  # typed 512 on a 512-feature SAE
    assert panel.controls.feature.value == sae.d_sae  # kept as typed, not snapped to 511
    assert panel.error is not None and f"feature index {sae.d_sae} is out of range" in panel.error
    assert panel.rendered is not None and panel.rendered.feature == 7
    assert panel.steered_text == good
    panel.controls.feature.value = -1
    assert panel.error is not None and "feature index -1 is out of range" in panel.error
    panel.controls.feature.value = sae.d_sae - 1
    assert panel.error is None and panel.rendered.feature == sae.d_sae - 1


def test_bad_sae_arguments_are_refused(lm, sae, tiny_dirs):
    with pytest.raises(TypeError, match="sae must be an SAE"):
        SteeringPanel(lm, sae="steerlab-tiny-sae")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs at least one vector"):
        SteeringPanel(lm)
    other = sl.load(tiny_dirs["gpt2"], backend="hf")  # d_model 64
    with pytest.raises(ValueError, match="reads 128 dimensions"):
        SteeringPanel(other, sae=sae)


def test_feature_starts_the_panel_on_that_feature(lm, sae):
    vector = sl.SteeringVector({sae.site: torch.ones(128)})
    panel = SteeringPanel(lm, {"ones": vector}, sae=sae, feature=499, alpha=8.0,
                          prompt=PROMPT, max_new_tokens=NEW, debounce=0)  # fmt: skip
    assert panel.render_count == 1 and panel.rendered is not None
    assert (panel.rendered.vector, panel.rendered.feature) == (FEATURE, 499)
    with pytest.raises(sl.features.SAEError, match="out of range"):
        SteeringPanel(lm, sae=sae, feature=sae.d_sae, debounce=0)
    with pytest.raises(ValueError, match="give sae= too"):
        SteeringPanel(lm, {"ones": vector}, feature=3, debounce=0)


def test_adding_and_removing_vectors_keeps_the_sae_feature_entry(lm, sae):
    panel = SteeringPanel(lm, sae=sae, prompt=PROMPT, max_new_tokens=NEW, debounce=0)
    panel.add_vector("ones", torch.ones(128), select=False)
    assert list(panel.controls.vector.options) == ["ones", FEATURE]
    panel.remove_vector("ones")
    assert list(panel.controls.vector.options) == [FEATURE]
