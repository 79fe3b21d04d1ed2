"""Feature activations over prompts, their figures, and the shipped toy SAE against its card."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from helpers import PROMPTS, load_tiny

import steerlab as sl
from steerlab.core.sites import SiteError
from steerlab.features import SAE, FeatureActivations, SAEError, features
from steerlab.features.load import TOY_SAES

SITE = "blocks.1.hook_resid_post"
D_SAE = 96


@pytest.fixture(scope="module")
def random_sae() -> SAE:
    g = torch.Generator().manual_seed(0)
    W_dec = torch.randn(D_SAE, 64, generator=g)
    return SAE(W_dec.T.contiguous() * 0.2, W_dec, torch.randn(D_SAE, generator=g) * 0.1,
               torch.randn(64, generator=g), SITE, model_name="gpt2")  # fmt: skip


@pytest.fixture
def hf_lm(tiny_dirs) -> sl.SteerableModel:
    return load_tiny(tiny_dirs, "gpt2", "hf")


def _encoded(lm, sae, prompts, steer=None):
    cache = lm.run_with_cache(prompts, sites=[sae.site], steer=steer)
    real = cache.attention_mask.bool()
    return sae.encode(cache[sae.site]) * real[..., None], real


def test_top_k_per_token_equals_the_full_encoding_and_pads_are_empty(hf_lm, random_sae):
    acts = features(hf_lm, PROMPTS, random_sae, k=6)
    full, real = _encoded(hf_lm, random_sae, PROMPTS)
    top = torch.topk(full, 6, dim=-1)
    assert acts.k == 6 and acts.top(6).values.shape == (3, real.shape[1], 6)
    torch.testing.assert_close(acts.top(6).values[real], top.values[real])
    assert torch.equal(acts.top(6).indices[real], top.indices[real])
    assert bool((acts.top_values[~real] == 0).all()) and bool((acts.top_indices[~real] == -1).all())
    assert bool((acts.top(2).values[real] > 0).any())  # the SAE does fire
    assert acts.str_tokens[2][-1] != "" and acts.str_tokens[0][0] == ""  # left-padded labels


def test_feature_and_columns_are_exact_at_every_token(hf_lm, random_sae):
    acts = features(hf_lm, PROMPTS, random_sae, k=4)
    full, real = _encoded(hf_lm, random_sae, PROMPTS)
    torch.testing.assert_close(acts.feature(7), full[..., 7])
    torch.testing.assert_close(acts.columns([3, 0, 95]), full[..., [3, 0, 95]])
    assert bool((acts.feature(7)[~real] == 0).all())


def test_dense_values_only_on_request_with_the_memory_in_the_message(hf_lm, random_sae):
    acts = features(hf_lm, PROMPTS, random_sae)
    width = acts.attention_mask.shape[1]
    with pytest.raises(SAEError, match=rf"3 x {width} x {D_SAE} would take .* MiB.*dense=True"):
        acts.values  # noqa: B018
    dense = features(hf_lm, PROMPTS, random_sae, dense=True)
    full, _ = _encoded(hf_lm, random_sae, PROMPTS)
    assert dense.values.shape == (3, width, D_SAE)
    torch.testing.assert_close(dense.values, full)
    torch.testing.assert_close(dense.feature(5), acts.feature(5))


def test_batched_equals_one_prompt_at_a_time(hf_lm, random_sae):
    batched = features(hf_lm, PROMPTS, random_sae, k=5)
    for row, prompt in enumerate(PROMPTS):
        alone = features(hf_lm, [prompt], random_sae, k=5)
        keep = batched.attention_mask[row].bool()
        torch.testing.assert_close(
            batched.top_values[row][keep], alone.top_values[0], atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(
            batched.feature(11)[row][keep], alone.feature(11)[0], atol=1e-5, rtol=1e-5
        )


def test_prompt_top_ranks_features_by_their_peak_in_the_prompt(hf_lm, random_sae):
    acts = features(hf_lm, PROMPTS, random_sae, k=8)
    full, real = _encoded(hf_lm, random_sae, PROMPTS)
    peak = full[2][real[2]].max(0).values  # [d_sae]
    assert acts.prompt_top(2, n=5) == torch.topk(peak, 5).indices.tolist()


def test_alpha_zero_steer_gives_identical_features_and_a_steer_changes_them(hf_lm, random_sae):
    plain = features(hf_lm, PROMPTS, random_sae, dense=True)
    steer = sl.Steer("blocks.0.hook_resid_post", random_sae.W_dec[3], alpha=[0.0])
    assert torch.equal(
        features(hf_lm, PROMPTS, random_sae, steer=steer, dense=True).values, plain.values
    )
    steered = features(hf_lm, PROMPTS, random_sae, steer=sl.Steer(SITE, random_sae.W_dec[3], 4.0))
    assert not torch.allclose(steered.feature(3), plain.feature(3))


def test_bad_inputs_are_refused_before_any_forward(hf_lm, random_sae):
    forwards: list[int] = []
    handle = hf_lm.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        wrong_site = SAE(random_sae.W_enc, random_sae.W_dec, random_sae.b_enc, random_sae.b_dec,
                         "blocks.9.hook_resid_pre")  # fmt: skip
        with pytest.raises(SiteError, match=r"Layer 9 is out of range"):
            features(hf_lm, PROMPTS, wrong_site)
        narrow = SAE(torch.zeros(32, 8), torch.zeros(8, 32), torch.zeros(8), torch.zeros(32), SITE)
        with pytest.raises(SAEError, match=r"reads 32-wide activations.*model's are 64-wide"):
            features(hf_lm, PROMPTS, narrow)
        for k in (0, D_SAE + 1, 2.0, True):
            with pytest.raises(SAEError, match=r"k must be an int in \[1, d_sae=96\]"):
                features(hf_lm, PROMPTS, random_sae, k=k)
    finally:
        handle.remove()
    assert forwards == []
    acts = features(hf_lm, PROMPTS, random_sae, k=4)
    with pytest.raises(SAEError, match=r"top\(k\) 5 is out of range \[1, 4\] \(the number kept"):
        acts.top(5)
    with pytest.raises(SAEError, match=r"feature index 96 is out of range \[0, 95\]"):
        acts.feature(96)


def test_an_sae_of_another_model_warns(hf_lm, random_sae):
    other = SAE(random_sae.W_enc, random_sae.W_dec, random_sae.b_enc, random_sae.b_dec, SITE,
                model_name="gemma-2-2b")  # fmt: skip
    with pytest.warns(UserWarning, match=r"trained on 'gemma-2-2b'"):
        features(hf_lm, PROMPTS[:1], other)


def test_repr_and_html(hf_lm, random_sae):
    acts = features(hf_lm, PROMPTS, random_sae, k=3)
    assert isinstance(acts, sl.FeatureActivations) and sl.FeatureActivations is FeatureActivations
    assert sl.SAE is SAE and sl.load_sae is sl.features.load_sae
    width = acts.attention_mask.shape[1]
    assert repr(acts) == (
        f"FeatureActivations(3 prompts x {width} positions, top 3 per token, {D_SAE} features at {SITE})"
    )
    assert "<table>" in acts._repr_html_() and "top features" in acts._repr_html_()


# --- figures --------------------------------------------------------------------------


def test_features_heatmap_shows_the_prompts_top_features_at_its_real_tokens(hf_lm, random_sae):
    acts = features(hf_lm, PROMPTS, random_sae, k=8)
    fig = sl.plots.features(acts, row=0, n=5).to_dict()
    heat = fig["data"][0]
    skip = acts.leading_bos(0)  # the tiny model's tokenizer starts with a BOS: left out
    top = acts.prompt_top(0, 5, skip=skip)
    positions = acts.real_positions(0)[skip:]
    assert heat["type"] == "heatmap" and list(heat["x"]) == [str(i) for i in top]
    assert (
        len(heat["y"])
        == len(positions)
        == int(acts.attention_mask[0].sum()) - skip
        < acts.tokens.shape[1]
    )
    torch.testing.assert_close(torch.tensor(heat["z"]), acts.columns(top)[0, positions])
    assert "%{z:.3f}" in heat["hovertemplate"] and "feature %{x}" in heat["hovertemplate"]
    assert fig["layout"]["yaxis"]["autorange"] == "reversed"
    assert SITE in fig["layout"]["title"]["text"]


def test_feature_trace_alone_and_against_a_baseline(hf_lm, random_sae):
    plain = features(hf_lm, PROMPTS, random_sae)
    steered = features(hf_lm, PROMPTS, random_sae, steer=sl.Steer(SITE, random_sae.W_dec[3], 4.0))
    one = sl.plots.feature_trace(plain, 3, row=2).to_dict()
    assert [t["type"] for t in one["data"]] == ["bar"]
    assert one["data"][0]["y"] == pytest.approx(
        plain.feature(3)[2, plain.real_positions(2)].tolist()
    )
    both = sl.plots.feature_trace(steered, 3, baseline=plain, row=2).to_dict()
    assert [t["name"] for t in both["data"]] == ["baseline", "steered"]
    assert both["data"][1]["y"] == pytest.approx(
        steered.feature(3)[2, steered.real_positions(2)].tolist()
    )
    assert both["layout"]["yaxis"]["range"] == both["layout"]["yaxis2"]["range"]  # one scale
    assert max(both["data"][1]["y"]) <= both["layout"]["yaxis"]["range"][1]


def test_features_heatmap_leaves_a_bos_token_out_by_default(toy_lm):
    """As the panel's picker does: on steerlab-tiny most of a prompt's strongest features
    are the BOS token's."""
    sae = sl.load_sae("steerlab-tiny-sae")
    acts = toy_lm.features("Once upon a time, there was a little cat called Finn.", sae)
    first = acts.tokens[0, acts.real_positions(0)[0]].item()
    assert first == toy_lm.tokenizer.bos_token_id and acts.leading_bos(0) == 1
    assert acts.prompt_top(0, 10) != acts.prompt_top(0, 10, skip=1)  # BOS features rank high
    heat = sl.plots.features(acts).data[0]
    assert list(heat.x) == [str(i) for i in acts.prompt_top(0, 10, skip=1)]
    assert len(heat.y) == len(acts.real_positions(0)) - 1  # no BOS row either
    assert not any("bos" in c[0] for c in heat.customdata)
    kept = sl.plots.features(acts, skip_bos=False).data[0]
    assert list(kept.x) == [str(i) for i in acts.prompt_top(0, 10)]
    assert "bos" in kept.customdata[0][0]


