"""The engine seam on real backends: a cache continued across calls, and mixed batches.

Every test runs on hf, hooked and bridge (the ``lm`` fixture), on a tiny random GPT-2 and
(where named) a tiny random Llama, with left padding.
"""

from __future__ import annotations

import pytest
import torch
from helpers import BACKENDS, PROMPTS, load_tiny

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer

SITE = "blocks.1.hook_resid_pre"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("positions", [None, "all", "generated", 3])
def test_continuing_equals_one_run(tiny_dirs, backend, direction, family, positions):
    lm = load_tiny(tiny_dirs, family, backend)
    steer = None if positions is None else sl.Steer(SITE, direction, alpha=4.0, positions=positions)
    kwargs = dict(stop_at_eos=False)
    whole = lm.generate(PROMPTS, steer, max_new_tokens=20, **kwargs)
    first = lm.generate(PROMPTS, steer, max_new_tokens=10, keep_cache=True, **kwargs)
    rest = lm.generate(None, steer, max_new_tokens=10, cache=first.cache, **kwargs)
    assert [a + b for a, b in zip(first.tokens, rest.tokens)] == whole.tokens
    assert lm.hook_count() == 0


def test_new_text_on_a_cache_equals_the_joined_prompt(lm):
    """Continuing with text: the same tokens as one prompt holding everything."""
    first = lm.generate(PROMPTS, max_new_tokens=5, stop_at_eos=False, keep_cache=True)
    more = lm.generate([" and", "!", " then"], max_new_tokens=6, stop_at_eos=False,
                       cache=first.cache)  # fmt: skip
    for row in range(len(PROMPTS)):
        held = first.cache.row_tokens(row)
        grown = lm.tokenizer.decode(held[1:])  # the BOS is added again by the tokenizer
        again = lm.generate(grown[: len(grown) - len(lm.tokenizer.decode(more.tokens[row]))],
                            max_new_tokens=1, stop_at_eos=False)  # fmt: skip
        assert again.tokens[0] == more.tokens[row][:1]


def test_cache_fork_repeat_and_crop(lm):
    out = lm.generate(PROMPTS[:1], max_new_tokens=6, stop_at_eos=False, keep_cache=True)
    cache = out.cache
    wide = cache.repeat(3)
    assert (wide.batch_size, wide.length) == (3, cache.length)
    copy = cache.fork()
    a = lm.generate(None, max_new_tokens=4, stop_at_eos=False, cache=cache)
    b = lm.generate(None, max_new_tokens=4, stop_at_eos=False, cache=copy)
    c = lm.generate(None, max_new_tokens=4, stop_at_eos=False, cache=wide)
    assert a.tokens == b.tokens and c.tokens == a.tokens * 3
    assert cache.length == copy.length == out.cache.length
    held = cache.length
    cache.crop(held - 4)  # back to the end of the first call's text
    again = lm.generate(None, max_new_tokens=4, stop_at_eos=False, cache=cache)
    assert again.tokens == a.tokens


def test_mixed_requests_each_equal_their_own_run(tiny_dirs, backend, direction):
    lm = load_tiny(tiny_dirs, "llama", backend)
    other = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(5))
    enc = [tuple(lm.tokenizer(p)["input_ids"]) for p in PROMPTS]
    requests = [
        Request(enc[0], (Steer(SITE, direction, 4.0, "all", sl.Add()),), Sampling(max_new_tokens=6)),
        Request(enc[1], (), Sampling(max_new_tokens=12, temperature=0.9, seed=4), "a"),
        Request(enc[2], (Steer("blocks.0.hook_resid_post", other, 1.0, "prompt", sl.Ablate()),),
                Sampling(max_new_tokens=9, temperature=1.3, top_k=7, seed=1), "b"),
        Request(enc[0], (Steer(SITE, other, -3.0, "generated", sl.Clamp(2.0)),
                         Steer("blocks.0.hook_mlp_out", direction, 2.0, 2, sl.Add())),
                Sampling(max_new_tokens=10, top_p=0.8, temperature=1.0, seed=9, stop=("e",)), "c"),
    ]  # fmt: skip
    mixed = lm.engine.run(requests)
    for request, got in zip(requests, mixed):
        alone = lm.engine.run([request])[0]
        assert (got.tokens, got.finish_reason) == (alone.tokens, alone.finish_reason)
    assert lm.hook_count() == 0


def test_generate_is_the_mixed_engine_with_one_steer_on_every_row(lm, direction):
    steer = sl.Steer(SITE, direction, alpha=[0.0, 5.0])
    out = lm.generate(PROMPTS[:2], steer, max_new_tokens=6, stop_at_eos=False, seed=0)
    enc = [tuple(lm.tokenizer(p)["input_ids"]) for p in PROMPTS[:2]]
    requests = [
        Request(enc[p], (Steer(SITE, direction, a, "all", sl.Add()),),
                Sampling(max_new_tokens=6, stop_at_eos=False), f"0|{PROMPTS[p]!r}")
        for p in (0, 1) for a in (0.0, 5.0)
    ]  # fmt: skip
    assert [c.tokens for c in lm.engine.run(requests)] == out.tokens


def test_finished_rows_are_dropped_without_changing_results(lm):
    enc = [tuple(lm.tokenizer(p)["input_ids"]) for p in PROMPTS]
    requests = [Request(enc[i % 3], (), Sampling(max_new_tokens=2 if i % 2 else 12,
                                                  stop_at_eos=False), str(i)) for i in range(4)]  # fmt: skip
    widths = []
    handle = lm.model.register_forward_pre_hook(
        lambda m, args, kwargs: widths.append(_batch_of(args, kwargs)), with_kwargs=True
    )
    try:
        mixed = lm.engine.run(requests)
    finally:
        handle.remove()
    assert widths[0] == 4 and widths[-1] == 2
    for request, got in zip(requests, mixed):
        assert lm.engine.run([request])[0].tokens == got.tokens


def _batch_of(args, kwargs) -> int:
    first = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
    return int(first.shape[0])


@pytest.mark.parametrize("site", ["blocks.1.hook_resid_mid", "blocks.0.hook_resid_mid"])
def test_steering_resid_mid_reaches_the_rest_of_the_model_on_every_backend(tiny_dirs, site):
    """The bridge's own hook_resid_mid does not feed the MLP: a silent wrong answer once."""
    vector = torch.randn(64, generator=torch.Generator().manual_seed(2))
    steer = sl.Steer(site, vector, alpha=5.0)
    backends = BACKENDS  # last positions: pads' logits mean nothing
    logits = [
        load_tiny(tiny_dirs, "gpt2", b).logits(PROMPTS, steer, last_only=True) for b in backends
    ]
    plain = load_tiny(tiny_dirs, "gpt2", "hf").logits(PROMPTS, last_only=True)
    assert not torch.allclose(logits[0], plain, atol=1e-3)
    for other in logits[1:]:
        torch.testing.assert_close(other, logits[0], atol=1e-4, rtol=1e-4)
