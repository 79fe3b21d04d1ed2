"""Tensor parallel 2 on CPU (two worker processes), eager: every rank adds the whole
vector, since the block input is replicated after each all-reduce; rows still equal plain
HF (compiled: ``test_graph.py``)."""

from __future__ import annotations

import os

import pytest
import torch
from failures import LONG, PROMPTS, assert_later_calls_exact, overflowing, request_for
from reference import RefSteer, greedy
from transformers import AutoModelForCausalLM

import steerlab as sl
from steerlab.core.errors import NonFiniteError
from steerlab.toy import asset_path

NEW = 12


@pytest.fixture(scope="module")
def lm():
    # One OpenMP thread per rank, on cores 0 and 1; no core held back for the engine.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    model = sl.load(
        "steerlab-tiny",
        backend="vllm",
        tensor_parallel_size=2,
        max_model_len=128,
        vllm_args={"enforce_eager": True},
    )  # compiled: test_graph.py
    yield model
    model.engine.close()
    del os.environ["VLLM_CPU_OMP_THREADS_BIND"], os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"]


def test_tensor_parallel_rows_equal_hf(lm):
    hf = AutoModelForCausalLM.from_pretrained(asset_path("steerlab-tiny"), dtype=torch.float32)
    v = torch.randn(128, generator=torch.Generator().manual_seed(0)) * 0.4
    w = torch.randn(128, generator=torch.Generator().manual_seed(1))
    steers = [sl.Steer("blocks.1.hook_resid_pre", v, alpha=[0.0, 3.0]),
              sl.Steer("blocks.2.hook_resid_mid", w, alpha=[0.0, 1.0], op=sl.Ablate())]  # fmt: skip
    out = lm.generate(["Once upon a time", "The sea was"], steers, max_new_tokens=NEW)
    assert len(lm.engine.llm.collective_rpc("steerlab_hook_count")) == 2  # two ranks
    for row, prompt in enumerate(out.prompt_tokens):
        a, b = out.alphas[row]
        ref = [RefSteer("blocks.1.hook_resid_pre", v, a),
               RefSteer("blocks.2.hook_resid_mid", w, b, "all", "ablate")]  # fmt: skip
        assert out.tokens[row] == greedy(hf.eval(), prompt, ref, NEW, lm.eos_ids), row
    assert out.tokens[1] != out.tokens[0]
    assert lm.hook_count() == 0


def test_later_calls_are_exact_after_an_overflowing_steer(lm, hf):
    """Issue 49 on tensor parallel 2: both ranks see the overflowing forward's output (it
    is replicated after the last all-reduce) and each zeroes the NaN in its own KV cache
    shard, so later calls, unsteered ones included, are exact. Alone, and beside a plain
    and a steered row (the call fails whole)."""
    assert_later_calls_exact(lm, hf)
    for _ in range(2):
        with pytest.raises(NonFiniteError, match=r"alpha=1e\+08"):
            lm.generate(PROMPTS[0] * 8, overflowing(), max_new_tokens=5)
    beside = [request_for(lm, LONG[1], False), request_for(lm, LONG[0], True)]  # plain, steered
    with pytest.raises(NonFiniteError, match="row 2"):
        lm.engine.run([*beside, request_for(lm, PROMPTS[0] * 4, False, 5, overflow=True)])
    assert_later_calls_exact(lm, hf)
