"""Issue 22's numeric edges on vLLM: a temperature below steerlab's floor and a top-p that
keeps one token decode exactly as greedy, as they do on the local engines."""

from __future__ import annotations

import pytest

PROMPTS = ["Once upon a time", "The happy fox"]


@pytest.mark.parametrize("temperature", [1e-39, 5e-324, 1e-6])
def test_a_temperature_below_the_floor_is_greedy(lm, temperature):
    greedy = lm.generate(PROMPTS, max_new_tokens=12).tokens
    got = lm.generate(PROMPTS, max_new_tokens=12, temperature=temperature, seed=3).tokens
    assert got == greedy


@pytest.mark.parametrize("top_p", [1e-46, 1e-9])
def test_a_top_p_that_keeps_one_token_is_greedy(lm, top_p):
    greedy = lm.generate(PROMPTS, max_new_tokens=12).tokens
    got = lm.generate(PROMPTS, max_new_tokens=12, temperature=1.0, top_p=top_p, seed=3).tokens
    assert got == greedy