def test_feature_trace_names_its_panels_where_token_labels_cannot_cover_them(hf_lm, random_sae):
    """Subplot titles sat between the panels, under the upper panel's rotated token labels."""
    plain = features(hf_lm, PROMPTS, random_sae)
    steered = features(hf_lm, PROMPTS, random_sae, steer=sl.Steer(SITE, random_sae.W_dec[3], 4.0))
    fig = sl.plots.feature_trace(steered, 3, baseline=plain, row=2)
    assert not fig.layout.annotations
    assert "baseline" in fig.layout.yaxis.title.text and "steered" in fig.layout.yaxis2.title.text
    assert fig.layout.xaxis.showticklabels is False  # the same tokens: labelled once, below
    assert fig.layout.xaxis2.showticklabels is not False
    other = features(hf_lm, PROMPTS[0], random_sae)
    apart = sl.plots.feature_trace(other, 3, baseline=plain, row=0)
    if [t for t in other.str_tokens[0] if t] != [t for t in plain.str_tokens[0] if t]:
        assert apart.layout.xaxis.showticklabels is not False


def test_feature_figures_export_like_the_others(tmp_path, hf_lm, random_sae):
    from steerlab.exporting import find_browser

    if find_browser() is None:
        pytest.skip("static export needs a Chrome or Chromium")
    acts = features(hf_lm, PROMPTS, random_sae)
    for name, fig in [("heat", sl.plots.features(acts, row=2)),
                      ("trace", sl.plots.feature_trace(acts, 3, baseline=acts, row=2))]:  # fmt: skip
        path = sl.export(fig, tmp_path / f"{name}.png", width="column")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the shipped toy SAE --------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_record() -> dict:
    return json.loads((TOY_SAES["steerlab-tiny-sae"] / "training.json").read_text())


