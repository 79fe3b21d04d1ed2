"""Qwen2 and Qwen3 on vLLM (compiled, every site in the graph): tiny random models whose vLLM classes are
not Llama's own, steered at every kind of site in one continuous batch, row for row equal
to plain HF with hooks.

The site table gives them Llama's form (``pair``: layers pass ``(delta, residual)``); this
checks that against vLLM's own Qwen modules rather than assuming it. One engine per family.
"""

from __future__ import annotations

import pytest
import torch
from reference import RefSteer, greedy, peaky_folder
from transformers import AutoModelForCausalLM

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer

NEW = 10
OPS = {"add": sl.Add(), "ablate": sl.Ablate(), "clamp": sl.Clamp(3.0)}
ROWS = [
    [],
    [("hook_embed", "add", "all")],
    [("blocks.0.hook_resid_pre", "add", "all")],
    [("blocks.1.hook_resid_mid", "ablate", "all")],
    [("blocks.2.hook_resid_post", "clamp", "generated")],
    [("blocks.1.hook_attn_out", "add", "prompt")],
    [("blocks.3.hook_mlp_out", "add", 2)],
    [("blocks.2.hook_resid_pre", "add", "all"), ("blocks.2.hook_resid_pre", "ablate", "all")],
]


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def family(request, tmp_path_factory):
    path = peaky_folder(tmp_path_factory.mktemp(request.param), request.param, seed=5)
    lm = sl.load(
        str(path),
        backend="vllm",
        max_model_len=128,
        graph="all",
        vllm_args={"enforce_eager": False},
    )  # compiled, every site in the graph
    yield request.param, lm, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lm.engine.close()


def _vec(seed: int) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed)) * 2.0


def test_every_site_kind_in_one_batch_equals_hf(family):
    name, lm, hf = family
    prompts = ["Hello there", "abc", "The sea"]
    requests, refs = [], []
    for i, steers in enumerate(ROWS):
        ids = tuple(lm.tokenizer(prompts[i % len(prompts)])["input_ids"])
        vectors = [_vec(10 * i + k) for k in range(len(steers))]
        row = tuple(Steer(site, v, 1.0, where, OPS[op])
                    for (site, op, where), v in zip(steers, vectors))  # fmt: skip
        requests.append(Request(ids, row, Sampling(max_new_tokens=NEW), f"r{i}"))
        refs.append([RefSteer(site, v, 1.0, where, op, 3.0)
                     for (site, op, where), v in zip(steers, vectors)])  # fmt: skip
    # compiled, a row with two steers at one site runs its forwards uncompiled
    done = lm.engine.run(requests)
    plain = {}
    for i, (request, ref) in enumerate(zip(requests, refs)):
        expected = greedy(hf.eval(), list(request.prompt), ref, NEW, lm.eos_ids)
        assert done[i].tokens == expected, (name, i)
        plain.setdefault(request.prompt, greedy(hf, list(request.prompt), [], NEW, lm.eos_ids))
    changed = sum(d.tokens != plain[r.prompt] for d, r in zip(done, requests))
    assert changed >= len(requests) - 3, name  # most steers change their row
    assert lm.hook_count() == 0
