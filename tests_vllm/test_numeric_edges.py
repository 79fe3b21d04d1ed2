"""Issue 22's numeric edges on vLLM: a temperature below steerlab's floor and a top-p that
keeps one token decode exactly as greedy, as they do on the local engines."""

from __future__ import annotations

import pytest
from failures import overflowing

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


@pytest.fixture(scope="module")
def own():
    """An engine of its own in the default mode, eager on a CPU (the recovery test runs on
    it and on the shared compiled engine; the overflow is the same number either way: the
    graph's arithmetic equals the eager ops', ``tests/test_vllm_graph.py``)."""
    import steerlab as sl

    model = sl.load("steerlab-tiny", backend="vllm", max_model_len=128,
                    vllm_args={"block_size": 32})  # fmt: skip
    yield model
    model.engine.close()


def test_the_default_on_a_cpu_is_eager_and_says_why(own):
    """On a CPU compiled starts 2-3x slower and gains 1.1-1.25x only where its graph holds
    the steers (the README's table)."""
    (worker,) = own.engine.rpc("steerlab_describe")
    assert worker["enforce_eager"] and worker["compilation_mode"] == 0 and not worker["graph"]
    said = own.explain(PROMPTS[0])
    assert said.startswith("vllm eager (the default on a CPU: compiled starts 2-3x slower "
                           "there")  # fmt: skip
    assert "vllm_args={'enforce_eager': False} compiles" in said


def test_a_steer_that_overflows_names_itself_and_decodes_nothing(own):
    """Before the check, the NaN logits decoded as token 0 five times, empty text, no error."""
    from steerlab.core.errors import NonFiniteError

    with pytest.raises(NonFiniteError, match=r"Add at blocks.1.hook_resid_pre with alpha=1e\+08"):
        own.generate(PROMPTS[0], overflowing(), max_new_tokens=5)
    assert own.hook_count() == 0


@pytest.mark.parametrize("engine", ["own", "lm"])
def test_later_calls_are_exact_after_an_overflowing_steer(engine, request):
    """The overflowing row's NaN went into its KV blocks, which vLLM frees unscrubbed: every
    later call given one of them read NaN (0 * NaN in the masked slots), unsteered ones
    included, until the engine restarted. Eager and compiled."""
    import torch

    import steerlab as sl
    from steerlab.core.errors import NonFiniteError

    lm = request.getfixturevalue(engine)
    steer = sl.Steer("blocks.2.hook_resid_pre", torch.ones(128), alpha=4.0, positions="first:2")
    long = [p * 6 for p in PROMPTS]  # prompts that fill more blocks than the overflowing one
    before = [
        lm.generate(p, s, max_new_tokens=6).tokens for p in (PROMPTS, long) for s in (None, steer)
    ]
    for _ in range(2):
        with pytest.raises(NonFiniteError):
            lm.generate(PROMPTS[0] * 8, overflowing(), max_new_tokens=5)
        with pytest.raises(NonFiniteError):  # the same overflowing steer: it fails again
            lm.generate(PROMPTS[0] * 8, overflowing(), max_new_tokens=5)
    after = [
        lm.generate(p, s, max_new_tokens=6).tokens for p in (PROMPTS, long) for s in (None, steer)
    ]
    assert after == before
    assert lm.hook_count() == 0