def test_toy_sae_loads_offline_and_saelens_reads_it(tmp_path):
    code = (
        "import steerlab as sl, sae_lens, torch\n"
        "sae = sl.load_sae('steerlab-tiny-sae')\n"
        "lens = sae_lens.SAE.load_from_disk(str(sl.features.TOY_SAES['steerlab-tiny-sae']))\n"
        "x = torch.randn(4, 128)\n"
        "assert torch.allclose(lens.encode(x), sae.encode(x), atol=1e-5)\n"
        "print(sae.site, sae.architecture, sae.d_in, sae.d_sae, sae.model_name)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "empty-hf-home")}  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [
        "blocks.2.hook_resid_pre",
        "standard",
        "128",
        "512",
        "steerlab-tiny",
    ]


def test_toy_sae_is_small_and_its_card_matches_its_record(toy_record):
    folder = TOY_SAES["steerlab-tiny-sae"]
    assert sum(f.stat().st_size for f in folder.iterdir()) < 2 * 2**20
    sae = sl.load_sae("steerlab-tiny-sae")
    assert sae.content_hash == toy_record["content_hash"]
    from steerlab.toy.train_sae import card

    assert (folder / "README.md").read_text() == card(toy_record)


def test_toy_sae_card_figures_hold_for_the_shipped_weights(toy_record):
    """Recompute FVE, L0, dead features and the best concept features on the card's held-out stories."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerlab.toy import asset_path
    from steerlab.toy.corpus import make_story
    from steerlab.toy.train_sae import Recipe, concept_features, reconstruction, residuals

    recipe = Recipe(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in toy_record["recipe"].items()}
    )
    path = asset_path("steerlab-tiny")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rng = random.Random(recipe.seed + 2)
    stories = [make_story(rng) for _ in range(recipe.n_eval_stories)]
    held = residuals(model, tokenizer, [s.text for s in stories], recipe.layer)
    sae = sl.load_sae("steerlab-tiny-sae")
    measured = reconstruction(sae, torch.cat(held))
    card = toy_record["held_out"]
    assert measured["tokens"] == card["tokens"]
    assert measured["fraction_variance_explained"] == pytest.approx(
        card["fraction_variance_explained"], abs=1e-4
    )
    assert measured["l0"] == pytest.approx(card["l0"], abs=1e-3)
    assert measured["dead_features"] == card["dead_features"]
    sentiment = concept_features(sae, held, [s.positive for s in stories])
    assert [r["feature"] for r in sentiment] == [
        r["feature"] for r in toy_record["concepts"]["sentiment"]
    ]
    best = toy_record["best_sentiment_features"]
    assert (best["positive"], best["negative"]) == (
        sentiment[0]["feature"],
        sentiment[3]["feature"],
    )


def test_the_best_sentiment_feature_steers_sentiment_through_the_public_api(toy_record):
    from steerlab.toy.evidence import NEUTRAL_PROMPT
    from steerlab.toy.metrics import mean_concept_score

    lm = sl.load("steerlab-tiny", backend="hf")
    sae = sl.load_sae("steerlab-tiny-sae")
    best = toy_record["best_sentiment_features"]["positive"]
    steer = sl.Steer(sae.site, sae.feature(best), alpha=[0.0, 16.0])
    out = lm.generate([NEUTRAL_PROMPT] * 32, steer, max_new_tokens=48, temperature=1.0, seed=0)
    by_alpha = {a: [t for t, row in zip(out.text, out.alphas) if row[0] == a] for a in (0.0, 16.0)}
    assert 0.3 <= mean_concept_score(by_alpha[0.0]) <= 0.7
    assert mean_concept_score(by_alpha[16.0]) >= 0.8
