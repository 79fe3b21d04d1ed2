"""The engine on a GPU and split over a GPU and the CPU (skipped without CUDA; CI has none).

Compared with the same weights on the CPU: greedy tokens, a continued cache, mixed rows.
"""

from __future__ import annotations

import pytest
import torch
from helpers import PROMPTS

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
SITE = "blocks.1.hook_resid_pre"
SPLIT = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu",
         "model.layers.2": 0, "model.norm": "cpu", "model.rotary_emb": 0, "lm_head": "cpu"}  # fmt: skip


@pytest.fixture(scope="module")
def models(tiny_dirs):
    cpu = sl.load(tiny_dirs["llama"], backend="hf", device="cpu")
    return (
        cpu,
        sl.load(tiny_dirs["llama"], backend="hf", device="cuda"),
        sl.load(tiny_dirs["llama"], backend="hf", device_map=SPLIT),
    )


@pytest.mark.parametrize("which", ["cuda", "split"])
def test_steered_continuation_and_mixed_rows_match_the_cpu(models, which):
    cpu, cuda, split = models
    lm = cuda if which == "cuda" else split
    direction = torch.randn(cpu.d_model, generator=torch.Generator().manual_seed(0))
    steer = sl.Steer(SITE, direction, alpha=3.0, positions="generated")
    kwargs = dict(max_new_tokens=8, stop_at_eos=False)
    reference = cpu.generate(PROMPTS, steer, max_new_tokens=16, stop_at_eos=False).tokens
    first = lm.generate(PROMPTS, steer, keep_cache=True, **kwargs)
    rest = lm.generate(None, steer, cache=first.cache, **kwargs)
    assert [a + b for a, b in zip(first.tokens, rest.tokens)] == reference

    enc = [tuple(cpu.tokenizer(p)["input_ids"]) for p in PROMPTS]
    requests = [
        Request(enc[0], (Steer(SITE, direction, 2.0, "all", sl.Add()),), Sampling(max_new_tokens=5)),
        Request(enc[1], (), Sampling(max_new_tokens=9)),
        Request(enc[2], (Steer(SITE, direction, 1.0, "prompt", sl.Ablate()),), Sampling(max_new_tokens=7)),
    ]  # fmt: skip
    assert [c.tokens for c in lm.engine.run(requests)] == [
        c.tokens for c in cpu.engine.run(requests)
    ]
    assert lm.hook_count() == 0
